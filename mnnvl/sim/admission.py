"""Admission of the simulated API server: discovery documents, defaults, validation and the
validating plugins that refuse pods (PodSecurity, webhooks, ResourceQuota)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mnnvl.sim.model import RESOURCES, ApiError, Obj
from mnnvl.sim.podsecurity import violation
from mnnvl.sim.schemas import SchemaAdmission
from mnnvl.sim.store import Store, now_iso

CD = "computedomains"
DEFAULT_SERVICE_ACCOUNT = "default"


# The short names and the ``all`` category kubectl resolves through discovery (``kubectl get
# ns``, ``kubectl get all``): each kind's ShortNames()/Categories() in kubernetes
# pkg/registry/*/*/storage/storage.go (jobs, the DRA kinds and ComputeDomains have none).
SHORT_NAMES = {
    "namespaces": ["ns"],
    "nodes": ["no"],
    "pods": ["po"],
    "services": ["svc"],
    "events": ["ev"],
    "resourcequotas": ["quota"],
    "serviceaccounts": ["sa"],
    "configmaps": ["cm"],
    "persistentvolumeclaims": ["pvc"],
    "customresourcedefinitions": ["crd", "crds"],
}
CATEGORY_ALL = {"pods", "services", "jobs"}


def _discovery_groups() -> dict[tuple[str, str], list[Obj]]:
    groups: dict[tuple[str, str], list[Obj]] = {}
    for rt in RESOURCES.values():
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        entries = groups.setdefault((rt.group, rt.version), [])
        entries.append(
            {
                "name": rt.plural,
                "singularName": rt.kind.lower(),
                "kind": rt.kind,
                "namespaced": rt.namespaced,
                "verbs": verbs,
                "shortNames": SHORT_NAMES.get(rt.plural, []),
                "categories": ["all"] if rt.plural in CATEGORY_ALL else [],
            }
        )
        if rt.status_subresource:
            entries.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "kind": rt.kind,
                    "namespaced": rt.namespaced,
                    "verbs": ["get", "patch", "update"],
                }
            )
    groups[("", "v1")].append(
        {
            "name": "pods/log",
            "singularName": "",
            "kind": "Pod",
            "namespaced": True,
            "verbs": ["get"],
        }
    )
    return groups


DISCOVERY = _discovery_groups()


def discovery(parts: list[str], crd_installed: bool) -> Obj:
    """The discovery documents (/version, /api, /apis, /api/v1, /apis/<group>/<version>)."""
    if parts == ["version"]:
        # Every field a real kube-apiserver's /version has (clients' models require them).
        return {
            "major": "1",
            "minor": "34",
            "gitVersion": "v1.34.0-mnnvl-sim",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2025-08-27T00:00:00Z",
            "goVersion": "go1.24.6",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    gvs = {gv for gv in _served(crd_installed) if gv[0]}
    if parts == ["apis"]:
        groups = [
            {
                "name": g,
                "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
            }
            for g, v in sorted(gvs)
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    gv = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
    if gv not in DISCOVERY or (gv[0] and gv not in gvs):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "/".join(p for p in gv if p),
        "resources": DISCOVERY[gv],
    }


def _served(crd_installed: bool) -> list[tuple[str, str]]:
    return [gv for gv in DISCOVERY if gv[0] != "resource.nvidia.com" or crd_installed]


def openapi_v3(parts: list[str], crd_installed: bool) -> Obj:
    """``/openapi/v3`` and its group-version documents, as much as kubectl reads: each kind's
    PATCH operation (``x-kubernetes-group-version-kind``) with the ``fieldValidation`` query
    parameter, which is how kubectl decides that the server validates fields, so it sends
    ``fieldValidation=Strict`` instead of validating against schemas itself
    (kubernetes/cli-runtime ``pkg/resource/query_param_verifier_v3.go``, kubectl
    ``pkg/validation/schema.go`` ``paramVerifyingSchema``, v0.32.4). Without it kubectl falls
    back to ``/openapi/v2`` and, on a 404 there, refuses to apply. No schemas are served
    (``kubectl explain`` has nothing to show)."""
    paths = {("api/" if not g else f"apis/{g}/") + v: (g, v) for g, v in _served(crd_installed)}
    if not parts:
        return {"paths": {p: {"serverRelativeURL": f"/openapi/v3/{p}?hash=sim"} for p in paths}}
    gv = paths.get("/".join(parts))
    if gv is None:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    query = [
        {"name": n, "in": "query", "schema": {"type": "string"}}
        for n in ("dryRun", "fieldManager", "fieldValidation")
    ]
    operations = {}
    for rt in RESOURCES.values():
        if (rt.group, rt.version) == gv:
            scope = "/namespaces/{namespace}" if rt.namespaced else ""
            prefix = f"/apis/{rt.group}" if rt.group else "/api"
            gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
            operations[f"{prefix}/{rt.version}{scope}/{rt.plural}/{{name}}"] = {
                "patch": {
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": query,
                }
            }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0-mnnvl-sim"},
        "paths": operations,
    }


def validate(
    resource: str, new: Obj, old: Obj | None, schemas: SchemaAdmission | None = None
) -> None:
    """Admission the CRD schemas and built-in validation perform for the objects we model."""
    name = new.get("metadata", {}).get("name", "")
    if resource == CD:
        _validate_cd(name, new, old, schemas.driver_version if schemas else "v0.4.0")
    elif (
        resource == "resourceclaimtemplates"
        and old is not None
        and old.get("spec") != new.get("spec")
    ):
        raise _invalid("ResourceClaimTemplate", name, "spec: Invalid value: field is immutable")
    if schemas is not None:
        schemas.check(resource, new)


def _validate_cd(name: str, new: Obj, old: Obj | None, driver_version: str) -> None:
    spec = new.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("channel"), dict):
        raise _invalid("ComputeDomain", name, "spec.channel: Required value")
    channel = spec["channel"]
    if not (channel.get("resourceClaimTemplate") or {}).get("name"):
        raise _invalid(
            "ComputeDomain", name, "spec.channel.resourceClaimTemplate.name: Required value"
        )
    mode = channel.setdefault("allocationMode", "Single")
    if mode not in ("All", "Single"):
        raise _invalid(
            "ComputeDomain",
            name,
            f"spec.channel.allocationMode: Unsupported "
            f'value: "{mode}": supported values: "All", "Single"',
        )
    # v25.12.0: numNodes required, any integer; v0.4.0: optional, default 0, minimum 0.
    if "numNodes" not in spec and driver_version != "v0.4.0":
        raise _invalid("ComputeDomain", name, "spec.numNodes: Required value")
    nodes = spec.setdefault("numNodes", 0)
    minimum = 0 if driver_version == "v0.4.0" else -(2**63)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < minimum:
        raise _invalid(
            "ComputeDomain",
            name,
            f"spec.numNodes: Invalid value: {nodes}: "
            "spec.numNodes in body should be greater than or equal to 0",
        )
    if old is not None and old.get("spec") != spec:
        raise _invalid(
            "ComputeDomain",
            name,
            'spec: Invalid value: "object": A computeDomain.spec is immutable',
        )


def _invalid(kind: str, name: str, msg: str) -> ApiError:
    group = "resource.nvidia.com" if kind == "ComputeDomain" else ""
    qual = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qual} "{name}" is invalid: {msg}',
        {"name": name, "group": group, "kind": kind},
    )


def default_on_create(resource: str, obj: Obj) -> None:
    """Status is not accepted on create for resources with a status subresource."""
    if RESOURCES[resource].status_subresource:
        obj.pop("status", None)
    if resource == "pods":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        scheduling_gated(obj)
    elif resource == "namespaces":
        obj["status"] = {"phase": "Active"}
    elif resource == "persistentvolumeclaims":
        # No volumes are modelled: a claim is bound as it is created (its host directory is
        # made on first mount).
        obj["status"] = {"phase": "Bound"}
    elif resource == "services":
        spec = obj.setdefault("spec", {})
        spec.setdefault("clusterIP", "10.96.0.10")
        spec.setdefault("type", "ClusterIP")


def scheduling_gated(pod: Obj) -> None:
    """A new pod with scheduling gates is created PodScheduled=False, reason SchedulingGated
    (kube-apiserver's pod strategy, ``applySchedulingGatedCondition``)."""
    if not (pod.get("spec") or {}).get("schedulingGates"):
        return
    pod.setdefault("status", {})["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates",
            "lastProbeTime": None,
            "lastTransitionTime": now_iso(),
        }
    ]


def ensure_default_service_account(store: Store, namespace: str) -> None:
    """What kube-controller-manager's serviceaccounts controller does for every namespace:
    create its ``default`` ServiceAccount (at once here; a moment later on a real cluster)."""
    if store.find("serviceaccounts", namespace, DEFAULT_SERVICE_ACCOUNT) is None:
        body = {"metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}}
        store.create("serviceaccounts", body)


# ---- validating admission of pods ------------------------------------------------------------


@dataclass(frozen=True)
class Denial:
    """A validating webhook (for tests) that refuses pods of one Job, or every pod."""

    webhook: str
    message: str
    job: str | None


class PodAdmission:
    """The validating admission plugins that can refuse a pod, in kube-apiserver's order:
    PodSecurity (the namespace's ``enforce`` label), validating webhooks (``deny``), then
    ResourceQuota, which runs last. A refusal is the 403 a real API server answers, to a
    client's create and to the Job controller's alike (which turns it into a FailedCreate
    Event on the Job)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._denials: list[Denial] = []
        self._lock = threading.Lock()

    def deny(self, webhook: str, message: str, job: str | None = None) -> None:
        """Make webhook ``webhook`` refuse pods (of Job ``job``, or all) with ``message``."""
        with self._lock:
            self._denials.append(Denial(webhook, message, job))

    def clear_denials(self) -> None:
        with self._lock:
            self._denials.clear()

    def admit(self, resource: str, pod: Obj) -> None:
        """Raise the API's refusal of a new pod, or return when every plugin admits it."""
        if resource != "pods":
            return
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        name = meta.get("name") or meta.get("generateName") or "Unknown"
        self._service_account(ns, name, pod)
        namespace = self.store.find("namespaces", "", ns)
        found = violation(namespace, pod) if namespace is not None else None
        if found:
            raise forbidden(name, found)
        job = (meta.get("labels") or {}).get("job-name")
        with self._lock:
            denial = next((d for d in self._denials if d.job in (None, job)), None)
        if denial is not None:
            # A webhook's refusal carries no 'pods "x" is forbidden' prefix (webhook errors'
            # ToStatusErr); the code defaults to 403.
            message = f'admission webhook "{denial.webhook}" denied the request: {denial.message}'
            raise ApiError(403, "", message, {"name": name, "kind": "pods"})
        self._quota(ns, name, pod)

    def _service_account(self, ns: str, name: str, pod: Obj) -> None:
        """The ServiceAccount plugin (a mutating one, so it runs before the validating plugins):
        an unset ``serviceAccountName`` becomes ``default``, and the account must exist
        (plugin/pkg/admission/serviceaccount, ``Admit``)."""
        namespace = self.store.find("namespaces", "", ns)
        if namespace is None or namespace["metadata"].get("deletionTimestamp"):
            return  # NamespaceLifecycle, which runs first, refuses it (the store's create)
        spec = pod.setdefault("spec", {})
        account = spec.setdefault("serviceAccountName", DEFAULT_SERVICE_ACCOUNT)
        if self.store.find("serviceaccounts", ns, account) is None:
            raise forbidden(
                name,
                f"error looking up service account {ns}/{account}: "
                f'serviceaccount "{account}" not found',
            )

    def _quota(self, ns: str, name: str, pod: Obj) -> None:
        quotas = sorted(
            self.store.list("resourcequotas", ns)[0], key=lambda q: q["metadata"]["name"]
        )
        if not quotas:
            return
        delta = pod_usage(pod)
        used: dict[str, int] = {}
        for other in self.store.list("pods", ns)[0]:
            # Terminal pods no longer count (QuotaV1Pod); terminating ones still do.
            if (other.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                for key, value in pod_usage(other).items():
                    used[key] = used.get(key, 0) + value
        for quota in quotas:
            hard = {
                k: q
                for k, v in ((quota.get("spec") or {}).get("hard") or {}).items()
                if (q := _quantity(v)) is not None
            }
            exceeded = sorted(k for k in hard if k in delta and used.get(k, 0) + delta[k] > hard[k])
            if exceeded:
                raise forbidden(
                    name,
                    f"exceeded quota: {quota['metadata']['name']}, "
                    f"requested: {_pretty(delta, exceeded)}, used: {_pretty(used, exceeded)}, "
                    f"limited: {_pretty(hard, exceeded)}",
                )


def pod_usage(pod: Obj) -> dict[str, int]:
    """What a pod charges to a quota: ``pods`` and ``count/pods``, and its integer requests
    and limits (``requests.nvidia.com/gpu``; an extended resource's request defaults to its
    limit)."""
    usage = {"pods": 1, "count/pods": 1}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for resource in {*limits, *requests}:
            for kind, amount in (
                ("requests", requests.get(resource, limits.get(resource))),
                ("limits", limits.get(resource)),
            ):
                value = _quantity(amount)
                if value is not None:
                    key = f"{kind}.{resource}"
                    usage[key] = usage.get(key, 0) + value
    return usage


def _quantity(value: object) -> int | None:
    """A whole-number quantity ("2", "1Gi"); None for a fraction (CPU: not modelled)."""
    from kubernetes.utils import parse_quantity

    try:
        number = parse_quantity(value)
    except (ValueError, TypeError):
        return None
    return int(number) if number == int(number) else None


def _pretty(usage: dict[str, int], keys: list[str]) -> str:
    return ",".join(f"{k}={usage.get(k, 0)}" for k in keys)


def forbidden(name: str, reason: str) -> ApiError:
    """``pods "<name>" is forbidden: <reason>`` (admission.NewForbidden)."""
    return ApiError(
        403, "Forbidden", f'pods "{name}" is forbidden: {reason}', {"name": name, "kind": "pods"}
    )
