"""Resource types, API errors and small helpers shared by the simulator's modules."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource plural, namespace or "", name)


@dataclass(frozen=True)
class ResourceType:
    plural: str
    group: str  # "" for the core group
    version: str
    kind: str
    namespaced: bool
    status_subresource: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RBAC_GROUP = "rbac.authorization.k8s.io"
DRA_GROUP = "resource.k8s.io"
CD_GROUP = "resource.nvidia.com"
TRAINER_GROUP = "trainer.kubeflow.org"
CRD_GROUP, CRD_KIND = "apiextensions.k8s.io", "CustomResourceDefinition"
TERMINAL = ("Succeeded", "Failed")  # the pod phases a pod never leaves
RESOURCES: dict[str, ResourceType] = {
    r.plural: r
    for r in (
        ResourceType("namespaces", "", "v1", "Namespace", False, True),
        ResourceType("nodes", "", "v1", "Node", False, True),
        ResourceType("pods", "", "v1", "Pod", True, True),
        ResourceType("services", "", "v1", "Service", True, True),
        ResourceType("events", "", "v1", "Event", True, False),
        ResourceType("resourcequotas", "", "v1", "ResourceQuota", True, True),
        ResourceType("serviceaccounts", "", "v1", "ServiceAccount", True, False),
        ResourceType("secrets", "", "v1", "Secret", True, False),
        ResourceType("configmaps", "", "v1", "ConfigMap", True, False),
        ResourceType("persistentvolumeclaims", "", "v1", "PersistentVolumeClaim", True, True),
        ResourceType("jobs", "batch", "v1", "Job", True, True),
        *(
            ResourceType(plural, RBAC_GROUP, "v1", kind, namespaced, False)
            for plural, kind, namespaced in (
                ("roles", "Role", True),
                ("rolebindings", "RoleBinding", True),
                ("clusterroles", "ClusterRole", False),
                ("clusterrolebindings", "ClusterRoleBinding", False),
            )
        ),
        ResourceType(
            "resourceclaimtemplates", DRA_GROUP, "v1", "ResourceClaimTemplate", True, False
        ),
        ResourceType("resourceclaims", DRA_GROUP, "v1", "ResourceClaim", True, True),
        # Published by the DRA driver stand-in (``mnnvl.sim.nvidia.stacks``), read-only to runs.
        ResourceType("deviceclasses", DRA_GROUP, "v1", "DeviceClass", False, False),
        ResourceType("resourceslices", DRA_GROUP, "v1", "ResourceSlice", False, False),
        ResourceType("computedomains", CD_GROUP, "v1beta1", "ComputeDomain", True, True),
        # Written by the Kueue stand-in only (kueue.py); v1beta2 is Kueue's storage version.
        ResourceType("workloads", "kueue.x-k8s.io", "v1beta2", "Workload", True, True),
        ResourceType("customresourcedefinitions", CRD_GROUP, "v1", CRD_KIND, False, True),
        # Served with the Kubeflow Trainer stand-in only (mnnvl.sim.policy.trainer).
        ResourceType("trainjobs", TRAINER_GROUP, "v1alpha1", "TrainJob", True, True),
        ResourceType(
            "clustertrainingruntimes",
            TRAINER_GROUP,
            "v1alpha1",
            "ClusterTrainingRuntime",
            False,
            False,
        ),
        ResourceType("trainingruntimes", TRAINER_GROUP, "v1alpha1", "TrainingRuntime", True, False),
    )
}
KIND_TO_PLURAL = {r.kind.lower(): r.plural for r in RESOURCES.values()}


class ApiError(Exception):
    """An error the API server returns as a Kubernetes ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def not_found(resource: str, name: str) -> ApiError:
    group = RESOURCES[resource].group if resource in RESOURCES else ""
    details = {"name": name, "group": group, "kind": resource}
    qual = f"{resource}.{group}" if group else resource
    return ApiError(404, "NotFound", f'{qual} "{name}" not found', details)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def iso_after(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


def clone(obj: Any) -> Any:
    # JSON round trip: objects are plain JSON and this is faster than copy.deepcopy.
    return json.loads(json.dumps(obj))


def resolve_kind(kind: str) -> str:
    """Accept a plural ("computedomains") or a kind ("ComputeDomain"); return the plural."""
    low = kind.lower()
    return low if low in RESOURCES else KIND_TO_PLURAL.get(low, low)


_OPTIONS_KIND = {"POST": "Create", "PUT": "Update", "PATCH": "Patch", "DELETE": "Delete"}


def dry_run_requested(verb: str, q: dict[str, str]) -> bool:
    """``dryRun=All`` (the only value a real API server accepts): admit and validate the
    write, answer what would be stored, store nothing, so no watch or controller sees it."""
    value = q.get("dryRun")
    if verb not in _OPTIONS_KIND or value in (None, ""):
        return False
    if value != "All":
        raise ApiError(
            422,
            "Invalid",
            f'{_OPTIONS_KIND[verb]}Options.meta.k8s.io "" is invalid: dryRun: Unsupported value: '
            f'[]string{{"{value}"}}: supported values: "All"',
        )
    return True


def controller_ref(owner: Obj, api_version: str, kind: str) -> Obj:
    """The ownerReference a controller puts on what it creates for ``owner``."""
    ref = {"apiVersion": api_version, "kind": kind, "name": owner["metadata"]["name"]}
    return ref | {"uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def finished(status: Obj) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
