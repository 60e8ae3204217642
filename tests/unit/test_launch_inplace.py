"""In-place restarts between two real launchers (two "pods" on this machine, gloo): a failed
worker restarts the workers of both, a fresh rendezvous per attempt, one restart budget, and
the pods left to be recreated when two attempts in a row fail the same way."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from mnnvl.ports import free_port

# Each worker joins the attempt's process group, all-reduces 6 times, reporting progress, and
# records its attempt; rank 1 fails after the 3rd all-reduce as ``plan`` says per attempt:
# "kill" (SIGKILL), "exit3", or "ok".
WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch, torch.distributed as dist
    from mnnvl.runtime import inplace, progress
    out, plan = sys.argv[1], sys.argv[2].split(",")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", **inplace.rendezvous(rank, world, 20.0, 20.0))
    open(os.path.join(out, f"rank{rank}-attempt{attempt}"), "w").close()
    for step in range(1, 7):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == world
        progress.report(f"step {step}", 60.0)
        what = plan[min(attempt, len(plan) - 1)]
        if rank == 1 and step == 3 and what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 1 and step == 3 and what == "exit3":
            sys.exit(3)
        time.sleep(0.05)
    dist.destroy_process_group()
    """
)


def launchers(tmp_path: Path, plan: str, *opts: str) -> list[subprocess.Popen[str]]:
    (tmp_path / "allreduce_worker.py").write_text(WORKER)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    common = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}", "--grace-s=2"]
    launch = [sys.executable, "-m", "mnnvl.runtime.launch", *common]
    worker = ["-m", "allreduce_worker", str(tmp_path), plan]
    return [
        subprocess.Popen(
            [*launch, f"--node-rank={n}", *opts, *worker],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]


def attempts(tmp_path: Path, rank: int) -> int:
    return len(list(tmp_path.glob(f"rank{rank}-attempt*")))


def test_a_killed_worker_restarts_the_workers_of_every_pod_in_place(tmp_path: Path) -> None:
    pods = launchers(tmp_path, "kill,ok", "--max-restarts=3")
    outs = [p.communicate(timeout=120) for p in pods]
    assert [p.returncode for p in pods] == [0, 0], outs
    # Both pods' workers ran twice: the launchers stayed, their workers started again.
    assert (attempts(tmp_path, 0), attempts(tmp_path, 1)) == (2, 2)
    said = outs[0][1]  # node rank 0's launcher, whose log the driver follows
    assert re.search(r"in-place restart 1 of at most 3: pod \S+ on node \S* rank 1 exit 137", said)


def test_two_attempts_failing_the_same_way_leave_the_pods_to_be_recreated(tmp_path: Path) -> None:
    pods = launchers(tmp_path, "exit3", "--max-restarts=3")
    failed = pods[1].communicate(timeout=120)
    assert pods[1].returncode == 3, failed
    assert "two attempts in a row failed the same way" in failed[1]
    # The other pod waits to be deleted (the driver recreates every pod): SIGTERM ends it.
    pods[0].send_signal(signal.SIGTERM)
    assert pods[0].wait(timeout=60) == 143
    assert attempts(tmp_path, 1) == 2


def test_the_budget_counts_in_place_restarts(tmp_path: Path) -> None:
    pods = launchers(tmp_path, "kill,exit3", "--max-restarts=1")
    failed = pods[1].communicate(timeout=120)
    assert pods[1].returncode == 3, failed
    assert "1 in-place restart(s) spent --max-restarts 1" in failed[1]
    pods[0].send_signal(signal.SIGTERM)
    assert pods[0].wait(timeout=60) == 143
