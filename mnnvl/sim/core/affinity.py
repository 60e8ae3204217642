"""Inter-pod affinity of the simulated scheduler, as kube-scheduler's InterPodAffinity plugin
(``pkg/scheduler/framework/plugins/interpodaffinity``: ``filtering.go``, ``scoring.go``).

Filter, per node, in upstream's order:
1. an existing pod's required anti-affinity term that matches the incoming pod forbids every
   node in that pod's topology domain ("didn't satisfy existing pods anti-affinity rules");
2. the incoming pod's required affinity: the node must carry every term's topologyKey and each
   domain must hold a pod matching *all* terms. The exception that lets a self-affine set start:
   when no pod anywhere matches all terms and the incoming pod matches them itself, any node
   carrying the keys passes. So the first pod of such a set lands wherever scoring sends it;
3. the incoming pod's required anti-affinity: no matching pod in the node's domain of any term.

Score: the incoming pod's preferred terms (+/- weight) and the existing pods' required affinity
terms that match it (``hardPodAffinityWeight`` 1) and preferred terms, summed per domain.
"""

from __future__ import annotations

from collections import Counter

from mnnvl.sim.api.model import Obj

EXISTING_ANTI = "node(s) didn't satisfy existing pods anti-affinity rules"
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI = "node(s) didn't match pod anti-affinity rules"
HARD_POD_AFFINITY_WEIGHT = 1  # kube-scheduler's InterPodAffinityArgs default
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
Pair = tuple[str, str]


def required_terms(pod: Obj, kind: str) -> list[Obj]:
    """``kind`` is ``podAffinity`` or ``podAntiAffinity``."""
    return list(
        (((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}).get(REQUIRED) or []
    )


def preferred_terms(pod: Obj, kind: str) -> list[tuple[int, Obj]]:
    weighted = (((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}).get(PREFERRED)
    return [(int(w.get("weight") or 0), w.get("podAffinityTerm") or {}) for w in weighted or []]


def selector_matches(sel: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels + matchExpressions) against labels; None matches
    nothing (an affinity term without a selector selects no pod)."""
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


def term_matches(owner: Obj, term: Obj, target: Obj) -> bool:
    """Whether ``target`` is in the namespaces and matches the selector of ``owner``'s term
    (no namespaces: the owner's own; an empty ``namespaceSelector``: every namespace)."""
    ns = target["metadata"].get("namespace")
    if term.get("namespaceSelector") != {}:
        namespaces = term.get("namespaces") or [owner["metadata"].get("namespace")]
        if ns not in namespaces:
            return False
    return selector_matches(term.get("labelSelector"), target["metadata"].get("labels") or {})


def _pair(term: Obj, labels: dict[str, str]) -> Pair | None:
    key = term.get("topologyKey", "")
    return (key, labels[key]) if key in labels else None


class InterPodAffinity:
    """The pre-filter state for one incoming pod over the pods already placed."""

    def __init__(self, pod: Obj, placed: list[tuple[Obj, dict[str, str]]]) -> None:
        """``placed``: each bound pod with its node's labels."""
        self.pod = pod
        self.affinity = required_terms(pod, "podAffinity")
        self.anti = required_terms(pod, "podAntiAffinity")
        self.affinity_counts: Counter[Pair] = Counter()
        self.anti_counts: Counter[Pair] = Counter()
        self.existing_anti: Counter[Pair] = Counter()
        self.scores: Counter[Pair] = Counter()
        for existing, labels in placed:
            self._count(existing, labels)
            self._score(existing, labels)

    def _count(self, existing: Obj, labels: dict[str, str]) -> None:
        if self.affinity and all(term_matches(self.pod, t, existing) for t in self.affinity):
            for t in self.affinity:
                if (pair := _pair(t, labels)) is not None:
                    self.affinity_counts[pair] += 1
        for t in self.anti:
            if term_matches(self.pod, t, existing) and (pair := _pair(t, labels)) is not None:
                self.anti_counts[pair] += 1
        for t in required_terms(existing, "podAntiAffinity"):
            if term_matches(existing, t, self.pod) and (pair := _pair(t, labels)) is not None:
                self.existing_anti[pair] += 1

    def _score(self, existing: Obj, labels: dict[str, str]) -> None:
        weighted: list[tuple[int, Obj, Obj, Obj]] = [
            *((w, t, self.pod, existing) for w, t in preferred_terms(self.pod, "podAffinity")),
            *((-w, t, self.pod, existing) for w, t in preferred_terms(self.pod, "podAntiAffinity")),
            *(
                (HARD_POD_AFFINITY_WEIGHT, t, existing, self.pod)
                for t in required_terms(existing, "podAffinity")
            ),
            *((w, t, existing, self.pod) for w, t in preferred_terms(existing, "podAffinity")),
            *((-w, t, existing, self.pod) for w, t in preferred_terms(existing, "podAntiAffinity")),
        ]
        for weight, term, owner, target in weighted:
            pair = _pair(term, labels)
            if weight and pair is not None and term_matches(owner, term, target):
                self.scores[pair] += weight

    def misfit(self, labels: dict[str, str]) -> str | None:
        """Why a node with these labels fails the filter, or None when it passes."""
        if any(self.existing_anti[pair] for pair in labels.items()):
            return EXISTING_ANTI
        if self.affinity and not self._affinity_ok(labels):
            return AFFINITY
        for t in self.anti:
            if (pair := _pair(t, labels)) is not None and self.anti_counts[pair] > 0:
                return ANTI
        return None

    def _affinity_ok(self, labels: dict[str, str]) -> bool:
        pairs = [_pair(t, labels) for t in self.affinity]
        if any(p is None for p in pairs):
            return False  # the node must carry every term's topology key
        if all(self.affinity_counts[p] > 0 for p in pairs if p is not None):
            return True
        # The first pod of a self-affine set: nothing matches yet anywhere in the cluster.
        return not self.affinity_counts and all(
            term_matches(self.pod, t, self.pod) for t in self.affinity
        )

    def raw_score(self, labels: dict[str, str]) -> int:
        return sum(self.scores[pair] for pair in labels.items())


def normalize_min_max(raw: dict[str, int], max_score: int) -> dict[str, int]:
    """InterPodAffinity's NormalizeScore: (score - min) scaled to 0..max_score."""
    if not raw:
        return {}
    low, high = min(raw.values()), max(raw.values())
    if high == low:
        return dict.fromkeys(raw, 0)
    return {n: int(max_score * (s - low) / (high - low)) for n, s in raw.items()}
