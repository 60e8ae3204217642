"""What the control plane does about a node that stopped answering, as upstream does it.

``default_tolerations`` is the DefaultTolerationSeconds admission plugin (kube-apiserver's
``--default-not-ready-toleration-seconds``/``--default-unreachable-toleration-seconds``);
``node_unreachable`` what the node lifecycle controller does to a node that stopped reporting;
``NodeLifecycle`` the taint-eviction controller (pkg/controller/tainteviction) and the pod
garbage collector (pkg/controller/podgc; its ``gcUnscheduledTerminating`` marks a pod deleted
before it was bound ``Failed`` and force-deletes it). A pod evicted from an unreachable node stays
Terminating, as no kubelet finishes it, until pod GC marks it ``Failed`` and force-deletes it:
once its node object has been gone for the quarantine time, or when the not-ready node is
tainted ``node.kubernetes.io/out-of-service``.
"""

from __future__ import annotations

import logging
import threading
import time

from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.events import record_event
from mnnvl.sim.api.model import TERMINAL, ApiError
from mnnvl.sim.api.selectors import tolerates
from mnnvl.sim.api.store import Obj, Store, now_iso

log = logging.getLogger(__name__)
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
DEFAULT_TOLERATION_S = 300.0  # kube-apiserver's --default-unreachable-toleration-seconds
POD_GC_QUARANTINE_S = 40.0  # podgc's quarantineTime for pods of a node that is gone
CHECK_PERIOD_S = 0.2  # how often due evictions and orphans are looked at


def default_tolerations(pod: Obj, seconds: float) -> None:
    """DefaultTolerationSeconds: add the not-ready/unreachable NoExecute tolerations a pod lacks."""
    tolerations = pod.setdefault("spec", {}).setdefault("tolerations", [])
    for key in (NOT_READY, UNREACHABLE):
        taint = {"key": key, "effect": "NoExecute"}
        if not tolerates(tolerations, taint):
            tolerations.append({**taint, "operator": "Exists", "tolerationSeconds": int(seconds)})


def eviction_due_in(pod: Obj, taints: list[Obj]) -> float | None:
    """Seconds from the taints' appearance until the pod is evicted, or None (tolerated forever)."""
    no_execute = [t for t in taints if t.get("effect") == "NoExecute"]
    if not no_execute:
        return None
    tolerations = pod["spec"].get("tolerations") or []
    used: list[Obj] = []
    for taint in no_execute:
        matching = [t for t in tolerations if tolerates([t], taint)]
        if not matching:
            return 0.0
        used += matching
    # The shortest tolerationSeconds of the tolerations in use decides (getMinTolerationTime).
    limits = [float(t["tolerationSeconds"]) for t in used if "tolerationSeconds" in t]
    return max(0.0, min(limits)) if limits else None


def node_unreachable(store: Store, name: str, deleted_after_s: float | None = None) -> None:
    """What the node lifecycle controller does to a node that stopped reporting: Ready
    Unknown and the ``unreachable`` taints; with ``deleted_after_s``, the node object is
    deleted that much later (a cloud provider's node controller, once the instance is gone)."""

    def not_ready(o: Obj) -> None:
        o["spec"]["taints"] = [
            {"key": UNREACHABLE, "effect": effect} for effect in ("NoSchedule", "NoExecute")
        ]
        o["status"]["conditions"] = [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
        ]

    if store.mutate("nodes", "", name, not_ready) is None:
        raise ValueError(f"no node {name}")
    if deleted_after_s is not None:
        timer = threading.Timer(deleted_after_s, _delete_node, (store, name))
        timer.daemon = True
        timer.start()


def _delete_node(store: Store, name: str) -> None:
    if store.find("nodes", "", name) is not None:
        store.delete("nodes", "", name)


class NodeLifecycle(Controller):
    """Taint eviction and pod GC, checked every ``CHECK_PERIOD_S`` seconds."""

    name = "sim-node-lifecycle"
    period_s = CHECK_PERIOD_S

    def __init__(self, store: Store, quarantine_s: float = POD_GC_QUARANTINE_S) -> None:
        super().__init__(store)
        self.quarantine_s = quarantine_s
        self._tainted_at: dict[str, float] = {}  # node -> when a NoExecute taint appeared
        self._gone_at: dict[str, float] = {}  # node name -> when its object was first missed

    def on_tick(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.store.list("nodes")[0]}
        now = time.monotonic()
        for name, node in nodes.items():
            if any(t["effect"] == "NoExecute" for t in node["spec"].get("taints") or []):
                self._tainted_at.setdefault(name, now)
            else:
                self._tainted_at.pop(name, None)
        pods, _ = self.store.list("pods", None, lambda o: bool(o["spec"].get("nodeName")))
        for pod in pods:
            node = pod["spec"]["nodeName"]
            if node in nodes:
                self._evict_if_due(pod, nodes[node], now)
            elif now - self._gone_at.setdefault(node, now) >= self.quarantine_s:  # podgc gcOrphaned
                self._fail_and_force_delete(
                    pod, ("DeletionByPodGC", "PodGC: node no longer exists")
                )
        self._gone_at = {k: v for k, v in self._gone_at.items() if k not in nodes}
        # podgc gcUnscheduledTerminating: a pod deleted before it was bound has no kubelet
        # to finish it (the Job controller may hold it with its tracking finalizer).
        unbound, _ = self.store.list("pods", None, _unbound_terminating)
        for pod in unbound:
            self._fail_and_force_delete(pod, None)

    def _evict_if_due(self, pod: Obj, node: Obj, now: float) -> None:
        name = node["metadata"]["name"]
        if name not in self._tainted_at or pod["status"].get("phase") in TERMINAL:
            return
        if pod["metadata"].get("deletionTimestamp"):
            if _out_of_service(node) and not _ready(node):
                self._fail_and_force_delete(pod, None)  # podgc gcTerminating
            return
        due = eviction_due_in(pod, node["spec"].get("taints") or [])
        if due is None or now - self._tainted_at[name] < due:
            return
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        msg = f"Marking for deletion Pod {ns}/{pod_name}"
        record_event(
            self.store, pod, "Normal", "TaintManagerEviction", msg, "taint-eviction-controller"
        )
        why = ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
        self.store.mutate("pods", ns, pod_name, lambda o: _set_condition(o, *why))
        self._delete(pod, None)

    def _fail_and_force_delete(self, pod: Obj, why: tuple[str, str] | None) -> None:
        """podgc's markFailedAndDeletePod: phase Failed (and the condition, in the same status
        patch), then a delete with grace 0."""

        def fail(o: Obj) -> None:
            if o["status"].get("phase") not in TERMINAL:
                o["status"]["phase"] = "Failed"
            if why is not None:
                _set_condition(o, *why)

        self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], fail)
        self._delete(pod, 0)

    def _delete(self, pod: Obj, grace_s: float | None) -> None:
        """Delete this pod (a pod of the same name made since is left alone); a second
        graceful delete of a Terminating pod changes nothing."""
        ns, name, uid = (
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            pod["metadata"]["uid"],
        )
        try:
            self.store.delete("pods", ns, name, grace_s=grace_s, precondition_uid=uid)
        except ApiError as e:  # gone or replaced meanwhile
            log.debug("node lifecycle: delete pod %s/%s: %s", ns, name, e)


def _unbound_terminating(pod: Obj) -> bool:
    return bool(
        pod["metadata"].get("deletionTimestamp")
        and not pod["spec"].get("nodeName")
        and (pod.get("status") or {}).get("phase") not in TERMINAL
    )


def _set_condition(pod: Obj, reason: str, message: str) -> None:
    """The ``DisruptionTarget`` condition, replacing any earlier one."""
    conds = [c for c in pod["status"].get("conditions") or [] if c["type"] != "DisruptionTarget"]
    cond = {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}
    pod["status"]["conditions"] = [*conds, {**cond, "lastTransitionTime": now_iso()}]


def _ready(node: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions") or []
    )


def _out_of_service(node: Obj) -> bool:
    return any(t.get("key") == OUT_OF_SERVICE for t in node["spec"].get("taints") or [])
