"""CPU seconds a simulated pod costs to start: forked from the kubelet's fork server vs exec'd.

The anchor is exec, how every pod starts with ``MNNVL_SIM_FORK_SERVER=0``.
Starts ``--pods`` containers one after the other each way, through the simulated kubelet's
``Container`` (the same path a pod takes), each running ``python -m mnnvl.runtime.train
--help``: the imports of a training worker (torch, ``torch.distributed.tensor``, the model)
and nothing else, exit 0. CPU seconds are those of every
process of each way (this one's children, the fork server included, from ``RUSAGE_CHILDREN``,
and this process), so the server's one import of torch counts against the forked pods. Prints
CPU seconds per pod each way and the ratio forked / exec (goal: well under 1), and the wall
time per pod.

    python bench/bench_pod_start.py [--pods 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

from mnnvl.sim.core import forkserver
from mnnvl.sim.core.procs import Container

COMMAND = [sys.executable, "-m", "mnnvl.runtime.train", "--help"]


def cpu_s() -> float:
    mine, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return mine.ru_utime + mine.ru_stime + kids.ru_utime + kids.ru_stime


def start_pods(pods: int, forked: bool, where: str) -> tuple[float, float]:
    """CPU and wall seconds per pod of ``pods`` pods started one after the other."""
    os.environ[forkserver.SWITCH_ENV] = "1" if forked else "0"
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    cpu, wall = cpu_s(), time.monotonic()
    forkserver.acquire()  # as a kubelet holds it: one server for every pod
    try:
        for i in range(pods):
            log = os.path.join(where, f"pod-{forked}-{i}.log")
            pod = Container(COMMAND, env, where, log, f"bench/{forked}-{i}")
            code = pod.wait()
            if code != 0:
                raise SystemExit(f"pod {i} exited {code}; see {log}")
    finally:
        forkserver.release()  # the server exits, so its CPU time is counted
    return (cpu_s() - cpu) / pods, (time.monotonic() - wall) / pods


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        exec_cpu, exec_wall = start_pods(ns.pods, False, where)
        fork_cpu, fork_wall = start_pods(ns.pods, True, where)
    print(
        f"pods={ns.pods} exec: {exec_cpu:.3f} CPU-s/pod {exec_wall:.3f} s/pod; "
        f"forked: {fork_cpu:.3f} CPU-s/pod {fork_wall:.3f} s/pod (server's start included); "
        f"ratio forked/exec CPU {fork_cpu / exec_cpu:.3f} wall {fork_wall / exec_wall:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
