"""The TrainJob builder: valid against Kubeflow Trainer's TrainJob CRD (the v2.3-era CRD with
the documented v2.4.0 ``resourceClaimsPerNode`` overlay, see tests/schemas/kubeflow-trainer),
carrying the run's channel claim, GPUs Trainer counts right, clique placement and the run's
labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from mnnvl.cli import main as cli
from mnnvl.contract import env as contract_env
from mnnvl.contract import nccl
from mnnvl.errors import SpecError
from mnnvl.inputs import surface
from mnnvl.inputs.names import LABEL_RUN_ID, RunNames
from mnnvl.inputs.spec import WorkloadSpec, from_inputs
from mnnvl.manifests import TRAIN_MODULE
from mnnvl.manifests.trainjob import take_trainjob, trainjob, trainjob_master_addr
from mnnvl.sim.api import trainer_crd

TRAINER_SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
RUN = "tj-1"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    path = trainer_crd.trainjob_crd_path(TRAINER_SCHEMAS)
    return jsonschema.Draft7Validator(trainer_crd.trainjob_schema(path))


def errors(validator: jsonschema.Draft7Validator, obj: dict[str, Any]) -> list[str]:
    return [e.message for e in validator.iter_errors(obj)]


def pod_patch(tj: dict[str, Any]) -> dict[str, Any]:
    (patch,) = tj["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    return node["template"]["spec"]["template"]


def test_limits_trainjob_validates_and_carries_the_channel_claim_and_gpus(validator):
    workload = WorkloadSpec(run_id=RUN, nodes=4, gpus_per_node=4)
    tj = trainjob(workload, TRAIN_MODULE, ["--steps", "5"])
    assert errors(validator, tj) == []
    names = RunNames.for_run(RUN)
    trainer = tj["spec"]["trainer"]
    assert tj["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 4
    assert trainer["resourceClaimsPerNode"] == [
        {"name": "imex-channel", "resourceClaimTemplateName": names.channel_template}
    ]
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert trainer["command"][:3] == ["python3", "-m", "mnnvl.runtime.launch"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env[contract_env.MASTER_ADDR] == trainjob_master_addr(workload)
    assert (
        env[contract_env.MASTER_ADDR]
        == f"{names.job('train')}-node-0-0.{names.job('train')}.default.svc"
    )
    assert env[contract_env.MASTER_PORT] == "29500"
    # the NCCL contract travels as for the Job
    assert nccl.pod_env(workload.nccl_profile).items() <= env.items()
    assert env[contract_env.NCCL_PROFILE] == workload.nccl_profile
    assert tj["metadata"]["labels"][LABEL_RUN_ID] == RUN


def test_gpus_from_dra_list_the_gpu_claim_first_so_trainer_counts_them(validator):
    workload = from_inputs(WorkloadSpec, run_id=RUN, gpu_mode="claim", gpus_per_node=8)
    tj = trainjob(workload, TRAIN_MODULE, [])
    assert errors(validator, tj) == []
    claims = tj["spec"]["trainer"]["resourceClaimsPerNode"]
    assert [c["name"] for c in claims] == ["gpus", "imex-channel"]
    assert claims[0]["resourceClaimTemplateName"] == RunNames.for_run(RUN).gpu_template
    assert "resourcesPerNode" not in tj["spec"]["trainer"]


def test_pods_are_placed_in_one_clique_one_per_node_with_the_runs_labels(validator):
    workload = from_inputs(
        WorkloadSpec, run_id=RUN, clique_label="example.com/rack", pvc=("data:/data",)
    )
    pod = pod_patch(trainjob(workload, TRAIN_MODULE, []))
    assert pod["metadata"]["labels"][LABEL_RUN_ID] == RUN
    affinity = pod["spec"]["affinity"]
    term = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "example.com/rack"
    (same_clique,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert same_clique["topologyKey"] == "example.com/rack"
    (one_per_node,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert one_per_node["topologyKey"] == "kubernetes.io/hostname"
    assert {"name": "pvc-0", "mountPath": "/data", "readOnly": False} in pod["spec"]["containers"][
        0
    ]["volumeMounts"]


def test_the_claim_field_is_admitted_only_through_the_documented_overlay():
    path = trainer_crd.trainjob_crd_path(TRAINER_SCHEMAS)
    schema = trainer_crd.trainjob_schema(path)
    trainer_props = schema["properties"]["spec"]["properties"]["trainer"]["properties"]
    assert trainer_props["resourceClaimsPerNode"]["description"].startswith("overlay")
    tj = trainjob(WorkloadSpec(run_id=RUN), TRAIN_MODULE, [])
    del trainer_props["resourceClaimsPerNode"]
    found = errors(jsonschema.Draft7Validator(schema), tj)
    assert any("resourceClaimsPerNode" in e for e in found), found


def test_an_unknown_field_is_refused_as_the_api_server_refuses_it(validator):
    tj = trainjob(WorkloadSpec(run_id=RUN), TRAIN_MODULE, [])
    tj["spec"]["trainer"]["numNode"] = 2
    assert any("numNode" in e for e in errors(validator, tj))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nodes": 4, "nodes_per_clique": 2}, "nodes_per_clique"),
        ({"priority_class": "hi"}, "priority_class"),
    ],
)
def test_what_a_trainjob_cannot_carry_is_refused_naming_the_input(change, field):
    with pytest.raises(SpecError) as err:
        from_inputs(WorkloadSpec, run_id=RUN, workload="trainjob", **change)
    assert err.value.field == field
    from_inputs(WorkloadSpec, run_id=RUN, **change)  # the Indexed Job carries it


@pytest.mark.parametrize("change", [{"nodes": 4, "nodes_per_clique": 2}, {"priority_class": "hi"}])
def test_the_pipelines_first_task_refuses_what_a_trainjob_cannot_carry(change):
    """The pipeline's first task, before any object exists, not its train task after the
    domain and the first verification."""
    values = {"workload": "trainjob", **change}
    with pytest.raises(SpecError, match="TrainJob"):
        surface.check_pipeline("mnnvl-training", values)
    surface.check_pipeline("mnnvl-training", change)


def test_render_workload_trainjob_emits_the_domain_and_a_valid_trainjob_for_training(
    validator, capsys
):
    argv = ["render", "--run-id", "tj-r", "--nodes", "2", "--gpus-per-node", "4"]
    assert cli.main([*argv, "--workload", "trainjob"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    train = RunNames.for_run("tj-r").job("train")
    assert kinds[0][0] == "ComputeDomain"
    assert ("TrainJob", train) in kinds
    # the train step is the TrainJob alone: no Job or Service of ours for it
    assert ("Job", train) not in kinds and ("Service", train) not in kinds
    (tj,) = [d for d in docs if d["kind"] == "TrainJob"]
    assert errors(validator, tj) == []
    assert TRAIN_MODULE in tj["spec"]["trainer"]["command"]


TEAMS = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "team-llm", "labels": {"team": "a"}},
    "spec": {
        "runtimeRef": {"name": "team-runtime"},
        "trainer": {
            "image": "team/trainer:1",
            "command": ["torchrun", "train.py"],
            "numNodes": 2,
            "resourceClaimsPerNode": [{"name": "scratch", "resourceClaimTemplateName": "ssd"}],
        },
    },
}


def test_a_teams_trainjob_is_made_the_runs_with_its_claims_labels_and_placement(validator):
    workload = from_inputs(WorkloadSpec, run_id=RUN, nodes=2, gpu_mode="claim", gpus_per_node=4)
    taken = take_trainjob(TEAMS, workload)
    assert errors(validator, taken) == []
    assert taken["metadata"]["name"] == RunNames.for_run(RUN).job("train")
    assert taken["metadata"]["labels"]["team"] == "a"
    assert taken["metadata"]["labels"][LABEL_RUN_ID] == RUN
    trainer = taken["spec"]["trainer"]
    assert [c["name"] for c in trainer["resourceClaimsPerNode"]] == [
        "gpus",
        "imex-channel",
        "scratch",
    ]
    assert trainer["command"] == ["torchrun", "train.py"]  # the team's own
    assert taken["spec"]["runtimeRef"] == {"name": "team-runtime"}
    assert pod_patch(taken)["spec"]["affinity"]["podAffinity"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"kind": "Job"}, "not a TrainJob"),
        ({"spec": {"trainer": {"numNodes": 3}, "runtimeRef": {"name": "r"}}}, "numNodes 3"),
        ({"spec": {"trainer": {}}}, "spec.runtimeRef.name"),
        ({"spec": {"runtimeRef": {"name": "r"}}}, "names no trainer: set spec.trainer"),
        ({"apiVersion": "trainer.kubeflow.org/v1"}, "apiVersion trainer.kubeflow.org/v1alpha1"),
    ],
)
def test_a_file_that_is_not_a_trainjob_of_the_runs_shape_is_refused(change, words):
    with pytest.raises(SpecError) as err:
        take_trainjob({**TEAMS, **change}, WorkloadSpec(run_id=RUN, nodes=2))
    assert err.value.field == "trainjob_file" and words in str(err.value)


def test_render_with_a_teams_trainjob_file_prints_it_as_the_run_takes_it(
    validator, capsys, tmp_path
):
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump(TEAMS))
    argv = ["render", "--run-id", "tj-own-r", "--nodes", "2", "--gpus-per-node", "4"]
    assert cli.main([*argv, "--trainjob-file", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    train = RunNames.for_run("tj-own-r").job("train")
    (tj,) = [d for d in docs if d["kind"] == "TrainJob"]
    assert tj["metadata"]["name"] == train and ("Job", train) not in [
        (d["kind"], d["metadata"]["name"]) for d in docs
    ]
    assert errors(validator, tj) == []
    assert tj["spec"]["trainer"]["command"] == ["torchrun", "train.py"]  # the team's program
    assert tj["metadata"]["labels"]["team"] == "a" and tj["metadata"]["labels"][LABEL_RUN_ID]
    claims = [c["name"] for c in tj["spec"]["trainer"]["resourceClaimsPerNode"]]
    assert "scratch" in claims and len(claims) >= 2  # the run's channel claim beside the team's


@pytest.mark.parametrize(
    ("kind", "kubectl"),
    [
        ("ClusterTrainingRuntime", "kubectl get clustertrainingruntime rt -o yaml"),
        ("TrainingRuntime", "kubectl get trainingruntime rt -n team -o yaml"),
    ],
)
def test_a_failed_trainjobs_message_points_at_the_runtime_it_names(kind: str, kubectl: str) -> None:
    from mnnvl.driver.trainjob_run import Runtime

    class NoApi:  # any runtime read has maxRestarts 3; a namespaced one is not read (no grant)
        def get(self, *_: Any) -> dict[str, Any]:
            return {"spec": {"template": {"spec": {"failurePolicy": {"maxRestarts": 3}}}}}

    runtime = Runtime(kind, "rt", "team")
    assert runtime.kubectl == kubectl
    allows = runtime.max_restarts(NoApi())  # type: ignore[arg-type]
    assert allows == (
        "the runtime allows 3"
        if kind == "ClusterTrainingRuntime"
        else f"its JobSet failurePolicy.maxRestarts is in `{kubectl}`"
    )
