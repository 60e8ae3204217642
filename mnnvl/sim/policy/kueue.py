"""A Kueue stand-in (``SimCluster(kueue=True)``): queued Jobs wait suspended in a Workload.

As Kueue v0.19 does it: its Job webhook stores a Job labelled ``kueue.x-k8s.io/queue-name``
suspended; its Job reconciler makes one ``kueue.x-k8s.io/v1beta2`` Workload per Job; its
scheduler admits a Workload whole once it fits the ClusterQueue's quota (``pods``,
``nvidia.com/gpu`` limits, DRA devices through ``deviceClassMappings``) and, for a topology
request, the free topology domains (:mod:`mnnvl.sim.policy.kueue_tas`), and un-suspends the Job.
Until then ``QuotaReserved=False`` names the reason with Kueue's message (the granular reasons
of the default ``UnadmittedWorkloadsObservability``).

``waitForPodsReady`` (on by default from v0.19): an admitted Workload whose pods are not all
Ready (or Succeeded) within the timeout is evicted as Kueue's workload controller does it
(``Evicted=True``, ``PodsReadyTimeout``; ``status.requeueState`` count + 1; the Job suspended
and its template restored), requeued after a back-off of base x 2^(count-1) (at most the
maximum) and then admitted like a new one.

TrainJobs (``trainer.kubeflow.org/trainjob``, Kueue's ``pkg/controller/jobs/trainjob``) are
queued the same way: the webhook stores one labelled with a queue suspended
(``trainjob_webhook.go`` calls jobframework's ``ApplyDefaultForSuspend``), its Workload
``trainjob-<name>-<hash>`` holds one pod set of ``numNodes`` pods with the ``node`` container's
``resourcesPerNode`` and ``resourceClaimsPerNode``, and admission sets ``spec.suspend`` to false
(``RunWithPodSetsInfo``; an eviction sets it true again, ``Stop``); no topology assignment.
Not modelled: the recovery timeout (a pod failing
after PodsReady), ``backoffLimitCount``, flavors beyond one, cohorts, preemption, admission
checks, priorities.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.model import controller_ref, finished, iso_after
from mnnvl.sim.api.store import ApiError, Obj, Store, WatchEvent, now_iso
from mnnvl.sim.policy import kueue_tas as tas

log = logging.getLogger(__name__)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
FLAVOR = "default-flavor"
TOPOLOGY = "default"
GPU = "nvidia.com/gpu"
QUEUED = ("jobs", "trainjobs")  # Kueue's integrations modelled: batch/job and TrainJob
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


@dataclass(frozen=True)
class KueueConfig:
    """What a Kueue administrator set up.

    ``local_queues``: LocalQueue name -> ClusterQueue name (None: any name, one ClusterQueue
    ``cluster-queue``). ``quotas``: ClusterQueue -> resource -> nominal quota; a ClusterQueue
    absent here does not exist (None: ``cluster-queue`` with ``pods`` = the cluster's nodes).
    ``device_class_mappings``: DeviceClass -> quota resource name (None: every class maps to
    its own name). Only the resources a ClusterQueue lists are checked. ``topology_levels``:
    the node labels of the flavor's Topology, highest first.
    """

    local_queues: dict[str, str] | None = None
    quotas: dict[str, dict[str, int]] | None = None
    device_class_mappings: dict[str, str] | None = None
    topology_levels: tuple[str, ...] = tas.DEFAULT_LEVELS
    # waitForPodsReady: Kueue v0.19's defaults (timeout 30 min; back-off 60 s doubling, at most
    # 3600 s; apis/config/v1beta2/defaults.go); 0 turns it off.
    pods_ready_timeout_s: float = 1800.0
    requeue_base_s: float = 60.0
    requeue_max_s: float = 3600.0


@dataclass
class _Verdict:
    reason: str = ""
    message: str = ""
    cluster_queue: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    placed: list[Obj] = field(default_factory=list)  # one node per pod, in rank order (TAS)


def queued(obj: Obj) -> bool:
    return QUEUE_LABEL in ((obj.get("metadata") or {}).get("labels") or {})


def workload_name(job: Obj) -> str:
    """``job-<name>-<5 hex>`` (``trainjob-…`` for a TrainJob), as Kueue names a Job's Workload
    (unique per Job uid)."""
    meta = job["metadata"]
    digest = hashlib.sha1(f"{meta['name']}/{meta['uid']}".encode()).hexdigest()[:5]
    return f"{job['kind'].lower()}-{meta['name']}"[:57] + f"-{digest}"


class KueueStandIn(Controller):
    name = "sim-kueue"
    # pods: the TAS ungater acts on new ones
    kinds = ("jobs", "trainjobs", "nodes", "workloads", "pods")

    def __init__(
        self, store: Store, admission_delay_s: float = 0.5, config: KueueConfig | None = None
    ) -> None:
        super().__init__(store)
        self.admission_delay_s = admission_delay_s
        self.config = config or KueueConfig()
        self._seen: dict[str, float] = {}  # job uid -> monotonic time first seen
        self._admitted: dict[str, float] = {}  # workload uid -> monotonic time admitted
        self._ready: set[str] = set()  # workload uids whose pods were all Ready once
        self._requeue_at: dict[str, float] = {}  # workload uid -> monotonic end of its back-off

    def mutate(self, resource: str, obj: Obj) -> None:
        """Admission webhook: queued Jobs and TrainJobs are created suspended."""
        if resource in QUEUED and queued(obj):
            obj.setdefault("spec", {})["suspend"] = True

    def on_events(self, events: list[WatchEvent]) -> None:
        """Every pass looks at every queued Job, whatever the events."""
        jobs = sorted(
            (j for resource in QUEUED for j in self.store.list(resource)[0] if queued(j)),
            key=lambda j: str(j["metadata"]["creationTimestamp"]),
        )
        workloads = {
            (w["metadata"]["namespace"], (w["metadata"].get("labels") or {}).get(JOB_UID_LABEL)): w
            for w in self.store.list("workloads")[0]
        }
        used: defaultdict[str, Counter[str]] = defaultdict(Counter)  # ClusterQueue -> usage
        nodes = self.store.list("nodes")[0]
        taken: set[str] = set()  # nodes of admitted pod sets with a topology assignment
        pending: list[tuple[Obj, Obj]] = []
        now = time.monotonic()
        for job in jobs:
            wl = workloads.get((job["metadata"]["namespace"], job["metadata"]["uid"]))
            if wl is None:
                # Kueue's job reconciler makes no Workload for a Job that is finished or being
                # deleted (jobframework's ReconcileGenericJob drops finalizers and returns): one
                # made now would block the Job's foreground deletion as its dependent.
                if finished(job.get("status") or {}) or job["metadata"].get("deletionTimestamp"):
                    continue
                wl = self._create_workload(job)
                if wl is None:
                    continue
            admission = (wl.get("status") or {}).get("admission")
            if admission is None:
                pending.append((job, wl))
            elif not finished(job.get("status") or {}):
                used[admission["clusterQueue"]].update(_usage(admission))
                taken.update(tas.assigned_nodes(admission, nodes))
                tas.ungate(self.store, wl)  # the topology ungater: pods onto their domain
                self._check_pods_ready(job, wl, now)
        for job, wl in pending:
            due = self._seen.setdefault(job["metadata"]["uid"], now) + self.admission_delay_s
            due = max(due, self._requeue_at.get(wl["metadata"]["uid"], 0.0))
            if due > now:
                self.wake_at(due)
                continue
            self._backoff_finished(wl)
            verdict = self._evaluate(job, used, taken, nodes)
            if verdict.reason:
                self._set_pending(wl, verdict)
                continue
            used[verdict.cluster_queue].update(verdict.usage)
            taken.update(n["metadata"]["name"] for n in verdict.placed)
            self._admit_workload(job, wl, verdict)

    def _create_workload(self, job: Obj) -> Obj | None:
        meta = job["metadata"]
        pod_set = {"name": "main", "count": _count(job), "template": _template(job)}
        body = {
            "metadata": {
                "name": workload_name(job),
                "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [controller_ref(job, job["apiVersion"], job["kind"])],
            },
            "spec": {"queueName": meta["labels"][QUEUE_LABEL], "podSets": [pod_set]},
        }
        try:
            return self.store.create("workloads", body)
        except ApiError as e:  # the Job went away meanwhile, or a previous pass made it
            log.debug("kueue stand-in: no workload for job %s: %s", meta["name"], e.message)
            return None

    def _evaluate(
        self, job: Obj, used: defaultdict[str, Counter[str]], taken: set[str], nodes: list[Obj]
    ) -> _Verdict:
        local_queues, quotas = self.config.local_queues, self.config.quotas
        if quotas is None:
            quotas = {"cluster-queue": {"pods": len(nodes)}}
        lq = job["metadata"]["labels"][QUEUE_LABEL]
        cq = "cluster-queue" if local_queues is None else local_queues.get(lq, "")
        if not cq:
            return _Verdict("Misconfigured", f"LocalQueue {lq} doesn't exist")
        if cq not in quotas:
            return _Verdict("Misconfigured", f"ClusterQueue {cq} doesn't exist")
        requests, error = self._requests(job)
        if error:
            return _Verdict("Misconfigured", error)
        for res, nominal in quotas[cq].items():
            want, have = requests.get(res, 0), used[cq][res]
            if want > nominal:
                return _Verdict(
                    "ExceedsMaxQuota",
                    f"couldn't assign flavors to pod set main: insufficient quota for {res} in "
                    f"flavor {FLAVOR}, previously considered podsets requests (0) + current "
                    f"podset request ({want}) > maximum capacity ({nominal})",
                )
            if want + have > nominal:
                return _Verdict(
                    "WaitingForQuota",
                    f"couldn't assign flavors to pod set main: insufficient unused quota for "
                    f"{res} in flavor {FLAVOR}, {want + have - nominal} more needed",
                )
        request = tas.topology_request(job) if job["kind"] == "Job" else None
        placed = tas.place(nodes, request, _count(job), taken) if request else []
        if request and not placed:
            return _Verdict(
                "TopologyPlacementFailed",
                f"couldn't assign flavors to pod set main: topology \"{TOPOLOGY}\" doesn't allow "
                f"to fit any of {_count(job) // request[1]} slice(s)",
            )
        return _Verdict(cluster_queue=cq, usage=requests, placed=placed)

    def _requests(self, job: Obj) -> tuple[dict[str, int], str]:
        """The pod set's quota usage, or Kueue's message for an unmapped DeviceClass."""
        count = _count(job)
        spec = _template(job).get("spec") or {}
        per_pod = Counter({"pods": 1})
        for c in spec.get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            if GPU in limits:
                per_pod[GPU] += int(limits[GPU])
        mappings = self.config.device_class_mappings
        ns = job["metadata"]["namespace"]
        for j, ref in enumerate(spec.get("resourceClaims") or []):
            rct = self.store.find(
                "resourceclaimtemplates", ns, ref.get("resourceClaimTemplateName", "")
            )
            devices = (((rct or {}).get("spec") or {}).get("spec") or {}).get("devices") or {}
            for req in devices.get("requests") or []:
                exactly = req.get("exactly") or {}
                dc = exactly.get("deviceClassName", "")
                name = dc if mappings is None else mappings.get(dc, "")
                if not name:
                    return {}, (
                        f"spec.podSets[0].template.spec.resourceClaims[{j}]."
                        f'resourceClaimTemplateName: Not found: "DeviceClass {dc} is not mapped '
                        'in DRA configuration for podset main"'
                    )
                per_pod[name] += int(exactly.get("count", 1))
        return {res: n * count for res, n in per_pod.items()}, ""

    def _check_pods_ready(self, job: Obj, wl: Obj, now: float) -> None:
        """Evict an admitted Workload whose pods are not all Ready within the timeout."""
        uid, timeout = wl["metadata"]["uid"], self.config.pods_ready_timeout_s
        if not timeout or uid in self._ready:
            return
        pods = self.store.list("pods", job["metadata"]["namespace"], lambda p: _owned(p, job))[0]
        if sum(1 for p in pods if _ready(p)) >= _count(job):
            self._ready.add(uid)
            return
        due = self._admitted.setdefault(uid, now) + timeout
        if due > now:
            self.wake_at(due)
            return
        meta = wl["metadata"]
        message = f"Exceeded the PodsReady timeout {meta['namespace']}/{meta['name']}"
        count = int(((wl.get("status") or {}).get("requeueState") or {}).get("count") or 0) + 1
        backoff = min(self.config.requeue_base_s * 2 ** (count - 1), self.config.requeue_max_s)
        self._requeue_at[uid] = now + backoff
        self._admitted.pop(uid, None)
        new = [
            _condition("Evicted", "True", "PodsReadyTimeout", message),
            _condition("QuotaReserved", "False", "Pending", message),
            _condition("Requeued", "False", "PodsReadyTimeout", message),
            _condition("Admitted", "False", "NoReservation", message),
        ]

        def write(o: Obj) -> None:
            st = o.setdefault("status", {})
            st.pop("admission", None)
            st["requeueState"] = {"count": count, "requeueAt": iso_after(backoff)}
            _set_conditions(st, new)

        self._mutate("workloads", wl, write)
        template = wl["spec"]["podSets"][0]["template"]

        def stop(o: Obj) -> None:  # the Job reconciler: suspend, restore the pod set info
            o["spec"]["suspend"] = True
            if "template" in o["spec"]:  # a TrainJob's lives in its runtime
                o["spec"]["template"] = template

        self._mutate(_resource(job), job, stop)
        log.info("kueue stand-in: evicted %s: %s", meta["name"], message)

    def _backoff_finished(self, wl: Obj) -> None:
        """A requeued Workload whose back-off ended: Requeued=True, then evaluated anew."""
        if self._requeue_at.pop(wl["metadata"]["uid"], None) is None:
            return
        cond = _condition(
            "Requeued", "True", "BackoffFinished", "The workload backoff was finished"
        )
        self._mutate("workloads", wl, lambda o: _set_conditions(o.setdefault("status", {}), [cond]))

    def _set_pending(self, wl: Obj, verdict: _Verdict) -> None:
        cond = _condition("QuotaReserved", "False", verdict.reason, verdict.message)

        def write(o: Obj) -> bool:
            st = o.setdefault("status", {})
            old = next((c for c in st.get("conditions") or [] if c["type"] == cond["type"]), None)
            if old and (old["reason"], old["message"]) == (cond["reason"], cond["message"]):
                return False  # unchanged: no write, no event
            _set_conditions(st, [cond])
            return True

        self._mutate("workloads", wl, write)

    def _admit_workload(self, job: Obj, wl: Obj, verdict: _Verdict) -> None:
        """Admit with the topology assignment of ``verdict.placed``, then start the Job as
        Kueue's Job reconciler does."""
        psa: Obj = {
            "name": "main",
            "flavors": {res: FLAVOR for res in verdict.usage},
            "resourceUsage": {res: str(n) for res, n in verdict.usage.items()},
            "count": _count(job),
        }
        if verdict.placed:
            psa["topologyAssignment"] = tas.assignment(self.config.topology_levels, verdict.placed)
        admission = {"clusterQueue": verdict.cluster_queue, "podSetAssignments": [psa]}
        quota = f"Quota reserved in ClusterQueue {verdict.cluster_queue}"
        new = [
            _condition("QuotaReserved", "True", "QuotaReserved", quota),
            _condition("Admitted", "True", "Admitted", "The workload is admitted"),
        ]

        def write(o: Obj) -> None:
            st = o.setdefault("status", {})
            for c in st.get("conditions") or []:
                if c["type"] == "Evicted" and c["status"] == "True":
                    c.update(status="False", message=f"Previously: {c['message']}")
                    c["lastTransitionTime"] = now_iso()
            st["admission"] = admission
            _set_conditions(st, new)

        meta = wl["metadata"]
        self._mutate("workloads", wl, write)
        self._admitted[meta["uid"]] = time.monotonic()
        self._ready.discard(meta["uid"])

        def start(o: Obj) -> None:  # RunWithPodSetsInfo: unsuspend, merge the pod set info
            o["spec"]["suspend"] = False
            if verdict.placed:
                tas.gate_template(o["spec"]["template"], meta["name"])

        self._mutate(_resource(job), job, start)

    def _mutate(self, resource: str, obj: Obj, fn: Callable[[Obj], object]) -> None:
        self.store.mutate(resource, obj["metadata"]["namespace"], obj["metadata"]["name"], fn)


def _owned(pod: Obj, job: Obj) -> bool:
    if job["kind"] == "TrainJob":  # its pods are its JobSet's, labelled with the name
        labels = pod["metadata"].get("labels") or {}
        return labels.get(JOBSET_NAME_LABEL) == job["metadata"]["name"]
    refs = pod["metadata"].get("ownerReferences") or []
    return any(r.get("uid") == job["metadata"]["uid"] for r in refs)


def _ready(pod: Obj) -> bool:
    """Counted by Kueue's PodsReady: a pod Ready or Succeeded (not one being deleted)."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    conds = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    return ready or status.get("phase") == "Succeeded"


def _condition(type_: str, status: str, reason: str, message: str) -> Obj:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def _set_conditions(status: Obj, new: list[Obj]) -> None:
    """Replace the conditions of the types in ``new`` with ``new``, stamped now."""
    types, stamp = {c["type"] for c in new}, now_iso()
    kept = [c for c in status.get("conditions") or [] if c.get("type") not in types]
    status["conditions"] = kept + [{**c, "lastTransitionTime": stamp} for c in new]


def _count(job: Obj) -> int:
    if job["kind"] == "TrainJob":
        return int((job["spec"].get("trainer") or {}).get("numNodes") or 1)
    return int(job["spec"].get("parallelism", 1))


def _template(job: Obj) -> Obj:
    """The pod template Kueue's quota reads: a TrainJob's ``node`` container with its per-node
    resources and claims (Kueue derives it from the TrainJob's JobSet)."""
    if job["kind"] != "TrainJob":
        return dict(job["spec"]["template"])
    trainer = job["spec"].get("trainer") or {}
    node = {"name": "node", "resources": trainer.get("resourcesPerNode") or {}}
    claims = trainer.get("resourceClaimsPerNode") or []
    return {"spec": {"containers": [node], "resourceClaims": claims}}


def _resource(job: Obj) -> str:
    return "trainjobs" if job["kind"] == "TrainJob" else "jobs"


def _usage(admission: Obj) -> dict[str, int]:
    usage = admission["podSetAssignments"][0]["resourceUsage"]
    return {res: int(n) for res, n in usage.items()}
