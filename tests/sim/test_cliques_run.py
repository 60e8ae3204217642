"""A run across two NVLink cliques on the simulated cluster: one Job per group, HSDP, per-clique
verify, and a teardown that leaves nothing behind."""

from __future__ import annotations

import kubernetes
import pytest

from mnnvl import steps
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, VerifyConfig, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster

RUN = "two-cliques"
CLIQUE = "nvidia.com/gpu.clique"

pytestmark = pytest.mark.slow


def test_two_clique_groups_train_hsdp_and_verify_per_clique_then_leave_nothing() -> None:
    domain = DomainSpec(run_id=RUN)
    workload = from_inputs(WorkloadSpec, run_id=RUN, nodes=4, nodes_per_clique=2, gpus_per_node=0)
    with SimCluster(nodes=4, cliques=2) as sim:
        kube = sim.kubeconfig_path
        steps.provision(domain, kubeconfig=kube)
        trained = steps.train(
            workload, TrainConfig(steps=4, warmup_steps=2, log_every=2), kubeconfig=kube
        )
        verified = steps.verify(
            workload, VerifyConfig(max_bytes=64 << 10, allow_unjudged=True), kubeconfig=kube
        )
        api = kubernetes.client.CoreV1Api(
            kubernetes.config.new_client_from_config(sim.admin_kubeconfig_path)
        )
        cliques = {n.metadata.name: n.metadata.labels[CLIQUE] for n in api.list_node().items}
        pods = api.list_namespaced_pod("default", label_selector=RunNames.for_run(RUN).selector)
        steps.teardown(domain, kubeconfig=kube)
        leftover = sim.objects(RunNames.for_run(RUN).selector)
    assert trained.raw["mesh"] == {
        "shape": [2, 2],
        "dims": ["replicate", "shard"],
        "groups": 2,
        "sharding": "HSDP",
    }
    placed: dict[tuple[str, str], set[str]] = {}
    for pod in pods.items:
        labels = pod.metadata.labels
        key = (labels["app.kubernetes.io/component"], labels["mnnvl.io/clique-group"])
        placed.setdefault(key, set()).add(pod.spec.node_name)
    assert sorted(placed) == [("train", "0"), ("train", "1"), ("verify", "0"), ("verify", "1")]
    for nodes in placed.values():
        assert len(nodes) == 2 and len({cliques[n] for n in nodes}) == 1  # one clique per group
    assert placed[("train", "0")].isdisjoint(placed[("train", "1")])  # groups share no node
    raw = verified.raw
    assert [c["group"] for c in raw["cliques"]] == [0, 1]
    assert {c["verdict"] for c in raw["cliques"]} == {"NOT_JUDGED"}
    assert raw["worst_clique"]["group"] in (0, 1)
    assert leftover == []
