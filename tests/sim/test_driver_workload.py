"""Workload Jobs over HTTP against the simulated cluster: rank env, logs, fail-fast, teardown."""

from __future__ import annotations

import logging
import textwrap
import time

import pytest

from mnnvl import steps
from mnnvl.errors import WaitTimeout, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs, with_inputs
from mnnvl.sim import SimCluster

RANK_CHECK = textwrap.dedent(
    """
    import json, os, sys
    index = os.environ["JOB_COMPLETION_INDEX"]
    nnodes = os.environ["NNODES"]
    ok = (
        os.environ["GROUP_RANK"] == index  # torchrun's --node-rank came from the Job index
        and os.environ["RANK"] == index  # one process per pod on CPU
        and os.environ["WORLD_SIZE"] == nnodes
        and bool(os.environ["MASTER_ADDR"])
    )
    print(f"rank check index={index} nnodes={nnodes} ok={ok}", flush=True)
    if index == "0":
        result = {"kind": "rankcheck", "index": index, "nnodes": nnodes, "ok": ok,
                  "master_addr": os.environ["MASTER_ADDR"], "run": os.environ["MNNVL_RUN_ID"]}
        print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0 if ok else 7)
    """
)


SIM = dict(nodes=2)
WORKERS = {"rank_check.py": RANK_CHECK, "quiet.py": 'print("nothing to report")\n'}
RUN = dict(prefix="w")

# The kubernetes client's own code paths: make test-client-newest runs them with its newest.
pytestmark = pytest.mark.client


def test_two_node_job_sees_its_rank_env_and_teardown_leaves_nothing(sim, run, caplog):
    domain, workload = run
    names = RunNames.for_run(domain.run_id)
    caplog.set_level("DEBUG", logger="mnnvl.driver.workload")  # what -v shows
    result = steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    assert result.job == names.job("job")
    assert len(result.pods) == 2
    assert result.result == {
        "kind": "rankcheck",
        "index": "0",
        "nnodes": "2",
        "ok": True,
        "master_addr": "127.0.0.1",
        "run": domain.run_id,
    }
    assert "rank check index=0 nnodes=2 ok=True" in result.log_tail
    rank0 = next(p for p in result.pods if p.startswith(f"{names.job('job')}-0-"))
    assert f"[{rank0}] rank check index=0" in caplog.text  # streamed, under -v
    assert "rank check index=1" in sim.pod_log("default", result.pods[1])

    down = steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert f"Job default/{names.job('job')}" in down.deleted
    assert f"ComputeDomain default/{names.domain}" in down.deleted
    assert sim.objects(names.selector) == []
    leftover = [
        o
        for o in sim.objects()
        if o[0] in ("ResourceClaimTemplate", "ResourceClaim", "Pod") and names.base in o[2]
    ]
    assert leftover == []


def test_relaunch_adopts_the_completed_job(sim, run):
    _, workload = run
    first = steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    before = sim.request_count
    again = steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    assert again.job == first.job and again.result == first.result
    assert sim.request_count - before < 20


def test_failed_pod_fails_fast_with_exit_code_and_events(sim, run):
    domain, workload = run
    workload = with_inputs(workload, max_restarts=0)  # no gang restart
    job = RunNames.for_run(domain.run_id).job("job")
    sim.faults.fail_pod(job, index=1, mode="Failed", exit_code=3)
    start = time.monotonic()
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    assert time.monotonic() - start < 45  # the deadlines are 60 s each
    message = str(info.value)
    assert f"{job}-1" in message and info.value.exit_code == 4
    assert "code 3" in message and info.value.pod_exit_code == 3
    assert "events:" in message and "no events" not in message
    assert "kubectl logs" in message  # what to check next


def test_image_pull_backoff_fails_fast_naming_the_reason(sim, run):
    domain, workload = run
    job = RunNames.for_run(domain.run_id).job("job")
    sim.faults.fail_pod(job, index=0, mode="ImagePullBackOff")
    start = time.monotonic()
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    assert time.monotonic() - start < 45  # not the 60 s pods-running deadline
    message = str(info.value)
    assert info.value.exit_code == 4 and f"{job}-0-" in message
    assert "ImagePullBackOff" in message or "ErrImagePull" in message
    assert "Failed to pull image" in message  # the pod's event
    assert "check the image name" in message


def test_unschedulable_pod_fails_once_its_grace_period_is_over(sim, run):
    domain, workload = run
    workload = with_inputs(workload, unschedulable_grace_s=2.0)
    job = RunNames.for_run(domain.run_id).job("job")
    sim.faults.fail_pod(job, index=1, mode="Unschedulable")
    start = time.monotonic()
    with pytest.raises(WorkloadFailed, match="Unschedulable") as info:
        steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    elapsed = time.monotonic() - start
    # No event arrives after the pod turned Unschedulable: the wait re-checks on its own
    # when the grace period ends, well before the 60 s deadline.
    assert 2.0 <= elapsed < 45
    message = str(info.value)
    assert info.value.exit_code == 4 and f"{job}-1-" in message
    assert "Unschedulable for more than 2 s" in message and "FailedScheduling" in message
    assert "check free GPUs and channel devices per node" in message


def test_unscheduled_rank0_fails_without_a_log_warning_and_says_no_node(sim, run, caplog):
    # A pod that never started has no log: reading one is no problem worth a warning.
    domain, workload = run
    workload = with_inputs(workload, unschedulable_grace_s=1.0)
    sim.faults.fail_pod(RunNames.for_run(domain.run_id).job("job"), index=0, mode="Unschedulable")
    caplog.set_level(logging.INFO, logger="mnnvl")
    with pytest.raises(WorkloadFailed, match="Unschedulable") as info:
        steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    assert "on no node: Unschedulable" in str(info.value)
    assert not [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "log" in r.getMessage()
    ]


def test_job_without_result_line_returns_none_and_the_log_tail(sim, run):
    _, workload = run
    result = steps.launch(workload, "quiet", [], kubeconfig=sim.kubeconfig_path)
    assert result.result is None
    assert "nothing to report" in result.log_tail


def test_pods_stuck_container_creating_time_out_naming_node_and_imex(workers):
    # Its own cluster: IMEX daemons that never become ready are not left to the other tests.
    with SimCluster(nodes=2, imex_delay_s=60) as cluster:
        domain = DomainSpec(run_id="stuck-pods", delete_timeout_s=30)
        workload = from_inputs(
            WorkloadSpec,
            run_id="stuck-pods",
            purpose="job",
            nodes=2,
            gpus_per_node=0,
            env={"PYTHONPATH": workers},
            pods_running_timeout_s=1.5,
        )
        steps.provision(domain, kubeconfig=cluster.kubeconfig_path)
        with pytest.raises(WaitTimeout) as info:
            steps.launch(workload, "rank_check", [], kubeconfig=cluster.kubeconfig_path)
        steps.teardown(domain, kubeconfig=cluster.kubeconfig_path)
    message = str(info.value)
    assert info.value.exit_code == 3
    job = RunNames.for_run("stuck-pods").job("job")
    assert "stuck ContainerCreating" in message and job in message
    assert "IMEX daemon on node sim-node-" in message and "not ready" in message
    assert "status.nodes" in message
    assert "kubectl get computedomain" in message and "kubelet-plugin" in message


def test_pod_wait_survives_watch_expiry(sim, run):
    _, workload = run
    sim.faults.expire_watches(2)
    result = steps.launch(workload, "rank_check", [], kubeconfig=sim.kubeconfig_path)
    assert result.result is not None and result.result["ok"] is True
    assert sim.faults.take_watch_expiry() is False


COMMAND_CHECK = textwrap.dedent(
    """
    import json, os
    e = os.environ
    ok = e["NODE_RANK"] == e["JOB_COMPLETION_INDEX"] and e["WORLD_SIZE"] == e["NNODES"] == "2"
    ok = ok and e["NPROC_PER_NODE"] == "1" and e["MASTER_ADDR"] and e["MASTER_PORT"].isdigit()
    print(f"node {e['NODE_RANK']} ok={ok} args={os.sys.argv[1:]}", flush=True)
    if e["NODE_RANK"] == "0":
        print("RESULT " + json.dumps({"ok": ok, "score": 0.5, "args": os.sys.argv[1:]}))
    raise SystemExit(0 if ok else 9)
    """
)


def test_a_command_runs_as_given_with_the_rendezvous_env(sim, run):
    _, workload = run
    args = ["a,b", "$(NOT_EXPANDED)", "x=y"]
    result = steps.launch(
        workload, "", ["python3", "-c", COMMAND_CHECK, *args], kubeconfig=sim.kubeconfig_path
    )
    assert result.exit_code == 0
    assert result.result == {"ok": True, "score": 0.5, "args": args}
    assert "node 0 ok=True" in result.log_tail


def test_cli_launch_command_after_double_dash(sim, run, capsys):
    import json

    from mnnvl.cli.main import main

    domain, workload = run
    argv = ["launch", "--run-id", domain.run_id, "--nodes", "2", "--gpus-per-node", "0"]
    argv += ["--env", f"PYTHONPATH={workload.env['PYTHONPATH']}", "--env", "EXTRA=1,2=3"]
    argv += ["--kubeconfig", sim.kubeconfig_path, "--command", "--", "python3", "-c"]
    code = main([*argv, COMMAND_CHECK, "--flag"])
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 0, out
    assert out["exit_code"] == 0 and out["result"]["args"] == ["--flag"]
    assert out["job"] == RunNames.for_run(domain.run_id).job("job")


def test_a_failing_command_fails_the_step_with_its_exit_code(sim, run):
    _, workload = run
    with pytest.raises(WorkloadFailed, match=r"with exit code 3") as failed:
        steps.launch(
            workload, "", ["python3", "-c", "raise SystemExit(3)"], kubeconfig=sim.kubeconfig_path
        )
    assert failed.value.pod_exit_code == 3  # structured, for the step's result artifact
