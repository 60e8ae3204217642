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
        uid, spec = job["metadata"]["uid"], job["spec"]
        status = job.get("status") or {}
        if _finished(status):
            self._ttl(job, status)
            return
        pods = self.store.list(
            "pods",
            ns,
            lambda o: any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []),
        )[0]
        indexed = spec.get("completionMode") == "Indexed"
        completions = int(spec.get("completions") or 1)
        per_index = spec.get("backoffLimitPerIndex")
        limit = int(spec.get("backoffLimit", 6 if per_index is None else 2**31 - 1))
        active = [
            p
            for p in pods
            if _phase(p) not in TERMINAL and not p["metadata"].get("deletionTimestamp")
        ]
        done = {_index(p) for p in pods if _phase(p) == "Succeeded"}
        failed_pods = [p for p in pods if _phase(p) == "Failed"]
        actions = [(p, failure_action(job, p)) for p in failed_pods]
        counted = [(p, a) for p, a in actions if a != "Ignore"]
        per_count: dict[int, int] = {}
        failed_idx: set[int] = set()
        for p, a in counted:
            i = _index(p)
            per_count[i] = per_count.get(i, 0) + 1
            if per_index is not None and (a == "FailIndex" or per_count[i] > int(per_index)):
                failed_idx.add(i)
        start = status.get("startTime") or now_iso()
        fail: tuple[str, str] | None = None
        if any(a == "FailJob" for _, a in counted):
            fail = (
                "PodFailurePolicy",
                "Container failed with an exit code matched by a FailJob rule",
            )
        elif len(counted) > limit:
            fail = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        deadline = spec.get("activeDeadlineSeconds")
        if fail is None and deadline is not None:
            left = _ts(start) + float(deadline) - time.time()
            if left <= 0:
                fail = ("DeadlineExceeded", "Job was active longer than specified deadline")
            elif "startTime" not in status:
                self._later(left + 0.05, ns, name)
        succeeded = len(done) if indexed else len([p for p in pods if _phase(p) == "Succeeded"])
        if fail is None and not indexed and succeeded >= completions:
            done = set(range(completions))
        if (
            fail is None
            and indexed
            and per_index is not None
            and failed_idx
            and len(done | failed_idx) >= completions
            and not active
        ):
            fail = ("FailedIndexes", "Job has failed indexes")
        if fail is None and len(done) < completions:
            active += self._create_pods(job, active, done | failed_idx, indexed, completions)
        elif fail is not None:
            for p in active:
                self.store.delete("pods", ns, p["metadata"]["name"])
            active = []
        self._write_status(
            job,
            start,
            active,
            done,
            succeeded,
            counted,
            failed_idx,
            fail,
            indexed,
            completions,
            per_index is not None,
        )

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
        active: list[Obj],
        done: set[int],
        succeeded: int,
        counted: list,
        failed_idx: set[int],
        fail: tuple[str, str] | None,
        indexed: bool,
        completions: int,
        per_index: bool,
    ) -> None:
        now = now_iso()
        st: Obj = {
            "startTime": start,
            "active": len(active),
            "succeeded": succeeded,
            "failed": len(counted),
            "terminating": 0,
            "uncountedTerminatedPods": {},
            "ready": len([p for p in active if _ready(p)]),
        }
        if indexed:
            st["completedIndexes"] = compress_indexes(done)
        if per_index:
            st["failedIndexes"] = compress_indexes(failed_idx)
        if fail is not None:
            st["conditions"] = [_cond("FailureTarget", fail, now), _cond("Failed", fail, now)]
        elif len(done) >= completions:
            st["conditions"] = [
                _cond("SuccessCriteriaMet", None, now),
                _cond("Complete", None, now),
            ]
            st["completionTime"] = now
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]

        def write(o: Obj) -> None:
            old = o.get("status") or {}
            if "conditions" not in st and old.get("conditions"):
                st["conditions"] = old["conditions"]
            o["status"] = st

        self.store.mutate("jobs", ns, name, write)
        if fail is not None or len(done) >= completions:
            reason = "Completed" if fail is None else fail[0]
            record_event(
                self.store,
                job,
                "Normal" if fail is None else "Warning",
                reason,
                "Job completed" if fail is None else fail[1],
                "job-controller",
            )
            self._ttl(job, st)

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
