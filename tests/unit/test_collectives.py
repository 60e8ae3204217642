"""Sweep mechanics on one gloo rank: adaptive loop counts and the per-path sum check."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from mnnvl import report
from mnnvl.runtime import collectives
from mnnvl.runtime.collectives import SweepPlan, adaptive_median, ci_tight, path_correct


def samples(values: list[float]) -> tuple[list[float], object]:
    calls: list[float] = []
    it = iter(values)

    def loop() -> float:
        calls.append(1.0)
        return next(it)

    return calls, loop


def test_steady_sizes_stop_after_the_minimum_loops() -> None:
    calls, loop = samples([1.000, 1.001, 0.999, 1.0, 1.0, 1.0])
    plan = SweepPlan(sizes=[4], reps=6, min_reps=3, rel_ci=0.01)
    assert adaptive_median(loop, plan, 6) == 1.0  # type: ignore[arg-type]
    assert len(calls) == 3


def test_noisy_sizes_run_to_the_most_loops() -> None:
    calls, loop = samples([1.0, 2.0, 1.0, 2.0, 1.0, 2.0])
    plan = SweepPlan(sizes=[4], reps=6, min_reps=3, rel_ci=0.01)
    adaptive_median(loop, plan, 6)  # type: ignore[arg-type]
    assert len(calls) == 6


def test_fixed_iters_always_run_every_loop() -> None:
    calls, loop = samples([1.0] * 5)
    adaptive_median(loop, SweepPlan(sizes=[4], iters=50, reps=5), 5)  # type: ignore[arg-type]
    assert len(calls) == 5


def test_confidence_interval_needs_two_samples_and_a_tight_spread() -> None:
    assert not ci_tight([1.0], 0.5)
    assert ci_tight([1.0, 1.0, 1.0], 0.01)
    assert not ci_tight([1.0, 1.1, 0.9], 0.01)


def test_large_sizes_warm_up_once_and_small_ones_five_times() -> None:
    plan = SweepPlan(sizes=[4])
    assert collectives.warmup_calls(plan, 64 << 20) == 1
    assert collectives.warmup_calls(plan, 1 << 20) == 5
    assert collectives.warmup_calls(SweepPlan(sizes=[4], warmup_iters=7), 64 << 20) == 7


def test_a_path_returning_the_right_sum_passes_the_check(gloo_one_rank: None) -> None:
    view = torch.empty(64)
    assert path_correct(view, lambda: dist.all_reduce(view))


def test_a_fast_wrong_path_fails_the_check(gloo_one_rank: None) -> None:
    view = torch.empty(64)
    assert not path_correct(view, lambda: view.mul_(2))  # wrong "sum": never timed


def test_one_rank_rows_and_reports_show_no_bandwidth(gloo_one_rank: None, tmp_path: Path) -> None:
    """A one-rank all-reduce moves nothing: its time stays, its bandwidth is "n/a: one rank"
    in the table, the Markdown and the CTRF report (never the no-op's petabytes per second)."""
    plan = SweepPlan(sizes=[1 << 10, 1 << 20], iters=4, reps=2)
    rows = collectives.run_sweep(plan, torch.device("cpu"))
    assert [r["bytes"] for r in rows] == [1 << 10, 1 << 20]
    assert all(r["algbw_gbps"] is None and r["busbw_gbps"] == 0.0 for r in rows)
    assert all(r["time_us"] > 0 and r["correct"] for r in rows)
    result = {
        "kind": "verify",
        "verdict": "NOT_JUDGED",
        "reasons": ["NOT_JUDGED: one rank: bus bandwidth is 0 by definition"],
        "threshold_gbps": None,
        "judged_busbw_gbps": 0.0,
        "peak_busbw_gbps": 0.0,
        "world_size": 1,
        "backend": "gloo",
        "sizes": rows,
    }
    table = [ln for ln in report.verify_table(result).splitlines() if ln.lstrip()[:1].isdigit()]
    assert [ln.split()[:2] for ln in table] == [["1", "KiB"], ["1", "MiB"]]
    assert all(ln.count("n/a: one rank") == 2 and ln.rstrip().endswith("yes") for ln in table)
    files = report.write_verify_report(result, str(tmp_path))
    markdown = Path(files["markdown"]).read_text()
    assert markdown.count("| n/a: one rank | n/a: one rank | yes |") == 2
    assert json.loads(Path(files["json"]).read_text())["sizes"][0]["algbw_gbps"] is None
    ctrf = json.loads(Path(files["ctrf"]).read_text())
    (small,) = [t for t in ctrf["results"]["tests"] if t["name"].startswith("bandwidth small")]
    assert "busbw 1 KiB n/a: one rank, 1 MiB n/a: one rank" in small["message"]
    assert "GB/s" not in small["message"]
