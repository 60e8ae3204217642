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
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mnnvl.contract.env import POD_NAME
from mnnvl.contract.termination import TERMINATION_PATH_ENV, parse
from mnnvl.ports import free_port
from mnnvl.runtime import inplace

# Each worker joins the attempt's process group, all-reduces 6 times, reporting progress, and
# records its attempt and pid; rank 1 fails after the 3rd all-reduce as ``plan`` says per
# attempt: "kill" (SIGKILL), "exit3", "say3" (exit 3 with its own termination message) or "ok";
# "linger": rank 1 exits 3 and rank 0 ignores SIGTERM and hangs once its peer is gone (a worker
# slow to stop). Each launcher's termination message goes to ``termination-<node rank>``.
WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch, torch.distributed as dist
    from mnnvl.contract.termination import Evidence
    from mnnvl.runtime import inplace, progress
    out, plan = sys.argv[1], sys.argv[2].split(",")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if rank == 0 and plan[0] == "linger":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gloo", **inplace.rendezvous(rank, world, 20.0, 20.0))
    with open(os.path.join(out, f"rank{rank}-attempt{attempt}"), "w") as f:
        f.write(str(os.getpid()))
    def steps():
        for step in range(1, 7):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == world
            progress.report(f"step {step}", 60.0)
            what = plan[min(attempt, len(plan) - 1)]
            if rank == 1 and step == 3 and what == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == 1 and step == 3 and what == "say3":
                with open(os.environ["MNNVL_TERMINATION_MESSAGE_PATH"], "w") as f:
                    f.write(Evidence(exit_code=3, error="first words").to_message())
            if rank == 1 and step == 3 and what in ("exit3", "linger", "say3"):
                sys.exit(3)
            time.sleep(0.05)
    try:
        steps()
    except Exception:
        if rank == 0 and plan[0] == "linger":
            time.sleep(600)  # as a worker blocked in a collective with a peer that is gone
        raise
    dist.destroy_process_group()
    """
)


def launchers(
    tmp_path: Path, plan: str, *opts: str, ranks: tuple[int, ...] = (0, 1), logs: bool = False
) -> list[subprocess.Popen[str]]:
    """Node ranks ``ranks`` of a 2-pod run; ``logs``: stderr goes to ``launcher-<rank>.log``."""
    (tmp_path / "allreduce_worker.py").write_text(WORKER)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    common = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}"]
    common += [] if any(o.startswith("--grace-s") for o in opts) else ["--grace-s=2"]
    launch = [sys.executable, "-m", "mnnvl.runtime.launch", *common]
    worker = ["-m", "allreduce_worker", str(tmp_path), plan]
    return [
        subprocess.Popen(
            [*launch, f"--node-rank={n}", *opts, *worker],
            env={**env, TERMINATION_PATH_ENV: str(tmp_path / f"termination-{n}")},
            stdout=subprocess.PIPE,
            stderr=open(tmp_path / f"launcher-{n}.log", "w") if logs else subprocess.PIPE,
            text=True,
        )
        for n in ranks
    ]


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(0.05)


def said(tmp_path: Path, rank: int, words: str) -> bool:
    return words in (tmp_path / f"launcher-{rank}.log").read_text()


def stop(pods: list[subprocess.Popen[str]], tmp_path: Path) -> None:
    """Whatever a failed test left running: the launchers and the workers they started."""
    workers = [f.read_text() for f in tmp_path.glob("rank*-attempt*")]
    for pid in [p.pid for p in pods] + [int(w) for w in workers if w.isdigit()]:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for pod in pods:
        pod.wait(timeout=30)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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


def test_deleting_the_pods_mid_restart_ends_every_launcher_and_worker_at_once(
    tmp_path: Path,
) -> None:
    # Rank 1 fails: its launcher waits at the barrier for node rank 0's, which is still stopping
    # a worker that ignores SIGTERM (--grace-s 60). Then both pods are deleted (SIGTERM).
    pods = launchers(tmp_path, "linger", "--max-restarts=3", "--grace-s=60", logs=True)
    try:
        wait_for(lambda: said(tmp_path, 1, "workers failed (rank 1: exit 3)"), 120, "a failure")
        wait_for(lambda: said(tmp_path, 0, "another pod failed"), 60, "node rank 0 stopping")
        workers = [int((tmp_path / f"rank{r}-attempt0").read_text()) for r in (0, 1)]
        sent = time.monotonic()
        for pod in pods:
            pod.send_signal(signal.SIGTERM)
        codes = [pod.wait(timeout=60) for pod in pods]
        took = time.monotonic() - sent
    finally:
        stop(pods, tmp_path)
    assert codes == [143, 143], [(tmp_path / f"launcher-{n}.log").read_text() for n in (0, 1)]
    assert took < 5.0, f"the launchers took {took:.1f} s to end after SIGTERM"
    assert not [pid for pid in workers if alive(pid)], "a worker outlived its launcher"
    assert attempts(tmp_path, 0) == 1  # no restart once the pods are being deleted


def test_a_launcher_waiting_for_the_store_ends_at_once_on_sigterm(tmp_path: Path) -> None:
    # Node rank 1's pod started; node rank 0's (which hosts the store) never comes.
    (pod,) = launchers(tmp_path, "ok", "--max-restarts=1", ranks=(1,), logs=True)
    try:
        wait_for(lambda: said(tmp_path, 1, "waiting for the launchers' store"), 120, "waiting")
        sent = time.monotonic()
        pod.send_signal(signal.SIGTERM)
        assert pod.wait(timeout=60) == 143
        took = time.monotonic() - sent
    finally:
        stop([pod], tmp_path)
    assert took < 5.0, f"the launcher took {took:.1f} s to end after SIGTERM"


def test_an_in_place_restart_leaves_no_evidence_of_its_attempt_to_the_next_failure(
    tmp_path: Path,
) -> None:
    # Rank 1 exits 3 saying why (restarted in place, restart 1 of 1), then is killed: its pod
    # fails with the kill, not with the first attempt's words.
    pods = launchers(tmp_path, "say3,kill", "--max-restarts=1", logs=True)
    try:
        assert pods[1].wait(timeout=120) == 137, (tmp_path / "launcher-1.log").read_text()
        pods[0].send_signal(signal.SIGTERM)
        assert pods[0].wait(timeout=60) == 143
    finally:
        stop(pods, tmp_path)
    found = parse((tmp_path / "termination-1").read_text())
    assert found is not None and (found.rank, found.exit_code) == (1, 137), found
    assert "first words" not in found.error


def test_a_launcher_signs_in_once_and_waits_out_an_earlier_gangs_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv(POD_NAME, "job-0-a")
    store = inplace.serve_or_connect("127.0.0.1", port, 0, 2)
    monkeypatch.setenv(POD_NAME, "job-1-a")
    inplace.serve_or_connect("127.0.0.1", port, 1, 2)
    # The same launcher signing in again (its first answer came too late) is no other gang's.
    inplace.serve_or_connect("127.0.0.1", port, 1, 2)
    inplace.Rounds(store, 2, 1, 1.0).release()  # both signed in: returns at once
    # The next gang's rank 1 finds this store (node rank 0's old pod still answers): it waits
    # for its own gang's, here at most a second.
    monkeypatch.setenv(POD_NAME, "job-1-b")
    monkeypatch.setattr(inplace, "CONNECT_S", 1.0)
    with pytest.raises(RuntimeError, match=r"earlier gang's \(pod job-1-a has node rank 1\)"):
        inplace.serve_or_connect("127.0.0.1", port, 1, 2)


def test_a_restarted_worker_waits_out_its_earlier_attempts_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without launchers' in-place restarts rank 0's worker hosts the store. A restarted rank 1
    # that reaches the store of the attempt before (its rank 0 not exited yet) waits for the new
    # one instead of joining a group that is going away; here at most a second.
    import datetime

    import torch.distributed as dist

    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    timeout = datetime.timedelta(seconds=5)
    earlier = dist.TCPStore(  # the attempt before: its rank 0 still answers
        "127.0.0.1", port, 2, is_master=True, timeout=timeout, wait_for_workers=False
    )
    assert inplace.rendezvous(1, 2, 1.0, 1.0)["rank"] == 1  # the attempt's own rank 1 joins
    with pytest.raises(RuntimeError, match=r"earlier attempt's \(rank 1 is in it\)"):
        inplace.rendezvous(1, 2, 1.0, 1.0)  # the next attempt's rank 1
    del earlier  # its rank 0 exits
