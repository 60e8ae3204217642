"""Kueue against the simulated cluster: a held Job says why, what cannot clear fails at once,
and clique groups are admitted as one gang. Each case ends with nothing of the run left."""

from __future__ import annotations

import contextlib
import logging
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.errors import WaitTimeout, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from mnnvl.sim.policy.kueue import KueueConfig
from mnnvl.sim.policy.kueue_tas import CLIQUE, HOSTNAME, INDEX_LABEL
from tests.sim.test_rbac_least_privilege import role_rules

QUICK = textwrap.dedent(
    """
    import os
    if os.environ["JOB_COMPLETION_INDEX"] == "0":
        print('RESULT {"kind": "quick", "ok": true}', flush=True)
    """
)
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
REPO = Path(__file__).resolve().parents[2]


WORKERS = {"quick.py": QUICK}


class Run:
    """A provisioned run on ``sim``; ``close`` tears it down and checks nothing is left."""

    def __init__(self, sim: SimCluster, workers: str, **workload: object) -> None:
        self.sim = sim
        self.run_id = f"k-{uuid.uuid4().hex[:10]}"
        self.domain = DomainSpec(run_id=self.run_id, delete_timeout_s=30)
        fields: dict[str, object] = {
            "run_id": self.run_id,
            "purpose": "job",
            "nodes": 2,
            "gpus_per_node": 0,
            "env": {"PYTHONPATH": workers},
            "pods_running_timeout_s": 60,
            "job_timeout_s": 120,
        }
        self.workload = from_inputs(WorkloadSpec, **(fields | workload))  # type: ignore[arg-type]
        steps.provision(self.domain, kubeconfig=sim.kubeconfig_path)

    def launch(self) -> object:
        return steps.launch(self.workload, "quick", [], kubeconfig=self.sim.kubeconfig_path)

    def pods_created(self) -> int:
        return sum(
            1
            for e in self.sim.events
            if e.get("reason") == "SuccessfulCreate"
            and e["involvedObject"]["name"].startswith(RunNames.for_run(self.run_id).base)
        )

    def close(self) -> None:
        steps.teardown(self.domain, kubeconfig=self.sim.kubeconfig_path)
        names = RunNames.for_run(self.run_id)
        assert self.sim.objects(names.selector) == []
        assert [o for o in self.sim.objects() if names.base in o[2]] == []


def _sim(
    config: KueueConfig, nodes: int = 2, cliques: int = 1, seed: int | None = None
) -> SimCluster:
    return SimCluster(
        nodes=nodes,
        cliques=cliques,
        scheduler_seed=seed,
        local_gpus=[],
        imex_delay_s=0.1,
        schedule_delay_s=0.05,
        kueue=True,
        kueue_admission_delay_s=0.2,
        kueue_config=config,
    )


@pytest.fixture
def run_on(workers: str) -> Iterator:
    """``with run_on(sim, **workload) as r``: a provisioned run, torn down and checked on exit."""

    @contextlib.contextmanager
    def make(sim: SimCluster, **workload: object) -> Iterator[Run]:
        r = Run(sim, workers, **workload)
        try:
            yield r
        finally:
            r.close()

    return make


def test_unmapped_channel_device_class_fails_at_once_quoting_kueue(run_on) -> None:
    # Kueue v0.18+ accounts DRA devices; the channel's DeviceClass is not in its mappings.
    config = KueueConfig(device_class_mappings={"gpu.nvidia.com": "nvidia.com/gpu"})
    # Not reading Kueue's reason, the step would sit out its whole admission timeout.
    with _sim(config) as sim, run_on(sim, queue_name="team", admission_timeout_s=30) as r:
        start = time.monotonic()
        with pytest.raises(WorkloadFailed) as info:
            r.launch()
        assert time.monotonic() - start < 20
        message = str(info.value)
        assert info.value.exit_code == 4
        assert "Kueue will not admit Workload default/job-" in message
        assert (
            f'"DeviceClass {CHANNEL_CLASS} is not mapped in DRA configuration for podset main"'
            in message
        )
        assert "deviceClassMappings" in message  # the fix
        assert r.pods_created() == 0


def test_unknown_local_queue_fails_at_once_naming_it(run_on) -> None:
    config = KueueConfig(local_queues={"team": "gpu-cq"}, quotas={"gpu-cq": {"pods": 8}})
    with _sim(config) as sim, run_on(sim, queue_name="no-such-queue", admission_timeout_s=30) as r:
        start = time.monotonic()
        with pytest.raises(WorkloadFailed) as info:
            r.launch()
        assert time.monotonic() - start < 20
        assert info.value.exit_code == 4
        assert 'Misconfigured: "LocalQueue no-such-queue doesn\'t exist"' in str(info.value)
        assert "kubectl get localqueue no-such-queue -n default" in str(info.value)


def test_quota_short_shows_kueues_reason_while_queued_then_times_out(run_on, caplog) -> None:
    # One pod of quota for a two-pod Job: it may clear (quota raised), so it waits, saying why.
    config = KueueConfig(local_queues={"team": "gpu-cq"}, quotas={"gpu-cq": {"pods": 1}})
    caplog.set_level(logging.INFO)
    with _sim(config) as sim, run_on(sim, queue_name="team", admission_timeout_s=3) as r:
        with pytest.raises(WaitTimeout) as info:
            r.launch()
        assert info.value.exit_code == 3
        assert "insufficient quota for pods in flavor default-flavor" in str(info.value)
        said = [m for m in caplog.messages if m.startswith("Kueue: Workload job-")]
        reason = "QuotaReserved=False (ExceedsMaxQuota: couldn't assign flavors"
        assert any(reason in m for m in said)
        assert r.pods_created() == 0


def test_without_permission_on_workloads_the_wait_falls_back_and_says_so_once(
    run_on, caplog
) -> None:
    with _sim(KueueConfig()) as sim:
        sim.store.delete("rolebindings", "default", "mnnvl-kueue-reader")  # the overlay not applied
        with run_on(sim, queue_name="team") as r:
            caplog.set_level(logging.INFO)
            outcome = r.launch()
            assert outcome.result == {"kind": "quick", "ok": True}  # type: ignore[attr-defined]
            said = [m for m in caplog.messages if "cannot read Kueue Workloads" in m]
            assert len(said) == 1
            assert "workloads.kueue.x-k8s.io" in said[0] and "manifests/overlays/kueue" in said[0]


def test_admitted_workload_is_reported_and_the_job_runs(run_on, caplog) -> None:
    caplog.set_level(logging.INFO)
    with _sim(KueueConfig()) as sim, run_on(sim, queue_name="team") as r:
        outcome = r.launch()
        assert outcome.result == {"kind": "quick", "ok": True}  # type: ignore[attr-defined]
        assert any(m.startswith("Kueue: Workload job-") for m in caplog.messages)
        sent = {r for r in sim.rbac_requests if r[1] == "kueue.x-k8s.io"}
    # The Kueue overlay grants what the Kueue path sends (and get, for `kubectl get workload`
    # by the same account); the base Role none of it.
    granted = role_rules(REPO / "manifests/overlays/kueue/kueue-rbac.yaml")
    assert {
        ("list", "kueue.x-k8s.io", "workloads"),
        ("watch", "kueue.x-k8s.io", "workloads"),
    } == sent
    assert sent < granted
    assert not any(
        g == "kueue.x-k8s.io" for _, g, _ in role_rules(REPO / "manifests/base/rbac.yaml")
    )


def test_clique_groups_are_one_gang_no_pod_starts_with_quota_for_one_group(run_on, eventually):
    # Two groups of two nodes on two cliques; the ClusterQueue has room for one group only.
    # Admitting group by group would start one group that then waits at the rendezvous
    # holding its nodes; as one Workload, nothing starts and the step reports "queued".
    config = KueueConfig(local_queues={"team": "gpu-cq"}, quotas={"gpu-cq": {"pods": 2}})
    with (
        _sim(config, nodes=4, cliques=2) as sim,
        run_on(
            sim,
            queue_name="team",
            nodes=4,
            nodes_per_clique=2,
            topology_aware=True,
            admission_timeout_s=4,
        ) as r,
    ):
        outcome: list[BaseException] = []

        def launch() -> None:
            try:
                r.launch()
            except BaseException as e:  # the step's error, checked below
                outcome.append(e)

        step = threading.Thread(target=launch)
        step.start()
        # While the step waits in the queue: one Workload for the whole run, and no pod.
        eventually(lambda: _workloads(sim), what="the run's Workload")
        assert len(_workloads(sim)) == 1
        assert r.pods_created() == 0
        step.join(30)
        assert outcome and isinstance(outcome[0], WaitTimeout)
        assert outcome[0].exit_code == 3
        assert "queued in LocalQueue team (Kueue)" in str(outcome[0])
        assert r.pods_created() == 0


def _workloads(sim: Any) -> list[Any]:
    return [o for o in sim.objects() if o[0] == "Workload"]


@pytest.mark.parametrize(
    "levels", [(CLIQUE, HOSTNAME), (CLIQUE,)], ids=["topology-clique-host", "topology-clique"]
)
def test_clique_groups_admitted_together_run_one_group_per_clique(run_on, levels) -> None:
    # One Job of 4 pods, slices of 2 (one clique group each) on 2 cliques of 2 nodes. Kueue's
    # TAS puts each slice in one clique; the scheduler's random tie-breaks alone would put a
    # slice across both. With the Topology's lowest level the host, the pods are pinned to
    # nodes; with the clique level only, the scheduler picks nodes inside the clique.
    config = KueueConfig(
        local_queues={"team": "gpu-cq"}, quotas={"gpu-cq": {"pods": 4}}, topology_levels=levels
    )
    gang = {"queue_name": "team", "nodes": 4, "nodes_per_clique": 2, "topology_aware": True}
    for seed in range(3):
        with _sim(config, nodes=4, cliques=2, seed=seed) as sim, run_on(sim, **gang) as r:
            outcome = r.launch()
            assert outcome.result == {"kind": "quick", "ok": True}  # type: ignore[attr-defined]
            assert r.pods_created() == 4
            slices = _cliques_by_slice(sim, r.run_id, slice_size=2)
            assert all(len(c) == 1 for c in slices.values()), f"seed {seed}: {slices}"
            assert slices[0] != slices[1], f"seed {seed}: both slices in {slices[0]}"


def _cliques_by_slice(sim: SimCluster, run_id: str, slice_size: int) -> dict[int, set[str]]:
    """slice (completion index // slice size) -> the cliques its pods ran in."""
    nodes = sim.store.list("nodes")[0]
    clique = {n["metadata"]["name"]: n["metadata"]["labels"][CLIQUE] for n in nodes}
    base = RunNames.for_run(run_id).base
    slices: dict[int, set[str]] = {}
    for pod in sim.store.list("pods")[0]:
        if pod["metadata"]["name"].startswith(base) and pod["spec"].get("nodeName"):
            index = int(pod["metadata"]["labels"][INDEX_LABEL])
            slices.setdefault(index // slice_size, set()).add(clique[pod["spec"]["nodeName"]])
    return slices


# Kueue v0.19's waitForPodsReady, played short: pods that are not Ready in time are evicted and
# requeued after a back-off, for ever unless the step bounds it.
PODS_READY = dict(local_queues={"team": "cq"}, quotas={"cq": {"pods": 2}})


def _never_ready(config: KueueConfig) -> SimCluster:
    # IMEX daemons that take an hour: the pods stay ContainerCreating, never Ready.
    return SimCluster(
        nodes=2,
        local_gpus=[],
        imex_delay_s=3600,
        schedule_delay_s=0.05,
        kueue=True,
        kueue_admission_delay_s=0.2,
        kueue_config=config,
    )


def _launch_within(r: Run, seconds: float) -> BaseException | None:
    """The step's outcome, or a failure of the test when it is still waiting after ``seconds``
    (a requeue loop the step does not bound)."""
    outcome: list[BaseException | None] = []

    def launch() -> None:
        try:
            r.launch()
            outcome.append(None)
        except BaseException as e:  # the step's error, checked by the caller
            outcome.append(e)

    step = threading.Thread(target=launch, daemon=True)
    step.start()
    step.join(seconds)
    assert outcome, f"the step still waits after {seconds:g} s of Kueue requeueing it"
    return outcome[0]


def test_evictions_for_the_pods_ready_timeout_are_named_counted_and_bounded(run_on, caplog) -> None:
    config = KueueConfig(**PODS_READY, pods_ready_timeout_s=1.0, requeue_base_s=0.3)
    caplog.set_level(logging.INFO)
    with _never_ready(config) as sim, run_on(sim, queue_name="team", max_restarts=1) as r:
        err = _launch_within(r, 60)
    assert isinstance(err, WorkloadFailed) and err.exit_code == 4
    message = str(err)
    assert (
        "Kueue evicted Job default/" in message
        and "2 time(s), more than --max-restarts 1" in message
    )
    assert "Evicted (PodsReadyTimeout: Exceeded the PodsReady timeout default/job-" in message
    assert "requeued 2 time(s) (status.requeueState.count)" in message
    suspended = [m for m in caplog.messages if "was suspended again (Workload job-" in m]
    assert (
        suspended and "PodsReadyTimeout" in suspended[0] and "eviction 1, at most 1" in suspended[0]
    )
    assert any(
        "Kueue: Workload job-" in m and "Evicted (PodsReadyTimeout" in m for m in caplog.messages
    )
    # The pods Kueue took away are no failed gang: no restart was counted or made.
    assert not any("restarting every rank" in m for m in caplog.messages)


def test_the_admission_timeout_counts_every_wait_across_requeues(run_on) -> None:
    # Each wait (a 1.2 s back-off) is shorter than the 3 s limit; their sum is not.
    config = KueueConfig(
        **PODS_READY, pods_ready_timeout_s=1.0, requeue_base_s=1.2, requeue_max_s=1.2
    )
    with (
        _never_ready(config) as sim,
        run_on(sim, queue_name="team", admission_timeout_s=3, max_restarts=20) as r,
    ):
        err = _launch_within(r, 60)
    assert isinstance(err, WaitTimeout) and err.exit_code == 3
    message = str(err)
    assert "queued in LocalQueue team (Kueue) for more than 3 s in all, over " in message
    assert "(--admission-timeout-s)" in message


def test_a_gang_restart_under_kueue_is_no_eviction(run_on, caplog) -> None:
    config = KueueConfig(**PODS_READY, pods_ready_timeout_s=30.0, requeue_base_s=0.3)
    caplog.set_level(logging.INFO)
    with _sim(config) as sim, run_on(sim, queue_name="team", max_restarts=1) as r:
        sim.faults.fail_pod(RunNames.for_run(r.run_id).job("job"), index=1, exit_code=1)
        outcome = r.launch()
        (workload,) = _workloads(sim)
    assert outcome.result == {"kind": "quick", "ok": True}  # type: ignore[attr-defined]
    assert len(outcome.restarts) == 1  # type: ignore[attr-defined]
    assert any("restarting every rank" in m for m in caplog.messages)
    assert not any("suspended again" in m or "Evicted" in m for m in caplog.messages)
    assert workload[2].startswith("job-")  # one Workload, admitted once


def test_a_run_queued_longer_than_the_reapers_age_bound_is_not_reaped(run_on, eventually) -> None:
    """The hourly reaper (an age bound, no live list) leaves a run whose Job waits for
    admission alone: nothing transitions while it is queued, yet its step is waiting."""
    config = KueueConfig(local_queues={"team": "gpu-cq"}, quotas={"gpu-cq": {"pods": 1}})
    with _sim(config) as sim, run_on(sim, queue_name="team", admission_timeout_s=8) as r:
        ended: dict[str, BaseException] = {}

        def launch() -> None:
            try:
                r.launch()
            except WaitTimeout as e:
                ended["error"] = e

        step = threading.Thread(target=launch, daemon=True)
        step.start()
        job = RunNames.for_run(r.run_id).job("job")
        eventually(lambda: sim.store.find("jobs", "default", job) is not None, 10, "the Job")
        created = time.monotonic()
        eventually(lambda: time.monotonic() - created > 3, 5, "the run idle past the bound")
        reaped = steps.reap(
            "default", live_run_ids=None, older_than_s=2.0, kubeconfig=sim.kubeconfig_path
        )
        assert reaped.runs == [] and reaped.deleted == []
        step.join(30)
        assert not step.is_alive() and ended["error"].exit_code == 3  # admission timeout
