"""The Job lifecycle against the simulated cluster: exit codes through torchrun, Job-aware,
queue-aware and timer-driven waits, a missing domain. Each case ends with nothing of the run
left in the cluster."""

from __future__ import annotations

import dataclasses
import json
import logging
import textwrap
import threading
import time
import uuid

import pytest
from kubernetes import client, config

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.driver import wait
from mnnvl.errors import WaitTimeout, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs, with_inputs
from mnnvl.sim import SimCluster

EXIT_ON_INDEX_1 = textwrap.dedent(
    """
    import os, sys, time
    if os.environ["JOB_COMPLETION_INDEX"] == "1":
        print("index 1 giving up with", sys.argv[1], flush=True)
        sys.exit(int(sys.argv[1]))
    time.sleep(30)
    """
)
# Index 1 crashes on every attempt, saying which: a training that a restart cannot save.
CRASH_ON_INDEX_1 = textwrap.dedent(
    """
    import os, sys, time
    if os.environ["JOB_COMPLETION_INDEX"] == "1":
        tries = os.path.join(os.environ["CRASH_DIR"], "tries")
        with open(tries, "a") as f:
            f.write("x")
        print(f"index 1 crashing on attempt {os.path.getsize(tries)}", flush=True)
        sys.exit(1)
    time.sleep(60)
    """
)
QUICK = textwrap.dedent(
    """
    import os
    if os.environ["JOB_COMPLETION_INDEX"] == "0":
        print('RESULT {"kind": "quick", "ok": true}', flush=True)
    """
)


ADMISSION_DELAY_S = 6.0  # the Kueue stand-in admits a queued Job this long after it was made


SIM = dict(nodes=2, kueue=True, kueue_admission_delay_s=ADMISSION_DELAY_S)
WORKERS = {
    "exit_on_index_1.py": EXIT_ON_INDEX_1,
    "crash_on_index_1.py": CRASH_ON_INDEX_1,
    "quick.py": QUICK,
    "sleeper.py": "import time\ntime.sleep(300)\n",
}
RUN = dict(prefix="l", job_timeout_s=120, leave_nothing=True)


def _pods_created(sim, job: str) -> int:
    return sum(
        1
        for e in sim.events
        if e.get("reason") == "SuccessfulCreate" and e["involvedObject"]["name"] == job
    )


def test_worker_exit_4_fails_the_job_on_the_first_attempt_despite_retries(sim, run):
    domain, workload = run  # the default --max-restarts: every index has retries
    assert workload.recovery.max_restarts > 0
    job = RunNames.for_run(domain.run_id).job("job")
    start = time.monotonic()
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "exit_on_index_1", ["4"], kubeconfig=sim.kubeconfig_path)
    assert time.monotonic() - start < 45  # not the 60 s deadlines
    message = str(info.value)
    assert f"Job default/{job} failed (PodFailurePolicy" in message
    assert "failed with exit code 4" in message  # the container's code, not torchrun's 1
    assert "index 1 giving up with 4" in message  # the failing pod's log tail
    assert _pods_created(sim, job) == 2  # one pod per index: no retry of a FAIL
    assert info.value.exit_code == 4


def test_job_that_runs_out_of_retries_before_running_ends_the_wait_at_once(sim, run):
    domain, workload = run
    workload = with_inputs(workload, max_restarts=1)
    job = RunNames.for_run(domain.run_id).job("job")
    sim.faults.fail_pod(job, index=1, mode="CrashLoop", exit_code=1)
    start = time.monotonic()
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "quick", [], kubeconfig=sim.kubeconfig_path)
    assert time.monotonic() - start < 45  # not the 60 s pods-running deadline
    message = str(info.value)
    assert f"Job default/{job} failed (MaxFailedIndexesExceeded" in message
    # The first failure restarts the gang (one retry per index): the message names the pod of
    # the failed index with its cause, not index 0's pod that the restart deleted (exit 143).
    assert "simulated CrashLoop fault: exit code 1" in message
    assert info.value.exit_code == 4


def test_a_run_out_of_restarts_names_the_last_attempts_failure_not_the_first(sim, run, tmp_path):
    domain, workload = run
    # Pods recreated per restart (the Job's own failure path): in place, one pod per index
    # lives throughout (tests/sim/test_inplace_restart.py names both failures there).
    env = {**workload.env, "CRASH_DIR": str(tmp_path), "MNNVL_IN_PLACE_RESTARTS": "0"}
    workload = with_inputs(workload, max_restarts=1, env=env)
    job = RunNames.for_run(domain.run_id).job("job")
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "crash_on_index_1", [], kubeconfig=sim.kubeconfig_path)
    message = str(info.value)
    created = [
        e["message"].removeprefix("Created pod: ")
        for e in sorted(sim.events, key=lambda e: int(e["metadata"]["resourceVersion"]))
        if e.get("reason") == "SuccessfulCreate" and e["involvedObject"]["name"] == job
    ]
    first, last = [name for name in created if name.startswith(f"{job}-1-")]  # one restart
    assert info.value.exit_code == 4
    assert f"Job default/{job} failed (MaxFailedIndexesExceeded" in message
    assert "after 1 restart(s) of every rank (--max-restarts 1)" in message
    # The pod of the last attempt, its exit code and its log; not the first attempt's pod.
    assert f"pod {last} (rank 1) on node " in message
    assert "(index 1): Failed with exit code 1" in message
    assert f"last log lines of {last}:" in message and "crashing on attempt 2" in message
    assert first not in message and "attempt 1" not in message


@pytest.mark.slow
def test_queued_job_reports_its_queue_and_pods_deadline_starts_at_admission(
    sim, run, caplog, monkeypatch
):
    domain, workload = run
    monkeypatch.setattr(wait, "PROGRESS_EVERY_S", 0.5)
    # Queued longer than the pods-running deadline: that deadline must start at admission.
    workload = with_inputs(workload, queue_name="team-q", pods_running_timeout_s=4)
    job = RunNames.for_run(domain.run_id).job("job")
    caplog.set_level(logging.INFO, logger="mnnvl")
    start = time.monotonic()
    result = steps.launch(workload, "quick", [], kubeconfig=sim.kubeconfig_path)
    assert time.monotonic() - start >= ADMISSION_DELAY_S
    assert result.result == {"kind": "quick", "ok": True}
    queued = [m for m in caplog.messages if f"{job} queued in LocalQueue team-q (Kueue)" in m]
    assert len(queued) >= 5  # progress lines while queued
    assert any("admitted after" in m for m in caplog.messages)


def test_queued_job_fails_after_its_admission_timeout(sim, run):  # admission takes 6 s
    _, workload = run
    workload = with_inputs(workload, queue_name="team-q", admission_timeout_s=1.5)
    start = time.monotonic()
    with pytest.raises(
        WaitTimeout, match="queued in LocalQueue team-q \\(Kueue\\) for more than"
    ) as info:
        steps.launch(workload, "quick", [], kubeconfig=sim.kubeconfig_path)
    assert info.value.exit_code == 3
    assert 1.5 <= time.monotonic() - start < 15


def test_pod_turning_unschedulable_during_the_wait_fails_after_the_grace(sim, run):
    # The pods appear and turn Unschedulable only after the wait listed and began to watch
    # (here: at admission), as with a real scheduler; nothing else happens afterwards, so
    # only the wait's own timer can end it.
    domain, workload = run
    workload = with_inputs(workload, queue_name="team-q", unschedulable_grace_s=2.0)
    job = RunNames.for_run(domain.run_id).job("job")
    sim.faults.fail_pod(job, index=1, mode="Unschedulable")
    start = time.monotonic()
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "quick", [], kubeconfig=sim.kubeconfig_path)
    assert ADMISSION_DELAY_S + 2.0 <= time.monotonic() - start < ADMISSION_DELAY_S + 40
    assert "Unschedulable for more than 2 s" in str(info.value)
    assert info.value.exit_code == 4


@pytest.mark.parametrize("command", ["launch", "train", "verify"])
def test_workload_steps_without_a_domain_fail_in_seconds_asking_to_provision(
    sim, workers, capsys, command
):
    run_id = f"np-{uuid.uuid4().hex[:8]}"
    argv = [command, "--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
    argv += ["--nodes", "2", "--gpus-per-node", "0", "--pods-running-timeout-s", "900"]
    if command == "launch":
        argv += ["--module", "quick"]
    start = time.monotonic()
    assert cli.main(argv) == 2
    assert time.monotonic() - start < 60  # not the 900 s pods-running timeout
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "does not exist; provision first" in out["error"]
    assert [o for o in sim.objects() if run_id in o[2]] == []


def test_wait_logs_progress_naming_pods_the_slowest_reason_and_domain_nodes(
    workers, caplog, monkeypatch
):
    monkeypatch.setattr(wait, "PROGRESS_EVERY_S", 0.4)
    caplog.set_level(logging.INFO, logger="mnnvl")
    # Its own cluster: IMEX daemons that never become ready are not left to the other tests.
    with SimCluster(nodes=2, imex_delay_s=60) as cluster:
        domain = DomainSpec(run_id="slow-imex", delete_timeout_s=30)
        workload = from_inputs(
            WorkloadSpec,
            run_id="slow-imex",
            purpose="job",
            nodes=2,
            gpus_per_node=0,
            env={"PYTHONPATH": workers},
            pods_running_timeout_s=2.5,
        )
        steps.provision(domain, kubeconfig=cluster.kubeconfig_path)
        with pytest.raises(WaitTimeout, match="stuck ContainerCreating"):
            steps.launch(workload, "quick", [], kubeconfig=cluster.kubeconfig_path)
        steps.teardown(domain, kubeconfig=cluster.kubeconfig_path)
        assert cluster.objects(RunNames.for_run("slow-imex").selector) == []
    lines = [m for m in caplog.messages if "pods Running 0/2; slowest:" in m]
    assert len(lines) >= 3
    assert "ContainerCreating (IMEX daemon on node sim-node-" in lines[-1]
    assert "status.nodes:" in lines[-1]


def test_node_still_labelled_for_another_domain_fails_after_the_grace(sim, run):
    _, workload = run
    workload = with_inputs(workload, unschedulable_grace_s=2.0)
    core = client.CoreV1Api(config.new_client_from_config(config_file=sim.admin_kubeconfig_path))
    stale = {"metadata": {"labels": {"resource.nvidia.com/computeDomain": "uid-of-another-cd"}}}
    core.patch_node("sim-node-1", stale)
    try:
        start = time.monotonic()
        with pytest.raises(WorkloadFailed) as info:
            steps.launch(workload, "quick", [], kubeconfig=sim.kubeconfig_path)
        assert 2.0 <= time.monotonic() - start < 45  # the grace, not the 60 s deadline
    finally:
        core.patch_node(
            "sim-node-1", {"metadata": {"labels": {"resource.nvidia.com/computeDomain": None}}}
        )
    message = str(info.value)
    assert "FailedPrepareDynamicResources for more than 2 s" in message
    assert "label already exists for a different ComputeDomain" in message
    assert info.value.exit_code == 4


def test_second_run_competing_for_the_same_nodes_fails_after_the_grace(sim, run, eventually):
    # The first run holds both nodes' IMEX channel; the scheduler marks the second run's pods
    # Unschedulable a moment after they are created, after the wait's first list.
    _, workload = run
    holder = f"h-{uuid.uuid4().hex[:8]}"
    holder_domain = DomainSpec(run_id=holder, delete_timeout_s=30)
    steps.provision(holder_domain, kubeconfig=sim.kubeconfig_path)
    holder_workload = dataclasses.replace(workload, run_id=holder)
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            steps.launch(holder_workload, "sleeper", [], kubeconfig=sim.kubeconfig_path)
        except BaseException as e:  # ends when its Job is torn down; checked below
            errors.append(e)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        holder_job = RunNames.for_run(holder).job("job")
        pods = lambda: [p for p in sim.store.list("pods")[0] if holder_job in str(p)]  # noqa: E731
        eventually(lambda: [p["status"].get("phase") for p in pods()] == ["Running"] * 2, 60)
        start = time.monotonic()
        with pytest.raises(WorkloadFailed) as info:
            steps.launch(
                with_inputs(workload, unschedulable_grace_s=2.0),
                "quick",
                [],
                kubeconfig=sim.kubeconfig_path,
            )
        assert 2.0 <= time.monotonic() - start < 45  # not the 60 s pods-running deadline
        assert "Unschedulable for more than 2 s" in str(info.value)
        assert "0/2 nodes are available" in str(info.value)
        assert f"{RunNames.for_run(workload.run_id).job('job')}-" in str(info.value)
        assert "check free GPUs and channel devices per node" in str(info.value)
        assert info.value.exit_code == 4
    finally:
        steps.teardown(holder_domain, kubeconfig=sim.kubeconfig_path)
        thread.join(30)
    assert [type(e).__name__ for e in errors] == ["WorkloadFailed"]  # its Job was deleted
    assert [o for o in sim.objects() if RunNames.for_run(holder).base in o[2]] == []
