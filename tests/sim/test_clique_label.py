"""The clique label on the simulated cluster: a provider's own key places the run (pod affinity
and Kueue's slices alike), a key no node carries is named with its counts, a label the DRA
driver drops while its kubelet plugin restarts is waited for, and an IMEX daemon that never gets
Ready names the host's IMEX service."""

from __future__ import annotations

import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mnnvl import steps
from mnnvl.errors import ProblemKind, WaitTimeout, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from mnnvl.sim.policy.kueue import KueueConfig
from mnnvl.sim.policy.kueue_tas import HOSTNAME, INDEX_LABEL

PROVIDER = "cloud.example.com/nvlink-domain"
DEFAULT = "nvidia.com/gpu.clique"
QUICK = textwrap.dedent(
    """
    import os
    if os.environ["JOB_COMPLETION_INDEX"] == "0":
        print('RESULT {"kind": "quick", "clique_label": "%s"}' % os.environ["MNNVL_CLIQUE_LABEL"])
    """
)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("workers")
    (Path(path) / "quick.py").write_text(QUICK)
    return str(path)


@contextmanager
def provisioned(sim: SimCluster, workers: str, **fields: object) -> Iterator[WorkloadSpec]:
    run_id = f"cl-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    base: dict[str, object] = dict(purpose="job", nodes=2, gpus_per_node=0, job_timeout_s=60)
    base.update(env={"PYTHONPATH": workers}, pods_running_timeout_s=60)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    try:
        yield from_inputs(WorkloadSpec, run_id=run_id, **(base | fields))  # type: ignore[arg-type]
    finally:
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
        assert sim.objects(RunNames.for_run(run_id).selector) == []


def _launch(sim: SimCluster, workload: WorkloadSpec) -> object:
    return steps.launch(workload, "quick", [], kubeconfig=sim.kubeconfig_path)


def _sim(**settings: object) -> SimCluster:
    return SimCluster(local_gpus=[], imex_delay_s=0.1, schedule_delay_s=0.05, **settings)  # type: ignore[arg-type]


def test_a_providers_clique_key_places_the_run_and_the_default_key_is_named(workers) -> None:
    with _sim(nodes=2, clique_label=PROVIDER) as sim:
        with provisioned(sim, workers, clique_label=PROVIDER) as workload:
            outcome = _launch(sim, workload)
            assert outcome.result == {"kind": "quick", "clique_label": PROVIDER}  # type: ignore[attr-defined]
            pod = next(p for p in sim.store.list("pods")[0] if workload.run_id in str(p))
            terms = pod["spec"]["affinity"]["podAffinity"]
            assert terms["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == (
                PROVIDER
            )
        # The default key on this cluster: no node carries it, said within the grace.
        with provisioned(sim, workers, unschedulable_grace_s=1.0) as workload:
            start = time.monotonic()
            with pytest.raises(WorkloadFailed) as info:
                _launch(sim, workload)
            assert time.monotonic() - start < 30
    message = str(info.value)
    assert info.value.exit_code == 4
    assert info.value.problem is ProblemKind.NO_CLIQUE_LABEL
    assert f"at most 0 of 2 nodes carry the clique label {DEFAULT}" in message
    assert "a clique group needs 2 nodes" in message and "--clique-label" in message


def test_a_label_dropped_while_the_plugin_restarts_is_waited_for_within_the_grace(
    workers,
) -> None:
    def label(sim: SimCluster, node: str, value: str | None) -> None:
        def write(o: dict) -> None:
            labels = o["metadata"].setdefault("labels", {})
            labels.pop(DEFAULT, None) if value is None else labels.__setitem__(DEFAULT, value)

        sim.store.mutate("nodes", "", node, write)

    with _sim(nodes=3) as sim:
        clique = sim.node_cliques["sim-node-0"]
        for node in ("sim-node-1", "sim-node-2"):  # the plugins of two nodes are restarting
            label(sim, node, None)
        with (
            provisioned(sim, workers, unschedulable_grace_s=1.0) as workload,
            pytest.raises(WorkloadFailed) as info,
        ):
            _launch(sim, workload)
        assert f"at most 1 of 3 nodes carry the clique label {DEFAULT}" in str(info.value)
        # Back within the grace: the run places and completes.
        with provisioned(sim, workers, unschedulable_grace_s=30.0) as workload:
            timer = threading.Timer(2.0, label, (sim, "sim-node-1", clique))
            timer.start()
            try:
                outcome = _launch(sim, workload)
            finally:
                timer.join()
            assert outcome.result["kind"] == "quick"  # type: ignore[attr-defined]


def test_kueue_slices_use_a_providers_clique_key(workers) -> None:
    config = KueueConfig(
        local_queues={"team": "cq"},
        quotas={"cq": {"pods": 4}},
        topology_levels=(PROVIDER, HOSTNAME),
    )
    gang = dict(queue_name="team", nodes=4, nodes_per_clique=2, topology_aware=True)
    cluster = _sim(nodes=4, cliques=2, clique_label=PROVIDER, kueue=True, kueue_config=config)
    with cluster as sim, provisioned(sim, workers, clique_label=PROVIDER, **gang) as workload:
        _launch(sim, workload)
        cliques: dict[int, set[str]] = {}
        for pod in sim.store.list("pods")[0]:
            if workload.run_id in str(pod) and pod["spec"].get("nodeName"):
                group = int(pod["metadata"]["labels"][INDEX_LABEL]) // 2
                cliques.setdefault(group, set()).add(sim.node_cliques[pod["spec"]["nodeName"]])
    assert all(len(c) == 1 for c in cliques.values()) and cliques[0] != cliques[1], cliques


def test_an_imex_daemon_that_never_gets_ready_names_the_hosts_imex_service(workers) -> None:
    with (
        SimCluster(nodes=2, local_gpus=[], imex_delay_s=3600) as sim,
        provisioned(sim, workers, pods_running_timeout_s=3) as workload,
        pytest.raises(WaitTimeout) as info,
    ):
        _launch(sim, workload)
    message = str(info.value)
    assert info.value.exit_code == 3
    assert info.value.problem is ProblemKind.IMEX_NOT_READY
    assert "whose IMEX daemon is not Ready in ComputeDomain default/" in message
    assert "NV_ERR_IN_USE" in message and "systemctl disable --now nvidia-imex.service" in message
