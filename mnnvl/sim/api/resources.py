"""What the simulated API server serves per resource: discovery documents, OpenAPI v3, create
defaults and validation (the registry strategies of kube-apiserver)."""

from __future__ import annotations

from mnnvl.sim.api.model import RESOURCES, ApiError, Obj
from mnnvl.sim.api.schemas import SchemaAdmission, invalid
from mnnvl.sim.api.store import Store, now_iso

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
        entries = groups.setdefault((rt.group, rt.version), [])
        common = {"singularName": "", "kind": rt.kind, "namespaced": rt.namespaced}
        entries.append(
            common
            | {
                "name": rt.plural,
                "singularName": rt.kind.lower(),
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                "shortNames": SHORT_NAMES.get(rt.plural, []),
                "categories": ["all"] if rt.plural in CATEGORY_ALL else [],
            }
        )
        if rt.status_subresource:
            entries.append(
                common | {"name": f"{rt.plural}/status", "verbs": ["get", "patch", "update"]}
            )
        if rt.plural == "pods":
            entries.append(common | {"name": "pods/log", "verbs": ["get"]})
    return groups


DISCOVERY = _discovery_groups()


def discovery(parts: list[str], unserved: frozenset[str]) -> Obj:
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
    gvs = {gv for gv in _served(unserved) if gv[0]}
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


def _served(unserved: frozenset[str]) -> list[tuple[str, str]]:
    """The group-versions served: every one but the API groups not installed (``unserved``)."""
    return [gv for gv in DISCOVERY if gv[0] not in unserved]


def openapi_v3(parts: list[str], unserved: frozenset[str]) -> Obj:
    """``/openapi/v3`` and its group-version documents, as much as kubectl reads: each kind's
    PATCH operation (``x-kubernetes-group-version-kind``) with the ``fieldValidation`` query
    parameter, which is how kubectl decides that the server validates fields, so it sends
    ``fieldValidation=Strict`` instead of validating against schemas itself
    (kubernetes/cli-runtime ``pkg/resource/query_param_verifier_v3.go``, kubectl
    ``pkg/validation/schema.go`` ``paramVerifyingSchema``, v0.32.4). Without it kubectl falls
    back to ``/openapi/v2`` and, on a 404 there, refuses to apply. No schemas are served
    (``kubectl explain`` has nothing to show)."""
    paths = {("api/" if not g else f"apis/{g}/") + v: (g, v) for g, v in _served(unserved)}
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
    if resource == CD:
        _validate_cd(new, old, schemas.driver_version if schemas else "v0.4.0")
    elif (
        resource == "resourceclaimtemplates"
        and old is not None
        and old.get("spec") != new.get("spec")
    ):
        raise invalid(resource, new, ["spec: Invalid value: field is immutable"])
    if schemas is not None:
        schemas.check(resource, new)


# What a suspended Job's pod template may change (pkg/apis/batch/validation/validation.go,
# validatePodTemplateUpdate with AllowMutableSchedulingDirectives): its scheduling directives.
SCHEDULING = ("nodeSelector", "affinity", "tolerations", "schedulingGates")


def job_update_error(new: Obj, old: Obj, minor: int) -> str:
    """Why the API server refuses this change of a Job's pod template ("" when it allows it).

    The template is immutable but for the scheduling directives of a Job that is suspended
    and has not started (``status.startTime`` unset); from Kubernetes 1.36 also of one that
    carries the ``Suspended`` condition and has no active pods
    (``MutableSchedulingDirectivesForSuspendedJobs``, beta; ``pkg/registry/batch/job/
    strategy.go`` reads the old Job's state)."""
    before, after = old["spec"].get("template") or {}, new["spec"].get("template") or {}
    if before == after:
        return ""
    field = 'spec.template: Invalid value: "...": field is immutable'
    if _without_scheduling(before) != _without_scheduling(after):
        return field
    status = old.get("status") or {}
    suspended = bool(old["spec"].get("suspend"))
    safely = (
        minor >= 36
        and not status.get("active")
        and any(
            c.get("type") == "Suspended" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
    )
    return "" if suspended and ("startTime" not in status or safely) else field


def _without_scheduling(template: Obj) -> Obj:
    spec = {k: v for k, v in (template.get("spec") or {}).items() if k not in SCHEDULING}
    return {"spec": spec}


def _validate_cd(new: Obj, old: Obj | None, driver_version: str) -> None:
    error = _cd_error(new, old, driver_version)
    if error:
        raise invalid(CD, new, [error])


def _cd_error(new: Obj, old: Obj | None, driver_version: str) -> str:
    """The first of the driver CRD's rules (and defaults) the ComputeDomain breaks, or ""."""
    spec = new.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("channel"), dict):
        return "spec.channel: Required value"
    channel = spec["channel"]
    if not (channel.get("resourceClaimTemplate") or {}).get("name"):
        return "spec.channel.resourceClaimTemplate.name: Required value"
    mode = channel.setdefault("allocationMode", "Single")
    if mode not in ("All", "Single"):
        return (
            f'spec.channel.allocationMode: Unsupported value: "{mode}": '
            'supported values: "All", "Single"'
        )
    # v25.12.0: numNodes required, any integer; v0.4.0: optional, default 0, minimum 0.
    if "numNodes" not in spec and driver_version != "v0.4.0":
        return "spec.numNodes: Required value"
    nodes = spec.setdefault("numNodes", 0)
    minimum = 0 if driver_version == "v0.4.0" else -(2**63)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < minimum:
        return (
            f"spec.numNodes: Invalid value: {nodes}: "
            "spec.numNodes in body should be greater than or equal to 0"
        )
    if old is not None and old.get("spec") != spec:
        return 'spec: Invalid value: "object": A computeDomain.spec is immutable'
    return ""


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
    elif resource == "jobs":
        default_job(obj)


def default_job(job: Obj) -> None:
    """A batch/v1 Job's defaults, as kube-apiserver sets them on create (``SetDefaults_Job``,
    pkg/apis/batch/v1/defaults.go): neither completions nor parallelism means one pod that must
    succeed once (both 1); parallelism alone defaults to 1, completions alone stays unset (a
    work queue); backoffLimit 6 (the largest int32 with a per-index limit); NonIndexed, not
    suspended; pods replaced once Failed under a podFailurePolicy, else once terminating; a
    podFailurePolicy condition pattern's status True; the template's labels when the Job has
    none."""
    spec = job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = spec["parallelism"] = 1
    if spec.get("parallelism") is None:
        spec["parallelism"] = 1
    if spec.get("backoffLimit") is None:
        spec["backoffLimit"] = 2**31 - 1 if spec.get("backoffLimitPerIndex") is not None else 6
    if spec.get("completionMode") is None:
        spec["completionMode"] = "NonIndexed"
    if spec.get("suspend") is None:
        spec["suspend"] = False
    policy = spec.get("podFailurePolicy")
    for rule in (policy or {}).get("rules") or []:
        for pattern in rule.get("onPodConditions") or []:
            if not pattern.get("status"):
                pattern["status"] = "True"
    if spec.get("podReplacementPolicy") is None:
        spec["podReplacementPolicy"] = "Failed" if policy else "TerminatingOrFailed"
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
    meta = job.setdefault("metadata", {})
    if labels and not meta.get("labels"):
        meta["labels"] = dict(labels)


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
