"""Where a checkpoint's host bytes could live, measured on a GPU: pinned memory
(``cudaHostAlloc``, today's staging), a ``/dev/shm`` file mapped and registered with CUDA only
while it is copied, or mapped and never registered.

For each it times what a save and a restart in place pay: making the buffer, device -> host,
host -> device, registering and unregistering, and how long a SIGKILLed process holding it
takes to be reaped (with when ``/proc`` first shows it exiting: ``PF_EXITING``).

    python bench/gpu_hostmem_probe.py [--gib 7]     # on a GPU machine; one JSON line per case
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time, torch
kind, gib, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
n = int(gib * 2**30)
rt = torch.cuda.cudart()
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
dev.random_(0, 255)
torch.cuda.synchronize()
out = {"kind": kind, "gib": gib}

def timed(name, fn):
    t = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    out[name] = round(time.perf_counter() - t, 3)
    return r

if kind == "pinned":
    host = timed("make_s", lambda: torch.empty(n, dtype=torch.uint8, pin_memory=True))
else:
    host = timed("make_s", lambda: torch.from_file(path, shared=True, size=n, dtype=torch.uint8))
    timed("touch_s", lambda: host.fill_(1))
if kind == "shm-registered":
    timed("register_s", lambda: rt.cudaHostRegister(host.data_ptr(), n, 0))
timed("d2h_s", lambda: host.copy_(dev, non_blocking=kind != "shm"))
timed("h2d_s", lambda: dev.copy_(host, non_blocking=kind != "shm"))
if kind == "shm-registered":
    timed("unregister_s", lambda: rt.cudaHostUnregister(host.data_ptr()))
    timed("h2d_unregistered_s", lambda: dev.copy_(host))
    timed("register_again_s", lambda: rt.cudaHostRegister(host.data_ptr(), n, 0))
print(json.dumps(out), flush=True)
sys.stdin.read()
"""
PF_EXITING = 0x4


def exiting(pid: int) -> bool:
    """Whether ``/proc`` shows ``pid`` exiting (or gone to a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") or bool(int(fields[6]) & PF_EXITING)


def one(kind: str, gib: float, shm: str) -> dict[str, object]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, str(gib), shm],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    out = json.loads(child.stdout.readline())
    t0 = time.monotonic()
    os.kill(child.pid, signal.SIGKILL)
    seen = None
    while child.poll() is None:
        if seen is None and exiting(child.pid):
            seen = time.monotonic() - t0
        time.sleep(0.002)
    out["kill_to_exiting_s"] = None if seen is None else round(seen, 3)
    out["kill_to_reaped_s"] = round(time.monotonic() - t0, 3)
    if os.path.exists(shm):
        os.unlink(shm)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=7)
    parser.add_argument("--kinds", default="pinned,shm-registered,shm")
    args = parser.parse_args()
    for kind in args.kinds.split(","):
        print(json.dumps(one(kind, args.gib, f"/dev/shm/hostmem-probe-{os.getpid()}")), flush=True)
