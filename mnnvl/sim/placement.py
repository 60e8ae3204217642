"""Scheduling filters: node selectors and affinity, GPU capacity, channel-0, pod (anti-)affinity."""

from __future__ import annotations

from typing import Any

from mnnvl.sim.dra import channel_domain
from mnnvl.sim.model import Obj
from mnnvl.sim.store import Store

GPU = "nvidia.com/gpu"
GPU_CLASS = "gpu.nvidia.com"
TERMINAL = ("Succeeded", "Failed")


def selector_matches(sel: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels + matchExpressions) against labels."""
    if sel is None:
        return False
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        key, op, vals = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": labels.get(key) in vals,
            "NotIn": labels.get(key) not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(op, False)
        if not ok:
            return False
    return True


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


class Context:
    """What one scheduling decision needs: usage per node and the placed pods."""

    def __init__(self, store: Store, pod: Obj, claims: list[Obj], nodes: list[Obj]) -> None:
        self.pod, self.nodes = pod, {n["metadata"]["name"]: n for n in nodes}
        self.need_gpus = pod_gpus(pod) + sum(claim_gpus(c) for c in claims)
        self.needs_channel = any(channel_domain(c) is not None for c in claims)
        bound, _ = store.list(
            "pods",
            None,
            lambda o: (
                bool(o["spec"].get("nodeName"))
                and (o.get("status") or {}).get("phase") not in TERMINAL
            ),
        )
        self.bound = bound
        self.gpus: dict[str, int] = {}
        for p in bound:
            node = p["spec"]["nodeName"]
            self.gpus[node] = self.gpus.get(node, 0) + pod_gpus(p)
        self.channels: set[str] = set()
        for c in store.list("resourceclaims")[0]:
            for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
                "results"
            ) or []:
                if r.get("device") == "channel-0":
                    self.channels.add(r["pool"])
                elif r.get("device") == "gpu":
                    self.gpus[r["pool"]] = self.gpus.get(r["pool"], 0) + claim_gpus(c)

    def misfit(self, node: Obj) -> str | None:
        name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
        if node.get("spec", {}).get("unschedulable"):
            return "node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
        if not node_affinity_ok(self.pod, labels):
            return "node(s) didn't match Pod's node affinity/selector"
        alloc = int((node.get("status") or {}).get("allocatable", {}).get(GPU) or 0)
        if self.need_gpus and self.gpus.get(name, 0) + self.need_gpus > alloc:
            return f"Insufficient {GPU}"
        if self.needs_channel and name in self.channels:
            return "cannot allocate all claims"
        aff = self.pod["spec"].get("affinity") or {}
        for term in _required(aff, "podAffinity"):
            if not self._affinity_ok(term, labels, anti=False):
                return "node(s) didn't match pod affinity rules"
        for term in _required(aff, "podAntiAffinity"):
            if not self._affinity_ok(term, labels, anti=True):
                return "node(s) didn't match pod anti-affinity rules"
        return None

    def _affinity_ok(self, term: Obj, node_labels: dict[str, str], anti: bool) -> bool:
        key, ns = term.get("topologyKey", ""), self.pod["metadata"]["namespace"]
        namespaces = term.get("namespaces") or [ns]
        peers = [
            p
            for p in self.bound
            if p["metadata"]["namespace"] in namespaces
            and selector_matches(term.get("labelSelector"), p["metadata"].get("labels") or {})
        ]
        domains = {
            (self.nodes.get(p["spec"]["nodeName"]) or {"metadata": {}})["metadata"]
            .get("labels", {})
            .get(key)
            for p in peers
        }
        here = node_labels.get(key)
        if anti:
            return here is None or here not in domains
        if here is None:
            return False
        if not peers:  # first pod of a group may go anywhere if it matches its own term
            return selector_matches(
                term.get("labelSelector"), self.pod["metadata"].get("labels") or {}
            )
        return here in domains


def _required(aff: Obj, kind: str) -> list[Any]:
    return list((aff.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or [])
