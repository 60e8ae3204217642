"""How long a SIGKILLed CUDA process takes to be gone, by what it held.

A launcher learns that its worker died when ``waitpid`` returns, and the kernel returns it only
after the dead process's memory and device files are released: its CUDA context, its GPU memory
and its pinned (page-locked) host buffers. Each case starts a child that takes ``gpu`` GiB of
GPU memory and ``pinned`` GiB of pinned host memory, kills it, and times kill -> waitpid.

    python bench/gpu_kill_probe.py            # on a GPU machine; prints one JSON line per case
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

CHILD = """
import os, sys, torch
gpu, pinned = float(sys.argv[1]), float(sys.argv[2])
held = []
if gpu:
    held.append(torch.empty(int(gpu * 2**30), dtype=torch.uint8, device="cuda"))
else:
    torch.cuda.init()
    torch.empty(1, device="cuda")
if pinned:
    held.append(torch.empty(int(pinned * 2**30), dtype=torch.uint8, pin_memory=True))
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""
CASES = [(0, 0), (30, 0), (0, 7), (0, 14), (30, 14)]


def one(gpu: float, pinned: float) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(gpu), str(pinned)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    return {"gpu_gib": gpu, "pinned_gib": pinned, "kill_to_reaped_s": time.monotonic() - t0}


if __name__ == "__main__":
    for gpu, pinned in CASES:
        print(json.dumps(one(gpu, pinned)), flush=True)
