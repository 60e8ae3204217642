"""Placement across several NVLink cliques: one Indexed Job per clique group, one Service."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from mnnvl.errors import SpecError
from mnnvl.inputs.defaults import MAX_GROUPS
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, VerifyConfig, WorkloadSpec, from_inputs
from mnnvl.manifests import TRAIN_MODULE, headless_service, indexed_jobs, render_run
from mnnvl.runtime.launch import with_node_rank
from tests.unit.test_manifests import crd_errors, crd_validators, k8s_valid  # noqa: F401

RUN = "Run_42.nightly"
GROUPED = from_inputs(WorkloadSpec, run_id=RUN, nodes=6, nodes_per_clique=2, gpus_per_node=4)


def _env(job: dict[str, Any]) -> dict[str, str]:
    (ctr,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in ctr["env"] if "value" in e}


def test_one_job_per_group_each_with_its_share_of_the_nodes_and_one_rendezvous() -> None:
    jobs = indexed_jobs(GROUPED, TRAIN_MODULE, [])
    names = RunNames.for_run(RUN)
    assert [j["metadata"]["name"] for j in jobs] == [names.job("train", g) for g in range(3)]
    assert all(j["spec"]["completions"] == j["spec"]["parallelism"] == 2 for j in jobs)
    master = f"{names.job('train', 0)}-0.{names.service('train')}.default.svc"
    for g, job in enumerate(jobs):
        env = _env(job)
        assert env["MASTER_ADDR"] == master and env["NNODES"] == "6"
        assert env["MNNVL_NUM_GROUPS"] == "3" and env["MNNVL_GROUP_INDEX"] == str(g)
        assert env["MNNVL_NODES_PER_GROUP"] == "2" and env["MNNVL_NODE_RANK_BASE"] == str(2 * g)
        assert job["metadata"]["labels"]["mnnvl.io/clique-group"] == str(g)
        (ctr,) = job["spec"]["template"]["spec"]["containers"]
        assert ctr["command"][:3] == ["python3", "-m", "mnnvl.runtime.launch"]
        assert not any(a.startswith("--node-rank") for a in ctr["command"])


def test_each_group_sits_in_one_clique_of_its_own_and_no_two_groups_share_a_node() -> None:
    jobs = indexed_jobs(GROUPED, TRAIN_MODULE, [])
    step = {"mnnvl.io/run-id": RUN, "app.kubernetes.io/component": "train"}
    for g, job in enumerate(jobs):
        aff = job["spec"]["template"]["spec"]["affinity"]
        (together,) = aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert together["topologyKey"] == "nvidia.com/gpu.clique"
        own = {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
        assert together["labelSelector"] == {"matchLabels": own}
        apart, other_cliques = aff["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert apart == {
            "labelSelector": {"matchLabels": step},
            "topologyKey": "kubernetes.io/hostname",
        }
        others = {"key": "mnnvl.io/clique-group", "operator": "NotIn", "values": [str(g)]}
        assert other_cliques == {
            "labelSelector": {"matchLabels": step, "matchExpressions": [others]},
            "topologyKey": "nvidia.com/gpu.clique",
        }
        # every pod of every group carries the labels the anti-affinity and the Service select
        assert step.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert headless_service(GROUPED)["spec"]["selector"] == step


def test_one_group_keeps_the_single_job_manifests() -> None:
    one = WorkloadSpec(run_id=RUN, nodes=4, gpus_per_node=4)
    same = from_inputs(WorkloadSpec, run_id=RUN, nodes=4, nodes_per_clique=4, gpus_per_node=4)
    assert indexed_jobs(one, TRAIN_MODULE, []) == indexed_jobs(same, TRAIN_MODULE, [])
    (job,) = indexed_jobs(one, TRAIN_MODULE, [])
    assert job["metadata"]["name"] == RunNames.for_run(RUN).job("train")
    assert "MNNVL_NUM_GROUPS" not in _env(job)


def test_render_144_nodes_in_8_cliques_validates_against_kubernetes_and_both_crds(
    crd_validators: dict[str, Any],  # noqa: F811
) -> None:
    workload = from_inputs(
        WorkloadSpec, run_id=RUN, nodes=144, nodes_per_clique=18, gpus_per_node=4
    )
    objs = render_run(DomainSpec(run_id=RUN), workload, TrainConfig(), VerifyConfig())
    kinds = [o["kind"] for o in objs]
    assert kinds == ["ComputeDomain", "Service", *["Job"] * 8, "Service", *["Job"] * 8]
    for validator in crd_validators.values():
        assert crd_errors(validator, objs[0]) == []
    for obj in objs[1:]:
        k8s_valid(obj)
    assert sum(o["spec"]["completions"] for o in objs if o["kind"] == "Job") == 2 * 144


def test_cli_render_of_144_nodes_writes_8_jobs_a_step_each_group_in_a_clique_of_its_own() -> None:
    cmd = [sys.executable, "-m", "mnnvl", "render", "--run-id", "big", "--nodes", "144"]
    cmd += ["--nodes-per-clique", "18", "--gpus-per-node", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))  # stdout is pure YAML
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(jobs) == 24  # verify-pre, train, verify-post: 8 groups each
    names = [d["metadata"]["name"] for d in docs if d["kind"] != "Service"]
    assert len(set(names)) == len(names) == 25 and max(map(len, names)) <= 63
    for job in jobs:  # the placement rule: one clique per group, no two groups in one clique
        group = job["metadata"]["labels"]["mnnvl.io/clique-group"]
        aff = job["spec"]["template"]["spec"]["affinity"]
        (together,) = aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert together["topologyKey"] == "nvidia.com/gpu.clique"
        assert together["labelSelector"]["matchLabels"] == {
            "batch.kubernetes.io/job-name": job["metadata"]["name"]
        }
        apart = aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (other_groups,) = [t for t in apart if t["topologyKey"] == "nvidia.com/gpu.clique"]
        assert other_groups["labelSelector"]["matchExpressions"] == [
            {"key": "mnnvl.io/clique-group", "operator": "NotIn", "values": [group]}
        ]
        assert other_groups["labelSelector"]["matchLabels"]["mnnvl.io/run-id"] == "big"
        assert [t["topologyKey"] for t in apart].count("kubernetes.io/hostname") == 1


@pytest.mark.parametrize("group", [0, 9, MAX_GROUPS - 1])
def test_names_stay_dns_labels_for_any_group_count(group: int) -> None:
    names = RunNames.for_run("r" * 63)
    host = f"{names.job('verify-post', group)}-98"  # the largest pod index (99 nodes)
    assert len(host) <= 63
    with pytest.raises(SpecError, match="group"):
        names.job("train", MAX_GROUPS)


def test_clique_groups_under_kueue_are_one_job_sliced_one_group_per_clique() -> None:
    workload = from_inputs(
        WorkloadSpec, run_id=RUN, nodes=4, nodes_per_clique=2, queue_name="gpu", topology_aware=True
    )
    (job,) = indexed_jobs(workload, TRAIN_MODULE, [])  # one Kueue Workload: all or nothing
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-slice-required-topology": "nvidia.com/gpu.clique",
        "kueue.x-k8s.io/podset-slice-size": "2",
    }
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    # Kueue's slices choose the cliques: no pod affinity would pull both groups into one.
    assert "podAffinity" not in template["spec"]["affinity"]
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert (env["MNNVL_NUM_GROUPS"], env["MNNVL_NODES_PER_GROUP"]) == ("2", "2")
    assert "MNNVL_NODE_RANK_BASE" not in env  # node rank = completion index in one Job
    assert env["MASTER_ADDR"].startswith(f"{job['metadata']['name']}-0.")
    k8s_valid(job)


def test_group_launcher_adds_the_groups_first_node_rank_to_the_index() -> None:
    env = {"MNNVL_NODE_RANK_BASE": "4", "JOB_COMPLETION_INDEX": "1"}
    assert with_node_rank(["--nnodes=6", "-m", "x"], env) == [
        "--node-rank=5",
        "--nnodes=6",
        "-m",
        "x",
    ]
    assert with_node_rank(["--node-rank=0", "-m", "x"], {}) == ["--node-rank=0", "-m", "x"]
    with pytest.raises(SpecError, match="JOB_COMPLETION_INDEX"):
        with_node_rank(["-m", "x"], {"MNNVL_NODE_RANK_BASE": "4"})


def test_custom_command_across_groups_runs_through_the_launchers_exec_verbatim() -> None:
    jobs = indexed_jobs(GROUPED, "", ["/opt/app/run", "--tag=$HOME"])
    for job in jobs:
        (ctr,) = job["spec"]["template"]["spec"]["containers"]
        assert ctr["command"] == [
            "python3",
            "-m",
            "mnnvl.runtime.launch",
            "--exec",
            "--",
            "/opt/app/run",
            "--tag=$$HOME",
        ]


def test_launcher_exec_gives_a_group_pod_its_node_rank_and_becomes_the_program() -> None:
    code = "import os, sys; print(os.environ['NODE_RANK'], sys.argv[1:]); sys.exit(7)"
    env = {"MNNVL_NODE_RANK_BASE": "4", "JOB_COMPLETION_INDEX": "1", "NODE_RANK": "1"}
    cmd = [sys.executable, "-m", "mnnvl.runtime.launch", "--exec", "--"]
    proc = subprocess.run(
        [*cmd, sys.executable, "-c", code, "a b"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (7, "5 ['a b']\n"), proc.stderr
    missing = subprocess.run(
        [*cmd, "/no/such/program"], capture_output=True, text=True, timeout=60, check=False
    )
    assert missing.returncode == 127 and "cannot run '/no/such/program'" in missing.stderr


def test_a_providers_clique_label_is_what_placement_kueue_and_the_workers_use() -> None:
    key = "cloud.example.com/nvlink-domain"
    grouped = from_inputs(WorkloadSpec, run_id=RUN, nodes=4, nodes_per_clique=2, clique_label=key)
    for g, job in enumerate(indexed_jobs(grouped, TRAIN_MODULE, [])):
        affinity = job["spec"]["template"]["spec"]["affinity"]
        (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert term["matchExpressions"] == [{"key": key, "operator": "Exists"}]
        (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        apart = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert together["topologyKey"] == key
        assert [t["topologyKey"] for t in apart] == ["kubernetes.io/hostname", key]
        assert _env(job)["MNNVL_CLIQUE_LABEL"] == key
        assert "nvidia.com/gpu.clique" not in str(job), g
    sliced = from_inputs(
        WorkloadSpec,
        run_id=RUN,
        nodes=4,
        nodes_per_clique=2,
        queue_name="q",
        topology_aware=True,
        clique_label=key,
    )
    (job,) = indexed_jobs(sliced, TRAIN_MODULE, [])
    notes = job["spec"]["template"]["metadata"]["annotations"]
    assert notes["kueue.x-k8s.io/podset-slice-required-topology"] == key
    whole = from_inputs(
        WorkloadSpec, run_id=RUN, nodes=2, queue_name="q", topology_aware=True, clique_label=key
    )
    (job,) = indexed_jobs(whole, TRAIN_MODULE, [])
    notes = job["spec"]["template"]["metadata"]["annotations"]
    assert notes == {"kueue.x-k8s.io/podset-required-topology": key}
    k8s_valid(job)


@pytest.mark.parametrize("bad", ["", "nvidia.com/", "-clique", "a/b/c", "x" * 64])
def test_a_clique_label_that_is_no_label_key_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(SpecError, match="clique_label"):
        from_inputs(WorkloadSpec, run_id=RUN, clique_label=bad)
