"""A step that fails removes its Job before it exits, leaving only the record of its failure;
a Job past its deadline exits 3; the step retried with the same inputs fails at once.

On the simulator's Job controller, whose ``activeDeadlineSeconds`` and foreground deletion
behave as the real ones (see mnnvl/sim/README.md).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnnvl import steps
from mnnvl.driver.ownership import FAILURE_ANNOTATION
from mnnvl.errors import MnnvlError, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs, with_inputs
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw, assert_nothing_left

SLEEPER = "import time\nprint('working', flush=True)\ntime.sleep(300)\n"


SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)


@pytest.fixture
def workload(sim: SimCluster, tmp_path: Path) -> Iterator[WorkloadSpec]:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "fails.py").write_text("print('diverged', flush=True)\nraise SystemExit(4)\n")
    (tmp_path / "done.py").write_text("print('RESULT {\"ok\": true}', flush=True)\n")
    run_id = f"fs-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=60)
    workload = from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="train",
        nodes=2,
        gpus_per_node=0,
        env={"PYTHONPATH": str(tmp_path)},
        pods_running_timeout_s=60,
        unschedulable_grace_s=60,
        job_timeout_s=60,
    )
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    yield workload
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert_nothing_left(sim)


def workload_objects(sim: SimCluster, run_id: str) -> list[tuple[str, str, str]]:
    """The run's pods and the Jobs that can run one (not a failed step's record) that exist
    now (the domain and Service stay until teardown)."""
    selector = RunNames.for_run(run_id).selector
    jobs = Raw(sim).call("GET", "/apis/batch/v1/namespaces/default/jobs", labelSelector=selector)
    records = {
        j["metadata"]["name"]
        for j in jobs["items"]
        if FAILURE_ANNOTATION in (j["metadata"].get("annotations") or {})
        and j["spec"]["parallelism"] == 0
        and j["spec"]["suspend"] is True
    }
    return [
        o for o in sim.objects(selector) if o[0] == "Pod" or (o[0] == "Job" and o[2] not in records)
    ]


def pods_created(sim: SimCluster, job: str) -> int:
    created = [e for e in sim.events if e.get("reason") == "SuccessfulCreate"]
    return sum(e["involvedObject"]["name"] == job for e in created)


def test_a_step_failed_by_an_unschedulable_pod_removes_its_job_and_running_pods_first(
    sim: SimCluster, workload: WorkloadSpec
) -> None:
    workload = with_inputs(workload, unschedulable_grace_s=1.0)
    job = RunNames.for_run(workload.run_id).job("train")
    sim.faults.fail_pod(job, index=1, mode="Unschedulable")  # index 0 runs, index 1 never
    with pytest.raises(MnnvlError) as info:
        steps.launch(workload, "sleeper", [], kubeconfig=sim.kubeconfig_path)
    err = info.value
    assert err.exit_code == 4 and "Unschedulable" in str(err)
    assert f"removed Job default/{job} and its pods" in str(err)
    # Gone before the step returned: the next step of the run finds the nodes free.
    assert workload_objects(sim, workload.run_id) == []


def test_a_job_past_its_timeout_exits_3_deadline_passed_and_is_removed(
    sim: SimCluster, workload: WorkloadSpec
) -> None:
    workload = dataclasses.replace(workload, job_timeout_s=2.0)
    job = RunNames.for_run(workload.run_id).job("train")
    # One pod never starts, so the Job controller's activeDeadlineSeconds ends the Job
    # (DeadlineExceeded) while the step still waits for its pods.
    sim.faults.fail_pod(job, index=1, mode="Unschedulable")
    with pytest.raises(MnnvlError) as info:
        steps.launch(workload, "sleeper", [], kubeconfig=sim.kubeconfig_path)
    err = info.value
    assert err.exit_code == 3
    assert "deadline passed" in str(err) and "--job-timeout-s 2" in str(err)
    assert "DeadlineExceeded" in str(err)
    assert f"removed Job default/{job} and its pods" in str(err)
    assert workload_objects(sim, workload.run_id) == []


def test_a_step_retried_after_its_workload_failed_fails_at_once_without_a_new_job(
    sim: SimCluster, workload: WorkloadSpec
) -> None:
    """KFP retries a failed task whatever its exit code: the retry meets the record of the
    failure and repeats it at once, with the same message, instead of running again."""
    job = RunNames.for_run(workload.run_id).job("train")
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "fails", [], kubeconfig=sim.kubeconfig_path)
    first = info.value
    assert first.exit_code == 4 and first.pod_exit_code == 4 and "diverged" in str(first)
    assert workload_objects(sim, workload.run_id) == []
    created = pods_created(sim, job)
    path = f"/apis/batch/v1/namespaces/default/jobs/{job}"
    record = Raw(sim).get(path)["metadata"]["uid"]

    started = time.monotonic()
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "fails", [], kubeconfig=sim.kubeconfig_path)
    retry_s = time.monotonic() - started
    again = info.value
    assert str(first) in str(again) and "a retry with the same inputs fails the same way" in str(
        again
    )
    assert (again.exit_code, again.pod_exit_code) == (4, 4)
    assert retry_s < 5, f"the retry took {retry_s:.1f} s"
    print(f"a retry after a failed workload failed again after {retry_s:.2f} s")
    assert Raw(sim).get(path)["metadata"]["uid"] == record and pods_created(sim, job) == created

    # Other input (the workload fixed) replaces the record and runs.
    assert steps.launch(workload, "done", [], kubeconfig=sim.kubeconfig_path).result == {"ok": True}
    assert pods_created(sim, job) == created + workload.nodes


def test_a_step_failed_by_a_cause_the_cluster_clears_runs_again_when_rerun(
    sim: SimCluster, workload: WorkloadSpec
) -> None:
    """An unschedulable pod is no verdict on the inputs: once the node is free, the step run
    again with the same inputs runs (no record of the failure replays it)."""
    workload = with_inputs(workload, unschedulable_grace_s=1.0)
    job = RunNames.for_run(workload.run_id).job("train")
    sim.faults.fail_pod(job, index=1, mode="Unschedulable")
    with pytest.raises(WorkloadFailed) as info:
        steps.launch(workload, "done", [], kubeconfig=sim.kubeconfig_path)
    assert info.value.exit_code == 4 and "Unschedulable" in str(info.value)
    selector = RunNames.for_run(workload.run_id).selector
    assert [o for o in sim.objects(selector) if o[0] in ("Job", "Pod")] == []  # no record
    created = pods_created(sim, job)

    sim.faults.clear_pod_faults(job)  # the node is free again
    rerun = steps.launch(workload, "done", [], kubeconfig=sim.kubeconfig_path)
    assert rerun.result == {"ok": True}
    assert pods_created(sim, job) == created + workload.nodes
