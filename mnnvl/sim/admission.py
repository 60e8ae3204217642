"""Admission of the simulated API server: discovery documents, defaults and validation."""

from __future__ import annotations

from mnnvl.sim.model import RESOURCES, ApiError, Obj

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


def validate(resource: str, new: Obj, old: Obj | None) -> None:
    """Admission the CRD schemas and built-in validation perform for the objects we model."""
    name = new.get("metadata", {}).get("name", "")
    if resource == CD:
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
        # v0.4.0 schema: numNodes optional with default 0 and minimum 0.
        nodes = spec.setdefault("numNodes", 0)
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
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
    elif (
        resource == "resourceclaimtemplates"
        and old is not None
        and old.get("spec") != new.get("spec")
    ):
        raise _invalid("ResourceClaimTemplate", name, "spec: Invalid value: field is immutable")


def _invalid(kind: str, name: str, msg: str) -> ApiError:
    group = "resource.nvidia.com" if kind == "ComputeDomain" else ""
    qual = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qual} "{name}" is invalid: {msg}',
        {"name": name, "group": group, "kind": kind},
    )


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def default_on_create(resource: str, obj: Obj) -> None:
    """Status is not accepted on create for resources with a status subresource."""
    if RESOURCES[resource].status_subresource:
        obj.pop("status", None)
    if resource == "pods":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif resource == "namespaces":
        obj["status"] = {"phase": "Active"}
    elif resource == "jobs" and KUEUE_QUEUE_LABEL in (obj["metadata"].get("labels") or {}):
        # Kueue's webhook: a Job for a LocalQueue starts suspended until Kueue admits it
        # (here: until someone sets spec.suspend to false, as Kueue's controller would).
        obj.setdefault("spec", {})["suspend"] = True
    elif resource == "services":
        spec = obj.setdefault("spec", {})
        spec.setdefault("clusterIP", "10.96.0.10")
        spec.setdefault("type", "ClusterIP")
