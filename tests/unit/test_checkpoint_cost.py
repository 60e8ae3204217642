"""A background checkpoint that slows the steps beside it is counted, not hidden."""

from __future__ import annotations

import pytest

from mnnvl.runtime import metrics


def _run(monkeypatch: pytest.MonkeyPatch, windows: list[tuple[float, str]]) -> metrics.Throughput:
    """Windows of 10 steps x 100 tokens: (seconds, "save" when a save starts at its end)."""
    clock = [0.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: clock[0])
    thr = metrics.Throughput()
    for seconds, what in windows:
        clock[0] += seconds
        thr.mark(1000)
        if what == "save":
            thr.save_started()
    return thr


def test_the_steps_a_first_save_slowed_are_counted_as_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    # As seen on one H200: ten steps take 2.4 s, the ten beside the first save 9.1 s.
    thr = _run(
        monkeypatch,
        [(5.0, ""), (2.4, ""), (2.4, "save"), (9.1, ""), (2.4, ""), (2.4, "save"), (3.1, "")],
    )
    assert thr.checkpoint_lost_s() == pytest.approx(6.7 + 0.7)


def test_no_save_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    thr = _run(monkeypatch, [(5.0, ""), (2.4, ""), (2.5, ""), (2.3, "")])
    assert thr.checkpoint_lost_s() == 0.0


def test_a_save_still_written_at_the_next_mark_slows_the_window_after_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [0.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: clock[0])
    thr = metrics.Throughput()
    for seconds, save, still_writing in [
        (5.0, False, False),
        (2.0, True, False),
        (4.0, False, True),
        (3.0, False, False),
        (2.0, False, False),
    ]:
        clock[0] += seconds
        thr.mark(1000, still_writing)
        if save:
            thr.save_started()
    assert thr.checkpoint_lost_s() == pytest.approx(2.0 + 1.0)
