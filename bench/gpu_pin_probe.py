"""Does pinning host memory slow the GPU work beside it? (the first background checkpoint save)

A training-like loop of bf16 matmuls runs on the GPU while another thread allocates pinned
host memory the size of a checkpoint's staging buffers (``--gib``), as the first background
save does (``mnnvl.runtime.checkpoint``: later saves reuse those buffers). Prints the loop's
iteration time before, during and after the allocation, and how long the allocation took.

    python bench/gpu_pin_probe.py --gib 6.8
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=6.8)
    parser.add_argument("--iters", type=int, default=1500)
    ns = parser.parse_args()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times: list[tuple[float, float]] = []  # (start, seconds) of each synced iteration
    window: dict[str, float] = {}

    def pin() -> None:
        window["start"] = time.perf_counter()
        buf = torch.empty(int(ns.gib * 2**30), dtype=torch.uint8, pin_memory=True)
        window["end"] = time.perf_counter()
        del buf

    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    pinner = threading.Timer(2.0, pin)
    pinner.start()
    for _ in range(ns.iters):
        t = time.perf_counter()
        for _ in range(4):
            a @ a
        torch.cuda.synchronize()
        times.append((t, time.perf_counter() - t))
    pinner.join()
    start, end = window["start"], window["end"]
    before = [s for t, s in times if t + s < start]
    during = [s for t, s in times if t < end and t + s > start]
    after = [s for t, s in times if t > end]
    print(
        json.dumps(
            {
                "pinned_gib": ns.gib,
                "pin_s": round(end - start, 3),
                "iter_ms_before": round(1e3 * statistics.median(before), 3) if before else None,
                "iter_ms_during_median": round(1e3 * statistics.median(during), 3)
                if during
                else None,
                "loop_s_lost_during": round(
                    sum(during) - len(during) * statistics.median(before), 3
                )
                if during and before
                else None,
                "iter_ms_after": round(1e3 * statistics.median(after), 3) if after else None,
            }
        )
    )


if __name__ == "__main__":
    main()
