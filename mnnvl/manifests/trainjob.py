"""A Kubeflow Trainer v2 TrainJob running a step's workers, in place of the Service and Job.

The TrainJob names a runtime (default the ``torch-distributed`` ClusterTrainingRuntime), whose
JobSet Trainer makes: JobSet ``<trainjob>``, replicated job ``node``, one Indexed Job
``<trainjob>-node-0`` with a pod per node (hostname ``<trainjob>-node-0-<i>``, subdomain
``<trainjob>``, the JobSet's headless Service), container ``node`` (kubeflow/trainer
``pkg/runtime/framework/plugins/jobset/builder.go``, ``plugins/torch/torch.go``).

Every pod runs the same command as the Indexed Job's (``python3 -m mnnvl.runtime.launch``)
with the same NCCL contract env; the rendezvous address is rank 0's pod, as Trainer's
``PET_MASTER_ADDR`` names it (``<trainjob>-node-0-0.<trainjob>``) written out to the
namespace's ``.svc`` name, on Trainer's port 29500 (``ContainerTrainerPort``).

The IMEX channel claim travels in ``spec.trainer.resourceClaimsPerNode`` (Trainer v2.4.0,
alpha feature gate ``DynamicResourceAllocation``); the placement, volumes and security in a
``runtimePatches`` entry (the fields Trainer lets a manager patch: no priority class, no
``automountServiceAccountToken``).
"""

from __future__ import annotations

from typing import Any

from mnnvl.contract import env as contract_env
from mnnvl.errors import SpecError
from mnnvl.inputs.names import LABEL_COMPONENT, LABEL_RUN_ID, MANAGED_BY, RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests.claims import wants_gpu_claim
from mnnvl.manifests.domain import object_meta
from mnnvl.manifests.workload import (
    CHANNEL_CLAIM,
    GPU_CLAIM,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_REQUIRED_TOPOLOGY,
    command,
    container_security,
    pod_env,
    pod_security_context,
    tolerations,
    volume_mounts,
    volumes,
)

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
RUNTIME_KIND = "ClusterTrainingRuntime"
DEFAULT_RUNTIME = "torch-distributed"
# Trainer's names for the torch runtime's pods (pkg/constants/constants.go: Node,
# ContainerTrainerPort).
NODE = "node"
TRAINER_PORT = 29500
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def trainjob_name(workload: WorkloadSpec) -> str:
    """The TrainJob (and so its JobSet and headless Service) of the step."""
    return RunNames.for_run(workload.run_id).job(workload.purpose)


def trainjob_master_addr(workload: WorkloadSpec) -> str:
    """Rank 0's pod: Trainer's ``PET_MASTER_ADDR`` with the namespace's ``.svc`` suffix, which
    resolves from any namespace and whatever the cluster domain (as the Job's ``master_addr``)."""
    name = trainjob_name(workload)
    return f"{name}-{NODE}-0-0.{name}.{workload.namespace}.svc"


def pod_labels(workload: WorkloadSpec) -> dict[str, str]:
    """The run's labels on every pod, so status, logs, teardown and the reaper find them."""
    return RunNames.for_run(workload.run_id).labels(workload.purpose)


def trainjob(
    workload: WorkloadSpec, module: str, args: list[str], runtime: str = DEFAULT_RUNTIME
) -> dict[str, Any]:
    """The step's TrainJob on ``workload.nodes`` nodes, running ``module`` through the pods' entry.

    Restarts are the runtime's: its JobSet ``failurePolicy.maxRestarts`` (a runtime patch
    cannot set it), so ``max_restarts`` is not written here. What a TrainJob cannot carry
    (clique groups, a priority class) its workload spec refused already.
    """
    names = RunNames.for_run(workload.run_id)
    labels = names.labels(workload.purpose)
    if workload.queue_name:
        labels[KUEUE_QUEUE_LABEL] = workload.queue_name  # Kueue's TrainJob integration
    trainer: dict[str, Any] = {
        "image": workload.image,
        "command": command(module, args),
        "env": trainjob_env(workload),
        "numNodes": workload.nodes,
        "numProcPerNode": workload.procs_per_node,
        "resourceClaimsPerNode": claims_per_node(workload),
    }
    if workload.gpus_per_node > 0 and not wants_gpu_claim(workload):
        # Extended resources win Trainer's GPU count over any claim.
        trainer["resourcesPerNode"] = {"limits": {GPU_RESOURCE: str(workload.gpus_per_node)}}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": object_meta(
            names.job(workload.purpose), workload.namespace, labels, workload.owner
        ),
        "spec": {
            "runtimeRef": {
                "name": runtime,
                "apiGroup": "trainer.kubeflow.org",
                "kind": RUNTIME_KIND,
            },
            "activeDeadlineSeconds": int(workload.job_timeout_s),
            "trainer": trainer,
            "runtimePatches": [runtime_patch(workload)],
        },
    }


def claims_per_node(workload: WorkloadSpec) -> list[dict[str, str]]:
    """The pod claims Trainer adds to every node pod and its ``node`` container.

    Trainer's GPU auto-count (``numProcPerNode`` ``auto``, and what it tells Kueue) reads only
    the FIRST claim the ``node`` container references, counting an ExactCount request whose
    name contains "gpu"; ``nvidia.com/gpu`` limits win over any claim. So where GPUs come from
    DRA the GPU claim goes first: the channel claim first would count 0 GPUs.
    """
    names = RunNames.for_run(workload.run_id)
    channel = {"name": CHANNEL_CLAIM, "resourceClaimTemplateName": names.channel_template}
    if wants_gpu_claim(workload):
        return [{"name": GPU_CLAIM, "resourceClaimTemplateName": names.gpu_template}, channel]
    return [channel]


def trainjob_env(workload: WorkloadSpec) -> list[dict[str, Any]]:
    """The Job's contract env with the rendezvous moved to the TrainJob's rank-0 pod and port.

    Trainer's own ``PET_*`` variables are added by Trainer; ours never use its reserved names.
    """
    rendezvous = {
        contract_env.MASTER_ADDR: trainjob_master_addr(workload),
        contract_env.MASTER_PORT: str(TRAINER_PORT),
    }
    return [
        {"name": e["name"], "value": rendezvous[e["name"]]} if e["name"] in rendezvous else e
        for e in pod_env(workload)
    ]


def runtime_patch(workload: WorkloadSpec) -> dict[str, Any]:
    """Placement, volumes and security of the ``node`` pods, as Trainer lets a manager patch."""
    pod_meta: dict[str, Any] = {"labels": pod_labels(workload)}
    if workload.placement.topology_aware:
        pod_meta["annotations"] = {KUEUE_REQUIRED_TOPOLOGY: workload.placement.clique_label}
    pod: dict[str, Any] = {
        "affinity": affinity(workload),
        "tolerations": tolerations(workload),
        "securityContext": pod_security_context(workload.pod),
        "volumes": volumes(workload.pod),
        "containers": [
            {
                "name": NODE,
                "volumeMounts": volume_mounts(workload.pod),
                "securityContext": container_security(),
            }
        ],
    }
    if workload.pod.worker_service_account:
        pod["serviceAccountName"] = workload.pod.worker_service_account
    if workload.placement.node_selector:
        pod["nodeSelector"] = dict(workload.placement.node_selector)
    replicated = {
        "name": NODE,
        "template": {"spec": {"template": {"metadata": pod_meta, "spec": pod}}},
    }
    return {
        "manager": MANAGED_BY,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated]}}},
    }


def affinity(workload: WorkloadSpec) -> dict[str, Any]:
    """One pod per node (a node has one IMEX channel device); with ``clique_affinity`` all pods
    on nodes of one NVLink clique (the first pod picks it, as for the Job's pods)."""
    step = {"matchLabels": {LABEL_RUN_ID: workload.run_id, LABEL_COMPONENT: workload.purpose}}
    result: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": step, "topologyKey": HOSTNAME_LABEL}
            ]
        }
    }
    if workload.placement.clique_affinity:
        clique = workload.placement.clique_label
        result["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": clique, "operator": "Exists"}]}]
            }
        }
        result["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": step, "topologyKey": clique}
            ]
        }
    return result


def take_trainjob(user: dict[str, Any], workload: WorkloadSpec) -> dict[str, Any]:
    """A team's own TrainJob made the step's: named and labelled as the run's (so adoption,
    teardown and the reaper find it), in the run's namespace, with the run's claims in
    ``resourceClaimsPerNode`` (the GPU claim first where GPUs come from DRA; the team's other
    claims after), GPU limits where it names none, and the run's placement patch appended.
    Its runtime, image, command and env stay the team's. Raises ``SpecError`` naming
    ``trainjob_file`` for anything that is not a TrainJob of ``workload``'s shape.
    """
    if user.get("apiVersion") != API_VERSION or user.get("kind") != KIND:
        raise SpecError(
            "trainjob_file",
            f"is a {user.get('apiVersion')}/{user.get('kind')}, not a TrainJob: give a file "
            f"with apiVersion {API_VERSION} and kind {KIND}",
        )
    given = user.get("spec") or {}
    if not (given.get("runtimeRef") or {}).get("name"):
        raise SpecError(
            "trainjob_file", "names no runtime: set spec.runtimeRef.name (e.g. torch-distributed)"
        )
    if not isinstance(given.get("trainer"), dict):
        raise SpecError(
            "trainjob_file",
            "names no trainer: set spec.trainer with the image and command every node runs",
        )
    trainer = dict(given["trainer"])
    nodes = trainer.setdefault("numNodes", workload.nodes)
    if nodes != workload.nodes:
        raise SpecError(
            "trainjob_file",
            f"numNodes {nodes} but nodes {workload.nodes}: make them agree (verification "
            "runs on nodes)",
        )
    ours = claims_per_node(workload)
    theirs = [
        c
        for c in trainer.get("resourceClaimsPerNode") or []
        if c.get("name") not in {c["name"] for c in ours}
    ]
    trainer["resourceClaimsPerNode"] = ours + theirs
    limits = (trainer.get("resourcesPerNode") or {}).get("limits") or {}
    if workload.gpus_per_node > 0 and not wants_gpu_claim(workload) and GPU_RESOURCE not in limits:
        resources = dict(trainer.get("resourcesPerNode") or {})
        resources["limits"] = {**limits, GPU_RESOURCE: str(workload.gpus_per_node)}
        trainer["resourcesPerNode"] = resources
    names = RunNames.for_run(workload.run_id)
    meta = object_meta(names.job(workload.purpose), workload.namespace, {}, workload.owner)
    meta["labels"] = {**(user.get("metadata", {}).get("labels") or {}), **pod_labels(workload)}
    patches = [
        p for p in user["spec"].get("runtimePatches") or [] if p.get("manager") != MANAGED_BY
    ]
    spec = {
        **user["spec"],
        "trainer": trainer,
        "runtimePatches": [*patches, runtime_patch(workload)],
    }
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
