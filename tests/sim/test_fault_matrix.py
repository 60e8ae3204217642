"""Fault matrix: one test per fault, on the strict simulator.

Each row asserts the step's exit code, that the message names the object and what to check
next, and that nothing of the run remains after teardown. Not here: SIGTERM of the launcher
with a re-run, and the verification/training verdict rows (they need torch workers); the
Job- and queue-aware wait rows (a Failed Job, a queued Job, Unschedulable after the first list,
a second run competing for the same nodes, a node held by another domain, no domain) are in
``test_job_lifecycle.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.errors import MnnvlError
from mnnvl.names import RunNames
from mnnvl.sim import SimCluster
from mnnvl.spec import DomainSpec, WorkloadSpec
from tests.sim.test_sim_fidelity import CD_PATH, Raw

SLEEPER = "import time\nprint('working', flush=True)\ntime.sleep(300)\n"
DONE = "import json\nprint('RESULT ' + json.dumps({'ok': True}), flush=True)\n"


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("workers")
    (path / "sleeper.py").write_text(SLEEPER)
    (path / "done.py").write_text(DONE)
    return str(path)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, local_gpus=[], imex_delay_s=0.1) as cluster:
        yield cluster


class Run:
    """One run's specs; ``close`` tears it down and checks that nothing of it is left."""

    def __init__(
        self, sim: SimCluster, workers: str, rct_timeout_s: float = 2, **workload: Any
    ) -> None:
        self.sim, self.id = sim, f"fm-{uuid.uuid4().hex[:8]}"
        self.names = RunNames.for_run(self.id)
        self.domain = DomainSpec(run_id=self.id, rct_timeout_s=rct_timeout_s, delete_timeout_s=10)
        self.workload = WorkloadSpec(
            run_id=self.id,
            purpose="job",
            nodes=2,
            gpus_per_node=0,
            env={"PYTHONPATH": workers},
            pods_running_timeout_s=workload.pop("pods_running_timeout_s", 60),
            job_timeout_s=60,
            **workload,
        )
        self.kc = sim.kubeconfig_path

    def provision(self) -> Any:
        return steps.provision(self.domain, kubeconfig=self.kc)

    def launch(self, module: str) -> Any:
        return steps.launch(self.workload, module, [], kubeconfig=self.kc)

    def teardown(self) -> Any:
        return steps.teardown(self.domain, kubeconfig=self.kc)

    def close(self) -> None:
        self.teardown()
        assert self.sim.objects() == [], "objects of the run remain after teardown"


@pytest.fixture
def run(sim: SimCluster, workers: str) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def make(**workload: Any) -> Run:
        made.append(Run(sim, workers, **workload))
        return made[-1]

    yield make
    for r in made:
        r.close()


def failure(fn: Callable[[], Any]) -> MnnvlError:
    with pytest.raises(MnnvlError) as info:
        fn()
    return info.value


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as e:  # handed to the test thread
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


def wait_running(sim: SimCluster, job: str, count: int = 2, timeout_s: float = 60) -> None:
    raw = Raw(sim)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = raw.call("GET", "/api/v1/namespaces/default/pods", labelSelector=f"job-name={job}")
        if sum(p["status"].get("phase") == "Running" for p in pods["items"]) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"pods of {job} never Running")


# ---- rows -----------------------------------------------------------------------------------


def test_crd_not_installed_exits_5_naming_the_crd_and_the_driver_chart(workers: str) -> None:
    with SimCluster(nodes=1, crd_installed=False, local_gpus=[]) as cluster:
        r = Run(cluster, workers)
        err = failure(r.provision)
        assert err.exit_code == 5
        assert "computedomains.resource.nvidia.com" in str(err)
        assert "nvidia-dra-driver-gpu" in str(err)
        r.teardown()
        assert cluster.objects() == []


def test_channel_template_never_generated_exits_3_naming_it_and_the_controller(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    sim.faults.no_rct(r.names.domain)
    err = failure(r.provision)
    assert err.exit_code == 3
    assert r.names.channel_template in str(err) and "controller" in str(err)


def test_imex_never_ready_exits_3_naming_the_pod_node_and_imex(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    sim.faults.imex_delay_s = 600
    try:
        r = run(pods_running_timeout_s=2)
        r.provision()
        err = failure(lambda: r.launch("done"))
    finally:
        sim.faults.imex_delay_s = 0.1
    assert err.exit_code == 3
    message = str(err)
    assert "stuck ContainerCreating" in message and r.names.job("job") in message
    assert "IMEX daemon on node sim-node-" in message and "kubectl get computedomain" in message


def test_image_pull_failure_exits_4_naming_the_pod_and_the_image(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    sim.faults.fail_pod(r.names.job("job"), index=1, mode="ImagePullBackOff")
    r.provision()
    err = failure(lambda: r.launch("done"))
    assert err.exit_code == 4
    assert "ImagePullBackOff" in str(err) and f"{r.names.job('job')}-1-" in str(err)
    assert "check the image name" in str(err)


def test_pod_failed_without_retries_exits_4_with_its_exit_code(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    sim.faults.fail_pod(r.names.job("job"), index=0, mode="Failed", exit_code=9)
    r.provision()
    err = failure(lambda: r.launch("done"))
    assert err.exit_code == 4
    assert "exit code 9" in str(err) and f"{r.names.job('job')}-0-" in str(err)
    assert "kubectl logs" in str(err)


def test_pod_oom_killed_without_retries_exits_4_naming_the_pod(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    sim.faults.fail_pod(r.names.job("job"), index=1, mode="OOMKilled", exit_code=137)
    r.provision()
    err = failure(lambda: r.launch("done"))
    assert err.exit_code == 4
    assert "exit code 137" in str(err) and f"{r.names.job('job')}-1-" in str(err)
    assert "kubectl logs" in str(err)


def test_pod_oom_killed_with_a_retry_left_is_replaced_and_the_step_succeeds(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run(backoff_limit_per_index=1)
    sim.faults.fail_pod(r.names.job("job"), index=1, mode="OOMKilled", exit_code=137)
    r.provision()
    assert r.launch("done").result == {"ok": True}
    job = Raw(sim).get(f"/apis/batch/v1/namespaces/default/jobs/{r.names.job('job')}")
    assert job["status"]["failed"] == 1 and job["status"]["succeeded"] == 2


def test_domain_deleted_under_a_running_workload_exits_4_naming_the_imex_domain(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    thread, errors = in_background(lambda: r.launch("sleeper"))
    wait_running(sim, r.names.job("job"))
    Raw(sim).call("DELETE", CD_PATH.format(ns="default") + "/" + r.names.domain)
    thread.join(timeout=60)
    assert errors and isinstance(errors[0], MnnvlError)
    err = errors[0]
    assert err.exit_code == 4
    assert f"IMEX domain of ComputeDomain default/{r.names.domain}" in str(err)


def test_node_lost_during_training_exits_4_naming_the_node(workers: str) -> None:
    with SimCluster(nodes=2, local_gpus=[], imex_delay_s=0.1) as cluster:
        r = Run(cluster, workers)
        r.provision()
        thread, errors = in_background(lambda: r.launch("sleeper"))
        wait_running(cluster, r.names.job("job"))
        cluster.lose_node("sim-node-1")
        thread.join(timeout=60)
        assert errors and isinstance(errors[0], MnnvlError)
        assert errors[0].exit_code == 4
        assert "node sim-node-1 left the IMEX domain" in str(errors[0])
        r.close()


def test_transient_429_500_503_bursts_are_retried_and_the_step_succeeds(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    for status in (429, 500, 503):
        sim.faults.fail_requests("POST", "/computedomains", status, count=1)
    assert r.provision().domain == r.names.domain


def test_watch_410_during_the_wait_is_survived(sim: SimCluster, run: Callable[..., Run]) -> None:
    r = run()
    sim.faults.expire_watches(3)
    assert r.provision().channel_template == r.names.channel_template


def test_api_unreachable_during_a_wait_exits_5_naming_the_request(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run(rct_timeout_s=60)  # the API stays down longer than the retries last
    sim.faults.no_rct(r.names.domain)  # provision has to wait for the template ...
    sim.faults.fail_requests("GET", "/resourceclaimtemplates", 503, count=10_000)
    try:
        err = failure(r.provision)  # ... and the API answers 503 while it does
    finally:
        sim.faults.clear_requests()
    assert err.exit_code == 5
    assert "resourceclaimtemplates in default" in str(err)
    assert "check the API server" in str(err)


def test_provision_rerun_adopts_instead_of_duplicating(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    first, second = r.provision(), r.provision()
    assert (first.adopted, second.adopted, first.uid) == (False, True, second.uid)


def test_teardown_twice_is_a_no_op(run: Callable[..., Run]) -> None:
    r = run()
    r.provision()
    assert r.teardown().deleted
    assert r.teardown().deleted == []


def test_finalizer_stuck_exits_3_naming_the_finalizer_and_the_controller(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    sim.faults.stick_finalizer("ComputeDomain", r.names.domain)
    try:
        err = failure(r.teardown)
    finally:
        sim.faults.unstick_finalizer("ComputeDomain", r.names.domain)
    assert err.exit_code == 3
    assert r.names.domain in str(err)
    assert "finalizer resource.nvidia.com/computeDomain" in str(err)
    assert "controller" in str(err)


def test_kueue_suspended_job_admitted_late_still_completes(workers: str) -> None:
    with SimCluster(
        nodes=2, local_gpus=[], imex_delay_s=0.1, kueue=True, kueue_admission_delay_s=2
    ) as cluster:
        r = Run(cluster, workers, queue_name="team")
        r.provision()
        assert r.launch("done").result == {"ok": True}
        r.close()


def test_api_unreachable_during_teardown_exits_5_then_a_retry_cleans_up(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    sim.faults.fail_requests("*", "/", 503, count=10_000)
    try:
        err = failure(r.teardown)
    finally:
        sim.faults.clear_requests()
    assert err.exit_code == 5
    assert "503 ServiceUnavailable" in str(err) and "jobs in default" in str(err)
    assert "check the API server" in str(err)
