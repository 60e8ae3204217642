"""Sweep mechanics on one gloo rank: adaptive loop counts and the per-path sum check."""

from __future__ import annotations

import torch
import torch.distributed as dist

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
