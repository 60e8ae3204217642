"""Rank 0's log as one progress line: what the launcher shows of a worker's log lines."""

from __future__ import annotations

from mnnvl.driver.progress_line import ProgressLine

STAMP = "2026-12-03 13:21:33,262 "


def test_training_shows_its_first_line_with_an_eta_once_then_keeps_the_latest() -> None:
    shown = ProgressLine()
    first = (
        "step 1 loss 6.6799 lr 0.00012 tok/s 1039 (520/rank) mfu n/a mem 0.27 GiB; 1 of 20 steps"
    )
    assert shown.line(STAMP + first) is None  # the first step's rate includes compiling
    assert shown.text == "train: step 1/20, loss 6.6799, 1039 tokens/s"
    tenth = "step 10 loss 6.1596 lr 0.000232 tok/s 9116 (4558/rank) mfu n/a mem 0.28 GiB; "
    assert shown.line(STAMP + tenth + "10 of 20 steps, ETA 4 min 10 s") == (
        "train: step 10/20, loss 6.1596, 9116 tokens/s, ETA 4 min 10 s"
    )
    later = "step 15 loss 6.0 lr 0.0002 tok/s 9000 (4500/rank) mfu n/a mem 0.28 GiB; "
    later += "15 of 20 steps, ETA 2 s"
    assert shown.line(STAMP + later) is None  # later ones go into the wait's progress line
    assert shown.text == "train: step 15/20, loss 6.0, 9000 tokens/s, ETA 2 s"


def test_a_sweep_shows_sizes_done_of_all() -> None:
    shown = ProgressLine()
    line = "sweep size 16384 bytes done (the sweep across all ranks), 5 of 11 sizes"
    assert shown.line(STAMP + line) == (
        "verify: 5 of 11 sizes done (16 KiB, the sweep across all ranks)"
    )


def test_other_lines_and_an_older_workers_lines_show_nothing() -> None:
    shown = ProgressLine()
    assert shown.line("step 10 loss 6.1 lr 0.1 tok/s 9116 (4558/rank) mfu n/a mem 0.28 GiB") is None
    assert shown.line("sweep size 1024 bytes done (the sweep across all ranks)") is None
    assert shown.line('RESULT {"kind": "train"}') is None
    assert shown.text == ""  # the wait's progress line falls back to the step it parses itself
