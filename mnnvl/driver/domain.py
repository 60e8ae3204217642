"""The ComputeDomain: create or adopt it, wait for its channel template, delete it and wait gone.

Provisioning never waits for ``status.status == Ready``: IMEX daemons start only where
workload pods are being prepared, so Ready before pods deadlocks (``numNodes > 0``) or
proves nothing (``numNodes = 0``). The gate is the controller-generated ResourceClaimTemplate.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from mnnvl.driver.api import COMPUTE_DOMAIN, POD, RESOURCE_CLAIM_TEMPLATE, Api
from mnnvl.driver.ownership import Deletions, create_or_adopt
from mnnvl.driver.wait import Deadline, Objects, wait_for, wait_gone
from mnnvl.errors import CrdMissing, MnnvlError, NotAdoptable, NotFound, Refused, SpecError
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.namespace import pod_namespace
from mnnvl.inputs.spec import DomainSpec, OwnerRef
from mnnvl.manifests import compute_domain

logger = logging.getLogger(__name__)

DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
FINALIZER = "resource.nvidia.com/computeDomain"


def _driver_logs(component: str) -> str:
    """The driver's log command for both chart lines: NVIDIA's chart (<= 25.12) labels its
    pods ``nvidia-dra-driver-gpu-component``, the kubernetes-sigs chart (v0.4+)
    ``dra-driver-nvidia-gpu-component``."""
    return (
        f"kubectl logs -n <driver-ns> -l nvidia-dra-driver-gpu-component={component} "
        f"(chart <= 25.12; from v0.4: -l dra-driver-nvidia-gpu-component={component})"
    )


CONTROLLER_LOGS = _driver_logs("controller")
KUBELET_PLUGIN_LOGS = _driver_logs("kubelet-plugin")


@dataclass(frozen=True)
class Domain:
    """What provisioning learned about the domain."""

    name: str
    namespace: str
    uid: str
    channel_template: str
    adopted: bool


def ensure_domain(api: Api, spec: DomainSpec) -> Domain:
    """Create the run's ComputeDomain, or adopt it when this run already made it.

    Adoption needs the same spec (allocation mode, channel template): a domain's spec is
    immutable, so a different one is a conflict (exit 2) that names the way out.
    """
    names = RunNames.for_run(spec.run_id)
    try:
        cd, adopted = create_or_adopt(api, COMPUTE_DOMAIN, compute_domain(spec))
    except NotFound as e:
        # The namespace 404 is handled by create_or_adopt; the only other 404 for a POST
        # to the collection: the resource type is unknown.
        raise CrdMissing(spec.namespace) from e
    meta = cd["metadata"]
    logger.info(
        "%s ComputeDomain %s/%s (uid %s)",
        "adopted" if adopted else "created",
        spec.namespace,
        names.domain,
        meta.get("uid"),
    )
    return Domain(
        name=names.domain,
        namespace=spec.namespace,
        uid=str(meta.get("uid", "")),
        channel_template=names.channel_template,
        adopted=adopted,
    )


def wait_for_channel_template(api: Api, domain: Domain, deadline: Deadline) -> dict[str, Any]:
    """Block until the DRA controller has created the domain's ResourceClaimTemplate."""
    name = domain.channel_template

    def owner_uid(objects: Objects) -> str | None:
        rct = objects.get(name)
        if rct is None:
            return None
        return str((rct["metadata"].get("labels") or {}).get(DOMAIN_LABEL, ""))

    def fail(objects: Objects) -> None:
        uid = owner_uid(objects)
        if uid is not None and uid != domain.uid:
            raise NotAdoptable(
                f"an RCT named {domain.namespace}/{name} already exists; the DRA controller "
                "cannot create the domain's channel template (that one is labelled "
                f"{DOMAIN_LABEL}={uid or '<unset>'}, the domain's uid is {domain.uid}): "
                "delete that ResourceClaimTemplate or use another run id"
            )

    def describe(objects: Objects) -> str:
        state = domain_state(api, domain.name, domain.namespace)
        return f"ResourceClaimTemplate {name} absent; {state}"

    objects = wait_for(
        api,
        RESOURCE_CLAIM_TEMPLATE,
        domain.namespace,
        name=name,
        what=f"ResourceClaimTemplate {domain.namespace}/{name} (made by the DRA controller)",
        done=lambda objects: owner_uid(objects) == domain.uid,
        fail=fail,
        describe=describe,
        deadline=deadline,
        hint=f"is the DRA driver's controller running? check {CONTROLLER_LOGS}",
    )
    logger.info("ResourceClaimTemplate %s ready after %.1f s", name, deadline.elapsed())
    return objects[name]


def channel_mode(rct: dict[str, Any]) -> str:
    """The ``allocationMode`` of the controller's channel template ("" when it names none)."""
    for cfg in ((rct.get("spec") or {}).get("spec") or {}).get("devices", {}).get("config") or []:
        params = (cfg.get("opaque") or {}).get("parameters") or {}
        if params.get("kind") == "ComputeDomainChannelConfig":
            return str(params.get("allocationMode") or "")
    return ""


def refuse_forced_single(
    api: Api, spec: DomainSpec, domain: Domain, rct: dict[str, Any], deadline: Deadline
) -> None:
    """``--allocation-mode All`` where the driver gives each pod channel 0 only: delete the
    domain and raise ``SpecError`` (exit 2).

    The driver's IMEX mode is its own setting, which the namespaced Role cannot read; its
    channel template says it: with host-managed IMEX the controller writes ``Single`` whatever
    the domain asked (``channelAllocationModeFor`` in
    ``cmd/compute-domain-controller/resourceclaimtemplate.go`` of
    kubernetes-sigs/dra-driver-nvidia-gpu).
    """
    got = channel_mode(rct)
    if spec.allocation_mode != "All" or got != "Single":
        return
    delete_domain(api, spec.namespace, domain.name, deadline, Deletions(spec.run_id))
    raise SpecError(
        "allocation_mode",
        f"All is not served here: the DRA driver's channel template for ComputeDomain "
        f"{spec.namespace}/{domain.name} gives each pod channel 0 only (allocationMode "
        "Single), as it does with host-managed IMEX (resources.computeDomains.imex.mode="
        "hostManaged); the domain was deleted; run with --allocation-mode Single",
    )


def delete_domain(api: Api, namespace: str, name: str, deadline: Deadline, gone: Deletions) -> bool:
    """Delete the run's ComputeDomain and wait until it is gone (404).

    False when it already was, or when the object of that name is not the run's (then it
    is left alone and listed in ``gone.skipped``). Gone means the controller removed its
    finalizer after cleaning up, so the nodes' IMEX state is released; only then may a new
    domain take those nodes.
    """
    if not gone.delete_named(api, COMPUTE_DOMAIN, namespace, name):
        return False
    wait_gone(
        api,
        COMPUTE_DOMAIN,
        namespace,
        name=name,
        what=f"ComputeDomain {namespace}/{name}",
        deadline=deadline,
        hint=f"finalizer {FINALIZER} still present; "
        f"check the DRA controller logs: {CONTROLLER_LOGS}",
    )
    logger.info("ComputeDomain %s/%s gone after %.1f s", namespace, name, deadline.elapsed())
    return True


def refused_namespace(namespace: str, error: Refused) -> SpecError:
    """The error for a teardown or reap whose first list in ``namespace`` was refused: with
    the shipped Role (namespaced) a namespace that does not exist answers 403, as does one
    where the Role is not bound; nothing was deleted."""
    refusal = str(error).partition("; ")[0]
    return SpecError(
        "namespace",
        f"{namespace!r} does not exist, or this account has no mnnvl-runner Role there "
        f"({refusal}); nothing was deleted: check the name (kubectl get namespaces) or bind "
        f"the Role (kubectl apply -n {namespace} -k manifests/overlays/kfp, or "
        "manifests/overlays/argo)",
    )


def require_namespace(api: Api, namespace: str) -> None:
    """Raise ``SpecError`` when ``namespace`` does not exist, asked as a namespace-scoped
    account may (it may not GET namespaces): a server-side dry run of a ComputeDomain create,
    which stores nothing and which the NamespaceLifecycle admission answers 404 naming the
    namespace. Asked by a teardown or reap that found nothing, where an account with rights
    beyond one namespace lists an empty namespace that does not exist; any other answer
    (created, 409, refused) means it exists or cannot be told, and nothing is raised."""
    probe = compute_domain(DomainSpec(run_id="namespace-check", namespace=namespace))
    try:
        api.create(COMPUTE_DOMAIN, namespace, probe, dry_run=True)
    except NotFound as e:
        if e.details_kind == "namespaces":
            raise SpecError(
                "namespace",
                f"{namespace!r} does not exist, so no object of a run can be there; check the "
                "name (kubectl get namespaces)",
            ) from e
    except MnnvlError as e:
        logger.debug("namespace %s: the dry-run create answered %s", namespace, e)


def domain_state(api: Api, name: str, namespace: str) -> str:
    """A one-line summary of the domain's status for error messages (diagnostics only)."""
    return domain_nodes(api, name, namespace)[0]


def domain_nodes(api: Api, name: str, namespace: str) -> tuple[str, dict[str, str]]:
    """``(summary, {node: IMEX status})`` from the domain's ``status.nodes`` (never raises)."""
    try:
        cd = api.get(COMPUTE_DOMAIN, namespace, name)
    except MnnvlError as e:
        return f"ComputeDomain {namespace}/{name} unreadable ({e})", {}
    status = cd.get("status") or {}
    nodes = {str(n.get("name")): str(n.get("status", "?")) for n in status.get("nodes") or []}
    node_text = ", ".join(f"{k}={v}" for k, v in nodes.items()) or "none"
    summary = (
        f"ComputeDomain {namespace}/{name} status {status.get('status', '<unset>')}, "
        f"status.nodes: {node_text}"
    )
    return summary, nodes


def launcher_owner(api: Api, namespace: str) -> OwnerRef | None:
    """An owner reference to the pod this process runs in, when that pod is in ``namespace``.

    The pod is found from ``POD_NAME``/``POD_NAMESPACE`` (downward API) or, in a cluster,
    ``HOSTNAME`` and the service account's namespace file.
    """
    pod_name = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME", "")
    pod_ns = pod_namespace()
    if not pod_name or not pod_ns:
        logger.warning("--owner-pod: not running in a pod (POD_NAME/POD_NAMESPACE unset); no owner")
        return None
    if pod_ns != namespace:
        logger.warning(
            "--owner-pod: launcher pod is in %s, objects in %s; owners must share a namespace",
            pod_ns,
            namespace,
        )
        return None
    pod = api.get(POD, pod_ns, pod_name)
    return OwnerRef(api_version="v1", kind="Pod", name=pod_name, uid=pod["metadata"]["uid"])
