"""Fault matrix: one test per fault, on the strict simulator.

Each row asserts the step's exit code, that the message names the object and what to check
next, and that nothing of the run remains after teardown. Some rows live next to the code
they exercise, with deeper checks: Unschedulable after the wait's first list, a second run
competing for the same nodes, a node held by another domain and a missing domain in
``test_job_lifecycle.py``; a pod Unschedulable beyond the grace, a failed pod, an image that
cannot be pulled and IMEX daemons never ready in ``test_driver_workload.py``; foreign
objects and reap in ``test_ownership.py``; verify reports in ``test_steps_verify.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.driver import Api
from mnnvl.driver.api import COMPUTE_DOMAIN
from mnnvl.errors import MnnvlError, ProblemKind, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import (
    DomainSpec,
    TrainConfig,
    VerifyConfig,
    WorkloadSpec,
    from_inputs,
    with_inputs,
)
from mnnvl.sim import SimCluster
from mnnvl.sim.policy.nodelifecycle import OUT_OF_SERVICE
from tests.sim.simkit import (
    CD_PATH,
    GATED,
    Raw,
    assert_nothing_left,
    create_claim,
    foreign_domain,
    wait_for,
)

SLEEPER = "import time\nprint('working', flush=True)\ntime.sleep(300)\n"
DONE = "import json\nprint('RESULT ' + json.dumps({'ok': True}), flush=True)\n"
# Marks itself in $BARRIER, then works until the file $GATE exists and reports.
MARKED_GATED = (
    "import os, pathlib\n"
    "(pathlib.Path(os.environ['BARRIER']) / os.environ['HOSTNAME']).touch()\n" + GATED
)
WORKERS = {"sleeper.py": SLEEPER, "done.py": DONE, "gated.py": GATED, "marked.py": MARKED_GATED}
SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)


@pytest.fixture(scope="module")
def sim(sim: SimCluster) -> SimCluster:
    """The module's cluster (conftest) with the claim the runs mount."""
    create_claim(sim, CLAIM)
    return sim


class Run:
    """One run's specs; ``close`` tears it down and checks that nothing of it is left."""

    def __init__(
        self, sim: SimCluster, workers: str, rct_timeout_s: float = 2, **workload: Any
    ) -> None:
        self.sim, self.id = sim, f"fm-{uuid.uuid4().hex[:8]}"
        self.names = RunNames.for_run(self.id)
        self.domain = DomainSpec(run_id=self.id, rct_timeout_s=rct_timeout_s, delete_timeout_s=10)
        self.workload = from_inputs(
            WorkloadSpec,
            run_id=self.id,
            purpose="job",
            nodes=2,
            gpus_per_node=0,
            env={"PYTHONPATH": workers, **workload.pop("env", {})},
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
        assert_nothing_left(self.sim)


BACKGROUND: list[threading.Thread] = []  # steps started by in_background, joined by `run`


@pytest.fixture
def run(sim: SimCluster, workers: str) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def make(**workload: Any) -> Run:
        made.append(Run(sim, workers, **workload))
        return made[-1]

    yield make
    for r in made:  # all of them first: one run's objects may outlive another's teardown
        r.teardown()
    # A step still running in the background (its test failed early) may create objects
    # after the teardown above: wait for it to end, then tear down again, so one failing
    # test never leaves objects behind that fail every later test of the module.
    late = [t for t in BACKGROUND if t.is_alive()]
    for thread in BACKGROUND:
        thread.join(timeout=120)
    BACKGROUND.clear()
    if late:
        for r in made:
            r.teardown()
    assert_nothing_left(sim)


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
    BACKGROUND.append(thread)
    return thread, errors


def wait_running(sim: SimCluster, job: str, count: int = 2, timeout_s: float = 60) -> None:
    def running() -> bool:
        pods = Raw(sim).call(
            "GET", "/api/v1/namespaces/default/pods", labelSelector=f"job-name={job}"
        )
        return sum(p["status"].get("phase") == "Running" for p in pods["items"]) >= count

    wait_for(running, timeout_s, f"pods of {job} Running")


# ---- rows -----------------------------------------------------------------------------------


def test_crd_not_installed_exits_5_naming_the_crd_and_the_driver_chart(workers: str) -> None:
    with SimCluster(nodes=1, crd_installed=False, local_gpus=[]) as cluster:
        r = Run(cluster, workers)
        err = failure(r.provision)
        assert err.exit_code == 5
        assert "computedomains.resource.nvidia.com" in str(err)
        assert "nvidia-dra-driver-gpu" in str(err)
        r.teardown()
        assert_nothing_left(cluster)


def test_channel_template_never_generated_exits_3_naming_it_and_the_controller(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    sim.faults.no_rct(r.names.domain)
    err = failure(r.provision)
    assert err.exit_code == 3
    assert r.names.channel_template in str(err) and "controller" in str(err)


def test_pod_oom_killed_without_retries_exits_4_naming_the_pod(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run(max_restarts=0)
    sim.faults.fail_pod(r.names.job("job"), index=1, mode="OOMKilled", exit_code=137)
    r.provision()
    err = failure(lambda: r.launch("done"))
    assert err.exit_code == 4
    assert "exit code 137" in str(err) and f"{r.names.job('job')}-1-" in str(err)
    assert "kubectl logs" in str(err)


def test_pod_oom_killed_with_retries_left_is_not_retried_and_exits_4_naming_the_levers(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    # Host memory past the container's limit: the same configuration is killed again, so the
    # step fails on the first kill instead of spending its restarts.
    r = run()  # the default --max-restarts
    sim.faults.fail_pod(r.names.job("job"), index=1, mode="OOMKilled", exit_code=137)
    r.provision()
    err = failure(lambda: r.launch("sleeper"))
    assert err.exit_code == 4
    assert f"pod {r.names.job('job')}-1-" in str(err) and "was OOM-killed" in str(err)
    assert "not retried" in str(err) and "--batch-size" in str(err)
    r.close()


def test_domain_deleted_under_a_running_workload_exits_4_and_its_advice_to_rerun_holds(
    sim: SimCluster, run: Callable[..., Run], tmp_path: Any
) -> None:
    gate, barrier = tmp_path / "gate", tmp_path / "barrier"
    barrier.mkdir()
    r = run(env={"GATE": str(gate), "BARRIER": str(barrier)})
    r.provision()
    thread, errors = in_background(lambda: r.launch("marked"))
    wait_running(sim, r.names.job("job"))
    Raw(sim).call("DELETE", CD_PATH.format(ns="default") + "/" + r.names.domain)
    thread.join(timeout=60)
    assert errors and isinstance(errors[0], WorkloadFailed)
    err = errors[0]
    assert err.exit_code == 4 and err.problem is ProblemKind.MISSING_OBJECT
    # The pods lost IMEX; restarting them could not help (their channels come from the domain).
    message = str(err)
    assert f"ComputeDomain default/{r.names.domain} was deleted under the running" in message
    assert "a restart cannot run" in message
    # Attributed as every failed attempt is, and no checkpoint promised where none was logged.
    assert f"pod {r.names.job('job')}-" in message and ") on node sim-node-" in message
    assert "rerun the step: it resumes from the start (rank 0 has logged no checkpoint)" in message
    # What the error advises works: provision again and rerun the same step (the gate opens
    # once both workers run: a node rank whose peer's launcher has finished waits for it).
    for marker in barrier.iterdir():
        marker.unlink()
    r.provision()
    thread, errors = in_background(lambda: r.launch("marked"))
    started = lambda: errors or len(list(barrier.iterdir())) == 2  # noqa: E731
    wait_for(started, 60, "both workers of the rerun")
    assert not errors, errors  # not the failure replayed from a record of the step
    gate.write_text("go")
    thread.join(timeout=60)
    assert not errors, errors
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
    r = run(rct_timeout_s=60)  # the API stays down longer than the outage tolerance
    r.domain = dataclasses.replace(r.domain, api_outage_s=2)
    sim.faults.no_rct(r.names.domain)  # provision has to wait for the template ...
    sim.faults.fail_requests("GET", "/resourceclaimtemplates", 503, count=10_000)
    try:
        err = failure(r.provision)  # ... and the API answers 503 while it does
    finally:
        sim.faults.clear_requests()
    assert err.exit_code == 5
    assert "resourceclaimtemplates in default" in str(err)
    assert "check the API server" in str(err) and "longer than --api-outage-s 2" in str(err)


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
    # Worded as every wait for a delete is (the Jobs' and the pods' too): what is to be gone.
    assert f"waiting for ComputeDomain default/{r.names.domain} to be gone" in str(err)
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
    r.domain = dataclasses.replace(r.domain, api_outage_s=2)
    sim.faults.fail_requests("*", "/", 503, count=10_000)
    try:
        err = failure(r.teardown)
    finally:
        sim.faults.clear_requests()
    assert err.exit_code == 5
    assert "503 ServiceUnavailable" in str(err) and "jobs in default" in str(err)
    assert "check the API server" in str(err)
    assert f"mnnvl teardown --run-id {r.id} --namespace default" in str(err)


def test_409_on_create_from_a_foreign_object_exits_2_naming_it_and_leaves_it_alone(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    with Api.connect(r.kc) as api:
        theirs = api.create(COMPUTE_DOMAIN, "default", foreign_domain(r.names.domain))
        try:
            err = failure(r.provision)
            skipped = r.teardown().skipped
            still = api.get(COMPUTE_DOMAIN, "default", r.names.domain)
        finally:
            api.delete(COMPUTE_DOMAIN, "default", r.names.domain)
            wait_gone(sim)
    assert err.exit_code == 2
    assert f"ComputeDomain default/{r.names.domain} already exists" in str(err)
    assert f"not part of run {r.id!r}" in str(err) and "or use another run id" in str(err)
    assert len(skipped) == 1 and "left alone" in skipped[0]
    assert still["metadata"]["uid"] == theirs["metadata"]["uid"]


def launcher(r: Run, *argv: str) -> subprocess.Popen[str]:
    """``mnnvl <argv> --run-id <run> --kubeconfig <sim>`` as its own process."""
    command = [sys.executable, "-m", "mnnvl", *argv, "--run-id", r.id, "--kubeconfig", r.kc]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sigterm(proc: subprocess.Popen[str]) -> dict[str, Any]:
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    return dict(json.loads(out.splitlines()[-1]))


def wait_gone(sim: SimCluster, timeout_s: float = 30) -> None:
    wait_for(lambda: not sim.objects(), timeout_s, "nothing left")


def count(sim: SimCluster, kind: str, name_part: str) -> int:
    return sum(1 for o in sim.objects() if o[0] == kind and name_part in o[2])


def test_sigterm_mid_provision_then_the_rerun_adopts_and_the_exit_handler_cleans_up(
    sim: SimCluster, run: Callable[..., Run], capsys: pytest.CaptureFixture[str]
) -> None:
    r = run(rct_timeout_s=60)
    sim.faults.no_rct(r.names.domain)  # provision is certainly still waiting when killed
    proc = launcher(r, "provision", "--rct-timeout-s", "60")
    wait_for(lambda: count(sim, "ComputeDomain", r.names.domain), 60, "the domain created")
    assert proc.poll() is None
    result = sigterm(proc)
    assert result["exit_code"] == 143 and "SIGTERM" in result["error"]
    sim.faults.allow_rct(r.names.domain)
    again = r.provision()
    assert again.adopted and count(sim, "ComputeDomain", r.names.domain) == 1
    assert cli.main(["teardown", "--run-id", r.id, "--kubeconfig", r.kc]) == 0  # exit handler
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["ok"] is True
    assert_nothing_left(sim)


@pytest.mark.slow
def test_sigterm_mid_training_then_the_rerun_adopts_its_job_and_the_exit_handler_cleans_up(
    sim: SimCluster, run: Callable[..., Run], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "gate"
    r = run(env={"GATE": str(gate)})
    r.provision()
    job = r.names.job("job")
    argv = ["launch", "--module", "gated", "--nodes", "2", "--gpus-per-node", "0"]
    argv += [f"--env=PYTHONPATH={r.workload.env['PYTHONPATH']}", f"--env=GATE={gate}"]
    argv += ["--pods-running-timeout-s", "60", "--job-timeout-s", "60"]
    proc = launcher(r, *argv)
    wait_running(sim, job)
    result = sigterm(proc)
    assert result["exit_code"] == 143 and "SIGTERM" in result["error"]
    gate.write_text("go")
    assert cli.main([*argv, "--run-id", r.id, "--kubeconfig", r.kc]) == 0  # the same launch
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["result"] == {"ok": True}
    assert count(sim, "Job", job) == 1
    created = [e for e in sim.events if e.get("reason") == "SuccessfulCreate"]
    assert sum(e["involvedObject"]["name"] == job for e in created) == 2  # no duplicate pods
    assert cli.main(["teardown", "--run-id", r.id, "--kubeconfig", r.kc]) == 0  # exit handler
    assert_nothing_left(sim)


def verify_workload(r: Run) -> WorkloadSpec:
    return WorkloadSpec(
        run_id=r.id, purpose="verify-pre", nodes=2, gpus_per_node=0, job_timeout_s=120
    )


@pytest.mark.slow
def test_verification_fail_exits_4_naming_the_measured_and_required_bandwidth(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    config = VerifyConfig(max_bytes=64 << 10, min_busbw_gbps=90_000)
    err = failure(lambda: steps.verify(verify_workload(r), config, kubeconfig=r.kc))
    assert err.exit_code == 4
    assert "verification FAIL" in str(err) and "judged busbw" in str(err) and "90000" in str(err)


@pytest.mark.slow
def test_not_judged_exits_4_unless_allowed_and_names_the_flag(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    gated = VerifyConfig(max_bytes=64 << 10)  # gloo, no threshold: nothing to judge
    err = failure(lambda: steps.verify(verify_workload(r), gated, kubeconfig=r.kc))
    assert err.exit_code == 4
    assert "verification NOT_JUDGED" in str(err) and "NOT_JUDGED: no NVLink" in str(err)
    assert "--allow-unjudged" in str(err)
    allowed = VerifyConfig(max_bytes=64 << 10, allow_unjudged=True)
    result = steps.verify(verify_workload(r), allowed, kubeconfig=r.kc)
    assert result.verdict == "NOT_JUDGED" and result.threshold_gbps is None
    assert result.raw["nccl"]["transport"].startswith("none (gloo")


@pytest.mark.slow
def test_training_nan_exits_4_naming_the_step_and_the_pod(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run(env={"MNNVL_TEST_INJECT_NAN_STEP": "2"})
    r.provision()
    config = TrainConfig(steps=6, log_every=2, warmup_steps=1)
    err = failure(lambda: steps.train(r.workload, config, kubeconfig=r.kc))
    assert err.exit_code == 4
    assert "non-finite loss or gradient norm by step 2" in str(err)
    assert f"Job default/{r.names.job('train')} failed" in str(err)
    assert "lower --lr, check --data or try --dtype fp32" in str(err)


def test_invalid_image_name_exits_2_before_creating_anything_or_4_once_in_a_pod(
    sim: SimCluster, run: Callable[..., Run], capsys: pytest.CaptureFixture[str]
) -> None:
    r = run()
    argv = ["launch", "--run-id", r.id, "--module", "done", "--image", "Team/Trainer:1.0"]
    assert cli.main([*argv, "--kubeconfig", r.kc]) == 2
    assert "is not a valid image reference" in capsys.readouterr().out
    assert_nothing_left(sim)
    # A reference the cluster cannot parse but that got past the client (a hand-edited
    # manifest, an older client): the wait fails fast instead of waiting out its deadline.
    object.__setattr__(r.workload, "image", "Team/Trainer:1.0")
    r.provision()
    err = failure(lambda: r.launch("done"))
    assert err.exit_code == 4  # not 3: the pods-running deadline was not waited out
    assert "InvalidImageName" in str(err) and f"{r.names.job('job')}-" in str(err)
    assert "check the image reference" in str(err)


# ---- a lost or hung worker during training: gang restart from the checkpoint on a PVC ------

CLAIM, MOUNT = "fm-ckpt", "/ckpt"
# Only the collective timeout is shortened, for the tests' speed (its default, 300 s, is what a
# hung worker costs before the restart); the recovery inputs (--max-restarts) and the stall
# timeout (2 x collective + 60 s) keep their defaults. The collective timeout also bounds the
# start-up rendezvous, which after a restart waits for the stopped pod's deletion (the
# simulator's grace period is at most 5 s).
FAST_TIMEOUTS = {"collective_timeout_s": 10.0}


@dataclasses.dataclass
class Fault:
    """What ``train_with_a_fault`` saw: the step's result or error, the pod the fault hit,
    and the wall-clock time of the fault."""

    result: Any
    error: BaseException | None
    victim: str
    at: float


def train_with_a_fault(
    sim: SimCluster,
    r: Run,
    sig: signal.Signals | Callable[[str], None],
    timeouts: dict[str, float] = FAST_TIMEOUTS,
    **workload: Any,
) -> Fault:
    """Train 2 nodes with checkpoints on a claim (``workload``: overrides of the recovery
    inputs, ``timeouts`` the training's); once the first checkpoint exists, send ``sig`` to
    every process of index 1's pod (or call ``sig`` with that pod's node)."""
    workload = with_inputs(
        r.workload, purpose="train", pvc=(f"{CLAIM}:{MOUNT}",), job_timeout_s=240, **workload
    )
    config = TrainConfig(
        steps=150,
        checkpoint_dir=f"{MOUNT}/{r.id}",
        checkpoint_every=10,
        log_every=5,
        **timeouts,
    )
    outcome: list[Any] = []
    thread, errors = in_background(
        lambda: outcome.append(steps.train(workload, config, kubeconfig=r.kc))
    )
    latest = os.path.join(sim.pvc_dir("default", CLAIM), r.id, "latest")
    wait_for(lambda: os.path.exists(latest), 120, "the first checkpoint")
    job = r.names.job("train")
    pods = Raw(sim).call("GET", "/api/v1/namespaces/default/pods", labelSelector=f"job-name={job}")
    victim, node = next(
        (p["metadata"]["name"], p["spec"]["nodeName"])
        for p in pods["items"]
        if p["metadata"]["name"].startswith(f"{job}-1-") and p["status"].get("phase") == "Running"
    )
    at = time.time()
    if isinstance(sig, signal.Signals):
        sim.signal_pod("default", victim, sig)
    else:
        sig(node)
    thread.join(timeout=300)
    return Fault(outcome[0] if outcome else None, errors[0] if errors else None, victim, at)


@pytest.mark.slow(55)
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["hung", "killed"])
def test_a_hung_or_killed_worker_restarts_every_rank_from_the_checkpoint_by_default(
    sim: SimCluster,
    run: Callable[..., Run],
    sig: signal.Signals,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The default recovery inputs: no --max-restarts given.
    r = run()
    r.provision()
    caplog.set_level("INFO", logger="mnnvl")
    fault = train_with_a_fault(sim, r, sig)
    assert fault.error is None, fault.error
    result = fault.result
    assert result.steps == 150
    assert 1 <= result.restarts <= WorkloadSpec(run_id=r.id).recovery.max_restarts
    # Resumed from a checkpoint (every 10 steps), not from step 0, and the log says which.
    assert result.start_step >= 10 and result.start_step % 10 == 0
    resumed = [m for m in caplog.messages if m.startswith("train: resumed from step")]
    assert resumed == [
        f"train: resumed from step {result.start_step} ({result.raw['resumed_from']})"
    ]
    assert r.id in result.raw["resumed_from"]
    restarted = next(rec for rec in caplog.records if "restarting every rank" in rec.getMessage())
    assert result.recovery_s is not None and result.recovery_s > 0
    seen_s = restarted.created - fault.at  # the fault until the driver saw a pod fail
    print(
        f"{sig.name}: fault to first resumed step {seen_s + result.recovery_s:.1f} s "
        f"(failure seen after {seen_s:.1f} s, then {result.recovery_s:.1f} s to the first "
        f"step), resumed from step {result.start_step}, steps lost {result.steps_lost}"
    )
    r.close()
    assert sim.processes(r.names.selector) == []


@pytest.mark.slow(120)
def test_a_hung_worker_at_the_default_inputs_is_resumed_within_two_minutes(
    sim: SimCluster, run: Callable[..., Run], caplog: pytest.LogCaptureFixture
) -> None:
    # Every input at its default: the pods' stall watchdog, derived from the steps seen,
    # finds the hang long before the collective timeout (300 s) would.
    r = run()
    r.provision()
    caplog.set_level("INFO", logger="mnnvl")
    fault = train_with_a_fault(sim, r, signal.SIGSTOP, timeouts={})
    assert fault.error is None, fault.error
    result = fault.result
    assert result.steps == 150 and result.restarts == 1
    restarted = next(rec for rec in caplog.records if "restarting every rank" in rec.getMessage())
    assert "exit code 12" in restarted.getMessage()  # the stall watchdog, not a collective
    seen_s = restarted.created - fault.at
    resumed_s = seen_s + result.recovery_s
    print(f"SIGSTOP at the defaults: seen after {seen_s:.1f} s, resumed after {resumed_s:.1f} s")
    assert resumed_s < 120
    r.close()
    assert sim.processes(r.names.selector) == []


@pytest.mark.slow(40)
def test_a_hung_worker_without_restarts_exits_4_naming_the_stalled_pod(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    fault = train_with_a_fault(sim, r, signal.SIGSTOP, max_restarts=0)
    assert fault.result is None and isinstance(fault.error, MnnvlError)
    assert fault.error.exit_code == 4
    # The survivor's collective timed out; it names the rank that never arrived by its pod
    # (hostname <job>-<index>).
    victim_host = fault.victim.rsplit("-", 1)[0]
    assert f"ranks that did not arrive: rank 1 (pod {victim_host}" in str(fault.error)
    r.close()


# A node lost mid-run, as the control plane handles it: its pods are evicted after their
# toleration and stay Terminating until the node object is deleted (here 1 s after the loss,
# as a cloud provider's node controller does once the instance is gone); pod GC then fails
# them with DisruptionTarget and the gang restarts. Upstream's delays (300 s toleration, 40 s
# pod GC quarantine) are shortened.
LOST_NODE_TIMING = {"default_toleration_s": 1.0, "pod_gc_quarantine_s": 0.5}


def train_losing_a_node(
    nodes: int, workers: str, deleted_after_s: float | None = 1.0
) -> tuple[Any, BaseException | None, list[str]]:
    """Train on 2 of ``nodes`` nodes and lose index 1's node after the first checkpoint; its
    Node object is deleted ``deleted_after_s`` later (None: never, as on bare metal, where the
    operator taints it out-of-service once the step has said so).
    Returns (the result, the error, the nodes the replacement pods run on)."""
    with SimCluster(nodes=nodes, local_gpus=[], imex_delay_s=0.1, **LOST_NODE_TIMING) as sim:
        create_claim(sim, CLAIM)
        r = Run(sim, workers, unschedulable_grace_s=3)
        r.provision()
        lost: list[str] = []

        def lose(node: str) -> None:
            lost.append(node)
            sim.lose_node(node, deleted_after_s=deleted_after_s)

        fault = train_with_a_fault(sim, r, lose)
        result, error, victim = fault.result, fault.error, fault.victim
        pods = Raw(sim).call("GET", "/api/v1/namespaces/default/pods")["items"]
        placed = sorted(p["spec"].get("nodeName") or "" for p in pods)
        if deleted_after_s is None:
            assert error is not None
            assert f"node {lost[0]} was lost and pod {victim} has stayed Terminating" in str(error)
            taint_out_of_service(sim, lost[0])  # what the error tells the operator to do
            wait_for(
                lambda: victim not in pod_names(sim),
                what="pod GC removes the pod of the out-of-service node",
            )
        else:
            if error is not None:
                assert f"node {lost[0]} was lost (pod {victim}: DeletionByPodGC" in str(error)
            assert lost[0] not in placed
        r.close()  # nothing left
        return result, error, placed


def pod_names(sim: SimCluster) -> set[str]:
    pods = Raw(sim).call("GET", "/api/v1/namespaces/default/pods")["items"]
    return {p["metadata"]["name"] for p in pods}


def taint_out_of_service(sim: SimCluster, node: str) -> None:
    """`kubectl taint nodes NODE node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`."""
    raw = Raw(sim)
    path = f"/api/v1/nodes/{node}"
    taints = raw.call("GET", path)["spec"].get("taints") or []
    taint = {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}
    raw.call("PATCH", path, {"spec": {"taints": [*taints, taint]}})


@pytest.mark.slow
def test_node_lost_and_never_deleted_exits_4_naming_the_node_and_the_fix(workers: str) -> None:
    # Bare metal: nobody deletes the Node, so the evicted pod stays Terminating and its Job
    # never replaces the index. Bound: the toleration (1 s) + the grace (3 s), well before
    # the survivors could use up their restarts.
    started = time.monotonic()
    result, error, _ = train_losing_a_node(2, workers, deleted_after_s=None)
    assert result is None and isinstance(error, MnnvlError)
    assert error.exit_code == 4
    assert "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in str(error)
    assert "DeletionByTaintManager" in str(error)
    print(f"lost node never deleted: failed after {time.monotonic() - started:.1f} s")


@pytest.mark.slow(45)
def test_node_lost_mid_run_restarts_every_rank_on_a_spare_node_and_finishes(workers: str) -> None:
    result, error, _ = train_losing_a_node(3, workers)
    assert error is None, error
    assert result.restarts == 1 and result.steps == 150
    assert result.start_step >= 10  # resumed from the checkpoint on the claim


@pytest.mark.slow
def test_node_lost_mid_run_without_a_spare_node_exits_4_naming_the_lost_node(
    workers: str,
) -> None:
    # Bound: the node's removal (1 s) + pod GC's quarantine (0.5 s) + the unschedulable
    # grace (3 s) for the replacement, plus the restart's start-up.
    started = time.monotonic()
    result, error, _ = train_losing_a_node(2, workers)
    assert result is None and isinstance(error, WorkloadFailed)
    assert error.exit_code == 4
    assert "Unschedulable" in str(error) and "nowhere to go" in str(error)
    # A node coming back clears it: the step's record must not replay it on a rerun.
    assert error.problem is ProblemKind.UNSCHEDULABLE and not error.permanent
    print(f"no spare node: failed after {time.monotonic() - started:.1f} s")
