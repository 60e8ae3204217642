"""Scheduling filters and scores of the simulated kube-scheduler, in upstream's plugin order.

Filters (the first that fails names the node's reason, as kube-scheduler reports it):
NodeUnschedulable, TaintToleration (``NoSchedule``/``NoExecute`` taints), NodeAffinity
(nodeSelector + required node affinity), NodeResourcesFit (``nvidia.com/gpu`` limits, and
``gpu.nvidia.com`` claims on a node whose GPUs are no DRA devices, against allocatable),
InterPodAffinity (:mod:`mnnvl.sim.core.affinity`), DynamicResources (one ``channel-0`` per node;
GPU claims get free devices of the node's ``gpu.nvidia.com`` ResourceSlice). Scores, with the
default plugin weights: TaintToleration 3 (untolerated ``PreferNoSchedule`` taints),
NodeResourcesFit 1 (least allocated CPU and memory, with the scheduler's non-zero defaults for
pods that request none), NodeResourcesBalancedAllocation 1, InterPodAffinity 2. The scheduler
picks the highest total and breaks ties at random.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from mnnvl.sim.api.model import TERMINAL, Obj
from mnnvl.sim.api.selectors import tolerates
from mnnvl.sim.api.store import Store
from mnnvl.sim.core.affinity import InterPodAffinity, normalize_min_max, selector_matches
from mnnvl.sim.nvidia.dra import channel_domain
from mnnvl.sim.nvidia.stacks import GPU, GPU_CLASS, GPU_DRIVER

MAX_SCORE = 100
UNSCHEDULABLE = "node(s) were unschedulable"
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
# kube-scheduler scores a pod without requests as if it asked for 100m CPU and 200 MiB.
DEFAULT_REQUEST = {"cpu": 100, "memory": 200 * 1024 * 1024}  # millicores, bytes


def node_affinity_ok(pod: Obj, node_labels: dict[str, str]) -> bool:
    spec = pod["spec"]
    if any(node_labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not req:
        return True
    return any(
        selector_matches({"matchExpressions": t.get("matchExpressions") or []}, node_labels)
        for t in req.get("nodeSelectorTerms") or []
    )


def untolerated(pod: Obj, node: Obj, effects: tuple[str, ...]) -> list[Obj]:
    tolerations = pod["spec"].get("tolerations") or []
    return [
        t
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in effects and not tolerates(tolerations, t)
    ]


def pod_gpus(pod: Obj) -> int:
    total = 0
    for c in pod["spec"].get("containers") or []:
        res = c.get("resources") or {}
        total += int(
            (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU) or 0
        )
    return total


def claim_gpus(claim: Obj) -> int:
    reqs = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    return sum(
        int((r.get("exactly") or {}).get("count") or 1)
        for r in reqs
        if (r.get("exactly") or {}).get("deviceClassName") == GPU_CLASS
    )


def slice_gpus(store: Store) -> dict[str, list[str]]:
    """Node -> the names of its GPU devices in ResourceSlices of driver ``gpu.nvidia.com``
    (absent for a node whose GPUs come from the device plugin)."""
    found: dict[str, list[str]] = {}
    for s in store.list("resourceslices")[0]:
        spec = s.get("spec") or {}
        if spec.get("driver") == GPU_DRIVER and spec.get("nodeName"):
            found.setdefault(str(spec["nodeName"]), []).extend(
                str(d["name"]) for d in spec.get("devices") or []
            )
    return found


def quantity(text: Any, resource: str) -> int:
    """A resource quantity in millicores (cpu) or bytes (memory)."""
    from kubernetes.utils import parse_quantity

    value = parse_quantity(text)
    return int(value * 1000) if resource == "cpu" else int(value)


def pod_requests(pod: Obj, non_zero: bool) -> dict[str, int]:
    """CPU and memory requested by the pod's containers (limits stand in for absent requests,
    as the API server defaults them); ``non_zero``: the scheduler's defaults for none."""
    total = dict.fromkeys(DEFAULT_REQUEST, 0)
    for c in pod["spec"].get("containers") or []:
        res = c.get("resources") or {}
        for r in total:
            value = (res.get("requests") or {}).get(r) or (res.get("limits") or {}).get(r)
            if value is not None:
                total[r] += quantity(value, r)
            elif non_zero:
                total[r] += DEFAULT_REQUEST[r]
    return total


class Context:
    """One scheduling cycle: the placed pods, per-node usage and the inter-pod affinity state."""

    def __init__(self, store: Store, pod: Obj, claims: list[Obj], nodes: list[Obj]) -> None:
        self.pod, self.nodes = pod, {n["metadata"]["name"]: n for n in nodes}
        self.limit_gpus, self.claim_gpus = pod_gpus(pod), sum(claim_gpus(c) for c in claims)
        # Nodes whose GPUs are DRA devices in ResourceSlices (no device plugin): claims get
        # devices, limits get nothing. Elsewhere both draw on allocatable nvidia.com/gpu.
        self.devices = slice_gpus(store)
        self.taken: dict[str, set[str]] = {}
        self.needs_channel = any(channel_domain(c) is not None for c in claims)
        bound, _ = store.list("pods", None, _holds_its_node)
        self.gpus: Counter[str] = Counter()
        self.requested: defaultdict[str, Counter[str]] = defaultdict(Counter)  # non-zero
        self.real: defaultdict[str, Counter[str]] = defaultdict(Counter)  # as written
        for p in bound:
            node = p["spec"]["nodeName"]
            self.gpus[node] += pod_gpus(p)
            self.requested[node].update(pod_requests(p, non_zero=True))
            self.real[node].update(pod_requests(p, non_zero=False))
        self.channels: set[str] = set()
        for c in store.list("resourceclaims")[0]:
            for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
                "results"
            ) or []:
                if r.get("device") == "channel-0":
                    self.channels.add(r["pool"])
                elif r.get("device") == "gpu":
                    self.gpus[r["pool"]] += claim_gpus(c)
                elif r.get("driver") == GPU_DRIVER:
                    self.taken.setdefault(r["pool"], set()).add(r["device"])
        placed = [
            (p, _labels(self.nodes[p["spec"]["nodeName"]]))
            for p in bound
            if p["spec"]["nodeName"] in self.nodes
        ]
        self.inter_pod = InterPodAffinity(pod, placed)

    def misfit(self, node: Obj) -> str | None:
        """The first filter the node fails for this pod, in kube-scheduler's words."""
        name, labels = node["metadata"]["name"], _labels(node)
        if (node.get("spec") or {}).get("unschedulable") and not tolerates(
            self.pod["spec"].get("tolerations") or [],
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        ):
            return UNSCHEDULABLE
        taints = untolerated(self.pod, node, ("NoSchedule", "NoExecute"))
        if taints:
            key, value = taints[0].get("key", ""), taints[0].get("value") or ""
            return f"node(s) had untolerated taint {{{key}: {value}}}"
        if not node_affinity_ok(self.pod, labels):
            return NODE_AFFINITY
        alloc = int((node.get("status") or {}).get("allocatable", {}).get(GPU) or 0)
        free = self.free_gpus(name)
        need = self.limit_gpus + (self.claim_gpus if free is None else 0)
        if need and self.gpus[name] + need > alloc:
            return f"Insufficient {GPU}"
        why = self.inter_pod.misfit(labels)
        if why is not None:
            return why
        if self.needs_channel and name in self.channels:
            return "cannot allocate all claims"
        if free is not None and self.claim_gpus > len(free):
            return "cannot allocate all claims"
        return None

    def free_gpus(self, node: str) -> list[str] | None:
        """The node's unallocated GPU devices, or None when its GPUs are no DRA devices."""
        if node not in self.devices:
            return None
        taken = self.taken.get(node, set())
        return [d for d in self.devices[node] if d not in taken]

    def scores(self, feasible: list[Obj]) -> dict[str, int]:
        """Weighted totals per feasible node name (higher is better)."""
        names = [n["metadata"]["name"] for n in feasible]
        prefer_no = {
            n["metadata"]["name"]: len(untolerated(self.pod, n, ("PreferNoSchedule",)))
            for n in feasible
        }
        worst = max(prefer_no.values(), default=0)
        affinity = normalize_min_max(
            {n["metadata"]["name"]: self.inter_pod.raw_score(_labels(n)) for n in feasible},
            MAX_SCORE,
        )
        return {
            name: 3 * (MAX_SCORE - (MAX_SCORE * prefer_no[name] // worst if worst else 0))
            + self._least_allocated(self.nodes[name])
            + self._balanced(self.nodes[name])
            + 2 * affinity[name]
            for name in names
        }

    def _allocatable(self, node: Obj) -> dict[str, int]:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        return {r: quantity(alloc.get(r, "0"), r) for r in DEFAULT_REQUEST}

    def _least_allocated(self, node: Obj) -> int:
        """NodeResourcesFit's LeastAllocated over CPU and memory (weight 1 each)."""
        name, alloc = node["metadata"]["name"], self._allocatable(node)
        incoming = pod_requests(self.pod, non_zero=True)
        used = self.requested[name]
        total = 0
        for r, cap in alloc.items():
            want = used[r] + incoming[r]
            total += 0 if cap == 0 or want > cap else (cap - want) * MAX_SCORE // cap
        return total // len(alloc)

    def _balanced(self, node: Obj) -> int:
        """NodeResourcesBalancedAllocation: 1 - the spread of CPU and memory fractions."""
        name, alloc = node["metadata"]["name"], self._allocatable(node)
        incoming = pod_requests(self.pod, non_zero=False)
        used = self.real[name]
        fractions = [
            min((used[r] + incoming[r]) / cap, 1.0) if cap else 1.0 for r, cap in alloc.items()
        ]
        spread = abs(fractions[0] - fractions[1]) / 2
        return int((1 - spread) * MAX_SCORE)


def _holds_its_node(pod: Obj) -> bool:
    """Bound and not finished: the pod uses its node's resources."""
    return (
        bool(pod["spec"].get("nodeName")) and (pod.get("status") or {}).get("phase") not in TERMINAL
    )


def _labels(node: Obj) -> dict[str, str]:
    return dict(node["metadata"].get("labels") or {})
