"""Pod scheduler and ResourceClaim controller of the simulated cluster.

Claims: each ``pod.spec.resourceClaims[].resourceClaimTemplateName`` becomes a ResourceClaim
``<pod>-<claim>-<5 chars>`` owned by the pod (a missing template leaves the pod Pending with a
``FailedResourceClaimCreation`` Event). Scheduling works as kube-scheduler's default profile
(filters and scores in :mod:`mnnvl.sim.core.placement`): every node is filtered, the feasible ones
are scored, and ties among the best are broken at random from the cluster's seed, so two runs
with the same seed place the same way and different seeds show different placements.

Queue order: pods by priority, then by arrival. Pods that arrive in one pass (the Job
controller's workers create several Jobs' pods concurrently, so which reaches the real queue
first is a race) are taken in an order drawn from the seed. Event-driven: a pending pod is
retried whenever pods, nodes or templates change.
"""

from __future__ import annotations

import random
import secrets
import string
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.events import record_event
from mnnvl.sim.api.faults import Faults
from mnnvl.sim.api.model import TERMINAL, controller_ref
from mnnvl.sim.api.store import Obj, Store, WatchEvent, clone, now_iso
from mnnvl.sim.core.affinity import AFFINITY
from mnnvl.sim.core.placement import NODE_AFFINITY, UNSCHEDULABLE, Context
from mnnvl.sim.nvidia.dra import DRIVER, channel_domain
from mnnvl.sim.nvidia.stacks import GPU_DRIVER

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOB_LABEL = "batch.kubernetes.io/job-name"


# Filter verdicts preemption cannot fix (kube-scheduler's UnschedulableAndUnresolvable).
UNRESOLVABLE = (NODE_AFFINITY, AFFINITY, UNSCHEDULABLE, "node(s) had untolerated taint")


def _released(ev: WatchEvent) -> bool:
    """A pod ended or went: its claims may be free again."""
    return ev.resource == "pods" and (
        ev.type == "DELETED" or (ev.obj.get("status") or {}).get("phase") in TERMINAL
    )


def rand5() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))


class Scheduler(Controller):
    name = "sim-scheduler"
    kinds = ("pods", "nodes", "resourceclaimtemplates", "persistentvolumeclaims")

    def __init__(self, store: Store, faults: Faults, seed: int = 0) -> None:
        super().__init__(store)
        self.faults = faults
        self.rng = random.Random(seed)
        self._first_seen: dict[str, float] = {}  # pod uid -> monotonic time first seen

    def on_events(self, events: list[WatchEvent]) -> None:
        """One pass for a burst; claims are released first when a pod ended or went."""
        if any(_released(ev) for ev in events):
            self._release_claims()
        self._schedule_pending()

    def _release_claims(self) -> None:
        """Deallocate claims whose consuming pods have ended or gone (frees channel-0)."""
        live = {
            p["metadata"]["uid"]
            for p in self.store.list("pods")[0]
            if (p.get("status") or {}).get("phase") not in TERMINAL
        }
        for claim in self.store.list("resourceclaims")[0]:
            st = claim.get("status") or {}
            users = [r for r in st.get("reservedFor") or [] if r.get("uid") in live]
            if st.get("allocation") and not users:
                meta = claim["metadata"]
                self.store.mutate(
                    "resourceclaims", meta["namespace"], meta["name"], lambda o: o.update(status={})
                )

    def _ensure_claims(self, pod: Obj) -> list[Obj] | None:
        """Create the pod's claims from templates; None while some template is missing."""
        ns, pname = pod["metadata"]["namespace"], pod["metadata"]["name"]
        statuses = {
            s["name"]: s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        claims: list[Obj] = []
        for entry in pod["spec"].get("resourceClaims") or []:
            cname = statuses.get(entry["name"]) or entry.get("resourceClaimName")
            if cname is None and entry.get("resourceClaimTemplateName"):
                cname = self._claim_from_template(pod, entry)
                if cname is None:
                    return None
                statuses[entry["name"]] = cname
                new = [{"name": k, "resourceClaimName": v} for k, v in statuses.items()]
                self.store.mutate("pods", ns, pname, _set_status(resourceClaimStatuses=new))
            claim = self.store.find("resourceclaims", ns, cname or "")
            if claim is None:
                return None
            claims.append(claim)
        return claims

    def _claim_from_template(self, pod: Obj, entry: Obj) -> str | None:
        ns, tname = pod["metadata"]["namespace"], entry["resourceClaimTemplateName"]
        rct = self.store.find("resourceclaimtemplates", ns, tname)
        if rct is None or rct["metadata"].get("deletionTimestamp"):
            msg = (
                f"PodResourceClaim {entry['name']}: resource claim template "
                f'"{tname}": resourceclaimtemplate.resource.k8s.io "{tname}" not found'
            )
            reason = "FailedResourceClaimCreation"
            record_event(self.store, pod, "Warning", reason, msg, "resource_claim")
            return None
        tspec = rct.get("spec") or {}
        name = f"{pod['metadata']['name']}-{entry['name']}-{rand5()}"
        tmeta = tspec.get("metadata") or {}
        self.store.create(
            "resourceclaims",
            {
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": tmeta.get("labels") or {},
                    "annotations": {
                        **(tmeta.get("annotations") or {}),
                        "resource.kubernetes.io/pod-claim-name": entry["name"],
                    },
                    "ownerReferences": [controller_ref(pod, "v1", "Pod")],
                },
                "spec": clone(tspec.get("spec") or {}),
            },
        )
        return name

    def _schedule_pending(self) -> None:
        pods, _ = self.store.list("pods", None, _unbound)
        now = time.monotonic()
        self.rng.shuffle(pods)
        pods.sort(key=lambda p: -int(p["spec"].get("priority") or 0))  # stable: ties stay shuffled
        seen = {p["metadata"]["uid"] for p in pods}
        self._first_seen = {u: t for u, t in self._first_seen.items() if u in seen}
        for pod in pods:
            claims = self._ensure_claims(pod)  # the claim controller does not wait for gates
            if pod["spec"].get("schedulingGates"):
                continue  # the SchedulingGates PreEnqueue plugin: not tried until ungated
            due = self._first_seen.setdefault(pod["metadata"]["uid"], now) + (
                self.faults.schedule_delay_s
            )
            if due > now:
                self.wake_at(due)
            elif claims is not None:
                self._schedule(pod, claims)

    def _schedule(self, pod: Obj, claims: list[Obj]) -> None:
        nodes = sorted(
            self.store.list("nodes")[0], key=lambda n: _node_order(n["metadata"]["name"])
        )
        missing = missing_claim(self.store, pod)
        if missing:
            self._unschedulable(pod, prefilter_message(len(nodes), missing))
            return
        labels = pod["metadata"].get("labels") or {}
        index = labels.get(INDEX_LABEL)
        reasons: Counter[str] = Counter()
        feasible: list[Obj] = []
        ctx = Context(self.store, pod, claims, nodes)
        if self.faults.pod_fault(
            labels.get(JOB_LABEL), int(index) if index else None, "Unschedulable"
        ):
            reasons["node(s) were unschedulable (simulated fault)"] = len(nodes)
        else:
            for node in nodes:
                why = ctx.misfit(node)
                if why is None:
                    feasible.append(node)
                else:
                    reasons[why] += 1
        if feasible:
            scores = ctx.scores(feasible)
            best = max(scores.values())
            chosen = self.rng.choice([n for n, s in scores.items() if s == best])
            self._bind(pod, claims, chosen, ctx.free_gpus(chosen))
            return
        self._unschedulable(pod, unschedulable_message(len(nodes), reasons))

    def _unschedulable(self, pod: Obj, msg: str) -> None:
        self._set_scheduled(pod, "False", reason="Unschedulable", message=msg)
        record_event(self.store, pod, "Warning", "FailedScheduling", msg, "default-scheduler")

    def _set_scheduled(self, pod: Obj, status: str, **why: str) -> None:
        """Set the pod's PodScheduled condition (left as it is when its status, reason and
        message are unchanged)."""
        cond: Obj = {"type": "PodScheduled", "status": status, **why}
        cond |= {"lastTransitionTime": now_iso(), "lastProbeTime": None}

        def write(o: Obj) -> bool:
            conds = o.setdefault("status", {}).setdefault("conditions", [])
            old = next((c for c in conds if c["type"] == "PodScheduled"), None)
            if old is not None and all(
                old.get(k) == cond.get(k) for k in ("status", "reason", "message")
            ):
                return False
            o["status"]["conditions"] = [c for c in conds if c["type"] != "PodScheduled"] + [cond]
            return True

        self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], write)

    def _bind(self, pod: Obj, claims: list[Obj], node: str, free: list[str] | None) -> None:
        """Allocate the claims on ``node`` (GPU claims from its ``free`` devices, when its
        GPUs are DRA devices; one result per device) and bind the pod."""
        ns, name, uid = (pod["metadata"][k] for k in ("namespace", "name", "uid"))
        for claim in claims:
            channel = channel_domain(claim) is not None
            results = []
            for r in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
                if channel:
                    devices = [(DRIVER, "channel-0")]
                elif free is None:
                    devices = [(GPU_DRIVER, "gpu")]
                else:
                    count = int((r.get("exactly") or {}).get("count") or 1)
                    devices, free = [(GPU_DRIVER, d) for d in free[:count]], free[count:]
                results += [
                    {"request": r["name"], "driver": drv, "pool": node, "device": dev}
                    for drv, dev in devices
                ]
            allocated = _set_status(
                allocation={"devices": {"results": results}},
                reservedFor=[{"resource": "pods", "name": name, "uid": uid}],
            )
            self.store.mutate("resourceclaims", ns, claim["metadata"]["name"], allocated)
        bound = self.store.mutate("pods", ns, name, lambda o: o["spec"].update(nodeName=node))
        if bound is None:  # deleted meanwhile
            return
        self._set_scheduled(bound, "True")
        msg = f"Successfully assigned {ns}/{name} to {node}"
        record_event(self.store, bound, "Normal", "Scheduled", msg, "default-scheduler")


def _unbound(pod: Obj) -> bool:
    return not (pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"))


def missing_claim(store: Store, pod: Obj) -> str:
    """The VolumeBinding plugin's PreFilter: a pod whose PersistentVolumeClaim does not exist
    fits no node (``persistentvolumeclaim "x" not found``, UnschedulableAndUnresolvable)."""
    ns = pod["metadata"].get("namespace", "default")
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and store.find("persistentvolumeclaims", ns, claim) is None:
            return f'persistentvolumeclaim "{claim}" not found'
    return ""


def prefilter_message(total: int, why: str) -> str:
    """kube-scheduler's FailedScheduling text when a PreFilter plugin rejected the pod: the
    plugin's message instead of per-node counts; preemption cannot help on any node."""
    return (
        f"0/{total} nodes are available: {why}. preemption: 0/{total} nodes are available: "
        f"{total} Preemption is not helpful for scheduling."
    )


def unschedulable_message(total: int, reasons: dict[str, int]) -> str:
    """kube-scheduler's FailedScheduling text, preemption post-filter included."""
    hopeless = sum(n for r, n in reasons.items() if r.startswith(UNRESOLVABLE))
    victims = total - hopeless
    preemption = ", ".join(
        f"{n} {r}"
        for r, n in sorted(
            {
                "No preemption victims found for incoming pod": victims,
                "Preemption is not helpful for scheduling": hopeless,
            }.items()
        )
        if n
    )
    return (
        f"0/{total} nodes are available: "
        + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        + f". preemption: 0/{total} nodes are available: {preemption}."
    )


def _set_status(**fields: Any) -> Callable[[Obj], None]:
    """A ``Store.mutate`` function that sets these fields of the object's status."""
    return lambda o: o.setdefault("status", {}).update(fields)


def _node_order(name: str) -> tuple[str, int]:
    base, _, num = name.rpartition("-")
    return (base, int(num)) if num.isdigit() else (name, 0)
