"""In-place restarts on the simulated cluster: a failed worker restarts the workers inside the
pods, which keep running (same uids, no pod created again); the driver counts each restart in
place from rank 0's log, within the one ``--max-restarts`` budget, and recreates the pods
when two attempts in a row fail the same way."""

from __future__ import annotations

import json
import re
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.contract.env import HOST_COPY_DIR
from mnnvl.driver import lifecycle
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw, assert_nothing_left, create_claim

SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)
CLAIM = "ip-ckpt"
HOST_COPIES = Path(HOST_COPY_DIR).name  # the pods' host copies of their checkpoints, by run


def host_copies(sim: SimCluster, run_id: str) -> list[Path]:
    """The run's host copies in any simulated pod's ``/dev/shm``."""
    return list(Path(sim._kubelet.env.shm_root).glob(f"*/{HOST_COPIES}/{run_id}"))


@pytest.fixture(scope="module")
def sim(sim: SimCluster) -> SimCluster:
    """The module's cluster (conftest) with the claim the training runs mount."""
    create_claim(sim, CLAIM)
    return sim


class PodUids:
    """The uids of a Job's pods, polled until ``stop``: which pods the run ever had."""

    def __init__(self, sim: SimCluster, job: str) -> None:
        self.sim, self.job, self.uids = sim, job, set[str]()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.wait(0.2):
            pods = Raw(self.sim).call(
                "GET", "/api/v1/namespaces/default/pods", labelSelector=f"job-name={self.job}"
            )
            self.uids |= {p["metadata"]["uid"] for p in pods["items"]}

    def stop(self) -> set[str]:
        self.done.set()
        self.thread.join()
        return self.uids


def train(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp: Path, *extra: str, run_id: str = ""
) -> tuple[int, dict[str, Any], str, set[str]]:
    """``mnnvl run`` of 30 steps on 2 nodes, checkpoints every 10 on a claim, as ``run_id``
    (default: a new one); (exit code, the train result, stderr, the uids of every train pod
    the run had)."""
    run_id = run_id or f"ip-{uuid.uuid4().hex[:8]}"
    argv = ["run", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0", "--skip-verify"]
    argv += ["--steps", "30", "--log-every", "5", "--checkpoint-every", "10"]
    argv += ["--checkpoint-dir", f"/ckpt/{run_id}", "--pvc", f"{CLAIM}:/ckpt"]
    out = tmp / f"{run_id}.json"
    argv += ["--report-dir", str(tmp / run_id), "--result-path", str(out)]
    argv += ["--kubeconfig", sim.kubeconfig_path, *extra]
    uids = PodUids(sim, RunNames.for_run(run_id).job("train"))
    code = cli.main(argv)
    err = capsys.readouterr().err
    return code, json.loads(out.read_text()).get("train") or {}, err, uids.stop()


@pytest.mark.slow(45)
def test_a_killed_worker_restarts_in_place_and_resumes_loss_for_loss(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Rank 1 kills itself after step 15, once; the run resumes from the checkpoint of step 10.
    fault = ["--env", "MNNVL_TEST_SIGNAL_AT=15:1:SIGKILL"]
    code, result, err, uids = train(sim, capsys, tmp_path, *fault)
    assert code == 0, err[-3000:]
    assert len(uids) == 2, uids  # the same two pods from start to end
    assert result["restarts"] == 1
    (fault,) = result["faults"]
    assert (fault["how"], fault["rank"], fault["exit_code"]) == ("in-place", 1, 137)
    assert fault["steps_lost"] == 5 and fault["recovery_s"] > 0
    assert re.search(r"restart 1 at .*: in-place pod \S+ .*exit code 137", err), err[-3000:]
    assert "1 restart (1 in place)" in err
    # The restarted workers loaded the checkpoint of step 10 from their pods' memory, and the
    # run's copies are gone once it ended.
    raw = result["raw"]
    assert (raw["resume_source"], raw["start_step"]) == ("host", 10), raw["resumed_from"]
    assert raw["resume_load_s"] > 0
    assert not Path(raw["resumed_from"]).parent.parent.exists()
    # Loss for loss from the checkpoint: the same as a run that was never interrupted.
    code, clean, err, _ = train(sim, capsys, tmp_path)
    assert code == 0, err[-3000:]
    resumed = dict(result["raw"]["losses"])  # step -> loss, every 5 steps and the first
    uninterrupted = dict(clean["raw"]["losses"])
    assert min(resumed) == 11 and {15, 20, 25, 30} <= resumed.keys()
    assert {k: v for k, v in resumed.items() if k in uninterrupted} == {
        k: v for k, v in uninterrupted.items() if k > 10
    }  # exact bits


@pytest.mark.slow
def test_recreated_pods_resume_from_disk(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # In-place restarts off: the pods are made again, with memory of their own.
    fault = ["--env", "MNNVL_TEST_SIGNAL_AT=15:1:SIGKILL", "--env", "MNNVL_IN_PLACE_RESTARTS=0"]
    code, result, err, uids = train(sim, capsys, tmp_path, *fault)
    assert code == 0, err[-3000:]
    assert len(uids) == 4, uids
    raw = result["raw"]
    assert (raw["resume_source"], raw["start_step"]) == ("disk", 10), raw["resumed_from"]
    assert raw["resumed_from"].endswith("/step-10")
    run_id = Path(raw["checkpoint"]).parent.name  # the checkpoints' folder is /ckpt/<run id>
    assert not host_copies(sim, run_id)  # the first pods' copies too


@pytest.mark.slow
def test_a_failed_run_leaves_no_host_copy_once_its_pods_are_deleted(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # No restart allowed: the run fails after step 25, and teardown deletes the pods. The save of
    # step 20 waited for step 10's to complete, host copy included, however slow the machine.
    fault = ["--env", "MNNVL_TEST_SIGNAL_AT=25:1:SIGKILL", "--max-restarts", "0"]
    run_id = f"ip-{uuid.uuid4().hex[:8]}"
    code, _, err, _ = train(sim, capsys, tmp_path, *fault, run_id=run_id)
    assert code == 4, err[-3000:]
    assert "host copy of the checkpoint" in err  # there was one
    # Only this run's copies: other tests' runs may hold copies of their own meanwhile.
    assert not host_copies(sim, run_id)  # gone with the pods, as a memory emptyDir


@pytest.mark.slow(80)
def test_a_stopped_worker_at_the_default_inputs_restarts_in_place(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Every recovery input at its default: the pod's stall watchdog finds the stopped worker.
    fault = ["--env", "MNNVL_TEST_SIGNAL_AT=15:1:SIGSTOP"]
    code, result, err, uids = train(sim, capsys, tmp_path, *fault)
    assert code == 0, err[-3000:]
    assert len(uids) == 2, uids
    (fault,) = result["faults"]
    assert (fault["how"], fault["exit_code"]) == ("in-place", 12)  # the stall watchdog's code


# Joins the attempt's process group, all-reduces for a while and prints a RESULT; rank 1 fails
# as $IP_PLAN says for the n-th time it runs, counted in $IP_COUNT (the pods share this
# machine's disk): "kill" (SIGKILL), "exit3", "pod" (SIGKILL to its launcher: the pod fails),
# "ok".
PLANNED = textwrap.dedent(
    """
    import datetime, json, os, signal, sys, time
    import torch, torch.distributed as dist
    from mnnvl.runtime import inplace, progress
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=30)
    dist.init_process_group("gloo", timeout=timeout, **inplace.rendezvous(rank, world, 30.0, 30.0))
    plan, count = os.environ["IP_PLAN"].split(","), os.environ["IP_COUNT"]
    n = len(os.listdir(count)) if rank == 1 else 0
    for step in range(1, 9):
        dist.all_reduce(torch.ones(1))
        progress.report(f"step {step}", 60.0)
        what = plan[min(n, len(plan) - 1)]
        if rank == 1 and step == 3 and what != "ok":
            open(os.path.join(count, str(n)), "w").close()
            if what == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if what == "pod":
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(60)
            sys.exit(3)
        time.sleep(0.2)
    if rank == 0:
        print("RESULT " + json.dumps({"ok": True}), flush=True)
    dist.destroy_process_group()
    """
)


def launch_planned(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path, plan: str, *extra: str
) -> tuple[int, str, set[str], int, dict[str, Any]]:
    """``mnnvl launch`` of the planned module on a provisioned run; (exit code, stderr, the
    uids of every pod the step had, how often rank 1 failed, the result line). Nothing of the
    run is left."""
    (tmp_path / "planned.py").write_text(PLANNED)
    count = tmp_path / "count"
    count.mkdir()
    run_id = f"ip-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    env = [f"PYTHONPATH={tmp_path}", f"IP_PLAN={plan}", f"IP_COUNT={count}"]
    argv = ["launch", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0"]
    argv += ["--module", "planned", "--kubeconfig", sim.kubeconfig_path]
    for each in env:
        argv += ["--env", each]
    uids = PodUids(sim, RunNames.for_run(run_id).job("job"))
    try:
        code = cli.main([*argv, *extra])
    finally:
        found = uids.stop()
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert_nothing_left(sim, RunNames.for_run(run_id).selector)
    said = capsys.readouterr()
    result = json.loads(said.out.splitlines()[-1]) if said.out.strip() else {}
    return code, said.err, found, len(list(count.iterdir())), result


@pytest.mark.slow
def test_two_attempts_failing_the_same_way_recreate_the_pods(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Rank 1 exits 3 twice, then succeeds: in place once, then the same failure again.
    code, err, uids, failures, result = launch_planned(sim, capsys, tmp_path, "exit3,exit3,ok")
    assert code == 0, err[-3000:]
    assert failures == 2
    assert len(uids) == 4, uids  # both pods made again once
    assert "restarting every rank" in err
    restarts = [(r["how"], r["exit_code"]) for r in result["restarts"]]
    assert restarts == [("in-place", 3), ("recreated", 3)], result


@pytest.mark.slow
def test_a_second_failure_past_max_restarts_1_ends_the_step_naming_both(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err, _, failures, _ = launch_planned(
        sim, capsys, tmp_path, "kill,exit3,ok", "--max-restarts", "1"
    )
    assert code == 4, err[-3000:]
    assert failures == 2
    assert re.search(r"exit code 3.*restarted in place before: pod \S+ rank 1 exit 137", err)


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["followed", "cut"])
def test_recreated_pods_count_the_restarts_before_them_in_the_one_budget(
    sim: SimCluster,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: str,
) -> None:
    # Rank 1's pod dies (its launcher killed): the pods are recreated, restart 1 of 1. Then its
    # worker exits 3 in the new pods, whose launchers would restart it in place: past the budget.
    # "cut": the driver's stream of the new rank 0's log ends at once (as when the new gang
    # completes before the driver sees its rank 0 run): the stored log still counts.
    if stream == "cut":

        class FirstPodOnly(lifecycle.LogFollower):
            followed: list[str] = []

            def _run(self) -> None:
                self.followed.append(self.pod)
                if len(self.followed) == 1:
                    super()._run()

        monkeypatch.setattr(lifecycle, "LogFollower", FirstPodOnly)
    code, err, uids, failures, _ = launch_planned(
        sim, capsys, tmp_path, "pod,exit3,ok", "--max-restarts", "1"
    )
    assert code == 4, err[-3000:]
    assert failures == 2 and len(uids) == 4
    assert re.search(r"rank 1 \(crashed\) failed with exit code 3 after 1 restart", err), err[
        -3000:
    ]
    assert re.search(r"pods recreated before: pod \S+ \(rank 1\) on node \S+ exit 137", err)
