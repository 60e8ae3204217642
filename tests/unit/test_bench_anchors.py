"""A benchmark's anchor is measured in the same run or not printed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_make_run_bench_prints_goal_and_measurements_but_no_anchor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("bench_make_run", BENCH / "bench_make_run.py")
    assert spec is not None and spec.loader is not None
    bench: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # The measured run is replaced: this checks what the report states about a 20 s run.
    monkeypatch.setattr(bench, "run_once", lambda extra: (20.0, 0, {"train": 5.0, "cpu": 30.0}))
    monkeypatch.setattr(sys, "argv", ["bench_make_run.py", "--repeat", "2"])
    assert bench.main() == 0
    out = capsys.readouterr().out
    result = json.loads(out.splitlines()[-1])
    assert result["median_s"] == 20.0 and result["goal_met"] is True
    assert "anchor" not in out.lower() and not any("anchor" in k for k in result)
