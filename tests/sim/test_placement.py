"""Placement across NVLink cliques under a scheduler that breaks ties at random.

The simulated scheduler scores nodes and breaks ties from a seed, as kube-scheduler does at
random, so the first pod of a clique group may land in any clique. Each test names the seed it
used in its failure message (``SimCluster(scheduler_seed=...)`` or ``MNNVL_SIM_SEED`` replays it).
Most seeds run against the scheduler alone (``placement_harness``); a few run whole steps.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from mnnvl import steps
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import LABEL_CLIQUE_GROUP, RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs, with_inputs
from mnnvl.manifests import indexed_jobs
from mnnvl.sim import SimCluster
from mnnvl.sim.api.store import Store
from tests.sim.placement_harness import CLIQUE, add_pods, cluster, schedule
from tests.sim.simkit import ALL_RUNNING

TWO_BY_TWO = from_inputs(WorkloadSpec, run_id="race", nodes=4, nodes_per_clique=2, gpus_per_node=0)
# Every pod stays Running until all of them run (as a rendezvous would hold them), so all of
# them compete for nodes at once and none frees its node for another before the run is placed.
PRINT_RANK = "import os; print('NODE_RANK', os.environ['NODE_RANK'], flush=True)\n" + ALL_RUNNING


def _cliques(store: Store) -> dict[str, str]:
    """node -> its clique."""
    return {n["metadata"]["name"]: n["metadata"]["labels"][CLIQUE] for n in store.list("nodes")[0]}


def _groups_by_clique(store: Store, placed: dict[str, str]) -> dict[str, set[str]]:
    """clique group -> the cliques its pods were placed in."""
    cliques = _cliques(store)
    groups: dict[str, set[str]] = {}
    for pod in store.list("pods")[0]:
        name = pod["metadata"]["name"]
        if name in placed:
            group = pod["metadata"]["labels"][LABEL_CLIQUE_GROUP]
            groups.setdefault(group, set()).add(cliques[placed[name]])
    return groups


def _without_group_anti_affinity(workload: WorkloadSpec) -> list[dict]:
    """The Jobs as they were before groups kept apart: hostname anti-affinity only."""
    jobs = indexed_jobs(workload, "mnnvl.runtime.verify", [])
    for job in jobs:
        anti = job["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        terms = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        anti["requiredDuringSchedulingIgnoredDuringExecution"] = [
            t for t in terms if t["topologyKey"] != CLIQUE
        ]
    return jobs


# ---- the scheduler alone, many seeds --------------------------------------------------------


def test_two_groups_on_two_cliques_of_two_place_one_group_per_clique_for_50_seeds() -> None:
    for seed in range(50):
        store, scheduler = cluster([2, 2], seed)
        add_pods(store, TWO_BY_TWO)
        placed = schedule(store, scheduler)
        assert len(placed) == 4, f"seed {seed}: only {sorted(placed.items())} placed"
        groups = _groups_by_clique(store, placed)
        assert all(len(c) == 1 for c in groups.values()), f"seed {seed}: {groups}"
        assert groups["0"] != groups["1"], f"seed {seed}: both groups in {groups['0']}"


def test_seeded_scheduler_reproduces_the_co_placement_deadlock_without_group_anti_affinity() -> (
    None
):
    """With only the hostname anti-affinity between groups (the rule before), the first pod
    of group 1 may take a node in group 0's clique: then neither group can finish. Among 50
    seeds some do that (seed 0 does with today's scoring), as on a real scheduler."""
    stuck = []
    for seed in range(50):
        store, scheduler = cluster([2, 2], seed)
        add_pods(store, TWO_BY_TWO, _without_group_anti_affinity(TWO_BY_TWO))
        placed = schedule(store, scheduler)
        if len(placed) < 4:
            stuck.append(seed)
            groups = _groups_by_clique(store, placed)
            assert groups["0"] == groups["1"], f"seed {seed}: {groups}"  # both in one clique
            pending = [p for p in store.list("pods")[0] if not p["spec"].get("nodeName")]
            message = pending[0]["status"]["conditions"][-1]["message"]
            assert "didn't match pod affinity rules" in message, f"seed {seed}: {message}"
    assert 0 < len(stuck) < 50, f"deadlocked seeds: {stuck}"


def test_first_pod_of_a_group_lands_in_either_clique_depending_on_the_seed() -> None:
    first_cliques: set[str] = set()
    for seed in range(20):
        store, scheduler = cluster([2, 2], seed)
        add_pods(store, with_inputs(TWO_BY_TWO, nodes=2, nodes_per_clique=0))
        placed = schedule(store, scheduler)
        assert len(placed) == 2, f"seed {seed}: {placed}"
        cliques = {_cliques(store)[node] for node in placed.values()}
        assert len(cliques) == 1, f"seed {seed}: {placed}"
        first_cliques |= cliques
    assert first_cliques == {"c0", "c1"}  # first fit by node name would always pick c0


def test_four_nodes_in_groups_of_two_place_on_three_cliques_of_two_for_every_seed() -> None:
    for seed in range(30):
        store, scheduler = cluster([2, 2, 2], seed)
        add_pods(store, TWO_BY_TWO)
        placed = schedule(store, scheduler)
        assert len(placed) == 4, f"seed {seed}: only {sorted(placed.items())} placed"
        groups = _groups_by_clique(store, placed)
        assert all(len(c) == 1 for c in groups.values()) and groups["0"] != groups["1"], (
            f"seed {seed}: {groups}"
        )


def test_taint_without_toleration_keeps_pods_off_the_node_and_a_toleration_lets_them_on() -> None:
    one = WorkloadSpec(run_id="taint", nodes=2, gpus_per_node=0)
    for tolerations, expect_bound in (((), 1), (("dedicated=mnnvl:NoSchedule",), 2)):
        store, scheduler = cluster([3], seed=1)
        for node in ("node-0", "node-1"):
            taint = {"key": "dedicated", "value": "mnnvl", "effect": "NoSchedule"}
            store.mutate("nodes", "", node, lambda o, t=taint: o["spec"].update(taints=[t]))
        add_pods(store, with_inputs(one, tolerations=tolerations))
        placed = schedule(store, scheduler)
        assert len(placed) == expect_bound, (tolerations, placed)
        if not tolerations:
            assert set(placed.values()) == {"node-2"}
            pending = [p for p in store.list("pods")[0] if not p["spec"].get("nodeName")]
            message = pending[0]["status"]["conditions"][-1]["message"]
            assert "2 node(s) had untolerated taint {dedicated: mnnvl}" in message


# ---- whole steps on the simulated cluster ----------------------------------------------------


@pytest.fixture
def run_id() -> Iterator[str]:
    yield f"p-{uuid.uuid4().hex[:8]}"


def _launch(sim: SimCluster, workload: WorkloadSpec) -> dict[str, str]:
    """Provision, launch a program that prints its NODE_RANK on every pod, tear down;
    pod name -> (node, printed NODE_RANK)."""
    kube = sim.kubeconfig_path
    domain = DomainSpec(run_id=workload.run_id, delete_timeout_s=30)
    steps.provision(domain, kubeconfig=kube)
    barrier = tempfile.mkdtemp(prefix="placement-")
    env = {"BARRIER": barrier, "PODS": str(workload.nodes)}
    workload = dataclasses.replace(workload, env={**workload.env, **env})
    try:
        steps.launch(workload, "", [sys.executable, "-c", PRINT_RANK], kubeconfig=kube)
        core = client.CoreV1Api(
            config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        )
        selector = RunNames.for_run(workload.run_id).selector
        pods = core.list_namespaced_pod("default", label_selector=selector).items
        return {p.metadata.name: sim.pod_log("default", p.metadata.name) for p in pods}
    finally:
        steps.teardown(domain, kubeconfig=kube)
        shutil.rmtree(barrier)
        assert sim.objects(RunNames.for_run(workload.run_id).selector) == []


@pytest.mark.parametrize("seed", [0, 3, 7])  # seeds whose draws deadlock the old rule
def test_custom_command_across_two_cliques_places_and_gets_its_node_rank(
    run_id: str, seed: int
) -> None:
    workload = dataclasses.replace(TWO_BY_TWO, run_id=run_id, purpose="job")
    with SimCluster(nodes=4, cliques=2, local_gpus=[], scheduler_seed=seed) as sim:
        logs = _launch(sim, workload)
    ranks = sorted(int(log.split("NODE_RANK")[1].split()[0]) for log in logs.values())
    assert ranks == [0, 1, 2, 3], f"seed {seed}: {logs}"


def test_four_nodes_in_groups_of_two_succeed_on_three_cliques_of_two(run_id: str) -> None:
    workload = dataclasses.replace(TWO_BY_TWO, run_id=run_id, purpose="job")
    with SimCluster(nodes=6, cliques=3, local_gpus=[]) as sim:
        logs = _launch(sim, workload)
        seed = sim.scheduler_seed
    assert len(logs) == 4, f"seed {seed}: {logs}"


def test_groups_of_three_on_cliques_of_two_fail_within_the_grace_naming_the_missing_clique(
    run_id: str,
) -> None:
    workload = from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="job",
        nodes=6,
        nodes_per_clique=3,
        gpus_per_node=0,
        unschedulable_grace_s=2.0,
        pods_running_timeout_s=120,
    )
    with SimCluster(nodes=4, cliques=2, local_gpus=[]) as sim:
        start = time.monotonic()
        with pytest.raises(WorkloadFailed) as info:
            _launch(sim, workload)
        elapsed, seed = time.monotonic() - start, sim.scheduler_seed
    message = str(info.value)
    assert info.value.exit_code == 4, f"seed {seed}: {message}"
    assert elapsed < 60, f"seed {seed}: failed after {elapsed:.0f} s, not within the grace"
    assert message.startswith("no NVLink clique with 3 free nodes for group g"), message
    assert "; cliques seen: " in message and "on 2 node(s)" in message, message
    assert "Unschedulable for more than 2 s" in message, message


def test_when_no_node_has_the_gpus_at_all_the_schedulers_reason_leads_not_the_cliques(
    run_id: str,
) -> None:
    workload = from_inputs(WorkloadSpec,
        run_id=run_id, purpose="job", nodes=4, nodes_per_clique=2, gpus_per_node=4,
        unschedulable_grace_s=1.0, pods_running_timeout_s=120,
    )  # fmt: skip
    with SimCluster(nodes=4, cliques=2, gpus_per_node=2, local_gpus=[]) as sim:
        with pytest.raises(WorkloadFailed) as info:
            _launch(sim, workload)
        seed = sim.scheduler_seed
    message = str(info.value)
    assert info.value.exit_code == 4, f"seed {seed}: {message}"
    first = message.split("; ")[0]
    assert "Unschedulable for more than 1 s: 0/4 nodes are available: 4 Insufficient " in first
    assert "no NVLink clique with 2 free nodes" in message  # still said, after the reason
    assert message.index("Insufficient") < message.index("no NVLink clique"), message
