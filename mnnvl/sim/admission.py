"""Admission of the simulated API server: discovery documents, defaults and validation."""

from __future__ import annotations

from mnnvl.sim.model import RESOURCES, ApiError, Obj
from mnnvl.sim.schemas import SchemaAdmission

CD = "computedomains"


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
    gvs = {gv for gv in DISCOVERY if gv[0] and (gv[0] != "resource.nvidia.com" or crd_installed)}
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
    elif resource == "namespaces":
        obj["status"] = {"phase": "Active"}
    elif resource == "services":
        spec = obj.setdefault("spec", {})
        spec.setdefault("clusterIP", "10.96.0.10")
        spec.setdefault("type", "ClusterIP")
