"""Runs where the host runs IMEX (``resources.computeDomains.imex.mode: hostManaged``).

The driver then makes only the channel template (always ``Single``), marks the domain Ready at
once, and runs no IMEX daemon, labels no node and reports no ``status.nodes``; a node without a
clique ID gets its channel claim prepared with no channel device.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from mnnvl import steps
from mnnvl.errors import SpecError, VerificationFailed, WaitTimeout
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, VerifyConfig, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from mnnvl.sim.nvidia.dra import LABEL_CD, LABEL_CLIQUE
from tests.sim.simkit import assert_nothing_left

SIM = dict(nodes=2, imex_mode="hostManaged")
VERIFY = VerifyConfig(max_bytes=64 << 10, min_busbw_gbps=1e-6)


@contextmanager
def _domain(sim: SimCluster, **spec: object) -> Iterator[DomainSpec]:
    domain = DomainSpec(run_id=f"hm-{uuid.uuid4().hex[:10]}", delete_timeout_s=30, **spec)
    try:
        yield domain
    finally:
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
        assert_nothing_left(sim, RunNames.for_run(domain.run_id).selector)


def _verify_workload(domain: DomainSpec, **spec: object) -> WorkloadSpec:
    fields: dict[str, object] = dict(purpose="verify", nodes=2, gpus_per_node=0, job_timeout_s=120)
    return from_inputs(WorkloadSpec, run_id=domain.run_id, **{**fields, **spec})  # type: ignore[arg-type]


@contextmanager
def _without_clique(sim: SimCluster, node: str) -> Iterator[None]:
    """The node's GPUs report no clique ID (NVML), and so it carries no clique label."""
    clique = sim.node_cliques.pop(node)
    sim.store.mutate("nodes", "", node, lambda o: o["metadata"]["labels"].pop(LABEL_CLIQUE))
    try:
        yield
    finally:
        sim.node_cliques[node] = clique
        sim.store.mutate(
            "nodes", "", node, lambda o: o["metadata"]["labels"].__setitem__(LABEL_CLIQUE, clique)
        )


@pytest.mark.slow
def test_a_verify_run_passes_with_a_domain_ready_at_once_and_no_daemons_or_labels(sim):
    labelled: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            labelled.update(
                n["metadata"]["name"]
                for n in sim.store.list("nodes")[0]
                if LABEL_CD in n["metadata"].get("labels", {})
            )

    with _domain(sim) as domain:
        steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        cd = sim.store.get("computedomains", "default", RunNames.for_run(domain.run_id).domain)
        assert cd["status"] == {"status": "Ready"}
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            result = steps.verify(_verify_workload(domain), VERIFY, kubeconfig=sim.kubeconfig_path)
        finally:
            done.set()
            watcher.join()
        assert result.verdict == "PASS"
        cd = sim.store.get("computedomains", "default", RunNames.for_run(domain.run_id).domain)
        assert cd["status"] == {"status": "Ready"}
    assert labelled == set()


def test_allocation_mode_all_is_refused_at_provision_and_nothing_is_left(sim):
    with _domain(sim, allocation_mode="All") as domain:
        with pytest.raises(SpecError) as info:
            steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        assert sim.objects(RunNames.for_run(domain.run_id).selector) == []
    message = str(info.value)
    assert info.value.exit_code == 2 and message.startswith("allocation_mode: All is not served")
    assert "hostManaged" in message and "--allocation-mode Single" in message


@pytest.mark.slow
@pytest.mark.parametrize("imex_mode", ["hostManaged", "daemons"])
def test_verify_fails_naming_the_pod_and_node_that_got_no_channel_device(sim, imex_mode):
    cluster = sim if imex_mode == "hostManaged" else SimCluster(nodes=2).start()
    try:
        with _without_clique(cluster, "sim-node-1"), _domain(cluster) as domain:
            steps.provision(domain, kubeconfig=cluster.kubeconfig_path)
            workload = _verify_workload(domain, clique_affinity=False)
            with pytest.raises(VerificationFailed) as info:
                steps.verify(workload, VERIFY, kubeconfig=cluster.kubeconfig_path)
    finally:
        if cluster is not sim:
            cluster.stop()
    pod = RunNames.for_run(domain.run_id).job("verify")
    message = str(info.value)
    assert f"pod {pod}-" in message
    assert "on node sim-node-1 has no IMEX channel device in /dev/nvidia-caps-imex-channels" in (
        message
    )


def test_a_host_imex_service_that_is_not_ready_is_named_and_no_daemon_is(sim):
    sim.faults.host_imex_down.add("sim-node-0")
    try:
        with _domain(sim) as domain:
            steps.provision(domain, kubeconfig=sim.kubeconfig_path)
            workload = _verify_workload(domain, purpose="job", pods_running_timeout_s=2)
            with pytest.raises(WaitTimeout) as info:
                steps.launch(workload, "", ["true"], kubeconfig=sim.kubeconfig_path)
    finally:
        sim.faults.host_imex_down.clear()
    message = str(info.value)
    assert "the host's nvidia-imex service on node sim-node-0 is not ready" in message
    assert "IMEX daemon on" not in message and "status.nodes)" not in message
