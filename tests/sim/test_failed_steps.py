"""A step that fails removes its Job before it exits; a Job past its deadline exits 3.

Both on the simulator's Job controller, whose ``activeDeadlineSeconds`` and foreground
deletion behave as the real ones (see mnnvl/sim/README.md).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnnvl import steps
from mnnvl.errors import MnnvlError
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec
from mnnvl.sim import SimCluster
from tests.sim.simkit import assert_nothing_left

SLEEPER = "import time\nprint('working', flush=True)\ntime.sleep(300)\n"


SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)


@pytest.fixture
def workload(sim: SimCluster, tmp_path: Path) -> Iterator[WorkloadSpec]:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    run_id = f"fs-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=60)
    workload = WorkloadSpec(
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
    """The run's Jobs and pods that exist now (the domain and Service stay until teardown)."""
    selector = RunNames.for_run(run_id).selector
    return [o for o in sim.objects(selector) if o[0] in ("Job", "Pod")]


def test_a_step_failed_by_an_unschedulable_pod_removes_its_job_and_running_pods_first(
    sim: SimCluster, workload: WorkloadSpec
) -> None:
    workload = dataclasses.replace(workload, unschedulable_grace_s=1.0)
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
