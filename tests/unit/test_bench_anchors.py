"""A benchmark's anchor is measured in the same run or not printed."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def typed_in_anchors(path: Path) -> list[str]:
    """Module-level names with ANCHOR in them bound to a number literal."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if isinstance(node.value.value, (int, float)) and any("ANCHOR" in n for n in names):
                found += [f"{path.name}: {n} = {node.value.value}" for n in names]
    return found


def test_no_benchmark_types_in_an_anchor_figure() -> None:
    assert [a for p in sorted(BENCH.glob("*.py")) for a in typed_in_anchors(p)] == []


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
