"""The multi-node workload: a headless Service and an Indexed Job, one pod per node.

Pod ``<job>-<index>`` gets the stable DNS name ``<job>-<index>.<service>.<ns>.svc.<cluster
domain>`` because the pod's ``subdomain`` is the headless Service's name; pod 0 hosts the rendezvous
(rank 0's store). Every pod holds the run's IMEX channel claim (from the template the DRA
controller made for the ComputeDomain) plus its GPUs, either as ``nvidia.com/gpu`` limits or
as a ``gpu.nvidia.com`` claim, never both.
"""

from __future__ import annotations

from typing import Any

from mnnvl.contract import env as contract_env
from mnnvl.contract import nccl, termination
from mnnvl.contract.exit_codes import NON_RETRIABLE_EXIT_CODES
from mnnvl.inputs.checks import parse_toleration
from mnnvl.inputs.names import LABEL_CLIQUE_GROUP, LABEL_COMPONENT, LABEL_RUN_ID, RunNames
from mnnvl.inputs.spec import PodTemplate, WorkloadSpec
from mnnvl.inputs.storage import parse_pvc
from mnnvl.manifests.claims import GPU_REQUEST, wants_gpu_claim
from mnnvl.manifests.domain import object_meta

CONTAINER = "worker"
# The runtime image's USER (images/runtime.Dockerfile): the uid and gid the worker pods run as
# under the restricted Pod Security Standard.
RUNTIME_UID = 1000
CHANNEL_CLAIM = "imex-channel"
GPU_CLAIM = GPU_REQUEST
RDZV_PORT_NAME = "rdzv"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "dshm"
PVC_VOLUME = "pvc"  # volumes pvc-0, pvc-1, ... in --pvc order
LAUNCH_MODULE = "mnnvl.runtime.launch"
TRAIN_MODULE = "mnnvl.runtime.train"
VERIFY_MODULE = "mnnvl.runtime.verify"
# Kueue topology-aware scheduling (annotation since Kueue v0.9; TAS is beta and on by default
# from v0.14, which the docs assume): all pods of the pod set (one group's Job) in one
# domain of this topology level.
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
# Kueue TAS pod-set slices (Kueue v0.13+; apis/kueue/v1beta2/topology_types.go): each slice of
# ``podset-slice-size`` pods in one domain of the level. Kueue orders a Job's pods into the
# slices by completion index (pkg/controller/tas/topology_ungater.go), so slice g is node ranks
# g*size .. g*size+size-1: clique group g.
KUEUE_SLICE_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"

# Set by the Job itself; a user value would break the rendezvous or the node rank.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def kueue_gang(workload: WorkloadSpec) -> bool:
    """Clique groups under Kueue: one Job (one Kueue Workload) for every group, admitted
    whole or not at all; Kueue's TAS places each group's slice of it in one clique."""
    return bool(workload.queue_name) and workload.groups > 1


def master_addr(workload: WorkloadSpec) -> str:
    """DNS name of pod index 0 (of group 0's Job), where rank 0's c10d store listens.

    ``<pod>.<service>.<namespace>.svc`` without the cluster domain, which differs between
    clusters (``cluster.local`` is only the default): the pod's resolver completes the name
    from the last entry of the search list the kubelet writes into every pod's resolv.conf
    (``<ns>.svc.<domain> svc.<domain> <domain>``; Kubernetes docs, "DNS for Services and Pods").
    """
    svc = RunNames.for_run(workload.run_id).service(workload.purpose)
    return f"{rank0_job(workload)}-0.{svc}.{workload.namespace}.svc"


def rank0_job(workload: WorkloadSpec) -> str:
    """The Job of rank 0 (its pod 0 rendezvous and prints the RESULT): clique group 0's Job
    when the step has one Job per group."""
    group = 0 if workload.groups > 1 and not kueue_gang(workload) else None
    return RunNames.for_run(workload.run_id).job(workload.purpose, group)


def headless_service(workload: WorkloadSpec) -> dict[str, Any]:
    """Headless Service giving each pod of the Job a DNS name (rendezvous on pod 0).

    ``publishNotReadyAddresses`` is on because the workers rendezvous before any readiness
    (they have no probes, and pod 0's address must resolve while the others start).
    """
    names = RunNames.for_run(workload.run_id)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(
            names.service(workload.purpose),
            workload.namespace,
            names.labels(workload.purpose),
            workload.owner,
        ),
        "spec": {
            "clusterIP": "None",
            "selector": step_selector(workload),
            "ports": [
                {
                    "name": RDZV_PORT_NAME,
                    "port": workload.pod.rdzv_port,
                    "targetPort": workload.pod.rdzv_port,
                    "protocol": "TCP",
                }
            ],
            "publishNotReadyAddresses": True,
        },
    }


def step_selector(workload: WorkloadSpec) -> dict[str, str]:
    """Labels of every pod of the step: its Job's pods, or all its groups' Jobs' pods."""
    names = RunNames.for_run(workload.run_id)
    if workload.groups == 1:
        return {JOB_NAME_LABEL: names.job(workload.purpose)}
    return {LABEL_RUN_ID: workload.run_id, LABEL_COMPONENT: workload.purpose}


def group_env(workload: WorkloadSpec, group: int | None) -> dict[str, str]:
    """Where a clique group's pods sit in the run (read by ``mnnvl.runtime.groups``); in the
    one Job of a Kueue gang a pod's group follows from its node rank."""
    if group is None:
        if not kueue_gang(workload):
            return {}
        return {
            contract_env.NUM_GROUPS: str(workload.groups),
            contract_env.NODES_PER_GROUP: str(workload.group_nodes),
        }
    return {
        contract_env.NUM_GROUPS: str(workload.groups),
        contract_env.GROUP_INDEX: str(group),
        contract_env.NODES_PER_GROUP: str(workload.group_nodes),
        contract_env.NODE_RANK_BASE: str(group * workload.group_nodes),
    }


def pod_env(workload: WorkloadSpec, group: int | None = None) -> list[dict[str, Any]]:
    """Container env: rendezvous, run id, the NCCL profile, then the user's variables.

    The user's values beat a profile's defaults but not its required values (the worker
    applies the same rule at start-up). Machine-pinned and Job-owned names never get here:
    ``WorkloadSpec`` refuses them, so nobody believes they changed them.
    """
    env = {
        contract_env.MASTER_ADDR: master_addr(workload),
        contract_env.MASTER_PORT: str(workload.pod.rdzv_port),
        contract_env.NNODES: str(workload.nodes),
        contract_env.NPROC_PER_NODE: str(workload.procs_per_node),
        contract_env.WORLD_SIZE: str(workload.world_size),
        contract_env.RUN_ID: workload.run_id,
        # The worker fails naming its pod when it asked for GPUs and sees none.
        contract_env.GPUS_PER_NODE: str(workload.gpus_per_node),
        # The worker fails naming its pod and node when its channel claim brought no device.
        contract_env.IMEX_CHANNELS: contract_env.IMEX_CHANNEL_DIR,
        # The workers name it when they find a group outside one clique.
        contract_env.CLIQUE_LABEL: workload.placement.clique_label,
        **group_env(workload, group),
    }
    profile_env = nccl.pod_env(workload.nccl_profile)
    required = nccl.get_profile(workload.nccl_profile).required
    env.update(profile_env)
    env.update({k: v for k, v in workload.env.items() if k not in required})
    # The Job controller appends JOB_COMPLETION_INDEX after these, so $(JOB_COMPLETION_INDEX)
    # would not expand here: NODE_RANK reads the same annotation directly.
    node_rank = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    node = {"fieldRef": {"fieldPath": "spec.nodeName"}}
    pod = {"fieldRef": {"fieldPath": "metadata.name"}}
    return [
        *({"name": k, "value": v} for k, v in env.items() if k not in contract_env.PINNED),
        {"name": contract_env.NODE_RANK, "valueFrom": node_rank},
        {"name": contract_env.NODE_NAME, "valueFrom": node},
        {"name": contract_env.POD_NAME, "valueFrom": pod},
    ]


def command(
    module: str, args: list[str], grouped: bool = False, max_restarts: int = 0
) -> list[str]:
    """The entry module on every node through ``mnnvl.runtime.launch``; ``$(VAR)`` is expanded
    by the kubelet from the env. A clique group's pods leave the node rank to the launcher
    (the group's first node rank plus the completion index: the kubelet cannot add).
    ``max_restarts`` (``--max-restarts``): the launchers restart failed workers in place
    within the step's one restart budget (``mnnvl.runtime.inplace``).

    ``module`` empty: ``args`` is the whole command, run as given once per pod, reading the
    rendezvous from the env; with clique groups through the launcher's ``--exec``, which sets
    ``NODE_RANK`` and then becomes the program (no shell needed in the image).
    """
    # The module and the words were checked once, on the spec (LaunchSpec); only steps' own
    # constants reach here otherwise.
    if module == "" and args:
        # "$$" is the kubelet's escape for "$": the user's words reach the program verbatim.
        verbatim = [a.replace("$", "$$") for a in args]
        return ["python3", "-m", LAUNCH_MODULE, "--exec", "--", *verbatim] if grouped else verbatim
    rank = [] if grouped else ["--node-rank=$(JOB_COMPLETION_INDEX)"]
    return [
        "python3",
        "-m",
        LAUNCH_MODULE,
        "--nnodes=$(NNODES)",
        "--nproc-per-node=$(NPROC_PER_NODE)",
        *rank,
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
        f"--max-restarts={max_restarts}",
        "-m",
        module,
        *(a.replace("$", "$$") for a in args),
    ]


def affinity(workload: WorkloadSpec, job: str, group: int | None = None) -> dict[str, Any]:
    """One pod per node always; with ``clique_affinity`` all pods of ``job`` in one NVLink
    clique, and with clique groups (one Job each) every group in a clique of its own.

    Anti-affinity on the hostname is not optional: a node has one IMEX channel device,
    which one pod's claim holds. The required pod affinity on the clique label
    does not deadlock the first pod: the scheduler lets a pod through when no pod matches
    its term yet and the pod matches its own term, so the first pod picks the clique and
    the rest follow. That first pod may land anywhere, so without the anti-affinity between
    groups two groups can start in one clique and each take nodes the other needs (neither
    can finish placing). With it, each group's first pod takes a clique no other group of
    the run holds, and the group's other pods find that clique's nodes free of the run's
    pods: placement cannot deadlock as long as the cluster has a clique with
    ``nodes_per_clique`` free nodes per group. A group whose clique is too small stays
    Pending; the launcher's wait reports it (no NVLink clique with room) after the grace.
    """
    same_job = {"matchLabels": {JOB_NAME_LABEL: job}}
    same_step = {"matchLabels": step_selector(workload)}
    clique, in_clique = workload.placement.clique_label, workload.placement.clique_affinity
    result: dict[str, Any] = {}
    if in_clique:
        clique_exists = {"key": clique, "operator": "Exists"}
        result["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [clique_exists]}]
            }
        }
    if in_clique and not kueue_gang(workload):
        # Under Kueue's slices Kueue chooses each group's clique: a clique label is enough.
        result["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": same_job, "topologyKey": clique}
            ]
        }
    anti = [{"labelSelector": same_step, "topologyKey": HOSTNAME_LABEL}]
    if in_clique and group is not None:
        other_groups = {
            "matchLabels": step_selector(workload),
            "matchExpressions": [
                {"key": LABEL_CLIQUE_GROUP, "operator": "NotIn", "values": [str(group)]}
            ],
        }
        anti.append({"labelSelector": other_groups, "topologyKey": clique})
    result["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": anti}
    return result


def container(
    workload: WorkloadSpec, module: str, args: list[str], group: int | None = None
) -> dict[str, Any]:
    """The ``worker`` container.

    No privilege: device access comes from CDI injection of the claimed devices, not from
    capabilities (NVIDIA's own MNNVL examples run their workers as uid 1000). The user is
    set on the pod (:func:`pod_security_context`).
    """
    claims = [{"name": CHANNEL_CLAIM}]
    resources: dict[str, Any] = {"claims": claims}
    if wants_gpu_claim(workload):
        claims.append({"name": GPU_CLAIM})
    elif workload.gpus_per_node > 0:  # limits, and auto where no cluster decided it
        resources["limits"] = {GPU_RESOURCE: str(workload.gpus_per_node)}
    return {
        "name": CONTAINER,
        "image": workload.image,
        "imagePullPolicy": workload.pod.image_pull_policy,
        "command": command(
            module, args, grouped=group is not None, max_restarts=workload.recovery.max_restarts
        ),
        "env": [
            *pod_env(workload, group),
            {"name": termination.TERMINATION_PATH_ENV, "value": termination.TERMINATION_PATH},
        ],
        # The worker's evidence of its own failure reaches pod status, so the driver reads it
        # without logs; a program that writes none hands over its last log lines instead (the
        # kubelet's fallback: only when the file is empty and the container failed, at most
        # 2048 bytes / 80 lines).
        "terminationMessagePath": termination.TERMINATION_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": resources,
        "volumeMounts": volume_mounts(workload.pod),
        "securityContext": container_security(),
    }


def container_security() -> dict[str, Any]:
    """Every worker container: no privileges (PodSecurity "restricted" asks for each)."""
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def volumes(pod: PodTemplate) -> list[dict[str, Any]]:
    """A worker pod's volumes: its shared memory and each ``--pvc`` claim."""
    return [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": pod.shm_size}},
        *(
            {
                "name": f"{PVC_VOLUME}-{i}",
                "persistentVolumeClaim": {"claimName": m.claim, "readOnly": m.read_only},
            }
            for i, m in enumerate(parse_pvc(pod.pvc))
        ),
    ]


def volume_mounts(pod: PodTemplate) -> list[dict[str, Any]]:
    """Where the worker container mounts ``volumes(pod)``."""
    return [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        *(
            {"name": f"{PVC_VOLUME}-{i}", "mountPath": m.path, "readOnly": m.read_only}
            for i, m in enumerate(parse_pvc(pod.pvc))
        ),
    ]


def tolerations(workload: WorkloadSpec) -> list[dict[str, Any]]:
    """GPU nodes' taint and the ``--toleration`` ones."""
    return [
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        *(parse_toleration(item) for item in workload.placement.tolerations),
    ]


def pod_failure_policy() -> dict[str, Any]:
    """Disruptions (eviction, preemption, node drain) are not the workload's fault and do not
    use up retries; exit codes a retry cannot fix fail the whole Job at once."""
    return {
        "rules": [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": list(NON_RETRIABLE_EXIT_CODES),
                },
            },
        ]
    }


def pod_security_context(pod: PodTemplate) -> dict[str, Any]:
    """The pod's security context for ``pod.pod_security``.

    ``restricted`` (default) passes the restricted Pod Security Standard: non-root as the
    runtime image's uid, with that gid owning mounted volumes (``fsGroup``; changed only when
    the volume's root does not match) so checkpoints on a PVC stay writable. ``baseline`` runs
    the image's own user (root allowed) for images that need it; capabilities stay dropped.
    """
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if pod.pod_security == "restricted":
        context |= {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "fsGroup": RUNTIME_UID,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
    return context


def pod_spec(
    workload: WorkloadSpec, module: str, args: list[str], group: int | None = None
) -> dict[str, Any]:
    names = RunNames.for_run(workload.run_id)
    job = names.job(workload.purpose, group)
    claims = [{"name": CHANNEL_CLAIM, "resourceClaimTemplateName": names.channel_template}]
    if wants_gpu_claim(workload):
        claims.append({"name": GPU_CLAIM, "resourceClaimTemplateName": names.gpu_template})
    pod, place = workload.pod, workload.placement
    spec: dict[str, Any] = {"restartPolicy": "Never", "subdomain": names.service(workload.purpose)}
    if pod.worker_service_account:
        spec["serviceAccountName"] = pod.worker_service_account
    spec |= {
        # Workers never call the API; mount a token only for an account the user chose.
        "automountServiceAccountToken": bool(pod.worker_service_account),
        # Workers need no per-Service variables; a busy namespace would add hundreds.
        "enableServiceLinks": False,
        "resourceClaims": claims,
        "containers": [container(workload, module, args, group)],
        "volumes": volumes(pod),
        "affinity": affinity(workload, job, group),
        "tolerations": tolerations(workload),
        "securityContext": pod_security_context(pod),
    }
    if place.node_selector:
        spec["nodeSelector"] = dict(place.node_selector)
    if place.priority_class:
        spec["priorityClassName"] = place.priority_class
    return spec


def indexed_job(
    workload: WorkloadSpec, module: str, args: list[str], group: int | None = None
) -> dict[str, Any]:
    """The Indexed Job running ``module`` through the pods' entry on ``nodes`` pods (with clique
    groups: clique group ``group``'s Job, on ``nodes_per_clique`` pods).

    ``maxFailedIndexes: 0`` makes any index that runs out of retries fail the Job and stop
    the other pods (a collective cannot finish without every rank). ``podReplacementPolicy:
    Failed`` keeps a replacement pod from starting before the old one is gone, so the two
    never race for the node's single IMEX channel or the index's hostname.

    ``backoffLimitPerIndex`` is ``max_restarts``: a gang restart costs every index one counted
    failure (the failed pod, and each pod the restart deletes: the kubelet moves a deleted pod
    to Failed, and only a ``DisruptionTarget`` pod is ignored), and the Job controller fails an
    index whose failed pod had ``job-index-failure-count`` >= the limit. So ``max_restarts``
    restarts leave each index at most that many failures, and the next one fails the Job.
    """
    names = RunNames.for_run(workload.run_id)
    job = names.job(workload.purpose, group)
    job_labels = names.labels(workload.purpose)
    if group is not None:
        job_labels[LABEL_CLIQUE_GROUP] = str(group)
    pod_labels = {**job_labels, JOB_NAME_LABEL: job}
    if workload.queue_name:
        # Kueue admits the Job (and suspends it until then) through this label.
        job_labels[KUEUE_QUEUE_LABEL] = workload.queue_name
    template: dict[str, Any] = {"labels": pod_labels}
    count = workload.group_nodes if group is not None else workload.nodes
    if kueue_gang(workload):
        template["annotations"] = {
            KUEUE_SLICE_TOPOLOGY: workload.placement.clique_label,
            KUEUE_SLICE_SIZE: str(workload.group_nodes),
        }
    elif workload.placement.topology_aware:
        template["annotations"] = {KUEUE_REQUIRED_TOPOLOGY: workload.placement.clique_label}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(job, workload.namespace, job_labels, workload.owner),
        "spec": {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": count,
            "backoffLimitPerIndex": workload.recovery.max_restarts,
            "maxFailedIndexes": 0,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": pod_failure_policy(),
            "activeDeadlineSeconds": int(workload.job_timeout_s),
            # No TTL by default: teardown deletes the Job (the reaper backs it up), and until
            # then a rerun of the step adopts it and returns its result.
            **ttl(workload),
            "template": {"metadata": template, "spec": pod_spec(workload, module, args, group)},
        },
    }


def ttl(workload: WorkloadSpec) -> dict[str, int]:
    """``ttlSecondsAfterFinished`` when one was asked for (0: none)."""
    seconds = workload.pod.ttl_after_finished_s
    return {"ttlSecondsAfterFinished": seconds} if seconds else {}


def indexed_jobs(workload: WorkloadSpec, module: str, args: list[str]) -> list[dict[str, Any]]:
    """The step's Jobs: one, or one per clique group, all in one rendezvous. Under Kueue the
    groups are one Job, so that Kueue admits them together or not at all."""
    if workload.groups == 1 or kueue_gang(workload):
        return [indexed_job(workload, module, args)]
    return [indexed_job(workload, module, args, g) for g in range(workload.groups)]
