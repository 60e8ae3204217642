"""``mnnvl preflight``: is this cluster ready for a run? Read-only; one row per check.

Every read is a GET or LIST except the SelfSubjectRulesReview, a create that every
authenticated account may send (``system:basic-user``) and that stores nothing. The
namespaced Role (``manifests/base``) lets preflight see the ComputeDomain API and its own
permissions; the rest is cluster-scoped and comes from the optional read-only cluster reader
(``manifests/overlays/cluster-reader``): without it those rows are SKIPPED and say so.
A row is PASS, WARN (a run may still work), FAIL (a run will not: the row names the fix) or
SKIPPED (not readable, or not asked for).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mnnvl.contract import rbac
from mnnvl.contract.result import FAIL, PASS
from mnnvl.driver.api import COMPUTE_DOMAIN, DEVICE_CLASS, NODE, RESOURCE_SLICE, Api, Kind
from mnnvl.driver.gpus import (
    CLUSTER_READER,
    GPU_DRIVER,
    NO_GPUS,
    choose_gpu_mode,
    device_plugin_nodes,
)
from mnnvl.driver.kueue import KUEUE_RBAC
from mnnvl.errors import DRA_INSTALL_HINT, NotFound, Refused
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import CLIQUE_LABEL

WARN, SKIPPED = "WARN", "SKIPPED"  # beside the verdicts PASS and FAIL

CRD = Kind("CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions")
RULES_REVIEW = Kind(
    "SelfSubjectRulesReview", "authorization.k8s.io", "v1", "selfsubjectrulesreviews"
)
LOCAL_QUEUE = Kind("LocalQueue", "kueue.x-k8s.io", "v1beta2", "localqueues")
CLUSTER_QUEUE = Kind("ClusterQueue", "kueue.x-k8s.io", "v1beta2", "clusterqueues")
CD_CRD = "computedomains.resource.nvidia.com"
CD_DRIVER = "compute-domain.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
NOT_READABLE = f"not readable by this account; {CLUSTER_READER} grants it"


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    saw: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _row(check: str, fn: Callable[[], Row]) -> Row:
    """``fn()``, or SKIPPED where a read was refused (an outage still ends the command, exit 5)."""
    try:
        return fn()
    except Refused:
        return Row(check, SKIPPED, NOT_READABLE)


def check_cluster(api: Api, workload: WorkloadSpec) -> list[Row]:
    """Every row, in the order a run needs them."""
    ns, place = workload.namespace, workload.placement
    # Read once: the nodes and ResourceSlices feed several rows.
    nodes = functools.cache(lambda: api.list(NODE, "")["items"])
    slices = functools.cache(lambda: api.list(RESOURCE_SLICE, "")["items"])
    return [
        _row("computedomain-crd", lambda: _crd_row(api, ns)),
        _row("device-classes", lambda: _class_row(api, workload)),
        _row("clique-labels", lambda: clique_row(nodes(), workload)),
        _row("channel-devices", lambda: channel_row(nodes(), slices(), place.clique_label)),
        _row("gpu-stack", lambda: _gpu_row(api, workload, slices())),
        _row("imex-mode", lambda: imex_row(slices())),
        _kueue_row(api, workload),
        _row("runner-permissions", lambda: _permissions_row(api, workload)),
    ]


def _crd_row(api: Api, ns: str) -> Row:
    fix = DRA_INSTALL_HINT
    try:
        crd = api.get(CRD, "", CD_CRD)
    except NotFound:
        return Row("computedomain-crd", FAIL, f"CRD {CD_CRD} not installed", fix)
    except Refused:  # the namespaced Role can still tell whether the API is served
        try:
            api.list(COMPUTE_DOMAIN, ns)
        except NotFound:
            return Row("computedomain-crd", FAIL, f"{CD_CRD}/v1beta1 not served", fix)
        return Row("computedomain-crd", PASS, f"v1beta1 served (the CRD itself: {NOT_READABLE})")
    served = [v["name"] for v in crd.get("spec", {}).get("versions", []) if v.get("served")]
    status = PASS if COMPUTE_DOMAIN.version in served else FAIL
    fix = "" if status == PASS else f"upgrade the DRA driver to one serving v1beta1; {fix}"
    return Row("computedomain-crd", status, f"served versions: {', '.join(served)}", fix)


def _class_row(api: Api, workload: WorkloadSpec) -> Row:
    seen, missing = [], []
    gpu_class = [workload.placement.gpu_device_class] if workload.gpus_per_node else []
    wanted = [CHANNEL_CLASS, *gpu_class]
    for name in wanted:
        try:
            spec = api.get(DEVICE_CLASS, "", name).get("spec") or {}
        except NotFound:
            missing.append(name)
            continue
        mapped = spec.get("extendedResourceName")
        seen.append(f"{name}" + (f" (extendedResourceName {mapped})" if mapped else ""))
    text = "; ".join(seen + [f"{m} absent" for m in missing])
    if CHANNEL_CLASS in missing:
        return Row("device-classes", FAIL, text, DRA_INSTALL_HINT)
    if missing and workload.placement.gpu_mode == "claim":
        fix = "install the DRA driver with GPUs (resources.gpus.enabled) or run --gpu-mode limits"
        return Row("device-classes", FAIL, text, fix)
    return Row("device-classes", PASS, text)


def clique_row(nodes: list[dict[str, Any]], workload: WorkloadSpec) -> Row:
    """Nodes per clique against the groups a run of ``workload``'s shape needs."""
    key = workload.placement.clique_label
    cliques = Counter(
        (n["metadata"].get("labels") or {})[key]
        for n in nodes
        if key in (n["metadata"].get("labels") or {})
    )
    size = workload.group_nodes
    text = f"{sum(cliques.values())} of {len(nodes)} nodes carry {key}" + (
        f"; cliques: {', '.join(f'{k}={v}' for k, v in sorted(cliques.items()))}" if cliques else ""
    )
    fix = (
        f"label the nodes {key}=<clusterUUID>.<cliqueId>: GPU Feature Discovery sets "
        "it, or the DRA driver with gpuCliqueLabelEnabled (it drops it while its plugin restarts); "
        "a provider's own key: --clique-label"
    )
    if not cliques:
        return Row("clique-labels", FAIL, text, fix)
    if sum(v >= size for v in cliques.values()) < workload.groups:
        need = f"{workload.groups} clique(s) of >= {size} nodes for --nodes {workload.nodes}"
        return Row(
            "clique-labels", FAIL, f"{text}; a run needs {need}", f"{fix}; or run fewer nodes"
        )
    return Row("clique-labels", PASS, text)


def _channel_devices(slices: list[dict[str, Any]], kind: str) -> set[str]:
    return {
        str(s["spec"].get("nodeName"))
        for s in slices
        if s["spec"].get("driver") == CD_DRIVER
        for d in s["spec"].get("devices") or []
        if ((d.get("attributes") or {}).get("type") or {}).get("string") == kind
    }


def channel_row(
    nodes: list[dict[str, Any]], slices: list[dict[str, Any]], key: str = CLIQUE_LABEL
) -> Row:
    """Every clique-labelled node publishes an IMEX channel (the driver's kubelet plugin)."""
    labelled = {n["metadata"]["name"] for n in nodes if key in (n["metadata"].get("labels") or {})}
    have = _channel_devices(slices, "channel")
    lacking = sorted(labelled - have)
    text = f"{len(have & labelled)} of {len(labelled)} clique nodes publish a channel device"
    if lacking or not have:
        fix = (
            "check the DRA driver's compute-domain kubelet plugin on those nodes (kubectl -n "
            "nvidia-dra-driver-gpu get pods -o wide)"
        )
        return Row("channel-devices", FAIL, f"{text}; none on {', '.join(lacking[:5])}", fix)
    return Row("channel-devices", PASS, text)


def _gpu_row(api: Api, workload: WorkloadSpec, slices: list[dict[str, Any]]) -> Row:
    if not workload.gpus_per_node:
        return Row("gpu-stack", PASS, "--gpus-per-node 0: CPU workers, no GPUs asked for")
    plugin = device_plugin_nodes(api)
    if plugin is None:
        raise Refused("list nodes")
    dra = sum(
        len(s["spec"].get("devices") or []) for s in slices if s["spec"].get("driver") == GPU_DRIVER
    )
    if not plugin and not dra:
        text = f"device plugin on no node, no DRA GPU device: {NO_GPUS}"
        return Row("gpu-stack", FAIL, text, "for CPU workers pass --gpus-per-node 0")
    mode, why = choose_gpu_mode(api, workload.placement.gpu_device_class)
    text = f"device plugin on {plugin} node(s), {dra} DRA GPU device(s); {why}"
    if workload.placement.gpu_mode == "auto":
        return Row("gpu-stack", PASS, f"{text}; --gpu-mode auto runs as {mode}")
    if workload.placement.gpu_mode == "claim" and not dra:
        return Row(
            "gpu-stack", FAIL, text, "no DRA GPUs here: run with --gpu-mode limits (or auto)"
        )
    if workload.placement.gpu_mode == "limits" and mode == "claim":
        return Row("gpu-stack", FAIL, text, "GPUs come only from DRA: run with --gpu-mode claim")
    return Row("gpu-stack", PASS, f"{text}; --gpu-mode {workload.placement.gpu_mode} fits")


def imex_row(slices: list[dict[str, Any]]) -> Row:
    """The driver's IMEX mode, from what its kubelet plugin publishes: a daemon device per node
    only when it runs the IMEX daemons (``computeDomainPublishedDevices`` in
    ``cmd/compute-domain-kubelet-plugin/driver.go`` of kubernetes-sigs/dra-driver-nvidia-gpu)."""
    channels, daemons = _channel_devices(slices, "channel"), _channel_devices(slices, "daemon")
    if not channels:
        return Row("imex-mode", FAIL, "no compute-domain channel devices", DRA_INSTALL_HINT)
    if daemons:
        return Row("imex-mode", PASS, f"daemons (driver-managed; {len(daemons)} node(s))")
    return Row(
        "imex-mode",
        PASS,
        "hostManaged (no daemon devices): the host's nvidia-imex service must run on every "
        "node; channels are Single, so --allocation-mode All is refused",
    )


def _kueue_row(api: Api, workload: WorkloadSpec) -> Row:
    if not workload.queue_name:
        return Row("kueue", SKIPPED, "no --queue-name given")
    try:
        lq = api.get(LOCAL_QUEUE, workload.namespace, workload.queue_name)
        cq = api.get(CLUSTER_QUEUE, "", str(lq.get("spec", {}).get("clusterQueue", "")))
    except NotFound as e:
        return Row(
            "kueue", FAIL, str(e), "create the LocalQueue and its ClusterQueue, or fix --queue-name"
        )
    except Refused:
        return Row("kueue", SKIPPED, f"LocalQueue/ClusterQueue {NOT_READABLE}")
    return kueue_row(workload.queue_name, cq)


def kueue_row(queue: str, cq: dict[str, Any]) -> Row:
    """What the ClusterQueue covers. Kueue's ``deviceClassMappings`` live in its Configuration
    (the ``kueue-manager-config`` ConfigMap in ``kueue-system``), which no overlay reads."""
    groups = cq.get("spec", {}).get("resourceGroups") or []
    covered = sorted({r for g in groups for r in g.get("coveredResources") or []})
    flavors = sorted({f["name"] for g in groups for f in g.get("flavors") or []})
    text = (
        f"LocalQueue {queue} -> ClusterQueue {cq['metadata']['name']} (flavors "
        f"{', '.join(flavors) or 'none'}; covers {', '.join(covered) or 'nothing'}); Kueue "
        f"admits a claim only if its DeviceClasses ({CHANNEL_CLASS}, and the GPU class with "
        "--gpu-mode claim) are in its Configuration's deviceClassMappings, which is not readable"
    )
    if not flavors:
        return Row("kueue", FAIL, text, "give the ClusterQueue a resource group with a flavor")
    return Row(
        "kueue", WARN, text, "check deviceClassMappings in kueue-system/kueue-manager-config"
    )


def _permissions_row(api: Api, workload: WorkloadSpec) -> Row:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": workload.namespace},
    }
    status = api.create(RULES_REVIEW, "", review).get("status") or {}
    return permissions_row(status.get("resourceRules") or [], workload)


def missing_rules(granted: list[dict[str, Any]], wanted: Any) -> list[str]:
    """``group/resource verb`` of each rule in ``wanted`` that no granted rule allows."""

    def allows(rule: dict[str, Any], group: str, resource: str, verb: str) -> bool:
        return (
            bool({group, "*"} & set(rule.get("apiGroups") or ()))
            and bool({resource, "*"} & set(rule.get("resources") or ()))
            and bool({verb, "*"} & set(rule.get("verbs") or ()))
        )

    return [
        f"{group or 'core'}/{resource} {verb}"
        for group, resources, verbs, _ in wanted
        for resource in resources
        for verb in verbs
        if not any(allows(r, group, resource, verb) for r in granted)
    ]


def permissions_row(granted: list[dict[str, Any]], workload: WorkloadSpec) -> Row:
    ns = workload.namespace
    missing = missing_rules(granted, rbac.RUNNER_RULES)
    if missing:
        fix = f"kubectl apply -n {ns} -k manifests/base (or the kfp/argo overlay)"
        return Row("runner-permissions", FAIL, f"missing in {ns}: {', '.join(missing)}", fix)
    kueue = missing_rules(granted, rbac.KUEUE_RULES) if workload.queue_name else []
    if kueue:
        text = (
            f"the Role's rules; missing {', '.join(kueue)}: waits can't say why Kueue holds a Job"
        )
        return Row("runner-permissions", WARN, text, f"kubectl apply -n {ns} -k {KUEUE_RBAC}")
    return Row("runner-permissions", PASS, f"every rule of Role {rbac.RUNNER} in {ns}")


def failure(rows: list[dict[str, str]]) -> str:
    """Each failing row with what it saw and its fix ("" when none fails)."""
    failed = [r for r in rows if r["status"] == FAIL]
    return "; ".join(f"{r['check']} {FAIL} ({r['saw']}): {r['fix']}" for r in failed)


def table(rows: list[Row]) -> str:
    """The rows as one plain-text table: check, status, what it saw, the fix."""
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  {'status':<7}  saw / fix"]
    for r in rows:
        lines.append(f"{r.check:<{width}}  {r.status:<7}  {r.saw}")
        if r.fix:
            lines.append(f"{'':<{width}}  {'':<7}  fix: {r.fix}")
    return "\n".join(lines)
