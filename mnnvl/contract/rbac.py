"""The permissions the launcher steps need: every request the driver can send, on every path.

One table, from which ``manifests/base/rbac.yaml``, the Kueue overlay's Role, the TrainJob
workload's (``manifests/overlays/trainer``) and the optional cluster reader
(``manifests/overlays/cluster-reader``) are generated
(``python manifests/render_examples.py``) and which the simulated cluster applies and enforces,
so a request the table lacks fails the tests with the 403 a real cluster would answer.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

RUNNER = "mnnvl-runner"
KUEUE_READER = "mnnvl-kueue-reader"
PART_OF = {"app.kubernetes.io/part-of": "mnnvl-pipelines"}

# (API group, resources, verbs, why): the launcher's Role in its namespace.
RUNNER_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...] = (
    (
        "resource.nvidia.com",
        ("computedomains",),
        ("create", "get", "list", "watch", "delete"),
        "provision (create or adopt), status, teardown and reap; a missing CRD is told from "
        "the create's 404, so no CRD read is needed",
    ),
    (
        "resource.k8s.io",
        ("resourceclaimtemplates",),
        ("create", "get", "list", "watch", "delete"),
        "the controller-made channel template (waited for); GPU claim templates (gpu_mode claim)",
    ),
    (
        "batch",
        ("jobs",),
        ("create", "get", "list", "watch", "patch", "delete"),
        "the multi-node workload; get: a retried step adopts its Job, a failed one reads it; "
        "patch: suspend it and resume it with a failing node kept out (node affinity)",
    ),
    (
        "",
        ("services",),
        ("create", "get", "list", "delete"),
        "the workload's headless Service; get: a retried step adopts it",
    ),
    (
        "",
        ("pods",),
        ("get", "list", "watch", "delete"),
        "waits and diagnostics; get: the launcher pod as owner (--owner-pod); delete: a gang "
        "restart deletes every pod of the step",
    ),
    ("", ("pods/log",), ("get",), "rank 0's log, streamed, and failed pods' logs"),
    ("", ("events",), ("list", "watch"), "why a pod or the Job is stuck (FailedCreate, ...)"),
)
# Read-only access to Kueue Workloads: why a queued Job is held (manifests/overlays/kueue).
KUEUE_RULES = (
    (
        "kueue.x-k8s.io",
        ("workloads",),
        ("get", "list", "watch"),
        "why Kueue holds a Job, and whether it ever will admit it",
    ),
)
# The TrainJob workload (manifests/overlays/trainer): the run's TrainJobs in the namespace, and
# the runtime they name, read by preflight. ClusterTrainingRuntimes are cluster-scoped, so
# reading them takes a ClusterRole (a cluster admin applies the overlay).
TRAINER = "mnnvl-trainer"
TRAINER_RULES = (
    (
        "trainer.kubeflow.org",
        ("trainjobs",),
        ("create", "get", "list", "watch", "delete"),
        "the TrainJob workload: create or adopt, wait, teardown and reap",
    ),
)
TRAINER_CLUSTER_RULES = (
    (
        "trainer.kubeflow.org",
        ("clustertrainingruntimes",),
        ("get",),
        "preflight: the ClusterTrainingRuntime the TrainJobs name (default torch-distributed)",
    ),
)
# Service accounts the Kueue reader binds: the base's, and the KFP overlay's.
KUEUE_SUBJECTS = (RUNNER, "pipeline-runner", "default-editor")
# Optional, read-only and cluster-scoped (a cluster admin grants it): what the cluster's GPU
# and IMEX stack is. Without it every step still runs; --gpu-mode auto then falls back to
# limits and an Unschedulable pod's message names --gpu-mode claim.
CLUSTER_READER = "mnnvl-cluster-reader"
CLUSTER_READER_RULES = (
    (
        "resource.k8s.io",
        ("deviceclasses", "resourceslices"),
        ("get", "list", "watch"),
        "--gpu-mode auto: whether the GPU DeviceClass maps nvidia.com/gpu "
        "(extendedResourceName); the GPUs and IMEX channels the DRA driver publishes",
    ),
    (
        "",
        ("nodes",),
        ("get", "list", "watch"),
        "GPUs from the device plugin (allocatable nvidia.com/gpu) and the clique labels",
    ),
    (
        "apiextensions.k8s.io",
        ("customresourcedefinitions",),
        ("get", "list", "watch"),
        "which NVIDIA and Kueue APIs the cluster serves",
    ),
    (
        "kueue.x-k8s.io",
        ("resourceflavors", "clusterqueues", "localqueues"),
        ("get", "list", "watch"),
        "a queue's flavors, quotas and topology; preflight follows --queue-name's LocalQueue "
        "to its ClusterQueue",
    ),
)


def _role(name: str, rules: Any, kind: str = "Role") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": dict(PART_OF)},
        "rules": [
            {"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)}
            for group, resources, verbs, _ in rules
        ],
    }


def _binding(name: str, role: str, accounts: tuple[str, ...]) -> dict[str, Any]:
    """A RoleBinding whose service-account subjects carry no namespace: the RBAC authorizer
    reads that as the binding's own namespace (``appliesToUser`` in kubernetes'
    plugin/pkg/auth/authorizer/rbac/rbac.go)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "labels": dict(PART_OF)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": a} for a in accounts],
    }


def runner_objects() -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding of ``manifests/base``."""
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": RUNNER, "labels": dict(PART_OF)},
    }
    return [account, _role(RUNNER, RUNNER_RULES), _binding(RUNNER, RUNNER, (RUNNER,))]


def kueue_reader_objects() -> list[dict[str, Any]]:
    """The Role and RoleBinding of ``manifests/overlays/kueue``."""
    return [_role(KUEUE_READER, KUEUE_RULES), _binding(KUEUE_READER, KUEUE_READER, KUEUE_SUBJECTS)]


def trainer_objects(namespace: str = "default") -> list[dict[str, Any]]:
    """The Role, RoleBinding, ClusterRole and ClusterRoleBinding of ``manifests/overlays/trainer``:
    the runner account of ``namespace`` (a ClusterRoleBinding's subject needs one)."""
    binding = _cluster_binding(TRAINER, namespace)
    return [
        _role(TRAINER, TRAINER_RULES),
        _binding(TRAINER, TRAINER, (RUNNER,)),
        _role(TRAINER, TRAINER_CLUSTER_RULES, "ClusterRole"),
        binding,
    ]


def _cluster_binding(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": dict(PART_OF)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": RUNNER, "namespace": namespace}],
    }


def cluster_reader_objects(namespace: str = "default") -> list[dict[str, Any]]:
    """The ClusterRole and ClusterRoleBinding of ``manifests/overlays/cluster-reader``: the
    runner account of ``namespace`` (a ClusterRoleBinding's subject needs one)."""
    binding = _cluster_binding(CLUSTER_READER, namespace)
    return [_role(CLUSTER_READER, CLUSTER_READER_RULES, "ClusterRole"), binding]


def to_yaml(objects: list[dict[str, Any]], rules: Any) -> str:
    """The objects as YAML documents, each rule of a Role under a comment saying why."""
    why = {(g, r, v): text for g, r, v, text in rules}
    docs = []
    for obj in objects:
        lines = [f"apiVersion: {obj['apiVersion']}", f"kind: {obj['kind']}", "metadata:"]
        lines += [f"  name: {obj['metadata']['name']}", "  labels:"]
        lines += [f"    {k}: {v}" for k, v in obj["metadata"]["labels"].items()]
        if "rules" in obj:
            lines.append("rules:")
            for rule in obj["rules"]:
                key = (rule["apiGroups"][0], tuple(rule["resources"]), tuple(rule["verbs"]))
                lines += [f"  # {line}" for line in textwrap.wrap(why[key], 94)]
                lines.append(f"  - apiGroups: {json.dumps(rule['apiGroups'])}")
                lines.append(f"    resources: {json.dumps(rule['resources'])}")
                lines.append(f"    verbs: {json.dumps(rule['verbs'])}")
        if "roleRef" in obj:
            ref = obj["roleRef"]
            lines += ["roleRef:", f"  apiGroup: {ref['apiGroup']}", f"  kind: {ref['kind']}"]
            lines += [f"  name: {ref['name']}", "subjects:"]
            for s in obj["subjects"]:
                lines += [f"  - kind: {s['kind']}", f"    name: {s['name']}"]
                lines += [f"    namespace: {s['namespace']}"] if "namespace" in s else []
        docs.append("\n".join(lines) + "\n")
    return "---\n".join(docs)
