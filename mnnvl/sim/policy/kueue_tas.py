"""Kueue topology-aware scheduling (TAS) for the Kueue stand-in: assignment, gate, ungater.

As Kueue does it (kubernetes-sigs/kueue): admission gives a pod set with a topology request
(``podset-required-topology``: all pods in one domain; ``podset-slice-required-topology`` +
``podset-slice-size``: each slice in one domain) a v1beta2 ``topologyAssignment``
(``apis/kueue/v1beta2/workload_types.go``), at the Topology's lowest level, which names only
the nodes when that is ``kubernetes.io/hostname``. Starting the Job merges the podset label,
the workload annotation and the ``kueue.x-k8s.io/topology`` scheduling gate into its pod
template (``pkg/podset/podset.go`` ``FromAssignment``/``Merge``), so every pod is created
gated; the topology ungater (``pkg/controller/tas/topology_ungater.go``) maps each gated pod to
a domain by its completion index (the pod set's ``podIndexLabel``), removes the gate and adds
the domain's level labels to ``spec.nodeSelector``.

The stand-in's notion of capacity is one pod per free node (TAS counts resources per node;
the product's pods take a whole node).
"""

from __future__ import annotations

from functools import partial
from itertools import groupby

from mnnvl.sim.api.store import Obj, Store

TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
GATE = {"name": TOPOLOGY_GATE}
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
PODSET_LABEL = "kueue.x-k8s.io/podset"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
SLICE_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
HOSTNAME = "kubernetes.io/hostname"
CLIQUE = "nvidia.com/gpu.clique"
# The Topology the product's docs have an administrator create (nvlink: clique, then host).
DEFAULT_LEVELS = (CLIQUE, HOSTNAME)


def topology_request(job: Obj) -> tuple[str, int] | None:
    """(topology level, slice size) of the Job's pod set; None without a topology request.
    A required topology is one slice of all the pods."""
    notes = (job["spec"]["template"].get("metadata") or {}).get("annotations") or {}
    if SLICE_TOPOLOGY in notes:
        return notes[SLICE_TOPOLOGY], max(1, int(notes.get(SLICE_SIZE, "1")))
    if REQUIRED_TOPOLOGY in notes:
        return notes[REQUIRED_TOPOLOGY], int(job["spec"].get("parallelism", 1))
    return None


def place(nodes: list[Obj], request: tuple[str, int], count: int, taken: set[str]) -> list[Obj]:
    """One node per pod, each slice inside one domain of the request's level (the domain with
    the most free nodes first, as Kueue's default BestFit starts from the largest); [] when
    some slice does not fit."""
    level, size = request
    free: dict[str, list[Obj]] = {}
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        domain = (node["metadata"].get("labels") or {}).get(level)
        if (
            domain
            and node["metadata"]["name"] not in taken
            and not node["spec"].get("unschedulable")
        ):
            free.setdefault(domain, []).append(node)
    chosen: list[Obj] = []
    for _ in range(count // size):
        domain = max(free, key=lambda d: len(free[d]), default=None)
        if domain is None or len(free[domain]) < size:
            return []
        chosen += free[domain][:size]
        free[domain] = free[domain][size:]
    return chosen


def assignment(levels: tuple[str, ...], placed: list[Obj]) -> Obj:
    """The Workload's ``topologyAssignment`` for pods placed on ``placed`` (in rank order):
    consecutive pods in one lowest-level domain share a domain entry."""
    keys = [HOSTNAME] if levels[-1] == HOSTNAME else list(levels)
    per_pod = [tuple((n["metadata"].get("labels") or {}).get(k, "") for k in keys) for n in placed]
    runs = [(values, len(list(pods))) for values, pods in groupby(per_pod)]
    slice_ = {
        "domainCount": len(runs),
        "valuesPerLevel": [
            {"individual": {"roots": [values[i] for values, _ in runs]}} for i in range(len(keys))
        ],
        "podCounts": {"individual": [n for _, n in runs]},
    }
    return {"levels": keys, "slices": [slice_]}


def domains(topology: Obj) -> list[tuple[dict[str, str], int]]:
    """(node selector, pod count) per domain of a ``topologyAssignment`` :func:`assignment`
    wrote (``individual`` values and counts only), in order."""
    keys = topology.get("levels") or []
    result = []
    for s in topology.get("slices") or []:
        for i, count in enumerate(s["podCounts"]["individual"]):
            values = [v["individual"]["roots"][i] for v in s["valuesPerLevel"]]
            result.append((dict(zip(keys, values, strict=True)), int(count)))
    return result


def assigned_nodes(admission: Obj, nodes: list[Obj]) -> set[str]:
    """The nodes an admitted Workload's assignments hold (one pod per node)."""
    held: set[str] = set()
    for psa in admission.get("podSetAssignments") or []:
        for selector, count in domains(psa.get("topologyAssignment") or {}):
            matching = [
                n["metadata"]["name"]
                for n in sorted(nodes, key=lambda n: n["metadata"]["name"])
                if n["metadata"]["name"] not in held
                and all(
                    (n["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items()
                )
            ]
            held.update(matching[:count])
    return held


def gate_template(template: Obj, workload: str) -> None:
    """What starting a TAS Job merges into its pod template (the gate, once)."""
    meta = template.setdefault("metadata", {})
    meta.setdefault("labels", {})[PODSET_LABEL] = "main"
    meta.setdefault("annotations", {})[WORKLOAD_ANNOTATION] = workload
    gates = template.setdefault("spec", {}).setdefault("schedulingGates", [])
    if GATE not in gates:
        gates.append(dict(GATE))


def ungate(store: Store, wl: Obj) -> None:
    """The topology ungater for one admitted Workload: each gated pod of the pod set loses the
    gate and gets the node selector of the domain its completion index falls in."""
    psa = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or [{}]
    topology = psa[0].get("topologyAssignment")
    if not topology:
        return
    by_rank = [selector for selector, n in domains(topology) for _ in range(n)]
    ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
    pods, _ = store.list(
        "pods",
        ns,
        lambda p: (
            (p["metadata"].get("annotations") or {}).get(WORKLOAD_ANNOTATION) == name
            and GATE in (p["spec"].get("schedulingGates") or [])
        ),
    )
    for pod in pods:
        rank = int(pod["metadata"]["labels"].get(INDEX_LABEL, "-1"))
        if 0 <= rank < len(by_rank):
            store.mutate("pods", ns, pod["metadata"]["name"], partial(_ungate, by_rank[rank]))


def _ungate(selector: dict[str, str], pod: Obj) -> bool:
    gates = pod["spec"].get("schedulingGates") or []
    if GATE not in gates:
        return False  # ungated meanwhile: nothing to write
    rest = [g for g in gates if g != GATE]
    if rest:
        pod["spec"]["schedulingGates"] = rest
    else:
        del pod["spec"]["schedulingGates"]  # an empty list is not kept, as the API drops it
    pod["spec"].setdefault("nodeSelector", {}).update(selector)
    return True
