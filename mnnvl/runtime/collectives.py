"""All-reduce bus-bandwidth sweep (float32 sum), measured the way nccl-tests measures it.

``algbw = bytes / time`` and ``busbw = algbw * 2(n-1)/n`` (nccl-tests' all-reduce factor),
with ``bytes`` the size of each rank's buffer and ``time`` the mean time of one all-reduce
over a timed loop, as nccl-tests reports it. Each size runs ``reps`` such loops; the reported
time is the median loop's mean, taken across ranks as the slowest rank's (a collective
is only as fast as its slowest member).

On CUDA each loop is timed with CUDA events around ``k`` calls issued straight on the
process group. Below ~150 µs per call the same loop is also timed as one captured CUDA graph
(like ``all_reduce_perf -G``) and through a second communicator driven by NCCL's C API
(``nccl_direct``, like nccl-tests), and the fastest counts: at 1 MiB torch's own per-call
host work (~9 µs on 2 x H200, torch 2.11 + NCCL 2.28) exceeds what the GPUs need, and
graph-captured torch collectives keep their cross-stream events, so only the direct path
shows the fabric's small-message latency. On CPU (gloo) the loop is timed with
``time.perf_counter``.

Every size is checked once before timing: rank ``r`` fills even elements with ``r + 1`` and
odd ones with ``r + 2``; the sum must be exact (small integers are exact in float32).
One buffer of the largest size is allocated; smaller sizes are views of it.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mnnvl.runtime.nccl_direct import DirectComm

logger = logging.getLogger(__name__)

ELEMENT_BYTES = 4  # float32
MAX_LOOP = 2000  # all-reduce calls in one loop (graph size bound)
# Calls slower than this are only timed eagerly: the host then enqueues faster than the
# GPU drains, so a graph cannot gain anything.
GRAPH_BELOW_S = 150e-6


@dataclass(frozen=True)
class SweepPlan:
    sizes: list[int]
    warmup_iters: int = 0  # 0 = auto
    iters: int = 0  # 0 = auto: enough calls for ``target_s`` of timed work per size
    reps: int = 5
    target_s: float = 0.08
    cuda_graphs: bool = True
    direct_nccl: bool = True


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


def bus_factor(world_size: int) -> float:
    return 2.0 * (world_size - 1) / world_size if world_size > 0 else 0.0


def loop_shape(plan: SweepPlan, est_s: float) -> tuple[int, int]:
    """(calls per loop, loops) for one size, given an estimate of one call's time."""
    reps = max(1, plan.reps)
    if plan.iters:
        reps = min(reps, plan.iters)
        return max(1, plan.iters // reps), reps
    calls = plan.target_s / max(est_s, 1e-7) / reps
    return int(min(MAX_LOOP, max(1, calls))), reps


def fill_pattern(view: torch.Tensor, rank: int) -> None:
    view.fill_(rank + 1)
    view[1::2] += 1


def pattern_ok(view: torch.Tensor, world_size: int) -> torch.Tensor:
    """A 0-d bool tensor on the buffer's device (no host sync here)."""
    base = world_size * (world_size + 1) // 2
    even = torch.all(view[0::2] == base)
    odd = torch.all(view[1::2] == base + world_size) if view.numel() > 1 else even
    return torch.logical_and(even, odd)


def run_sweep(plan: SweepPlan, device: torch.device) -> list[dict[str, Any]]:
    """Run the sweep on the default process group; every rank returns the same rows."""
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.empty(max(plan.sizes) // ELEMENT_BYTES, dtype=torch.float32, device=device)
    times: list[float] = []
    checks: list[torch.Tensor] = []
    # Like nccl-tests, warm up at the largest size first: clocks, NCCL buffers and
    # connections are then in their steady state when the small sizes are timed.
    for _ in range(plan.warmup_iters or 5):
        dist.all_reduce(buf)
    direct = _direct_comm(plan, device)
    try:
        for size in plan.sizes:
            view = buf[: size // ELEMENT_BYTES]
            fill_pattern(view, rank)
            dist.all_reduce(view)
            checks.append(pattern_ok(view, world))
            if device.type == "cuda":
                times.append(_time_cuda(view, plan, direct))
            else:
                times.append(_time_cpu(view, plan))
            logger.debug("all_reduce %d bytes: %.2f us", size, times[-1] * 1e6)
    finally:
        if direct is not None:
            direct.close()
    # The slowest rank's time per size, and correct only where every rank saw the exact sum.
    summary = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    ok = torch.stack(checks).to(torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    del buf
    factor = bus_factor(world)
    rows = []
    for size, t, good in zip(plan.sizes, summary.tolist(), ok.tolist(), strict=True):
        algbw = size / t / 1e9 if t > 0 else 0.0
        rows.append(
            {
                "bytes": size,
                "time_us": _sig(t * 1e6),
                "algbw_gbps": _sig(algbw),
                "busbw_gbps": _sig(algbw * factor),
                "correct": bool(good),
            }
        )
    return rows


def _sig(value: float) -> float:
    """Six significant digits: enough for 0.001 GB/s on gloo and 346.712 GB/s on NVLink."""
    return float(f"{value:.6g}")


def _agreed(seconds: float, device: torch.device) -> float:
    """The slowest rank's estimate, so every rank runs the same number of collectives."""
    est = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    return float(est.item())


def _median_loop(loops: int, calls: int, run_loop: Callable[[], float]) -> float:
    return statistics.median(run_loop() / calls for _ in range(loops))


def _time_cpu(view: torch.Tensor, plan: SweepPlan) -> float:
    for _ in range(plan.warmup_iters or 2):
        dist.all_reduce(view)
    start = time.perf_counter()
    dist.all_reduce(view)
    calls, loops = loop_shape(plan, _agreed(time.perf_counter() - start, view.device))

    def loop() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(view)
        return time.perf_counter() - t0

    return _median_loop(loops, calls, loop)


def _direct_comm(plan: SweepPlan, device: torch.device) -> DirectComm | None:
    if device.type != "cuda" or not plan.direct_nccl or not plan.cuda_graphs:
        return None
    return DirectComm.create(device)


def _time_cuda(view: torch.Tensor, plan: SweepPlan, direct: DirectComm | None = None) -> float:
    for _ in range(plan.warmup_iters or 5):
        dist.all_reduce(view)
    probe = 3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    _eager(view, probe)()
    end.record()
    end.synchronize()  # the only host syncs per size (here and below) size the timed loop
    est = _agreed(start.elapsed_time(end) / 1e3 / probe, view.device)
    calls, loops = loop_shape(plan, est)
    launchers = [_eager(view, calls)]
    if plan.cuda_graphs and est < GRAPH_BELOW_S:
        launchers.append(_capture(view, calls))
        if direct is not None:
            launchers.append(direct.launcher(view, calls))
    # Both ways are timed where graphs may help and the faster one counts: which one wins
    # depends on the torch/NCCL pair (graph-captured NCCL adds per-call host nodes).
    return min(_time_launcher(launch, calls, loops) for launch in launchers)


def _time_launcher(launch: Callable[[], None], calls: int, loops: int) -> float:
    launch()  # the first replay uploads a graph; keep it out of the timings
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(loops)
    ]
    for a, b in pairs:
        a.record()
        launch()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) / 1e3 / calls for a, b in pairs)


def _eager(view: torch.Tensor, calls: int) -> Callable[[], None]:
    """``calls`` all-reduces straight on the process group: less Python per call than
    ``dist.all_reduce``, and one wait at the end (NCCL runs them in order on its stream)."""
    group = dist.distributed_c10d._get_default_group()

    def launch() -> None:
        work = None
        for _ in range(calls):
            work = group.allreduce([view])
        if work is not None:
            work.wait()

    return launch


def _capture(view: torch.Tensor, calls: int) -> Callable[[], None]:
    """Capture ``calls`` all-reduces into one CUDA graph (NCCL supports stream capture).

    The collective was already run eagerly, so the communicator exists before capture.
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            dist.all_reduce(view)
    return graph.replay
