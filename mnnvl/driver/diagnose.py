"""Why a workload's pods are stuck or failed: the evidence a fail-fast wait raises with.

Reads pod status, the pod's recent events, the ComputeDomain's ``status.nodes`` and the tail
of a failed container's log, and names the next thing to check. Everything here only reads;
the waits that decide when to call it live in :mod:`mnnvl.driver.workload`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from mnnvl.contract.exit_codes import NON_RETRIABLE_EXIT_CODES
from mnnvl.driver.api import COMPUTE_DOMAIN, EVENT, Api
from mnnvl.driver.domain import KUBELET_PLUGIN_LOGS, domain_nodes, domain_state
from mnnvl.driver.gpus import shortage_hint
from mnnvl.driver.problem import Problem, exited_kind, problem
from mnnvl.driver.wait import Deadline, Objects
from mnnvl.errors import MnnvlError, ProblemKind
from mnnvl.inputs.names import LABEL_CLIQUE_GROUP, RunNames
from mnnvl.inputs.spec import WorkloadSpec

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"  # set by the Job controller
# Waiting reasons of an image that will not run: nothing changes until a person fixes the
# image, the pull secret or the pull policy (the kubelet keeps retrying the pull).
IMAGE_WAITING = {
    "ImagePullBackOff": ProblemKind.IMAGE_PULL,
    "ErrImagePull": ProblemKind.IMAGE_PULL,
    "ErrImageNeverPull": ProblemKind.IMAGE_PULL,
    "InvalidImageName": ProblemKind.IMAGE_REFERENCE,
}
# The scheduler's VolumeBinding plugin on a pod whose claim does not exist: no node can fit it
# until someone creates the claim, so waiting out the grace only delays the answer.
MISSING_CLAIM = re.compile(r'persistentvolumeclaim "[^"]+" not found')
PREPARE_FAILED = "FailedPrepareDynamicResources"
# Messages of the compute-domain kubelet plugin's NodePrepareResources that no retry fixes:
# the claim is in another namespace than its ComputeDomain (fatal at once), or the node still
# belongs to another domain (fatal only after a grace: that domain's pods may be leaving).
PREPARE_NAMESPACE = re.compile(r"namespace.*(mismatch|does not match|differ)", re.IGNORECASE)
PREPARE_OTHER_DOMAIN = "label already exists for a different ComputeDomain"
# With host-managed IMEX the kubelet plugin asks the host's nvidia-imex service before it hands
# out a channel (``checkHostIMEXReady``, cmd/compute-domain-kubelet-plugin/nvlib.go); the
# driver runs no IMEX daemon then, labels no node and reports no ``status.nodes``.
HOST_IMEX = "host nvidia-imex daemon"
# kube-scheduler's FailedScheduling text: the nodes it looked at, and how many failed the pod's
# node affinity (which asks for the clique label), and the DynamicResources plugin's reason for
# a node where a claim cannot be allocated (a device in use, held, or tainted: with
# DRADeviceTaints a tainted device is skipped without a word of its own).
SCHEDULER_TOTAL = re.compile(r"\b0/(\d+) nodes are available")
NODE_AFFINITY_MISSES = re.compile(r"\b(\d+) node\(s\) didn't match Pod's node affinity/selector")
CLAIMS_UNALLOCATABLE = "cannot allocate all claims"
UNPLACED = (ProblemKind.UNSCHEDULABLE, ProblemKind.CLAIM_UNALLOCATABLE)
# The compute-domain kubelet plugin's prepare error while the node's IMEX daemon is not Ready in
# the domain (AssertComputeDomainReady in cmd/compute-domain-kubelet-plugin/computedomain.go,
# kubernetes-sigs/dra-driver-nvidia-gpu v25.12.0): the kubelet retries it. With
# ComputeDomainCliques switched on over a live domain it lasted 8 min 41 s and cleared (#1486).
PREPARE_NOT_READY = re.compile(r"current node not ready in ComputeDomain|ComputeDomain not Ready")
# CUDA refusing a peer's fabric memory, in CUDA's words (#1417: "CUDA error in
# cuMemImportFromShareableHandle: invalid resource handle") or NCCL's (CUCHECK in
# src/include/checks.h: "Cuda failure %d '%s'"; 400 is CUDA_ERROR_INVALID_HANDLE).
IMEX_IMPORT_REFUSED = re.compile(
    r"[^\n]*(cuMemImportFromShareableHandle[^\n]*invalid resource handle"
    r"|Cuda failure 400 'invalid resource handle')[^\n]*"
)
LOG_TAIL_LINES = 20


def pod_index(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return str(
        (meta.get("annotations") or {}).get(INDEX_ANNOTATION)
        or (meta.get("labels") or {}).get(INDEX_ANNOTATION, "")
    )


# ---- one pod's status -----------------------------------------------------------------------


def waiting_state(pod: dict[str, Any]) -> tuple[str, str]:
    """The first waiting container's ``(reason, message)``, or ("", "")."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason") or ""), str(waiting.get("message") or "")
    return "", ""


def waiting_reason(pod: dict[str, Any]) -> str:
    return waiting_state(pod)[0]


def container_started(pod: dict[str, Any]) -> bool:
    """Whether a container of the pod ever ran: before that there is no log to read."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        if "running" in state or "terminated" in state or "terminated" in last:
            return True
    return False


def pod_phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def node_of(pod: dict[str, Any]) -> str:
    """The pod's node for messages; "no node" until the scheduler bound it."""
    return str((pod.get("spec") or {}).get("nodeName") or "no node")


def unschedulable(pod: dict[str, Any]) -> str:
    """The scheduler's message for a pod it could not place ("" when it has not said so)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        scheduled = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if scheduled and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "Unschedulable")
    return ""


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The ``terminated`` state of the pod's first container that has one, or {}."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            return dict(term)
    return {}


def exit_code(pod: dict[str, Any]) -> int | None:
    """The exit code of the pod's terminated container, or None while none terminated."""
    term = terminated(pod)
    return int(term.get("exitCode", 0)) if term else None


def _pod_state(pod: dict[str, Any]) -> str:
    phase = pod_phase(pod) or "Pending"
    reason = waiting_reason(pod) or (unschedulable(pod) and "Unschedulable")
    return f"{pod['metadata']['name']} {phase}{'/' + reason if reason else ''} on {node_of(pod)}"


# ---- evidence read from the API (never raises) ----------------------------------------------


def pod_events(api: Api, namespace: str, pod: str, limit: int = 5) -> str:
    """The pod's most recent events as one line (diagnostics; never raises)."""
    try:
        lst = api.list(EVENT, namespace, field_selector=f"involvedObject.name={pod}")
    except MnnvlError as e:
        return f"events unreadable ({e})"
    events = sorted(lst["items"], key=event_order)[-limit:]
    if not events:
        return "no events"
    return "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events)


def event_order(event: dict[str, Any]) -> tuple[str, int]:
    stamp = str(event.get("lastTimestamp") or event.get("eventTime") or "")
    version = str(event.get("metadata", {}).get("resourceVersion") or "0")
    return stamp, int(version) if version.isdigit() else 0


def log_tail(api: Api, namespace: str, pod: str) -> str:
    try:
        lines = api.pod_log(namespace, pod).splitlines()
    except MnnvlError as e:
        return f"(log unreadable: {e})"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"


# ---- pods that will not get to Running --------------------------------------------------------


class Grace:
    """How long each pod has been in a state that is fatal only once it lasted.

    Unschedulable is often transient (claims being allocated, a previous Job's pods still
    releasing their nodes' channel, an autoscaler adding nodes), and so is a node that still
    carries another domain's label while that domain's pods leave. Keys are
    ``<what>/<pod>``; a key no longer observed is forgotten. ``clock``: monotonic seconds.
    """

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s, self.clock = grace_s, clock
        self._since: dict[str, float] = {}

    def left_s(self, key: str, bad: bool) -> float | None:
        """Seconds of grace left (<= 0 when over), or None when ``key`` is not in a bad state."""
        if not bad:
            self._since.pop(key, None)
            return None
        since = self._since.setdefault(key, self.clock())
        return self.grace_s - (self.clock() - since)

    def retain(self, pods: Iterable[str]) -> None:
        alive = set(pods)
        for key in [k for k in self._since if k.split("/", 1)[1] not in alive]:
            del self._since[key]

    def recheck_in_s(self) -> float | None:
        """When the first grace period ends, so a wait re-checks without a new event."""
        if not self._since:
            return None
        now = self.clock()
        return max(0.0, min(self.grace_s - (now - since) for since in self._since.values()))


def prepare_events(events: Objects) -> dict[str, dict[str, Any]]:
    """The latest FailedPrepareDynamicResources event per pod name."""
    latest: dict[str, dict[str, Any]] = {}
    for event in sorted(events.values(), key=event_order):
        if event.get("reason") == PREPARE_FAILED:
            latest[str((event.get("involvedObject") or {}).get("name", ""))] = event
    return latest


def raise_on_stuck_pod(
    api: Api, workload: WorkloadSpec, pods: Objects, events: Objects, grace: Grace
) -> None:
    """Raise the step's error with the evidence for the first pod that will not recover."""
    domain = RunNames.for_run(workload.run_id).domain
    grace.retain(pods)
    prepare = prepare_events(events)
    for pod in sorted(pods.values(), key=pod_index):
        found = pod_problem(
            pod,
            prepare.get(pod["metadata"]["name"]),
            retries=workload.recovery.max_restarts > 0,
            grace=grace,
        )
        if found is None:
            continue
        group = (pod["metadata"].get("labels") or {}).get(LABEL_CLIQUE_GROUP)
        if found.kind in UNPLACED:
            found = label_shortage(workload, pod, grace.grace_s) or found
        gpus = ""
        if found.kind is ProblemKind.UNSCHEDULABLE:
            gpus = shortage_hint(api, unschedulable(pod))
        ns, name, node = workload.namespace, pod["metadata"]["name"], node_of(pod)
        tail = log_tail(api, ns, name) if pod_phase(pod) == "Failed" else ""
        found = imex_import(found, tail) or found
        text = (
            f"pod {ns}/{name} on {node}: {found.message}; events: {pod_events(api, ns, name)}; "
            f"{domain_state(api, domain, ns)}; {hint(found, ns, node)}"
        )
        if tail:
            text += f"; last log lines:\n{tail}"
        if found.kind in UNPLACED and group and workload.placement.clique_affinity:
            found = replace(found, kind=ProblemKind.NO_CLIQUE_ROOM)
            cliques = clique_shortage(api, workload, group, pods)
            # Every node short of a resource: no clique would do, the scheduler's reason leads.
            text = f"{text}; {cliques}" if every_node_short(found.message) else f"{cliques}; {text}"
        raise found.error(f"{text}; {gpus}" if gpus else text)


def every_node_short(message: str) -> bool:
    """Whether the scheduler refused every node for one lacking resource (``0/4 nodes are
    available: 4 Insufficient nvidia.com/gpu.``): no node fits the pod, in any clique."""
    m = re.search(r"0/(\d+) nodes are available: (\d+) Insufficient [^,.]+\.", message)
    return m is not None and m[1] == m[2]


def label_shortage(workload: WorkloadSpec, pod: dict[str, Any], grace_s: float) -> Problem | None:
    """The clique label on fewer nodes than a group needs, from the scheduler's counts: the
    pod's only node affinity is that the label exists, so the nodes that failed it lack the label
    (the runner may not read nodes). Not judged for a pod with a node selector (the user's, or
    Kueue's topology assignment), whose misses are not the label's alone."""
    said = unschedulable(pod)
    total, misses = SCHEDULER_TOTAL.search(said), NODE_AFFINITY_MISSES.search(said)
    selected = (pod.get("spec") or {}).get("nodeSelector")
    if not workload.placement.clique_affinity or selected or total is None or misses is None:
        return None
    carrying = int(total[1]) - int(misses[1])
    if carrying >= workload.group_nodes:
        return None
    return problem(
        ProblemKind.NO_CLIQUE_LABEL,
        pod=pod["metadata"]["name"],
        grace_s=grace_s,
        carrying=carrying,
        total=int(total[1]),
        label=workload.placement.clique_label,
        needed=workload.group_nodes,
        detail=said,
    )


def clique_shortage(api: Api, workload: WorkloadSpec, group: str, pods: Objects) -> str:
    """Why a clique group's pod cannot be placed: each group needs a clique of its own with
    ``nodes_per_clique`` free nodes. Names the cliques the run's placed pods sit in, from the
    ComputeDomain's ``status.nodes`` (the workload needs no permission to read nodes)."""
    names = RunNames.for_run(workload.run_id)
    try:
        status = api.get(COMPUTE_DOMAIN, workload.namespace, names.domain).get("status") or {}
    except MnnvlError:
        status = {}
    clique_of = {
        str(n.get("name")): str(n.get("cliqueID") or "?") for n in status.get("nodes") or []
    }
    held: dict[str, dict[str, list[str]]] = {}  # clique -> group -> nodes
    for pod in sorted(pods.values(), key=lambda p: p["metadata"]["name"]):
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            clique = clique_of.get(node, "not reported yet")
            pod_group = (pod["metadata"].get("labels") or {}).get(LABEL_CLIQUE_GROUP, "?")
            held.setdefault(clique, {}).setdefault(f"g{pod_group}", []).append(node)
    seen = "; ".join(
        f"{clique} holds "
        + ", ".join(
            f"{g} on {len(n)} node(s) ({', '.join(sorted(n))})" for g, n in sorted(by.items())
        )
        for clique, by in sorted(held.items())
    )
    return (
        f"no NVLink clique with {workload.group_nodes} free nodes for group g{group}; "
        f"cliques seen: {seen or 'none (no pod of the run placed)'}; every clique group needs "
        f"a clique of its own: free nodes in a clique ({workload.placement.clique_label}), or "
        "run fewer or smaller groups (--nodes, --nodes-per-clique)"
    )


def failed_problem(pod: dict[str, Any]) -> Problem:
    """The diagnosis of a pod whose container exited: its exit code and what it shows."""
    status = pod.get("status") or {}
    term = terminated(pod)
    code = exit_code(pod)
    kind = exited_kind(code, str(term.get("reason") or ""), str(status.get("reason") or ""))
    detail = str(status.get("message") or term.get("message") or "")
    return problem(
        kind,
        pod=pod["metadata"]["name"],
        exit_code=code,
        permanent=code in NON_RETRIABLE_EXIT_CODES,
        detail=detail,
    )


def pod_problem(
    pod: dict[str, Any], prepare: dict[str, Any] | None, *, retries: bool, grace: Grace
) -> Problem | None:
    """Why this pod will not get to Running by itself, or None when it still may."""
    name = pod["metadata"]["name"]
    if pod_phase(pod) == "Failed" and not retries:
        return failed_problem(pod)
    reason, said = waiting_state(pod)
    if reason in IMAGE_WAITING:
        return problem(IMAGE_WAITING[reason], pod=name, detail=reason)
    if reason == "CrashLoopBackOff":
        return problem(ProblemKind.CRASH_LOOP, pod=name)
    if reason == "CreateContainerConfigError":
        return problem(ProblemKind.CONFIG, pod=name, detail=said or reason)
    held = unschedulable(pod)
    if MISSING_CLAIM.search(held):
        return problem(ProblemKind.MISSING_CLAIM, pod=name, detail=held)
    left = grace.left_s(f"unschedulable/{name}", bool(held))
    if left is not None and left <= 0:
        claims = CLAIMS_UNALLOCATABLE in held
        kind = ProblemKind.CLAIM_UNALLOCATABLE if claims else ProblemKind.UNSCHEDULABLE
        return problem(kind, pod=name, grace_s=grace.grace_s, detail=held)
    message = str((prepare or {}).get("message") or "") if pod_phase(pod) == "Pending" else ""
    if PREPARE_NAMESPACE.search(message):
        return problem(ProblemKind.PREPARE, pod=name, detail=message)
    left = grace.left_s(f"prepare/{name}", PREPARE_OTHER_DOMAIN in message)
    if left is not None and left <= 0:
        return problem(ProblemKind.NODE_HELD, pod=name, grace_s=grace.grace_s, detail=message)
    return None


def hint(found: Problem, namespace: str, node: str) -> str:
    """What to check or change next, for each kind of diagnosis."""
    logs = f"check `kubectl logs -n {namespace} {found.pod}`"
    prepare = (
        "the node's IMEX channel cannot be prepared for this domain; check the driver's "
        f"kubelet-plugin logs ({KUBELET_PLUGIN_LOGS})"
    )
    placement = (
        "check free GPUs and channel devices per node (one pod per node per domain) and "
        "the nodes' clique labels (--clique-label)"
    )
    return {
        ProblemKind.IMAGE_PULL: "check the image name and the pull secret (with imagePullPolicy "
        "Never the image must be on the node)",
        ProblemKind.IMAGE_REFERENCE: "check the image reference",
        ProblemKind.CONFIG: f"create the Secret or ConfigMap the message names in namespace "
        f"{namespace}, or fix the reference (--env)",
        ProblemKind.MISSING_CLAIM: f"create that PersistentVolumeClaim in namespace {namespace} "
        "or fix --pvc",
        ProblemKind.UNSCHEDULABLE: placement,
        ProblemKind.NO_CLIQUE_ROOM: placement,
        ProblemKind.NO_CLIQUE_LABEL: "label the nodes' cliques: GPU Feature Discovery (GPU "
        "Operator ClusterPolicy) sets nvidia.com/gpu.clique, and so does the DRA driver's "
        "compute-domain kubelet plugin with "
        "kubeletPlugin.containers.computeDomains.gpuCliqueLabelEnabled=true (on in GPU Operator "
        "26.7's GPUCluster), which removes the label while it restarts; where a provider labels "
        "cliques under a key of its own, pass it as --clique-label (docs/real-cluster.md)",
        ProblemKind.CLAIM_UNALLOCATABLE: f"{placement}; a node cannot allocate a claim when its "
        "device is in use (another pod's GPU claim, or its IMEX channel held by another domain's "
        "pod) or tainted: the DRA driver's NVML health check taints a GPU after a fatal XID "
        "(gpu.nvidia.com/xid, gpu.nvidia.com/gpu-lost: NoSchedule) and DRADeviceTaints (on by "
        "default from Kubernetes 1.36) keeps such a device out of new claims until the GPU is "
        "fixed and the kubelet plugin restarts; see the taints with `kubectl get resourceslices "
        "-o yaml` (a cluster read)",
        ProblemKind.PREPARE: prepare,
        ProblemKind.NODE_HELD: "the node still carries another domain's label; check "
        f"`kubectl describe node {node}` (label resource.nvidia.com/computeDomain) and "
        f"{KUBELET_PLUGIN_LOGS}",
        ProblemKind.PREPARE_PENDING: "wait: the kubelet retries the prepare; if it lasts, "
        f"{prepare}",
        ProblemKind.IMEX_NOT_READY: "the daemon did not become Ready: where the host runs its own "
        "nvidia-imex.service, the ComputeDomain's daemon cannot take the GPU driver's IMEX "
        "session (its log: 'Failed to allocate Imex session ... NV_ERR_IN_USE'); disable it on "
        "every GPU node with `systemctl disable --now nvidia-imex.service && systemctl mask "
        "nvidia-imex.service` (kubernetes-sigs/dra-driver-nvidia-gpu#524); else read that "
        f"node's daemon log and the kubelet plugin's ({KUBELET_PLUGIN_LOGS}); after "
        "ComputeDomainCliques was switched on over a live domain its nodes took 8 min 41 s "
        "(#1486): raise --pods-running-timeout-s",
        ProblemKind.IMEX_IMPORT: "the node's IMEX daemon stopped serving imports while its pod and "
        "probes stay healthy (kubernetes-sigs/dra-driver-nvidia-gpu#1417, GB200 and GB300): "
        "`nvidia-imex-ctl -N` in the run's ComputeDomain daemon pods hangs or shows peers not "
        f"Connected; rebooting the node cleared it; {logs}",
        ProblemKind.OOM_KILLED: f"the container went over its memory limit; {logs}",
        ProblemKind.OUT_OF_MEMORY: f"GPU memory ran out: use smaller batches or more nodes; {logs}",
        ProblemKind.LOST_NODE: f"check `kubectl describe node {node}` and the IMEX daemon there; "
        f"{logs}",
    }.get(found.kind, logs)


def imex_import(found: Problem, log: str) -> Problem | None:
    """A failed worker whose log shows CUDA refusing to import a peer's memory through IMEX."""
    said = IMEX_IMPORT_REFUSED.search(log)
    exits = (ProblemKind.CRASHED, ProblemKind.COLLECTIVE_TIMEOUT, ProblemKind.STALLED)
    if said is None or found.kind not in exits:
        return None
    return problem(
        ProblemKind.IMEX_IMPORT,
        pod=found.pod,
        exit_code=found.exit_code,
        permanent=found.permanent,
        detail=said[0].strip(),
    )


def prepare_pending(pod: dict[str, Any], prepare: dict[str, Any] | None) -> Problem | None:
    """A Pending pod whose channel prepare waits for the node's IMEX daemon (transient)."""
    message = str((prepare or {}).get("message") or "")
    if pod_phase(pod) != "Pending" or not PREPARE_NOT_READY.search(message):
        return None
    return problem(ProblemKind.PREPARE_PENDING, pod=pod["metadata"]["name"], detail=message)


def imex_not_ready(
    api: Api, workload: WorkloadSpec, objects: Objects, deadline: Deadline
) -> Problem | None:
    """The first pod stuck ContainerCreating on a node whose IMEX daemon is not Ready in the
    run's domain (listed NotReady, or not listed while the domain is not Ready: a domain that
    is Ready without the node has no daemon to wait for)."""
    ns, domain = workload.namespace, RunNames.for_run(workload.run_id).domain
    try:
        status = api.get(COMPUTE_DOMAIN, ns, domain).get("status") or {}
    except MnnvlError:
        return None
    imex = {str(n.get("name")): str(n.get("status", "?")) for n in status.get("nodes") or []}
    for pod in sorted(objects.values(), key=pod_index):
        node = (pod.get("spec") or {}).get("nodeName")
        if waiting_reason(pod) != "ContainerCreating" or not node or imex.get(node) == "Ready":
            continue
        if node not in imex and status.get("status") == "Ready":
            continue
        return problem(
            ProblemKind.IMEX_NOT_READY,
            pod=pod["metadata"]["name"],
            name=pod["metadata"]["name"],
            node=node,
            domain=f"{ns}/{domain}",
            state=imex.get(node, "not in status.nodes"),
            elapsed_s=deadline.elapsed(),
        )
    return None


def imex_wait(node: str, imex: dict[str, str], events: str) -> str:
    """Why a pod's channel claim may not be prepared yet on ``node``: the host's nvidia-imex
    service (host-managed IMEX, said by a prepare event), the node's IMEX daemon as the
    domain's ``status.nodes`` reports it, or, without either, only that it is not listed."""
    if HOST_IMEX in events:
        return (
            f"the host's nvidia-imex service on node {node} is not ready (host-managed IMEX); "
            "check `systemctl status nvidia-imex` there and IMEX_CMD_ENABLED=1, "
            "IMEX_CMD_UNIX_DOMAIN_PATH in its /etc/nvidia-imex/config.cfg"
        )
    if imex.get(node) == "Ready":
        return "its claims are still being prepared"
    if node in imex:
        return f"IMEX daemon on node {node} not ready ({imex[node]})"
    return f"claims still being prepared (node {node} not in the domain's status.nodes)"


def describe_pods(
    api: Api, workload: WorkloadSpec, job: str, objects: Objects, deadline: Deadline
) -> str:
    """Each pod's phase and node; for a pod stuck ContainerCreating, why (IMEX) and its events."""
    ns, domain = workload.namespace, RunNames.for_run(workload.run_id).domain
    if not objects:
        return f"no pods of Job {job} ({pod_events(api, ns, job)})"
    pods = sorted(objects.values(), key=pod_index)
    summary, imex = domain_nodes(api, domain, ns)
    detail = ""
    stuck = next((p for p in pods if waiting_reason(p) == "ContainerCreating"), None)
    if stuck is not None:
        name, node = stuck["metadata"]["name"], str(stuck["spec"].get("nodeName"))
        events = pod_events(api, ns, name)
        detail = (
            f"; pod {name} stuck ContainerCreating {deadline.elapsed():.0f} s: "
            f"{imex_wait(node, imex, events)}; events: {events}"
        )
    return f"{', '.join(_pod_state(p) for p in pods)}{detail}; {summary}"


# ---- a failed Job ------------------------------------------------------------------------------


def last_failures(pods: Iterable[dict[str, Any]], culprits: set[int]) -> list[dict[str, Any]]:
    """The last failed pod of each index (the highest ``job-index-failure-count``, then the
    newest), the indexes of ``culprits`` first, then the latest attempt first."""

    def attempt(pod: dict[str, Any]) -> tuple[int, str]:
        meta = pod["metadata"]
        count = str((meta.get("annotations") or {}).get(FAILURE_COUNT, ""))
        return int(count) if count.isdigit() else 0, str(meta.get("creationTimestamp") or "")

    latest: dict[str, dict[str, Any]] = {}
    for pod in pods:
        index = pod_index(pod)
        if pod_phase(pod) == "Failed" and (
            index not in latest or attempt(pod) > attempt(latest[index])
        ):
            latest[index] = pod

    blamed = {str(index) for index in culprits}
    newest = sorted(sorted(latest.values(), key=pod_index), key=attempt, reverse=True)
    return sorted(newest, key=lambda p: pod_index(p) not in blamed)  # stable: newest first in each


def index_set(text: str) -> set[int]:
    """A Job's ``status.failedIndexes``/``completedIndexes`` (``"1,3-5"``) as a set."""
    found: set[int] = set()
    for part in filter(None, (t.strip() for t in text.split(","))):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            found.update(range(int(first), int(last or first) + 1))
    return found


def pods_progress(
    api: Api, workload: WorkloadSpec, objects: Objects, running: int, refused: str, events: Objects
) -> str:
    """One progress line: pods Running x/N, the API's refusal to create pods (``refused``),
    the slowest pod and why, the domain's nodes."""
    ns, domain = workload.namespace, RunNames.for_run(workload.run_id).domain
    summary, imex = domain_nodes(api, domain, ns)
    pods = sorted(objects.values(), key=pod_index)
    pod = next((p for p in pods if pod_phase(p) not in ("Running", "Succeeded")), None)
    line = f"pods Running {running}/{workload.nodes}"
    if refused:
        line += f"; pod creation refused: {refused}"
    if pod is not None:
        node = (pod.get("spec") or {}).get("nodeName")
        why = unschedulable(pod) or waiting_reason(pod) or "waiting to be scheduled"
        if why == "ContainerCreating" and node:
            why += f" ({imex_wait(node, imex, '')})"
        pending = prepare_pending(pod, prepare_events(events).get(pod["metadata"]["name"]))
        if pending is not None:
            why += f"; {pending.message}"
        line += f"; slowest: {_pod_state(pod)}: {why}"
    elif not objects and not refused:
        line += "; no pods created yet"
    return f"{line}; {summary}"
