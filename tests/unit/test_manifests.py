"""Builders: valid against the real schemas (both ComputeDomain CRDs, Kubernetes 1.34 strict)
and shaped the way MNNVL needs (channel claim, one pod per node, one clique, safe NCCL env)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from mnnvl import manifests
from mnnvl.contract import env as contract_env
from mnnvl.errors import SpecError
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import (
    DomainSpec,
    OwnerRef,
    TrainConfig,
    VerifyConfig,
    WorkloadSpec,
    from_inputs,
    with_inputs,
)
from mnnvl.manifests import (
    CHANNEL_CLAIM,
    CLIQUE_LABEL,
    GPU_CLAIM,
    JOB_NAME_LABEL,
    RUNTIME_UID,
    compute_domain,
    gpu_claim_template,
    headless_service,
    indexed_job,
    render_run,
    step_workload,
)
from mnnvl.sim.policy.podsecurity import ENFORCE_LABEL, violation
from mnnvl.yaml_stream import to_yaml

K8S = "1.34.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_PATHS = {
    "v25.12.0": "nvidia-dra-driver/crds/resource.nvidia.com_computedomains.yaml",
    "v0.4.0": "nvidia-dra-driver/v0.4.0/crds/resource.nvidia.com_computedomains.yaml",
}
OWNER = OwnerRef(api_version="argoproj.io/v1alpha1", kind="Workflow", name="wf", uid="u-1")
RUN = "Run_42.nightly"

WORKLOADS = {
    "limits": WorkloadSpec(run_id=RUN),
    "claim": from_inputs(WorkloadSpec, run_id=RUN, gpu_mode="claim", gpus_per_node=8, owner=OWNER),
    "cpu-only": from_inputs(
        WorkloadSpec, run_id=RUN, gpus_per_node=0, nodes=1, clique_affinity=False
    ),
    "claim-no-gpus": from_inputs(WorkloadSpec, run_id=RUN, gpu_mode="claim", gpus_per_node=0),
    "full-rack": from_inputs(
        WorkloadSpec,
        run_id="r" * 63,
        namespace="n" * 63,
        purpose="verify-post",
        nodes=18,
        gpus_per_node=4,
        nccl_profile="verify-strict",
        worker_service_account="mnnvl-worker",
        env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"},
        max_restarts=5,
        job_timeout_s=90.7,
    ),
}


def strict_crd_schema(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, like the API server's strict validation."""
    schema = copy.deepcopy(schema)

    def tighten(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    return schema


@pytest.fixture(scope="module")
def crd_validators(schema_dir: Path) -> dict[str, jsonschema.protocols.Validator]:
    validators = {}
    for version, rel in CRD_PATHS.items():
        crd = yaml.safe_load((schema_dir / rel).read_text())
        assert crd["spec"]["names"]["kind"] == "ComputeDomain"
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
        schema = strict_crd_schema(served["schema"]["openAPIV3Schema"])
        jsonschema.Draft7Validator.check_schema(schema)
        validators[version] = jsonschema.Draft7Validator(schema)
    return validators


def crd_errors(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[str]:
    return [e.message for e in validator.iter_errors(obj)]


def k8s_valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S, strict=True)


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def worker(job: dict[str, Any]) -> dict[str, Any]:
    (ctr,) = pod_spec(job)["containers"]
    assert ctr["name"] == "worker"
    return dict(ctr)


def env_of(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in worker(job)["env"] if "value" in e}


def train_job(workload: WorkloadSpec, cfg: TrainConfig | None = None) -> dict[str, Any]:
    from mnnvl.inputs.flags import to_args

    return indexed_job(workload, manifests.TRAIN_MODULE, to_args(cfg or TrainConfig()))


# ---- ComputeDomain against both CRDs ---------------------------------------------------


@pytest.mark.parametrize("crd", list(CRD_PATHS))
@pytest.mark.parametrize("mode", ["Single", "All"])
@pytest.mark.parametrize("owner", [None, OWNER])
def test_compute_domain_validates_against_both_crds(
    crd_validators: dict[str, Any], crd: str, mode: str, owner: OwnerRef | None
) -> None:
    cd = compute_domain(DomainSpec(run_id=RUN, namespace="team", allocation_mode=mode, owner=owner))
    assert crd_errors(crd_validators[crd], cd) == []
    assert cd["apiVersion"] == "resource.nvidia.com/v1beta1" and cd["kind"] == "ComputeDomain"


def test_compute_domain_names_the_runs_channel_template_with_num_nodes_zero() -> None:
    names = RunNames.for_run(RUN)
    cd = compute_domain(DomainSpec(run_id=RUN, namespace="team"))
    assert cd["metadata"]["name"] == names.domain
    assert cd["metadata"]["namespace"] == "team"
    assert cd["metadata"]["labels"] == names.labels("compute-domain")
    assert "ownerReferences" not in cd["metadata"]
    assert cd["spec"] == {
        "numNodes": 0,
        "channel": {
            "resourceClaimTemplate": {"name": names.channel_template},
            "allocationMode": "Single",
        },
    }


def test_compute_domain_owner_reference_neither_controls_nor_blocks_deletion() -> None:
    cd = compute_domain(DomainSpec(run_id=RUN, owner=OWNER))
    assert cd["metadata"]["ownerReferences"] == [
        {
            "apiVersion": OWNER.api_version,
            "kind": OWNER.kind,
            "name": OWNER.name,
            "uid": OWNER.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]


def test_both_crds_are_really_used_numnodes_is_required_only_by_v25_12(
    crd_validators: dict[str, Any],
) -> None:
    cd = compute_domain(DomainSpec(run_id=RUN))
    del cd["spec"]["numNodes"]
    assert any("numNodes" in m for m in crd_errors(crd_validators["v25.12.0"], cd))
    assert crd_errors(crd_validators["v0.4.0"], cd) == []


@pytest.mark.parametrize("crd", list(CRD_PATHS))
def test_crd_validation_checks_enums_required_fields_and_unknown_fields(
    crd_validators: dict[str, Any], crd: str
) -> None:
    cd = compute_domain(DomainSpec(run_id=RUN))
    bad_enum = copy.deepcopy(cd)
    bad_enum["spec"]["channel"]["allocationMode"] = "single"
    assert crd_errors(crd_validators[crd], bad_enum)
    no_name = copy.deepcopy(cd)
    del no_name["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert crd_errors(crd_validators[crd], no_name)
    unknown = copy.deepcopy(cd)
    unknown["spec"]["channel"]["deviceClassName"] = "nvidia.com/compute-domain"
    assert crd_errors(crd_validators[crd], unknown)


# ---- Kubernetes 1.34 strict schemas ----------------------------------------------------


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_job_and_service_validate_strictly_against_kubernetes_1_34(name: str) -> None:
    workload = WORKLOADS[name]
    k8s_valid(headless_service(workload))
    k8s_valid(train_job(workload))
    k8s_valid(indexed_job(workload, manifests.VERIFY_MODULE, ["--iters", "5"]))


def test_gpu_claim_template_validates_strictly_and_requests_exact_count() -> None:
    rct = gpu_claim_template(WORKLOADS["claim"])
    k8s_valid(rct)
    names = RunNames.for_run(RUN)
    assert rct["metadata"]["name"] == names.gpu_template
    (request,) = rct["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 8,
    }
    assert rct["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid


@pytest.mark.parametrize("name", ["limits", "claim-no-gpus"])
def test_gpu_claim_template_is_refused_without_claimed_gpus(name: str) -> None:
    with pytest.raises(SpecError, match=r"^gpu_mode: "):
        gpu_claim_template(WORKLOADS[name])


def test_validator_is_strict_the_pre_1_31_claim_shape_fails() -> None:
    job = train_job(WORKLOADS["limits"])
    template = RunNames.for_run(RUN).channel_template
    pod_spec(job)["resourceClaims"] = [
        {"name": CHANNEL_CLAIM, "source": {"resourceClaimTemplateName": template}}
    ]
    with pytest.raises(kubernetes_validate.ValidationError) as info:
        k8s_valid(job)
    assert "source" in info.value.message
    assert list(info.value.path)[-2:] == ["resourceClaims", 0]


def test_validator_is_strict_an_unknown_container_field_fails() -> None:
    job = train_job(WORKLOADS["limits"])
    pod_spec(job)["containers"][0]["gpus"] = 4
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_valid(job)


# ---- behaviour -------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_pod_references_the_channel_template_and_container_claims_match(name: str) -> None:
    workload = WORKLOADS[name]
    names = RunNames.for_run(workload.run_id)
    spec = pod_spec(train_job(workload))
    claims = {c["name"]: c for c in spec["resourceClaims"]}
    assert claims[CHANNEL_CLAIM] == {
        "name": CHANNEL_CLAIM,
        "resourceClaimTemplateName": names.channel_template,
    }
    used = [c["name"] for c in spec["containers"][0]["resources"]["claims"]]
    assert sorted(used) == sorted(claims)
    if workload.placement.gpu_mode == "claim" and workload.gpus_per_node:
        assert claims[GPU_CLAIM]["resourceClaimTemplateName"] == names.gpu_template


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_gpus_come_from_limits_or_a_claim_never_both(name: str) -> None:
    workload = WORKLOADS[name]
    ctr = worker(train_job(workload))
    limits = ctr["resources"].get("limits", {})
    has_claim = GPU_CLAIM in {c["name"] for c in ctr["resources"]["claims"]}
    assert not (has_claim and "nvidia.com/gpu" in limits)
    if workload.gpus_per_node == 0:
        assert not has_claim and "nvidia.com/gpu" not in limits
    elif workload.placement.gpu_mode in ("limits", "auto"):  # auto renders as limits (no cluster)
        assert limits == {"nvidia.com/gpu": str(workload.gpus_per_node)}
    else:
        assert has_claim and not limits


def test_one_pod_per_node_and_all_pods_in_one_clique() -> None:
    job = train_job(WORKLOADS["limits"])
    name = job["metadata"]["name"]
    aff = pod_spec(job)["affinity"]
    same_job = {"matchLabels": {JOB_NAME_LABEL: name}}
    assert aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": same_job, "topologyKey": "kubernetes.io/hostname"}
    ]
    assert aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": same_job, "topologyKey": CLIQUE_LABEL}
    ]
    terms = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": CLIQUE_LABEL, "operator": "Exists"}]}]
    }
    # The first pod may schedule only because it matches its own affinity term.
    assert job["spec"]["template"]["metadata"]["labels"][JOB_NAME_LABEL] == name


def test_without_clique_affinity_pods_still_spread_one_per_node() -> None:
    aff = pod_spec(train_job(WORKLOADS["cpu-only"]))["affinity"]
    assert set(aff) == {"podAntiAffinity"}


def test_job_is_indexed_one_pod_per_node_and_fails_fast() -> None:
    workload = WORKLOADS["full-rack"]
    spec = train_job(workload)["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 18
    # Each gang restart costs every index one counted failure: max_restarts restarts need
    # that many retries per index, and the next failure fails the Job.
    assert spec["backoffLimitPerIndex"] == workload.recovery.max_restarts == 5
    assert train_job(WorkloadSpec(run_id=RUN))["spec"]["backoffLimitPerIndex"] == 3
    assert (
        train_job(from_inputs(WorkloadSpec, run_id=RUN, max_restarts=0))["spec"][
            "backoffLimitPerIndex"
        ]
        == 0
    )
    assert spec["maxFailedIndexes"] == 0
    assert spec["activeDeadlineSeconds"] == 90
    # A finished Job stays until teardown unless a TTL is asked for: a rerun finds its result.
    assert "ttlSecondsAfterFinished" not in train_job(WorkloadSpec(run_id=RUN))["spec"]
    with_ttl = train_job(from_inputs(WorkloadSpec, run_id=RUN, ttl_after_finished_s=600))["spec"]
    assert with_ttl["ttlSecondsAfterFinished"] == 600
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[1]["action"] == "FailJob"
    assert rules[1]["onExitCodes"]["containerName"] == "worker"
    assert 0 not in rules[1]["onExitCodes"]["values"]
    assert 2 in rules[1]["onExitCodes"]["values"]


def test_service_is_headless_selects_the_jobs_pods_and_is_the_pods_subdomain() -> None:
    workload = WORKLOADS["limits"]
    svc, job = headless_service(workload), train_job(workload)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["ports"] == [
        {"name": "rdzv", "port": 29500, "targetPort": 29500, "protocol": "TCP"}
    ]
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert pod_spec(job)["subdomain"] == svc["metadata"]["name"] == job["metadata"]["name"]
    assert pod_labels.items() >= RunNames.for_run(RUN).labels("train").items()


def test_container_command_and_env_match_what_the_worker_reads() -> None:
    workload = WORKLOADS["full-rack"]
    job = indexed_job(workload, "mnnvl.runtime.verify", ["--iters", "5"])
    names = RunNames.for_run(workload.run_id)
    host = names.job("verify-post")
    assert worker(job)["command"] == [
        "python3",
        "-m",
        "mnnvl.runtime.launch",
        "--nnodes=$(NNODES)",
        "--nproc-per-node=$(NPROC_PER_NODE)",
        "--node-rank=$(JOB_COMPLETION_INDEX)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
        f"--max-restarts={workload.recovery.max_restarts}",
        "-m",
        "mnnvl.runtime.verify",
        "--iters",
        "5",
    ]
    env = env_of(job)
    assert list(env)[:5] == [
        "MASTER_ADDR",
        "MASTER_PORT",
        "NNODES",
        "NPROC_PER_NODE",
        "WORLD_SIZE",
    ]
    assert env["WORLD_SIZE"] == "72"
    (node_rank,) = [e for e in worker(job)["env"] if e["name"] == "NODE_RANK"]
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert node_rank["valueFrom"] == {"fieldRef": {"fieldPath": index}}
    assert env["MASTER_ADDR"] == f"{host}-0.{host}.{workload.namespace}.svc"
    assert "cluster.local" not in env["MASTER_ADDR"]  # the cluster domain differs between clusters
    assert (env["MASTER_PORT"], env["NNODES"], env["NPROC_PER_NODE"]) == ("29500", "18", "4")
    assert env["MNNVL_RUN_ID"] == workload.run_id
    assert env[contract_env.NCCL_PROFILE] == "verify-strict"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_DEBUG"] == "WARN"  # the user's value beats a profile default
    # no duplicate names (+ NODE_RANK, MNNVL_NODE_NAME, MNNVL_POD_NAME from the downward API)
    assert len(worker(job)["env"]) == len(env) + 3
    assert env["MNNVL_IMEX_CHANNELS"] == "/dev/nvidia-caps-imex-channels"
    (node,) = [e for e in worker(job)["env"] if e["name"] == "MNNVL_NODE_NAME"]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    (pod,) = [e for e in worker(job)["env"] if e["name"] == "MNNVL_POD_NAME"]
    assert pod["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_cpu_only_pods_run_one_process_each() -> None:
    assert env_of(train_job(WORKLOADS["cpu-only"]))["NPROC_PER_NODE"] == "1"


def test_profile_required_values_beat_the_users() -> None:
    workload = WorkloadSpec(run_id=RUN, nccl_profile="single-host", env={"NCCL_MNNVL_ENABLE": "1"})
    assert env_of(train_job(workload))["NCCL_MNNVL_ENABLE"] == "0"


@pytest.mark.parametrize("profile", ["production", "verify-strict", "single-host"])
def test_machine_pinned_nccl_variables_never_reach_pod_env(profile: str) -> None:
    env = env_of(train_job(WorkloadSpec(run_id=RUN, nccl_profile=profile)))
    assert not set(contract_env.PINNED) & set(env)
    assert env[contract_env.NCCL_PROFILE] == profile


@pytest.mark.parametrize(
    "name", [*contract_env.PINNED, "MASTER_ADDR", "MNNVL_NCCL_PROFILE", "NNODES"]
)
def test_user_env_may_not_set_pinned_or_job_owned_variables(name: str) -> None:
    with pytest.raises(SpecError) as info:
        WorkloadSpec(run_id=RUN, env={name: "1"})
    assert info.value.field == f"env.{name}"


def test_dollar_in_user_arguments_is_escaped_for_the_kubelet() -> None:
    cfg = TrainConfig(checkpoint_dir="/ckpt/$(HOME)/$x", checkpoint_every=1)
    command = worker(train_job(WORKLOADS["limits"], cfg))["command"]
    assert "/ckpt/$$(HOME)/$$x" in command


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_worker_runs_without_privilege(name: str) -> None:
    job = train_job(WORKLOADS[name])
    ctx = worker(job)["securityContext"]
    assert ctx["privileged"] is False
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "add" not in ctx["capabilities"]
    assert pod_spec(job).get("hostNetwork") is None and pod_spec(job).get("hostIPC") is None


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_worker_pod_passes_the_restricted_pod_security_standard_by_default(name: str) -> None:
    job = train_job(WORKLOADS[name])
    restricted = {"metadata": {"labels": {ENFORCE_LABEL: "restricted"}}}
    assert violation(restricted, job["spec"]["template"]) is None
    ctx = pod_spec(job)["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == RUNTIME_UID != 0


def test_baseline_pod_security_runs_the_images_own_user_and_passes_baseline_only() -> None:
    workload = with_inputs(WORKLOADS["limits"], pod_security="baseline")
    template = train_job(workload)["spec"]["template"]
    assert "runAsUser" not in template["spec"]["securityContext"]
    baseline = {"metadata": {"labels": {ENFORCE_LABEL: "baseline"}}}
    restricted = {"metadata": {"labels": {ENFORCE_LABEL: "restricted"}}}
    assert violation(baseline, template) is None
    assert "runAsNonRoot != true" in str(violation(restricted, template))


def test_shm_gpu_toleration_and_service_account() -> None:
    workload = WORKLOADS["full-rack"]
    spec = pod_spec(train_job(workload))
    assert spec["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": workload.pod.shm_size}}
    ]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["serviceAccountName"] == "mnnvl-worker"
    assert "serviceAccountName" not in pod_spec(train_job(WORKLOADS["limits"]))


# ---- render_run, YAML, examples --------------------------------------------------------


def kinds(objs: list[dict[str, Any]]) -> list[str]:
    return [o["kind"] for o in objs]


def test_render_run_creates_domain_then_gpu_template_then_service_before_each_job() -> None:
    workload = WORKLOADS["claim"]
    objs = render_run(DomainSpec(run_id=RUN), workload, TrainConfig(), VerifyConfig())
    assert kinds(objs) == [
        "ComputeDomain",
        "ResourceClaimTemplate",
        "Service",
        "Job",
        "Service",
        "Job",
    ]
    names = RunNames.for_run(RUN)
    assert [o["metadata"]["name"] for o in objs[2:]] == [
        names.job("train"),
        names.job("train"),
        names.job("verify"),
        names.job("verify"),
    ]
    assert env_of(objs[3])[contract_env.NCCL_PROFILE] == "production"
    assert env_of(objs[5])[contract_env.NCCL_PROFILE] == "verify-strict"
    assert worker(objs[3])["command"][10] == "mnnvl.runtime.train"
    assert worker(objs[5])["command"][10] == "mnnvl.runtime.verify"


def test_render_run_with_limits_and_one_step_has_no_gpu_template() -> None:
    objs = render_run(DomainSpec(run_id=RUN), WORKLOADS["limits"], None, VerifyConfig())
    assert kinds(objs) == ["ComputeDomain", "Service", "Job"]
    assert kinds(render_run(DomainSpec(run_id=RUN), WORKLOADS["claim"], None, None)) == [
        "ComputeDomain"
    ]


def test_render_run_objects_all_validate(crd_validators: dict[str, Any]) -> None:
    objs = render_run(DomainSpec(run_id=RUN), WORKLOADS["claim"], TrainConfig(), VerifyConfig())
    for validator in crd_validators.values():
        assert crd_errors(validator, objs[0]) == []
    for obj in objs[1:]:
        k8s_valid(obj)
    assert all(o["metadata"]["labels"]["mnnvl.io/run-id"] == RUN for o in objs)


def test_verify_step_keeps_single_host_profile_and_verify_purpose() -> None:
    workload = dataclasses.replace(WORKLOADS["limits"], nccl_profile="single-host")
    assert step_workload(workload, "verify").nccl_profile == "single-host"
    post = dataclasses.replace(workload, purpose="verify-post")
    assert step_workload(post, "verify").purpose == "verify-post"
    assert step_workload(post, "train").purpose == "train"


@pytest.mark.parametrize(
    ("domain", "field"),
    [(DomainSpec(run_id="other"), "run_id"), (DomainSpec(run_id=RUN, namespace="x"), "namespace")],
)
def test_render_run_refuses_a_domain_of_another_run_or_namespace(
    domain: DomainSpec, field: str
) -> None:
    with pytest.raises(SpecError) as info:
        render_run(domain, WORKLOADS["limits"], TrainConfig(), None)
    assert info.value.field == field


def test_to_yaml_round_trips_through_a_yaml_parser() -> None:
    workload = WorkloadSpec(
        run_id=RUN,
        env={"A": "yes", "B": "0x1F", "C": "a: b # c", "D": "", "E": "-1", "F": "'\"\n\t"},
    )
    objs = render_run(DomainSpec(run_id=RUN), workload, TrainConfig(), VerifyConfig())
    text = to_yaml(objs)
    assert text.count("---\n") == len(objs)
    assert list(yaml.safe_load_all(text)) == objs


def test_builders_are_pure_same_input_same_output_and_no_shared_state() -> None:
    workload = WORKLOADS["claim"]
    first, second = train_job(workload), train_job(workload)
    assert first == second
    first["spec"]["template"]["metadata"]["labels"]["x"] = "y"
    pod_spec(first)["affinity"]["podAntiAffinity"].clear()
    assert train_job(workload) == second


def test_checked_in_examples_and_rbac_match_what_their_sources_produce() -> None:
    script = REPO_ROOT / "manifests" / "render_examples.py"
    spec = importlib.util.spec_from_file_location("render_examples", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, text in module.rendered().items():
        path = REPO_ROOT / "manifests" / name
        assert path.read_text() == text, f"{name} is stale: run python manifests/render_examples.py"
        for obj in yaml.safe_load_all(text):
            if obj["kind"] != "ComputeDomain":
                k8s_valid(obj)


def test_scheduling_options_reach_the_pod_and_job_and_stay_valid() -> None:
    workload = from_inputs(
        WorkloadSpec,
        run_id=RUN,
        node_selector={"pool": "gb200"},
        tolerations=("dedicated=ml:NoSchedule", "maintenance:NoExecute"),
        priority_class="training-high",
        queue_name="team-a",
    )
    job = train_job(workload)
    k8s_valid(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gb200"}
    assert pod["priorityClassName"] == "training-high"
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in (
        pod["tolerations"]
    )
    assert {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"} in pod["tolerations"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert (
        "kueue.x-k8s.io/queue-name" not in train_job(WorkloadSpec(run_id=RUN))["metadata"]["labels"]
    )


@pytest.mark.parametrize("gpu_mode", ["limits", "claim"])
def test_render_stdout_pipes_into_a_yaml_parser_and_strict_validators(
    crd_validators: dict[str, Any], gpu_mode: str, tmp_path: Path
) -> None:
    """`mnnvl render … | kubectl apply -f -`: stdout holds YAML only, the result goes aside."""
    result_path = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mnnvl", "render", "--run-id", RUN, "--namespace", "team-a",
         "--gpus-per-node", "4", "--gpu-mode", gpu_mode, "--result-path", str(result_path)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    docs = list(yaml.safe_load_all(proc.stdout))
    assert all(isinstance(d, dict) and d.get("kind") for d in docs), "non-object in stdout"
    for doc in docs:
        if doc["kind"] == "ComputeDomain":
            for validator in crd_validators.values():
                assert crd_errors(validator, doc) == []
        else:
            k8s_valid(doc)
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["ok"] is True and len(result["objects"]) == len(docs)
    assert json.loads(result_path.read_text()) == result
