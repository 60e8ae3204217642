"""A Kueue stand-in (``SimCluster(kueue=True)``): queued Jobs wait suspended until admitted.

Like Kueue's Job webhook, a Job created with the label ``kueue.x-k8s.io/queue-name`` is stored
with ``spec.suspend: true``. Like Kueue's admission, it is un-suspended once it has waited
``admission_delay_s`` and its pods fit: the nodes the admitted, unfinished queued Jobs take
(one pod per node, ``parallelism`` pods per Job) plus its own do not exceed the cluster's nodes.
Re-evaluated whenever a Job or node changes, so a finished or deleted Job frees room at once.
Not modelled: ClusterQueues, flavors, Workload objects, preemption, quotas other than nodes.
"""

from __future__ import annotations

import logging
import threading
import time

from mnnvl.sim.jobstatus import finished
from mnnvl.sim.store import Obj, Store, WatchEvent

log = logging.getLogger(__name__)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMITTED = "kueue.x-k8s.io/admitted"  # annotation the stand-in sets (Kueue keeps a Workload)


def queued(obj: Obj) -> bool:
    return QUEUE_LABEL in ((obj.get("metadata") or {}).get("labels") or {})


class KueueStandIn:
    def __init__(self, store: Store, admission_delay_s: float = 0.5) -> None:
        self.store, self.admission_delay_s = store, admission_delay_s
        self._sub = store.subscribe(["jobs", "nodes"])
        self._thread: threading.Thread | None = None
        self._seen: dict[str, float] = {}  # job uid -> monotonic time first seen
        self._wake_at = 0.0

    def mutate(self, resource: str, obj: Obj) -> None:
        """Admission webhook: queued Jobs are created suspended."""
        if resource == "jobs" and queued(obj):
            obj.setdefault("spec", {})["suspend"] = True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sim-kueue", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.store.unsubscribe(self._sub)
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while self._sub.queue.get() is not None:
            while not self._sub.queue.empty():
                if self._sub.queue.get() is None:
                    return
            try:
                self._admit()
            except Exception:
                log.exception("kueue stand-in: admission pass failed")

    def _admit(self) -> None:
        jobs = [j for j in self.store.list("jobs")[0] if queued(j)]
        nodes = len(self.store.list("nodes")[0])
        used = sum(
            _width(j)
            for j in jobs
            if ADMITTED in (j["metadata"].get("annotations") or {})
            and not finished(j.get("status") or {})
        )
        now = time.monotonic()
        waiting = sorted(
            (j for j in jobs if ADMITTED not in (j["metadata"].get("annotations") or {})),
            key=lambda j: str(j["metadata"]["creationTimestamp"]),
        )
        for job in waiting:
            due = self._seen.setdefault(job["metadata"]["uid"], now) + self.admission_delay_s
            if due > now:
                self._wake(due - now)
                break  # first come, first served
            if used + _width(job) > nodes:
                break
            used += _width(job)
            self.store.mutate(
                "jobs", job["metadata"]["namespace"], job["metadata"]["name"], _admit_job
            )

    def _wake(self, delay_s: float) -> None:
        at = time.monotonic() + delay_s
        if time.monotonic() < self._wake_at <= at:
            return  # an earlier wake-up is already armed
        self._wake_at = at
        ev = WatchEvent(0, "jobs", "", "SYNC", {"metadata": {"name": ""}})
        timer = threading.Timer(delay_s + 0.01, self._sub.queue.put, (ev,))
        timer.daemon = True
        timer.start()


def _width(job: Obj) -> int:
    return int(job["spec"].get("parallelism", 1))


def _admit_job(o: Obj) -> None:
    o["metadata"].setdefault("annotations", {})[ADMITTED] = "true"
    o["spec"]["suspend"] = False
