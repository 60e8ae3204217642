"""All-reduce bus-bandwidth sweep (float32 sum, in place), measured as nccl-tests measures it.

``algbw = bytes / time`` and ``busbw = algbw * 2(n-1)/n`` (nccl-tests' all-reduce factor), with
``bytes`` each rank's buffer and ``time`` the mean of one call over a timed loop; the reported
time is the median loop's, the slowest rank's. One rank moves no data: its rows keep the time,
give ``algbw_gbps`` null and ``busbw_gbps`` 0.

CUDA loops are timed with CUDA events around calls issued straight on the process group; below
``GRAPH_BELOW_S`` per call also through a second communicator on NCCL's C API (``nccl_direct``,
like nccl-tests) or, without it, one captured CUDA graph (like ``all_reduce_perf -G``), and the
fastest counts: at 1 MiB torch's own per-call host work (~9 us on 2 x H200, torch 2.11 + NCCL
2.28) exceeds what the GPUs need. CPU (gloo) loops use ``time.perf_counter``.

Unless ``iters`` is given, a size stops once the 95 % confidence interval of the mean loop time
is within ``rel_ci`` (``min_reps`` to ``reps`` loops). The sweep warms up once at the largest
size, like nccl-tests. Every size is checked on every timed path first (rank ``r`` fills even
elements with ``r + 1``, odd ones with ``r + 2``; the sum must be exact): a wrong path is not
timed and marks the size incorrect. Smaller sizes are views of one largest buffer.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mnnvl.runtime.nccl_direct import DirectComm

logger = logging.getLogger(__name__)
Group = dist.ProcessGroup | None  # None: the default group (all ranks)
SLOW_RANK_ENV = "MNNVL_TEST_SLOW_RANK"

ELEMENT_BYTES = 4  # float32
MAX_LOOP = 2000  # all-reduce calls in one loop (graph size bound)
# Calls slower than this are only timed eagerly: the host then enqueues faster than the
# GPU drains, so a graph cannot gain anything.
GRAPH_BELOW_S = 150e-6
# From this size up a size needs only one warm-up call (the sweep's first warm-up at the
# largest size already brought clocks and NCCL buffers to their steady state).
LARGE_BYTES = 64 << 20
T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}


@dataclass(frozen=True)
class SweepPlan:
    sizes: list[int]
    warmup_iters: int = 0  # 0 = auto (see the module docstring)
    iters: int = 0  # 0 = adaptive: loops until the mean is known within ``rel_ci``
    reps: int = 5  # most loops per size (exactly this many when ``iters`` is given)
    target_s: float = 0.08  # timed work per size at most (``reps`` loops)
    cuda_graphs: bool = True  # also the direct NCCL path (``nccl_direct``)
    min_reps: int = 3
    rel_ci: float = 0.01
    # Told (size, "start" | "loop" | "done") between calls: the launcher's stall watchdog
    # hears from every timed loop, so even the largest size is never taken for a hang.
    progress: Callable[[int, str], None] | None = None

    def tell(self, size: int, event: str) -> None:
        if self.progress is not None:
            self.progress(size, event)


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Sizes from min to max doubling (rounded to whole float32 elements), max included."""
    lo = max(ELEMENT_BYTES, min_bytes - min_bytes % ELEMENT_BYTES)
    hi = max(lo, max_bytes - max_bytes % ELEMENT_BYTES)
    sizes = []
    size = lo
    while size < hi:
        sizes.append(size)
        size *= 2
    sizes.append(hi)
    return sizes


def judged_busbw(sizes: Sequence[dict[str, Any]], judge_min_bytes: int) -> float:
    """Best busbw at sizes >= judge_min_bytes; the largest size if the sweep stops below."""
    if not sizes:
        return 0.0
    big = [row["busbw_gbps"] for row in sizes if row["bytes"] >= judge_min_bytes]
    return max(big) if big else max(sizes, key=lambda row: row["bytes"])["busbw_gbps"]


def loop_shape(plan: SweepPlan, est_s: float) -> tuple[int, int]:
    """(calls per loop, most loops) for one size, given an estimate of one call's time."""
    reps = max(1, plan.reps)
    if plan.iters:
        reps = min(reps, plan.iters)
        return max(1, plan.iters // reps), reps
    calls = plan.target_s / max(est_s, 1e-7) / reps
    return int(min(MAX_LOOP, max(1, calls))), reps


def ci_tight(samples: list[float], rel_ci: float) -> bool:
    """True when the 95 % confidence half-width of the samples' mean is <= rel_ci x mean."""
    n = len(samples)
    if n < 2:
        return False
    mean = statistics.fmean(samples)
    half = T95.get(n, 2.0) * statistics.stdev(samples) / n**0.5
    return mean > 0 and half <= rel_ci * mean


def adaptive_median(run_loop: Callable[[], float], plan: SweepPlan, loops: int) -> float:
    """Median of per-loop times: ``loops`` of them when ``iters`` is fixed, else as few as
    the confidence interval allows (at least ``min_reps``, at most ``loops``)."""
    samples: list[float] = []
    for _ in range(loops):
        samples.append(run_loop())
        if not plan.iters and len(samples) >= plan.min_reps and ci_tight(samples, plan.rel_ci):
            break
    return statistics.median(samples)


def warmup_calls(plan: SweepPlan, size: int) -> int:
    if plan.warmup_iters:
        return plan.warmup_iters
    return 1 if size >= LARGE_BYTES else 5


def fill_pattern(view: torch.Tensor, rank: int) -> None:
    view.fill_(rank + 1)
    view[1::2] += 1


def pattern_ok(view: torch.Tensor, world_size: int) -> torch.Tensor:
    """A 0-d bool tensor on the buffer's device (no host sync here)."""
    base = world_size * (world_size + 1) // 2
    even = torch.all(view[0::2] == base)
    odd = torch.all(view[1::2] == base + world_size) if view.numel() > 1 else even
    return torch.logical_and(even, odd)


def run_sweep(
    plan: SweepPlan,
    device: torch.device,
    timings: dict[str, float] | None = None,
    group: Group = None,
) -> list[dict[str, Any]]:
    """Run the sweep on ``group`` (default: all ranks); every member returns the same rows.

    ``timings`` (when given) receives the seconds of the first warm-up and of setting up
    the direct NCCL communicator (default group only); each row has its own ``wall_ms``.
    """
    timings = {} if timings is None else timings
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buf = torch.empty(max(plan.sizes) // ELEMENT_BYTES, dtype=torch.float32, device=device)
    times: list[float] = []
    checks: list[torch.Tensor] = []
    paths: list[str] = []
    walls: list[float] = []
    own: list[float] = []  # CPU only: this rank's seconds per call outside the collective
    t0 = time.perf_counter()
    plan.tell(max(plan.sizes), "start")
    # Like nccl-tests, warm up at the largest size first: clocks, NCCL buffers and
    # connections are then in their steady state when the small sizes are timed.
    for _ in range(plan.warmup_iters or 5):
        dist.all_reduce(buf, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timings["warmup"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    cuda_direct = device.type == "cuda" and plan.cuda_graphs and group is None
    direct = DirectComm.create(device) if cuda_direct else None
    timings["direct_init"] = round(time.perf_counter() - t0, 3)
    try:
        for size in plan.sizes:
            t0 = time.perf_counter()
            plan.tell(size, "start")
            view = buf[: size // ELEMENT_BYTES]
            fill_pattern(view, rank)
            dist.all_reduce(view, group=group)
            ok = pattern_ok(view, world)
            if device.type == "cuda":
                seconds, path, path_ok = _time_cuda(view, plan, direct, group)
                ok = torch.logical_and(ok, torch.tensor(path_ok, device=device))
            else:
                seconds, path = _time_cpu(view, plan, group, own), "eager"
            times.append(seconds)
            checks.append(ok)
            paths.append(path)
            walls.append(time.perf_counter() - t0)
            logger.debug("all_reduce %d bytes: %.2f us (%s)", size, seconds * 1e6, path)
            plan.tell(size, "done")
    finally:
        if direct is not None:
            direct.close()
    # The slowest rank's time per size, and correct only where every rank saw the exact sum.
    summary = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(summary, op=dist.ReduceOp.MAX, group=group)
    ok_all = torch.stack(checks).to(torch.int32)
    dist.all_reduce(ok_all, op=dist.ReduceOp.MIN, group=group)
    del buf
    lags = _gather_own(own, device, group, world)
    factor = 2.0 * (world - 1) / world  # nccl-tests' all-reduce bus factor
    rows: list[dict[str, Any]] = []
    table = zip(plan.sizes, summary.tolist(), ok_all.tolist(), strict=True)
    for i, (size, t, good) in enumerate(table):
        algbw = size / t / 1e9 if t > 0 else 0.0
        rows.append(
            {
                "bytes": size,
                "time_us": _sig(t * 1e6),
                "algbw_gbps": None if world == 1 else _sig(algbw),
                "busbw_gbps": _sig(algbw * factor),
                "correct": bool(good),
                "path": paths[i],
                "wall_ms": round(walls[i] * 1e3, 2),
            }
        )
        if lags:
            rows[-1]["rank_own_us"] = [_sig(per_rank[i] * 1e6) for per_rank in lags]
    return rows


def _gather_own(
    own: list[float], device: torch.device, group: Group, world: int
) -> list[list[float]]:
    """Every member's own (outside-the-collective) time per size, in group rank order."""
    if not own:
        return []
    mine = torch.tensor(own, dtype=torch.float64, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    return [t.tolist() for t in everyone]


def _sig(value: float) -> float:
    """Six significant digits: enough for 0.001 GB/s on gloo and 346.712 GB/s on NVLink."""
    return float(f"{value:.6g}")


def _agreed(seconds: float, device: torch.device, group: Group = None) -> float:
    """The slowest rank's estimate, so every rank runs the same number of collectives."""
    est = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(est, op=dist.ReduceOp.MAX, group=group)
    return float(est.item())


def _slow_down_s() -> float:
    """Test hook ``MNNVL_TEST_SLOW_RANK=<rank>:<ms>``: that rank (CPU only) waits ``ms``
    before each timed all-reduce, to plant a degraded node."""
    text = os.environ.get(SLOW_RANK_ENV, "")
    slow_rank, _, ms = text.partition(":")
    if not text or slow_rank != os.environ.get("RANK", "0"):
        return 0.0
    return float(ms or 0) / 1e3


def _time_cpu(view: torch.Tensor, plan: SweepPlan, group: Group, own: list[float]) -> float:
    """Seconds per call (the slowest rank's); ``own`` receives this rank's mean seconds per
    call spent outside the collective (what the others waited for when it is late)."""
    delay = _slow_down_s()
    spent = {"outside": 0.0, "calls": 0}
    for _ in range(plan.warmup_iters or 2):
        dist.all_reduce(view, group=group)
    start = time.perf_counter()
    dist.all_reduce(view, group=group)
    calls, loops = loop_shape(plan, _agreed(time.perf_counter() - start, view.device, group))

    def loop() -> float:
        t0 = time.perf_counter()
        inside = 0.0
        for _ in range(calls):
            if delay:
                time.sleep(delay)
            t_call = time.perf_counter()
            dist.all_reduce(view, group=group)
            inside += time.perf_counter() - t_call
        elapsed = time.perf_counter() - t0
        spent["outside"] += elapsed - inside
        spent["calls"] += calls
        plan.tell(view.numel() * ELEMENT_BYTES, "loop")
        # Every rank must stop after the same loop: agree on the slowest rank's time.
        return _agreed(elapsed, view.device, group) / calls

    median = adaptive_median(loop, plan, loops)
    own.append(spent["outside"] / max(1, spent["calls"]))
    return median


def _time_cuda(
    view: torch.Tensor, plan: SweepPlan, direct: DirectComm | None, group: Group
) -> tuple[float, str, bool]:
    """(seconds per call on the fastest correct path, that path, every path correct)."""
    for _ in range(warmup_calls(plan, view.numel() * ELEMENT_BYTES)):
        dist.all_reduce(view, group=group)
    probe = 3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    _eager(view, probe, group)()
    end.record()
    end.synchronize()
    est = _agreed(start.elapsed_time(end) / 1e3 / probe, view.device, group)
    calls, loops = loop_shape(plan, est)
    launchers = {"eager": _eager(view, calls, group)}
    all_ok = True
    if plan.cuda_graphs and est < GRAPH_BELOW_S:
        if direct is not None:
            # Checked once before it is timed: a fast wrong path must never win.
            if path_correct(view, direct.launcher(view, 1)):
                launchers["direct"] = direct.launcher(view, calls)
            else:
                all_ok = False
                logger.error("direct NCCL all_reduce of %d bytes: wrong sum", view.numel() * 4)
        else:
            # Graph-captured torch collectives lose to the direct path everywhere measured
            # (they keep per-call cross-stream events); they are the fallback without it.
            launchers["graph"] = _capture(view, calls, group)
    timed = {
        name: _time_launcher(launch, calls, loops, plan, view, group)
        for name, launch in launchers.items()
    }
    best = min(timed, key=lambda name: timed[name])
    return timed[best], best, all_ok


def path_correct(view: torch.Tensor, launch_once: Callable[[], None]) -> bool:
    """Run one all-reduce of the check pattern through ``launch_once``; True when every rank
    got the exact sum (agreed over the default group, so all ranks take the same branch)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fill_pattern(view, rank)
    launch_once()
    ok = pattern_ok(view, world).to(torch.int32).reshape(1)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def _time_launcher(
    launch: Callable[[], None],
    calls: int,
    loops: int,
    plan: SweepPlan,
    view: torch.Tensor,
    group: Group = None,
) -> float:
    launch()  # the first replay uploads a graph; keep it out of the timings
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def loop() -> float:
        a.record()
        launch()
        b.record()
        b.synchronize()
        plan.tell(view.numel() * ELEMENT_BYTES, "loop")
        # Every rank must stop after the same loop: agree on the slowest rank's time.
        return _agreed(a.elapsed_time(b) / 1e3 / calls, view.device, group)

    return adaptive_median(loop, plan, loops)


def _eager(view: torch.Tensor, calls: int, group: Group = None) -> Callable[[], None]:
    """``calls`` all-reduces straight on the process group: less Python per call than
    ``dist.all_reduce``, and one wait at the end (NCCL runs them in order on its stream)."""
    pg = group or dist.distributed_c10d._get_default_group()

    def launch() -> None:
        work = None
        for _ in range(calls):
            work = pg.allreduce([view])
        if work is not None:
            work.wait()

    return launch


def _capture(view: torch.Tensor, calls: int, group: Group = None) -> Callable[[], None]:
    """Capture ``calls`` all-reduces into one CUDA graph (NCCL supports stream capture).

    The collective was already run eagerly, so the communicator exists before capture.
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            dist.all_reduce(view, group=group)
    return graph.replay
