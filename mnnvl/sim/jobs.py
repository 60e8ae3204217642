"""batch/v1 Job controller of the simulated cluster (Indexed and NonIndexed completion modes).

Pods ``<job>-<index>-<5 chars>`` (hostname ``<job>-<index>``) carry the real controller's labels,
annotation and ``JOB_COMPLETION_INDEX`` env. Status: active/ready/succeeded/failed,
completedIndexes/failedIndexes, startTime/completionTime, conditions Complete or Failed
(BackoffLimitExceeded, DeadlineExceeded, PodFailurePolicy, FailedIndexes). Supports backoffLimit,
backoffLimitPerIndex, podFailurePolicy (FailJob/FailIndex/Ignore/Count on exit codes and on the
DisruptionTarget condition), activeDeadlineSeconds and ttlSecondsAfterFinished.
"""

from __future__ import annotations

import calendar
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from mnnvl.sim.scheduler import INDEX_LABEL, JOB_LABEL, TERMINAL, rand5
from mnnvl.sim.store import Obj, Store, WatchEvent, clone, now_iso, record_event

log = logging.getLogger(__name__)
UID_LABEL = "batch.kubernetes.io/controller-uid"


def _ts(iso: str) -> float:
    return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))


def compress_indexes(indexes: set[int]) -> str:
    """{0,1,2,5} -> "0-2,5" (the format of status.completedIndexes)."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indexes):
        if run and i != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(i)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def failure_action(job: Obj, pod: Obj) -> str:
    """podFailurePolicy verdict for a failed pod: FailJob | FailIndex | Ignore | Count."""
    rules = ((job["spec"].get("podFailurePolicy") or {}).get("rules")) or []
    st = pod.get("status") or {}
    codes = {
        (cs.get("name"), ((cs.get("state") or {}).get("terminated") or {}).get("exitCode"))
        for cs in st.get("containerStatuses") or []
    }
    conds = {(c.get("type"), c.get("status")) for c in st.get("conditions") or []}
    for rule in rules:
        on_codes = rule.get("onExitCodes")
        if on_codes:
            vals, op = set(on_codes.get("values") or []), on_codes.get("operator", "In")
            hit = any(
                code is not None
                and code != 0
                and (code in vals) == (op == "In")
                and on_codes.get("containerName") in (None, name)
                for name, code in codes
            )
            if hit:
                return str(rule["action"])
        for pat in rule.get("onPodConditions") or []:
            if (pat.get("type"), pat.get("status", "True")) in conds:
                return str(rule["action"])
    return "Count"


class JobController:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._sub = store.subscribe(["jobs", "pods"])
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        self._ttl_armed: set[str] = set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sim-job-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        self.store.unsubscribe(self._sub)
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while (ev := self._sub.queue.get()) is not None:
            dirty = {self._job_key(ev)}
            while not self._sub.queue.empty():  # batch a burst of events
                nxt = self._sub.queue.get()
                if nxt is None:
                    return
                dirty.add(self._job_key(nxt))
            for key in dirty:
                if key is not None:
                    try:
                        self.sync(*key)
                    except Exception:
                        log.exception("job controller: sync %s failed", key)

    @staticmethod
    def _job_key(ev: WatchEvent) -> tuple[str, str] | None:
        if ev.resource == "jobs":
            return None if ev.type == "DELETED" else (ev.namespace, ev.obj["metadata"]["name"])
        for ref in ev.obj["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job" and ref.get("controller"):
                return ev.namespace, ref["name"]
        return None

    def _later(self, delay: float, ns: str, name: str) -> None:
        """Wake the controller for this job after ``delay`` seconds (deadline, TTL)."""
        ev = WatchEvent(0, "jobs", ns, "SYNC", {"metadata": {"name": name}})
        timer = threading.Timer(max(delay, 0.0), self._sub.queue.put, (ev,))
        timer.daemon = True
        timer.start()
        self._timers = [t for t in self._timers if t.is_alive()] + [timer]

    # ----- reconcile -------------------------------------------------------------------
    def sync(self, ns: str, name: str) -> None:
        job = self.store.find("jobs", ns, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        status = job.get("status") or {}
        if _finished(status):
            self._ttl(job, status)
            return
        progress = _progress(job, self._owned_pods(job))
        start = status.get("startTime") or now_iso()
        # A limit verdict wins over the deadline, which is only checked (and armed) without one.
        fail = _limit_failure(job, progress) or self._deadline_failure(job, status, start)
        if fail is None and not progress.indexed and progress.succeeded >= progress.completions:
            progress.done = set(range(progress.completions))
        fail = fail or _failed_indexes_failure(progress)
        active = self._reconcile_pods(job, progress, fail)
        self._write_status(job, start, progress, active, fail)

    def _owned_pods(self, job: Obj) -> list[Obj]:
        uid = job["metadata"]["uid"]
        return self.store.list(
            "pods",
            job["metadata"]["namespace"],
            lambda o: any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []),
        )[0]

    def _deadline_failure(self, job: Obj, status: Obj, start: str) -> tuple[str, str] | None:
        """DeadlineExceeded once activeDeadlineSeconds passed; on the first sync, a wake-up."""
        deadline_s = job["spec"].get("activeDeadlineSeconds")
        if deadline_s is None:
            return None
        left_s = _ts(start) + float(deadline_s) - time.time()
        if left_s <= 0:
            return ("DeadlineExceeded", "Job was active longer than specified deadline")
        if "startTime" not in status:
            self._later(left_s + 0.05, job["metadata"]["namespace"], job["metadata"]["name"])
        return None

    def _reconcile_pods(
        self, job: Obj, progress: _Progress, fail: tuple[str, str] | None
    ) -> list[Obj]:
        """The pods active after creating the missing ones, or deleting all once the Job failed."""
        if fail is None and len(progress.done) < progress.completions:
            skip = progress.done | progress.failed_idx
            created = self._create_pods(
                job, progress.active, skip, progress.indexed, progress.completions
            )
            return progress.active + created
        if fail is not None:
            for p in progress.active:
                self.store.delete("pods", job["metadata"]["namespace"], p["metadata"]["name"])
            return []
        return progress.active

    def _create_pods(
        self, job: Obj, active: list[Obj], skip: set[int], indexed: bool, completions: int
    ) -> list[Obj]:
        parallelism = int(job["spec"].get("parallelism", 1))
        busy = {_index(p) for p in active}
        want = [i for i in range(completions) if i not in skip and i not in busy]
        if not indexed:
            want = list(range(max(0, min(completions - len(skip), parallelism) - len(active))))
        created = []
        for i in want[: max(0, parallelism - len(active))]:
            created.append(self.store.create("pods", self._pod(job, i if indexed else None)))
        return created

    def _pod(self, job: Obj, index: int | None) -> Obj:
        jname, uid = job["metadata"]["name"], job["metadata"]["uid"]
        tmpl = clone(job["spec"].get("template") or {})
        meta, spec = tmpl.get("metadata") or {}, tmpl.get("spec") or {}
        labels = {
            **(meta.get("labels") or {}),
            JOB_LABEL: jname,
            "job-name": jname,
            UID_LABEL: uid,
            "controller-uid": uid,
        }
        annotations = dict(meta.get("annotations") or {})
        name = f"{jname}-{rand5()}"
        if index is not None:
            labels[INDEX_LABEL] = annotations[INDEX_LABEL] = str(index)
            name = f"{jname}-{index}-{rand5()}"
            spec["hostname"] = f"{jname}-{index}"
            ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}}
            for c in spec.get("containers") or []:
                c["env"] = [
                    *(c.get("env") or []),
                    {"name": "JOB_COMPLETION_INDEX", "valueFrom": ref},
                ]
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": jname,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pod_meta = {
            "name": name,
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        }
        record_event(
            self.store, job, "Normal", "SuccessfulCreate", f"Created pod: {name}", "job-controller"
        )
        return {"metadata": pod_meta, "spec": spec, "status": {"phase": "Pending"}}

    def _write_status(
        self,
        job: Obj,
        start: str,
        progress: _Progress,
        active: list[Obj],
        fail: tuple[str, str] | None,
    ) -> None:
        st = _status(start, progress, active, fail, now_iso())
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]

        def write(o: Obj) -> None:
            old = o.get("status") or {}
            # Conditions are only ever added: a sync that decides nothing keeps the old ones.
            if "conditions" not in st and old.get("conditions"):
                st["conditions"] = old["conditions"]
            o["status"] = st

        self.store.mutate("jobs", ns, name, write)
        if fail is not None or len(progress.done) >= progress.completions:
            self._record_end(job, fail)
            self._ttl(job, st)

    def _record_end(self, job: Obj, fail: tuple[str, str] | None) -> None:
        reason = "Completed" if fail is None else fail[0]
        record_event(
            self.store,
            job,
            "Normal" if fail is None else "Warning",
            reason,
            "Job completed" if fail is None else fail[1],
            "job-controller",
        )

    def _ttl(self, job: Obj, status: Obj) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        ended = max(
            (_ts(c["lastTransitionTime"]) for c in status.get("conditions") or []),
            default=time.time(),
        )
        left = ended + float(ttl) - time.time()
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if left > 0:
            if job["metadata"]["uid"] not in self._ttl_armed:
                self._ttl_armed.add(job["metadata"]["uid"])
                self._later(left + 0.05, ns, name)
        elif self.store.find("jobs", ns, name) is not None:
            self.store.delete("jobs", ns, name, "Background")


@dataclass
class _Progress:
    """What a Job's pods say, counted the way the real Job controller counts them."""

    indexed: bool
    completions: int
    per_index: Any  # spec.backoffLimitPerIndex (None when the Job has no per-index limit)
    active: list[Obj]  # neither terminal nor being deleted
    done: set[int]  # completed indexes
    succeeded: int  # completed indexes (Indexed) or Succeeded pods (NonIndexed)
    counted: list[tuple[Obj, str]]  # failed pods not Ignored by podFailurePolicy, with action
    failed_idx: set[int]  # indexes out of retries (backoffLimitPerIndex or FailIndex)


def _progress(job: Obj, pods: list[Obj]) -> _Progress:
    spec = job["spec"]
    indexed = spec.get("completionMode") == "Indexed"
    per_index = spec.get("backoffLimitPerIndex")
    active = [
        p for p in pods if _phase(p) not in TERMINAL and not p["metadata"].get("deletionTimestamp")
    ]
    done = {_index(p) for p in pods if _phase(p) == "Succeeded"}
    failed_pods = [p for p in pods if _phase(p) == "Failed"]
    actions = [(p, failure_action(job, p)) for p in failed_pods]
    counted = [(p, a) for p, a in actions if a != "Ignore"]
    succeeded = len(done) if indexed else len([p for p in pods if _phase(p) == "Succeeded"])
    return _Progress(
        indexed=indexed,
        completions=int(spec.get("completions") or 1),
        per_index=per_index,
        active=active,
        done=done,
        succeeded=succeeded,
        counted=counted,
        failed_idx=_failed_indexes(counted, per_index),
    )


def _failed_indexes(counted: list[tuple[Obj, str]], per_index: Any) -> set[int]:
    per_count: dict[int, int] = {}
    failed_idx: set[int] = set()
    for p, a in counted:
        i = _index(p)
        per_count[i] = per_count.get(i, 0) + 1
        if per_index is not None and (a == "FailIndex" or per_count[i] > int(per_index)):
            failed_idx.add(i)
    return failed_idx


def _limit_failure(job: Obj, progress: _Progress) -> tuple[str, str] | None:
    """A FailJob verdict, else BackoffLimitExceeded once more pods failed than allowed."""
    per_index = progress.per_index
    limit = int(job["spec"].get("backoffLimit", 6 if per_index is None else 2**31 - 1))
    if any(a == "FailJob" for _, a in progress.counted):
        return ("PodFailurePolicy", "Container failed with an exit code matched by a FailJob rule")
    if len(progress.counted) > limit:
        return ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    return None


def _failed_indexes_failure(progress: _Progress) -> tuple[str, str] | None:
    """FailedIndexes once every index is done or out of retries and no pod is left running."""
    if (
        progress.indexed
        and progress.per_index is not None
        and progress.failed_idx
        and len(progress.done | progress.failed_idx) >= progress.completions
        and not progress.active
    ):
        return ("FailedIndexes", "Job has failed indexes")
    return None


def _status(
    start: str, progress: _Progress, active: list[Obj], fail: tuple[str, str] | None, now: str
) -> Obj:
    """The Job's new status (conditions only when this sync decided the Job's end)."""
    st: Obj = {
        "startTime": start,
        "active": len(active),
        "succeeded": progress.succeeded,
        "failed": len(progress.counted),
        "terminating": 0,
        "uncountedTerminatedPods": {},
        "ready": len([p for p in active if _ready(p)]),
    }
    if progress.indexed:
        st["completedIndexes"] = compress_indexes(progress.done)
    if progress.per_index is not None:
        st["failedIndexes"] = compress_indexes(progress.failed_idx)
    if fail is not None:
        st["conditions"] = [_cond("FailureTarget", fail, now), _cond("Failed", fail, now)]
    elif len(progress.done) >= progress.completions:
        st["conditions"] = [
            _cond("SuccessCriteriaMet", None, now),
            _cond("Complete", None, now),
        ]
        st["completionTime"] = now
    return st


def _cond(type_: str, fail: tuple[str, str] | None, now: str) -> Obj:
    c: Obj = {"type": type_, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
    if fail is not None:
        c["reason"], c["message"] = fail
    return c


def _finished(status: Obj) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _index(pod: Obj) -> int:
    return int((pod["metadata"].get("labels") or {}).get(INDEX_LABEL, -1))


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def _ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
