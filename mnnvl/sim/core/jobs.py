"""batch/v1 Job controller of the simulated cluster (Indexed and NonIndexed completion modes).

Pods ``<job>-<index>-<5 chars>`` (hostname ``<job>-<index>``) carry the real controller's labels,
annotation and ``JOB_COMPLETION_INDEX`` env. Status: active/ready/succeeded/failed,
completedIndexes/failedIndexes, startTime/completionTime, conditions Complete or Failed
(BackoffLimitExceeded, DeadlineExceeded, PodFailurePolicy, FailedIndexes). Supports backoffLimit,
backoffLimitPerIndex, podFailurePolicy (FailJob/FailIndex/Ignore/Count on exit codes and on the
DisruptionTarget condition), activeDeadlineSeconds and ttlSecondsAfterFinished.

Pods go through the API server's validating admission (``admit``): a refused create becomes a
``FailedCreate`` Warning Event on the Job (``Error creating: <the API's message>``) and the
Job is synced again after an exponential backoff (1 s doubling to 60 s, the real controller's
DefaultJobApiBackOff/MaxJobApiBackOff), or sooner when one of its pods changes.
"""

from __future__ import annotations

import calendar
import logging
import time
from collections.abc import Callable

from mnnvl.contract.env import JOB_COMPLETION_INDEX
from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.events import record_event
from mnnvl.sim.api.model import ApiError, controller_ref, finished
from mnnvl.sim.api.store import Obj, Store, WatchEvent, clone, now_iso
from mnnvl.sim.core.jobstatus import (
    TRACKING_FINALIZER,
    Progress,
    absolute_failures,
    add_condition,
    condition,
    count_progress,
    failed_indexes_failure,
    job_status,
    limit_failure,
    only_replace_failed,
    phase,
    pod_index,
    replacement_counts,
    target_failure,
)
from mnnvl.sim.core.scheduler import INDEX_LABEL, JOB_LABEL, rand5

log = logging.getLogger(__name__)
UID_LABEL = "batch.kubernetes.io/controller-uid"
API_BACKOFF_S, MAX_API_BACKOFF_S = 1.0, 60.0


def _last_failed(pods: list[Obj], index: int) -> Obj | None:
    """The index's most recent failed pod (the one a new pod replaces)."""
    failed = [p for p in pods if pod_index(p) == index and phase(p) == "Failed"]
    return max(
        failed,
        key=lambda p: (absolute_failures(p), p["metadata"].get("creationTimestamp", "")),
        default=None,
    )


def _suspended(status: Obj) -> bool:
    return any(
        c["type"] == "Suspended" and c["status"] == "True" for c in status.get("conditions") or []
    )


def _ts(iso: str) -> float:
    return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))


class JobController(Controller):
    name = "sim-job-controller"
    kinds = ("jobs", "pods")

    def __init__(self, store: Store, admit: Callable[[str, Obj], None], minor: int = 36) -> None:
        super().__init__(store)
        self.admit = admit  # the API server's admission of a pod it creates
        # Kubernetes 1.36 clears status.startTime on suspension
        # (MutableSchedulingDirectivesForSuspendedJobs, beta); 1.34 and 1.35 keep it until
        # the Job resumes, when it is set anew.
        self.clears_start = minor >= 36
        self._create_failures: dict[str, int] = {}  # Job uid -> refused creates in a row
        self._ttl_armed: set[str] = set()
        # Pods already in their Job's status (what the real controller keeps in
        # status.uncountedTerminatedPods until it has removed their tracking finalizer).
        self._counted: set[str] = set()

    def on_events(self, events: list[WatchEvent]) -> None:
        """Each Job a burst touched is synced once."""
        for key in dict.fromkeys(self._job_key(ev) for ev in events):
            if key is not None:
                try:
                    self.sync(*key)
                except Exception:
                    log.exception("job controller: sync %s failed", key)

    @staticmethod
    def _job_key(ev: WatchEvent) -> tuple[str, str] | None:
        if ev.resource == "jobs":
            # A deleted Job is synced too: its pods' tracking finalizers are released, as the
            # real controller's deleteJob does (cleanupPodFinalizers, pkg/controller/job).
            return ev.namespace, ev.obj["metadata"]["name"]
        for ref in ev.obj["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job" and ref.get("controller"):
                return ev.namespace, ref["name"]
        # A pod that lost its Job (orphaned): its tracking finalizer is released by its uid.
        return ("", ev.obj["metadata"]["uid"]) if ev.namespace else None

    def sync(self, ns: str, name: str) -> None:
        job = self.store.find("jobs", ns, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            self._release_orphans(ns, name)
            return
        status = job.get("status") or {}
        if finished(status):
            self._release(job, self._owned_pods(job), keep=set())
            self._ttl(job, status)
            return
        pods = self._owned_pods(job)
        progress = count_progress(job, pods, self._counted)
        if job["spec"].get("suspend") and target_failure(status) is None:
            self._suspend(job, progress)
            return
        start = self._resume(job, status)
        fail = target_failure(status)
        # A limit verdict wins over the deadline, which is only checked (and armed) without one.
        fail = fail or limit_failure(job, progress) or self._deadline_failure(job, status, start)
        if fail is None and not progress.indexed and progress.succeeded >= progress.completions:
            progress.done = set(range(progress.completions))
        fail = fail or failed_indexes_failure(progress)
        active = self._reconcile_pods(job, progress, fail, pods)
        if fail is not None:
            progress = count_progress(job, self._owned_pods(job), self._counted)
        self._write_status(job, start, progress, active, fail)
        self._counted |= {p["metadata"]["uid"] for p in progress.fresh}
        self._release(job, self._owned_pods(job), self._delayed(progress, fail))

    def _delayed(self, progress: Progress, fail: tuple[str, str] | None) -> set[str]:
        """The last failed pod of each index still waiting for its replacement keeps its
        tracking finalizer, so that the replacement's failure count can be taken from it."""
        if fail is not None or not progress.indexed:
            return set()
        busy = {pod_index(p) for p in progress.active} | progress.done | progress.failed_idx
        return {
            p["metadata"]["uid"]
            for p in progress.fresh
            if phase(p) == "Failed" and pod_index(p) not in busy
        }

    def _release(self, job: Obj, pods: list[Obj], keep: set[str]) -> None:
        """Remove the tracking finalizer of pods counted in the Job's status, or of all once
        the Job has finished (a pod deleted meanwhile goes away with it)."""
        done = finished(job.get("status") or {})
        for p in pods:
            uid = p["metadata"]["uid"]
            if uid in keep or TRACKING_FINALIZER not in (p["metadata"].get("finalizers") or []):
                continue
            if done or uid in self._counted:
                self._drop_finalizer(p)

    def _release_orphans(self, ns: str, name: str) -> None:
        """The Job ``ns/name`` is gone or going, or (``ns`` empty) the pod of uid ``name`` lost
        its owner: those pods keep no finalizer."""

        def held(pod: Obj) -> bool:
            meta = pod["metadata"]
            owners = {r.get("name") for r in meta.get("ownerReferences") or []}
            named = name in owners if ns else meta["uid"] == name
            return named and TRACKING_FINALIZER in (meta.get("finalizers") or [])

        for p in self.store.list("pods", ns or None, held)[0]:
            self._drop_finalizer(p)

    def _drop_finalizer(self, pod: Obj) -> None:
        def write(o: Obj) -> None:
            o["metadata"]["finalizers"] = [
                f for f in o["metadata"].get("finalizers") or [] if f != TRACKING_FINALIZER
            ]

        self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], write)

    def _suspend(self, job: Obj, progress: Progress) -> None:
        """spec.suspend: no pods run; active ones are deleted; the clock stops."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        for p in progress.active:
            self.store.delete("pods", ns, p["metadata"]["name"])
        if not _suspended(job.get("status") or {}):
            record_event(self.store, job, "Normal", "Suspended", "Job suspended", "job-controller")
        progress = count_progress(job, self._owned_pods(job), self._counted)

        def write(o: Obj) -> None:
            st = o.setdefault("status", {})
            conds = st.setdefault("conditions", [])
            add_condition(conds, "Suspended", ("JobSuspended", "Job suspended"), now_iso())
            if self.clears_start:
                st.pop("startTime", None)
            st.update(active=0, ready=0, terminating=len(progress.terminating))

        self.store.mutate("jobs", ns, name, write)

    def _resume(self, job: Obj, status: Obj) -> str:
        """The Job's startTime; a Job leaving suspension gets Suspended=False and a new one."""
        if not _suspended(status):
            return str(status.get("startTime") or now_iso())
        now = now_iso()
        record_event(self.store, job, "Normal", "Resumed", "Job resumed", "job-controller")

        def write(o: Obj) -> None:
            st = o.setdefault("status", {})
            st["conditions"] = [
                c for c in st.get("conditions") or [] if c["type"] != "Suspended"
            ] + [condition("Suspended", ("JobResumed", "Job resumed"), now, status="False")]
            st["startTime"] = now

        self.store.mutate("jobs", job["metadata"]["namespace"], job["metadata"]["name"], write)
        return now

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
            meta = job["metadata"]
            self.requeue(left_s + 0.05, "jobs", meta["namespace"], meta["name"])
        return None

    def _reconcile_pods(
        self, job: Obj, progress: Progress, fail: tuple[str, str] | None, pods: list[Obj]
    ) -> list[Obj]:
        """The pods active after creating the missing ones, or deleting all once the Job failed.
        With ``only_replace_failed`` an index whose pod is still terminating waits for it."""
        if fail is not None:
            for p in progress.active:
                self.store.delete("pods", job["metadata"]["namespace"], p["metadata"]["name"])
            return []
        if len(progress.done) >= progress.completions:
            return progress.active
        skip = progress.done | progress.failed_idx
        if only_replace_failed(job):
            skip |= {pod_index(p) for p in progress.terminating}
        return progress.active + self._create_pods(job, progress, skip, pods)

    def _create_pods(
        self, job: Obj, progress: Progress, skip: set[int], pods: list[Obj]
    ) -> list[Obj]:
        parallelism = int(job["spec"].get("parallelism", 1))
        active, completions, indexed = progress.active, progress.completions, progress.indexed
        if indexed:
            skip = skip | {pod_index(p) for p in active}
            want = [i for i in range(completions) if i not in skip]
        else:
            want = list(range(max(0, min(completions - len(skip), parallelism) - len(active))))
        created = []
        for i in want[: max(0, parallelism - len(active))]:
            pod = self._pod(job, i if indexed else None)
            if indexed and progress.per_index is not None:
                pod["metadata"]["annotations"].update(
                    replacement_counts(job, _last_failed(pods, i))
                )
            try:
                self.admit("pods", pod)
                created.append(self.store.create("pods", pod))
            except ApiError as e:
                self._create_refused(job, e)
                break  # the rest of this batch waits for the retry, as in the real controller
            msg = f"Created pod: {pod['metadata']['name']}"
            record_event(self.store, job, "Normal", "SuccessfulCreate", msg, "job-controller")
            self._create_failures.pop(job["metadata"]["uid"], None)
        return created

    def _create_refused(self, job: Obj, err: ApiError) -> None:
        """A FailedCreate Event on the Job and a retry after the rate limiter's backoff."""
        ns, name, uid = (job["metadata"][k] for k in ("namespace", "name", "uid"))
        if "being terminated" in err.message:
            return  # the namespace is going away: the real controller stays silent
        msg = f"Error creating: {err.message}"
        record_event(self.store, job, "Warning", "FailedCreate", msg, "job-controller")
        failures = self._create_failures[uid] = self._create_failures.get(uid, 0) + 1
        self.requeue(min(API_BACKOFF_S * 2 ** (failures - 1), MAX_API_BACKOFF_S), "jobs", ns, name)

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
                c["env"] = [*(c.get("env") or []), {"name": JOB_COMPLETION_INDEX, "valueFrom": ref}]
        pod_meta = {
            "name": name,
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [controller_ref(job, "batch/v1", "Job")],
            # Keeps a finished pod until the controller has counted it in the Job's status.
            "finalizers": [TRACKING_FINALIZER],
        }
        return {"metadata": pod_meta, "spec": spec, "status": {"phase": "Pending"}}

    def _write_status(
        self,
        job: Obj,
        start: str,
        progress: Progress,
        active: list[Obj],
        fail: tuple[str, str] | None,
    ) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        result: Obj = {}

        def write(o: Obj) -> None:
            result.update(
                job_status(start, progress, active, fail, o.get("status") or {}, now_iso())
            )
            o["status"] = result

        self.store.mutate("jobs", ns, name, write)
        if finished(result) and not finished(job.get("status") or {}):
            end = ("Normal", "Completed", "Job completed") if fail is None else ("Warning", *fail)
            record_event(self.store, job, *end, "job-controller")
            self._ttl(job, result)

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
                self.requeue(left + 0.05, "jobs", ns, name)
        elif self.store.find("jobs", ns, name) is not None:
            self.store.delete("jobs", ns, name, "Background")
