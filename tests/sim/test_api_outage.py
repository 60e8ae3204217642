"""API server outages: each wait and the teardown ride out a restart of the API server.

The simulator's ``faults.api_outage(s, unsynced_s)`` refuses connections and cuts open ones
(watches, log streams) for ``s`` seconds while its controllers, kubelet and pod processes keep
running, then answers 403 Forbidden for ``unsynced_s``, as a restarting kube-apiserver does
until its RBAC caches have synced. Outages here last ``OUTAGE_S``: longer than the old fixed
retries (about 3 s) and within the tolerance the runs are given.
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
from pathlib import Path
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.driver import Api
from mnnvl.driver import wait as wait_module
from mnnvl.driver.api import COMPUTE_DOMAIN, JOB, POD, RESOURCE_CLAIM_TEMPLATE, SERVICE
from mnnvl.driver.retry import BACKOFF_MAX_S, RetryPolicy
from mnnvl.driver.wait import Deadline, wait_for
from mnnvl.errors import MnnvlError
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.simkit import GATED, assert_nothing_left
from tests.sim.simkit import wait_for as until

OUTAGE_S = 4.0
TOLERANCE_S = 30.0
STOP_S = 8.0  # a SIGSTOPped API server process: as a 20 s stop, only shorter
# 403s after an outage, for longer than a retry's longest backoff: every retrying request
# meets at least one (a real API server's last a few hundred ms, the simulator's default).
REFUSALS_S = BACKOFF_MAX_S + 1
REFUSED_LOG = "right after the API was unreachable"


# IMEX takes 2 s per node: pods stay ContainerCreating long enough to start an outage.
SIM = dict(nodes=2, local_gpus=[], imex_delay_s=2.0)


class Run:
    def __init__(self, sim: SimCluster, tmp: Path, outage_s: float = TOLERANCE_S) -> None:
        self.sim, self.id = sim, f"ao-{uuid.uuid4().hex[:8]}"
        self.names = RunNames.for_run(self.id)
        (tmp / "gated.py").write_text(GATED)
        self.gate = tmp / "open"
        self.kc = sim.kubeconfig_path
        self.domain = DomainSpec(
            run_id=self.id, rct_timeout_s=60, delete_timeout_s=60, api_outage_s=outage_s
        )
        self.workload = from_inputs(
            WorkloadSpec,
            run_id=self.id,
            purpose="job",
            nodes=2,
            gpus_per_node=0,
            env={"PYTHONPATH": str(tmp), "GATE": str(self.gate)},
            pods_running_timeout_s=120,
            job_timeout_s=120,
            api_outage_s=outage_s,
        )

    def provision(self) -> Any:
        return steps.provision(self.domain, kubeconfig=self.kc)

    def launch(self) -> Any:
        return steps.launch(self.workload, "gated", [], kubeconfig=self.kc)

    def teardown(self) -> Any:
        return steps.teardown(self.domain, kubeconfig=self.kc)

    def pod_phases(self) -> list[str]:
        pods, _ = self.sim.store.list("pods", "default")
        mine = [p for p in pods if self.names.job("job") in p["metadata"]["name"]]
        return sorted(str(p.get("status", {}).get("phase")) for p in mine)


@pytest.fixture
def run(sim: SimCluster, tmp_path: Path) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def make(**kw: Any) -> Run:
        made.append(Run(sim, tmp_path, **kw))
        return made[-1]

    yield make
    for r in made:
        r.gate.touch()
        until(lambda: serving(sim), 30)
        r.teardown()
    assert_nothing_left(sim)


def serving(sim: SimCluster) -> bool:
    """The API server is back from any outage and authorizes requests again."""
    server = sim._server
    assert server is not None
    return not server.down.is_set() and server.caches_synced()


def background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as e:  # handed to the test thread
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def finished(thread: threading.Thread, out: dict[str, Any], timeout_s: float = 120) -> Any:
    thread.join(timeout_s)
    assert not thread.is_alive(), "the step never ended"
    if "error" in out:
        raise out["error"]
    return out["result"]


@pytest.mark.client
def test_outage_while_waiting_for_the_channel_template_is_ridden_out(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    sim.faults.no_rct(r.names.domain)
    thread, out = background(r.provision)
    until(lambda: any(o[2] == r.names.domain for o in sim.objects()), 30)
    sim.faults.api_outage(OUTAGE_S)
    sim.faults.allow_rct(r.names.domain)  # the controller carries on during the outage
    assert finished(thread, out).channel_template == r.names.channel_template


def test_a_deadline_that_passes_during_an_outage_is_judged_on_what_the_api_shows_after(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    """The controller made the template in time, but the outage hid it past the deadline:
    the wait decides on the state it sees once the API answers, not on a stale view."""
    r = run()
    r.domain = dataclasses.replace(r.domain, rct_timeout_s=2)
    sim.faults.no_rct(r.names.domain)
    thread, out = background(r.provision)
    until(lambda: any(o[2] == r.names.domain for o in sim.objects()), 30)
    sim.faults.api_outage(OUTAGE_S)  # longer than the deadline
    sim.faults.allow_rct(r.names.domain)
    assert finished(thread, out).channel_template == r.names.channel_template


@pytest.mark.client
def test_outage_while_pods_start_and_while_the_job_runs_ends_with_the_workloads_result(
    sim: SimCluster, run: Callable[..., Run], caplog: pytest.LogCaptureFixture
) -> None:
    r = run()
    r.provision()
    follows = log_follows(sim)
    thread, out = background(r.launch)
    until(lambda: len(r.pod_phases()) == 2, 30)
    assert "Running" not in r.pod_phases()  # IMEX still starting: the pods-Running wait
    with caplog.at_level("INFO", logger="mnnvl"):
        sim.faults.api_outage(OUTAGE_S)
        until(lambda: r.pod_phases() == ["Running", "Running"], 30)  # meanwhile
        # the step saw them Running and follows rank 0's log: now the Job wait
        until(lambda: log_follows(sim) > follows, 30)
        sim.faults.api_outage(OUTAGE_S)
        r.gate.touch()  # the Job completes while nobody can watch it
        result = finished(thread, out)
    assert result.result == {"ok": True} and result.exit_code == 0
    messages = [rec.getMessage() for rec in caplog.records]
    assert any("log stream cut" in m for m in messages)  # rank 0's log was being followed
    teardown = r.teardown()
    assert teardown.deleted and sim.objects() == []


def test_outage_during_teardown_is_ridden_out_and_leaves_nothing(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    sim.faults.stick_finalizer("ComputeDomain", r.names.domain)
    thread, out = background(r.teardown)
    until(lambda: _deleting(sim, r.names.domain), 30)  # the deletion wait has begun
    sim.faults.api_outage(OUTAGE_S)
    sim.faults.unstick_finalizer("ComputeDomain", r.names.domain)
    result = finished(thread, out)
    assert f"ComputeDomain default/{r.names.domain}" in result.deleted
    assert sim.objects() == []


def test_outage_longer_than_the_tolerance_exits_5_then_teardown_lists_what_is_left(
    sim: SimCluster, run: Callable[..., Run], capsys: pytest.CaptureFixture[str]
) -> None:
    r = run(outage_s=2)
    r.provision()
    follows = log_follows(sim)
    thread, out = background(r.launch)
    until(lambda: log_follows(sim) > follows, 30)
    sim.faults.api_outage(3 * OUTAGE_S)
    with pytest.raises(MnnvlError) as info:
        finished(thread, out)
    assert info.value.exit_code == 5
    assert "longer than --api-outage-s 2 tolerates" in str(info.value)
    # The teardown (exit handler) during the same outage cannot finish either: it says what
    # may be left and how to remove it, in the JSON result and the last log line.
    code = cli.main(["teardown", "--run-id", r.id, "--kubeconfig", r.kc, "--api-outage-s", "2"])
    captured = capsys.readouterr()
    result = json.loads(captured.out.splitlines()[-1])
    assert code == 5 and result["exit_code"] == 5
    assert any(f"ComputeDomain default/{r.names.domain}" in item for item in result["leftovers"])
    assert result["cleanup"] == f"mnnvl teardown --run-id {r.id} --namespace default"
    last_log = captured.err.strip().splitlines()[-1]
    assert "may be left" in last_log and r.names.domain in last_log
    assert result["cleanup"] in last_log
    until(lambda: serving(sim), 60)
    r.gate.touch()
    assert cli.main([*result["cleanup"].split()[1:], "--kubeconfig", r.kc]) == 0
    assert sim.objects() == []


def test_teardown_rides_out_an_outage_that_ends_with_refusals_and_leaves_nothing(
    sim: SimCluster, run: Callable[..., Run], capsys: pytest.CaptureFixture[str]
) -> None:
    """The exit handler's teardown (`mnnvl teardown`, default inputs) during an API server
    restart: refused connections, then 403s until its authorizer's caches sync."""
    r = run()
    r.provision()
    sim.faults.stick_finalizer("ComputeDomain", r.names.domain)
    thread, out = background(lambda: cli.main(["teardown", "--run-id", r.id, "--kubeconfig", r.kc]))
    until(lambda: _deleting(sim, r.names.domain), 30)  # the deletion wait has begun
    sim.faults.api_outage(OUTAGE_S, REFUSALS_S)
    sim.faults.unstick_finalizer("ComputeDomain", r.names.domain)
    code = finished(thread, out)
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert REFUSED_LOG in captured.err  # it met the refusals and rode them out
    assert f"ComputeDomain default/{r.names.domain}" in json.loads(captured.out)["deleted"]
    assert sim.objects() == []


def test_reaper_rides_out_an_outage_that_ends_with_refusals(
    sim: SimCluster, run: Callable[..., Run], caplog: pytest.LogCaptureFixture
) -> None:
    r = run()
    r.provision()
    sim.faults.api_outage(OUTAGE_S, REFUSALS_S)
    with caplog.at_level("INFO", logger="mnnvl"):
        reaped = steps.reap(
            "default", live_run_ids={"another-run"}, older_than_s=0, kubeconfig=r.kc
        )
    assert reaped.runs == [r.id] and sim.objects() == []
    assert any(REFUSED_LOG in rec.getMessage() for rec in caplog.records)


@pytest.mark.client
def test_refusals_after_an_outage_are_fatal_past_their_bound_naming_verb_and_resource(
    sim: SimCluster,
) -> None:
    """403s that go on after an outage are retried for ``refused_s`` only, well within the
    outage tolerance, then fail as a refusal on a healthy connection does."""
    with Api.connect(sim.kubeconfig_path) as connected:
        api = Api(connected.client, RetryPolicy(outage_s=TOLERANCE_S, refused_s=2))
        api.list(POD, "default")
        sim.faults.api_outage(1, unsynced_s=2 * REFUSALS_S)
        start = time.monotonic()
        with pytest.raises(MnnvlError) as info:
            api.list(POD, "default")
        failed_after_s = time.monotonic() - start
        assert not serving(sim)  # it gave up while the API still refused, not at the end
    until(lambda: serving(sim), 60)
    assert info.value.exit_code == 5
    assert "list pods in default was refused (403 Forbidden: pods is forbidden: User " in str(
        info.value
    )
    assert 'cannot list resource "pods" in API group "" in the namespace "default"' in str(
        info.value
    )
    assert failed_after_s >= 1 + 2  # the outage, then the bound (not serving: before its end)


@pytest.mark.client
def test_a_refusal_on_a_healthy_connection_fails_the_step_at_once_with_exit_5(
    sim: SimCluster, run: Callable[..., Run]
) -> None:
    r = run()
    r.provision()
    refused_before = sim.request_counts[("GET", "fault")]
    sim.faults.fail_requests("GET", "/pods?watch=true", 403)  # the pods-Running wait's watch
    thread, out = background(r.launch)
    with pytest.raises(MnnvlError) as info:
        finished(thread, out, timeout_s=30)  # a retry would wait for the gated Job instead
    assert info.value.exit_code == 5
    assert str(info.value).startswith("watch pods in default was refused (403 Forbidden")
    assert sim.request_counts[("GET", "fault")] == refused_before + 1


def test_a_refusal_once_the_api_answered_again_is_fatal_at_once(sim: SimCluster) -> None:
    with Api.connect(sim.kubeconfig_path, outage_s=TOLERANCE_S) as api:
        sim.faults.api_outage(1, unsynced_s=0)
        api.list(POD, "default")  # rides out the outage: the API answered again
        sim.faults.fail_requests("GET", "/pods", 403)
        refused_before = sim.request_counts[("GET", "fault")]
        with pytest.raises(MnnvlError) as info:
            api.list(POD, "default")
    assert info.value.exit_code == 5
    assert sim.request_counts[("GET", "fault")] == refused_before + 1  # no retry
    assert str(info.value).startswith("list pods in default was refused (403 Forbidden")


@pytest.mark.client
def test_watch_bookmarks_advance_the_resume_point_so_a_quiet_watch_needs_no_relist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watch on something quiet while the rest of the cluster is busy: bookmarks carry
    the resourceVersion forward, so resuming never falls out of the server's history."""
    with SimCluster(nodes=1, local_gpus=[], watch_history=20) as small:
        monkeypatch.setattr(wait_module, "WATCH_CHUNK_S", 3.0)  # a bookmark 2 s before each end
        with Api.connect(small.kubeconfig_path) as api, Api.connect(small.kubeconfig_path) as other:
            watch, calls = api.watch, [0]

            def busy_between_watches(*args: Any, **kwargs: Any) -> Any:
                # Between two watches, other objects change 12 times: a resume from the last
                # bookmark is 12 events behind (inside the history of 20); one from the list's
                # version would be 24 behind by the third watch and get 410 Gone.
                for i in range(6 if calls[0] else 0):
                    other.delete(SERVICE, "default", f"other-{i}")
                    other.create(SERVICE, "default", _service(f"other-{i}"))
                calls[0] += 1
                return watch(*args, **kwargs)

            for i in range(6):
                other.create(SERVICE, "default", _service(f"other-{i}"))
            monkeypatch.setattr(api, "watch", busy_between_watches)
            lists_before = small.request_counts[("LIST", "resourceclaimtemplates")]
            with pytest.raises(MnnvlError, match="timed out"):
                wait_for(
                    api,
                    RESOURCE_CLAIM_TEMPLATE,
                    "default",
                    name="never-there",
                    what="a template that never comes",
                    done=lambda objects: bool(objects),
                    deadline=Deadline(10),
                )
            relists = small.request_counts[("LIST", "resourceclaimtemplates")] - lists_before
    assert calls[0] >= 3, f"only {calls[0]} watches: the test needs a third resume"
    assert relists == 1, f"the quiet watch was re-listed {relists - 1} times (410 Gone)"


def _service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": {"app": name}},
    }


def log_follows(sim: SimCluster) -> int:
    """How many pod logs steps asked for: a step follows rank 0's once every pod is Running."""
    return sim.request_counts[("GET", "pods/log")]


def _deleting(sim: SimCluster, name: str) -> bool:
    found, _ = sim.store.list("computedomains", "default")
    return any(
        o["metadata"]["name"] == name and o["metadata"].get("deletionTimestamp") for o in found
    )


@pytest.mark.slow
def test_run_survives_the_sim_up_server_process_being_stopped(tmp_path: Path) -> None:
    """SIGSTOP the `mnnvl sim up` process (its API server, controllers and kubelet freeze; the
    pod processes, its children, carry on) during training, SIGCONT: the run still ends 0
    and leaves nothing."""
    kc, run_id = tmp_path / "kubeconfig", f"stop-{uuid.uuid4().hex[:8]}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "2", "--gpus-per-node", "0",
         "--imex-delay-s", "0.1", "--kubeconfig", str(kc)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run: subprocess.Popen[str] | None = None
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if "Ctrl-C" in line:
                break
        threading.Thread(target=server.stderr.read, daemon=True).start()  # keep draining
        run = subprocess.Popen(
            [sys.executable, "-m", "mnnvl", "run", "--run-id", run_id, "--nodes", "2",
             "--gpus-per-node", "0", "--skip-verify", "--steps", "40", "--warmup-steps", "1",
             "--api-outage-s", "60", "--kubeconfig", str(kc)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert run.stderr is not None
        seen: list[str] = []
        for line in run.stderr:
            seen.append(line)
            if "pods 2/2 Running" in line:  # training: the step waits on its Job
                break
        drained: list[str] = []
        threading.Thread(target=lambda: drained.extend(run.stderr or []), daemon=True).start()
        os.kill(server.pid, signal.SIGSTOP)
        time.sleep(STOP_S)
        os.kill(server.pid, signal.SIGCONT)
        out, _ = run.communicate(timeout=300)
        result = json.loads(out.splitlines()[-1])
        assert run.returncode == 0 and result["ok"] is True, "".join(seen + drained)[-3000:]
        assert result["train"]["steps"] == 40
        with Api.connect(str(kc)) as api:
            selector = RunNames.for_run(run_id).selector
            left = [
                o["metadata"]["name"]
                for kind in (COMPUTE_DOMAIN, JOB, POD, SERVICE, RESOURCE_CLAIM_TEMPLATE)
                for o in api.list(kind, "default", label_selector=selector)["items"]
            ]
        assert left == []
    finally:
        for proc in (run, server):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                proc.wait(timeout=60)


@pytest.mark.slow(60)
@pytest.mark.parametrize("outage_s", [20, 75])
def test_mnnvl_run_rides_out_an_api_server_restart_during_training(
    outage_s: float, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server restarts while the run waits on its training Job (default inputs): its
    connections are refused for ``outage_s``, then it answers 403 until its RBAC caches sync.
    The run still ends 0 and leaves nothing; prints when it carried on after the fault."""
    run_id = f"rst-{uuid.uuid4().hex[:8]}"
    at: dict[str, float] = {}
    with SimCluster(nodes=2, local_gpus=[], imex_delay_s=0.1) as cluster:
        follows = log_follows(cluster)

        def restart_during_training() -> None:
            until(lambda: log_follows(cluster) > follows, 120)  # rank 0's log: training
            at["fault"] = time.monotonic()
            cluster.faults.api_outage(outage_s, REFUSALS_S)
            until(lambda: serving(cluster), outage_s + REFUSALS_S + 30)
            at["served"], seen = time.monotonic(), cluster.request_count
            until(lambda: cluster.request_count > seen, 60)  # the run's next request
            at["carried_on"] = time.monotonic()

        trigger = threading.Thread(target=restart_during_training, daemon=True)
        trigger.start()
        code = cli.main(
            ["run", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0",
             "--skip-verify", "--steps", "200", "--warmup-steps", "1",
             "--kubeconfig", cluster.kubeconfig_path]
        )  # fmt: skip
        captured = capsys.readouterr()
        result = json.loads(captured.out.splitlines()[-1])
        assert code == 0 and result["ok"] is True, captured.err[-3000:]
        trigger.join(1)
        assert not trigger.is_alive() and "carried_on" in at, "the restart never happened"
        assert REFUSED_LOG in captured.err  # the run met the 403s and rode them out
        assert result["train"]["steps"] == 200
        assert cluster.objects() == []
    lag_s = at["carried_on"] - at["served"]
    with capsys.disabled():
        print(
            f"\nAPI server restart: {outage_s:g} s refused + {REFUSALS_S:g} s of 403: the run "
            f"carried on {at['carried_on'] - at['fault']:.1f} s after the fault, {lag_s:.1f} s "
            "after the API authorized again"
        )
    assert lag_s < BACKOFF_MAX_S + 2  # the next retry of the longest backoff


def test_a_request_that_keeps_failing_gives_up_while_other_requests_are_answered(
    sim: SimCluster,
) -> None:
    """A webhook answering 500 to one pod delete while the watches and lists are answered:
    the delete fails (exit 5) naming itself once it failed longer than --api-outage-s."""
    outage_s = 2.0
    sim.faults.fail_requests("DELETE", "/pods/never-deleted", 500, count=10**6)
    stop = threading.Event()
    try:
        with Api.connect(sim.kubeconfig_path, outage_s=outage_s) as api:

            def others() -> None:  # other requests of the same client keep being answered
                while not stop.wait(0.1):
                    api.list(POD, "default")

            busy = threading.Thread(target=others, daemon=True)
            busy.start()
            started = time.monotonic()
            thread, out = background(lambda: api.delete(POD, "default", "never-deleted"))
            with pytest.raises(MnnvlError) as info:
                finished(thread, out, timeout_s=30)
            took = time.monotonic() - started
            stop.set()
            busy.join()
    finally:
        sim.faults.clear_requests()
    err = info.value
    assert err.exit_code == 5
    assert "delete pods default/never-deleted" in str(err) and "500" in str(err)
    assert f"longer than --api-outage-s {outage_s:g}" in str(err)
    assert outage_s <= took < outage_s + 2 * BACKOFF_MAX_S, f"gave up after {took:.1f} s"
    print(f"a delete answered 500 while other requests passed gave up after {took:.2f} s")
