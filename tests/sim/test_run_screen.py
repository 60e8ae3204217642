"""What a person sees of `mnnvl run --sim` at the default verbosity: a screen, not a log dump.

Each step shows its state changes, one progress line (training with its ETA), the verdict
table once and the summary; no worker RESULT JSON, no Python reprs. The stdout line points
at the report files instead of carrying the worker's RESULTs again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SCREEN_LINES = 40  # a 2-node run: four steps and the summary


def test_a_two_node_run_fits_one_screen_with_a_progress_line_and_its_eta(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    argv = ["run", "--sim", "--run-id", "screen", "--nodes", "2", "--gpus-per-node", "0"]
    argv += ["--min-busbw-gbps", "0.001", "--steps", "20", "--report-dir", str(reports)]
    done = subprocess.run(
        [sys.executable, "-m", "mnnvl", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    # The 15 s progress lines come with time, not with the run: a loaded machine adds one per
    # 15 s a step waits. The budget leaves room for a minute of them.
    waits = [ln for ln in lines if re.search(r"^\S+ INFO  waiting \d+ s: ", ln)]
    assert len(lines) - len(waits) <= SCREEN_LINES - 4, done.stderr
    # One line of its own; a 15 s waiting line repeats it.
    progress = [ln for ln in lines if re.search(r"train: step \d+/20, .*tokens/s, ETA \d+", ln)]
    assert len([ln for ln in progress if ln not in waits]) == 1, done.stderr
    assert any(re.search(r"verify: \d+ of \d+ sizes done", ln) for ln in lines), done.stderr
    # The verdict once per verification, then one line per task in the summary.
    assert sum("not judged:" in ln for ln in lines) == 2, done.stderr
    assert any(re.search(r"^\S+ INFO\s+train\s+20 steps, .*goodput \d+%", ln) for ln in lines)
    assert "RESULT {" not in done.stderr and "{'" not in done.stderr
    assert "size  time" not in done.stderr  # the busbw-per-size table is in the reports

    (out,) = done.stdout.splitlines()
    result = json.loads(out)
    assert len(out) < 4000, len(out)
    for task in ("verify_pre", "train", "verify_post"):
        assert "raw" not in result[task] and Path(result[task]["report_files"]["json"]).exists()
    assert json.loads((reports / "train" / "train.json").read_text())["goodput"] > 0
