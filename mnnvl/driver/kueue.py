"""Why Kueue holds a queued Job or TrainJob: its ``Workload``'s conditions, read beside the waits.

Kueue (v0.15+ serves ``kueue.x-k8s.io/v1beta2``) keeps one Workload per Job it manages, labelled
``kueue.x-k8s.io/job-uid``. While the Workload is not admitted its ``QuotaReserved=False``
condition carries the reason and Kueue's message (``pkg/controller/core/workload_controller.go``,
``pkg/scheduler/flavorassigner``). Reasons that an administrator must act on never clear by
themselves, so the step fails at once (exit 4) quoting Kueue:

- ``Misconfigured`` (Kueue v0.19's ``UnadmittedWorkloadsObservability``, on by default) or
  ``Inadmissible`` (before): the LocalQueue/ClusterQueue does not exist, or a DeviceClass of the
  pods' claim templates is not in Kueue's ``deviceClassMappings``;
- ``Suspended``: the ClusterQueue or LocalQueue is inactive. A queue *stopped* on purpose
  (``stopPolicy: Hold``, message "... is stopped") is an administrator's pause and is waited for.

Quota reasons (``WaitingForQuota``, ``ExceedsMaxQuota``, ``Pending``, ...) may clear when other
work ends or quota is raised: they are shown and waited for under ``--admission-timeout-s``.

An admitted Workload can be evicted: Kueue v0.19 turns ``waitForPodsReady`` on by default
(30 min for the pods to be Ready, the same after a pod of a running Job failed; requeued with
a back-off of 60 s x 2^(n-1), at most 3600 s, without limit: ``apis/config/v1beta2/defaults.go``,
``configuration_types.go`` and CHANGELOG-0.19 in kubernetes-sigs/kueue v0.19.0), and
preemption evicts for a higher-priority Workload. Kueue then sets ``Evicted=True`` (reason
``PodsReadyTimeout``, ``Preempted``, ...; ``apis/kueue/v1beta2/workload_types.go``), counts the
requeue in ``status.requeueState.count`` (with ``requeueAt``) and suspends the Job
(``pkg/controller/core/workload_controller.go``, ``pkg/controller/jobframework/reconciler.go``).
``describe`` and ``evicted`` say so in Kueue's words.
A TrainJob is queued and evicted the same way (Kueue's ``pkg/controller/jobs/trainjob``,
``trainjob_controller.go``: the webhook suspends one labelled with a queue,
``RunWithPodSetsInfo`` unsuspends it on admission, ``Stop`` suspends it again on eviction and
clears Kueue's runtime patch once its Jobs are inactive; its Workload carries the TrainJob's
uid). Trainer then suspends the TrainJob's JobSet and the Job controller deletes the pods.
:class:`QueuedWait` is the one queued phase of both paths.
Reading Workloads needs ``get/list/watch workloads.kueue.x-k8s.io`` (manifests/overlays/kueue);
without it the wait falls back to the Job's suspension alone and says so once.
"""

from __future__ import annotations

import logging
from typing import Any

from mnnvl.driver.api import Api, Kind
from mnnvl.driver.wait import Deadline, Objects, Source
from mnnvl.errors import MnnvlError, WaitTimeout, WorkloadFailed
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import KUEUE_QUEUE_LABEL

logger = logging.getLogger(__name__)

WORKLOAD = Kind("Workload", "kueue.x-k8s.io", "v1beta2", "workloads")
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PERMANENT_REASONS = frozenset({"Misconfigured", "Inadmissible", "Suspended"})
KUEUE_RBAC = "manifests/overlays/kueue"


def workload_source(api: Api, namespace: str, jobs: Source) -> Source | None:
    """The watch source for the Workloads of the Jobs (or TrainJobs) ``jobs`` selects, or None
    (logged once) when they cannot be read: no permission, or no Kueue v1beta2 API."""
    try:
        found = api.list(
            jobs.kind, namespace, label_selector=jobs.label_selector, field_selector=jobs.fields
        )["items"]
        uids = sorted(j["metadata"]["uid"] for j in found)
        selector = f"{JOB_UID_LABEL} in ({','.join(uids)})"
        api.list(WORKLOAD, namespace, label_selector=selector)
    except MnnvlError as e:
        logger.warning(
            "cannot read Kueue Workloads in %s (%s); progress shows only that the Job is "
            "suspended. Grant get/list/watch on workloads.kueue.x-k8s.io (%s) to see why "
            "Kueue holds it",
            namespace,
            e,
            KUEUE_RBAC,
        )
        return None
    return Source(WORKLOAD, label_selector=selector) if uids else None


def _conditions(wl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (wl.get("status") or {}).get("conditions") or []}


def _requeues(wl: dict[str, Any]) -> str:
    state = (wl.get("status") or {}).get("requeueState") or {}
    if not state.get("count"):
        return ""
    at = f", back-off until {state['requeueAt']}" if state.get("requeueAt") else ""
    return f"; requeued {state['count']} time(s) (status.requeueState.count){at}"


def evicted(workloads: Objects) -> str:
    """Kueue's eviction of a Workload in its words, with the requeue count ("" if none is
    evicted now)."""
    for name in sorted(workloads):
        conds = _conditions(workloads[name])
        cond = conds.get("Evicted") or {}
        if cond.get("status") == "True":
            preempted = conds.get("Preempted") or {}
            how = f", {_said(preempted)}" if preempted.get("status") == "True" else ""
            return f"Workload {name} Evicted ({_said(cond)}{how}){_requeues(workloads[name])}"
    return ""


def describe(workloads: Objects) -> str:
    """One phrase per Workload: evicted, admitted, quota reserved, or why it waits (Kueue's
    words), with the requeue count once Kueue requeued it."""
    parts = []
    for name in sorted(workloads):
        conds = _conditions(workloads[name])
        admitted, reserved = conds.get("Admitted", {}), conds.get("QuotaReserved", {})
        if (conds.get("Evicted") or {}).get("status") == "True":
            parts.append(evicted({name: workloads[name]}))
        elif admitted.get("status") == "True":
            parts.append(f"Workload {name} Admitted{_requeues(workloads[name])}")
        elif reserved.get("status") == "True":
            parts.append(f"Workload {name} QuotaReserved, Admitted=False ({_said(admitted)})")
        elif reserved:
            parts.append(
                f"Workload {name} QuotaReserved=False ({_said(reserved)})"
                f"{_requeues(workloads[name])}"
            )
        else:
            parts.append(f"Workload {name} not yet evaluated by Kueue")
    return "; ".join(parts) or "no Kueue Workload yet"


def _said(cond: dict[str, Any]) -> str:
    reason, message = cond.get("reason", ""), cond.get("message", "")
    return f"{reason}: {message}" if reason and message else reason or message or "no reason"


def raise_if_inadmissible(workloads: Objects, namespace: str, queue: str) -> None:
    """Fail the step (exit 4) when Kueue says a Workload cannot be admitted until someone acts."""
    for name in sorted(workloads):
        cond = _conditions(workloads[name]).get("QuotaReserved") or {}
        reason, message = cond.get("reason", ""), str(cond.get("message", ""))
        if cond.get("status") != "False" or reason not in PERMANENT_REASONS:
            continue
        if reason == "Suspended" and message.endswith("is stopped"):
            continue  # an administrator's pause (stopPolicy Hold): it ends when they resume
        raise WorkloadFailed(
            f'Kueue will not admit Workload {namespace}/{name}: {reason}: "{message}"; '
            f"{_hint(message, queue, namespace)}"
        )


def _hint(message: str, queue: str, namespace: str) -> str:
    if "DeviceClass" in message:
        return (
            "add the DeviceClass to Kueue's Configuration resources.deviceClassMappings and "
            "cover that resource in the ClusterQueue's quota (docs/real-cluster.md, Kueue)"
        )
    if "LocalQueue" in message:
        return (
            f"check `kubectl get localqueue {queue} -n {namespace}` or pass an existing "
            "--queue-name"
        )
    return "check `kubectl get clusterqueue` and its status conditions"


def queue_text(what: str, obj: dict[str, Any]) -> str:
    """``<what> queued in LocalQueue <q> (Kueue)``, or suspended without a queue label."""
    queue = ((obj.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    where = f"in LocalQueue {queue} (Kueue)" if queue else "(spec.suspend is true)"
    return f"{what} queued {where}"


class QueuedWait:
    """The queued phases of a wait on ``what`` (``Job ns/name``, ``TrainJob ns/name``), for the
    Job and the TrainJob path alike.

    While the workload is suspended, ``check`` logs that it is queued and each change of
    Kueue's verdict, fails at once on a Workload Kueue will never admit, and at
    ``admission_timeout_s`` counted over every wait in the queue (before the first admission
    and after each eviction). ``admitted`` marks the end of a wait. A workload suspended again
    after admission was evicted by Kueue (its ``waitForPodsReady`` timeout, preemption, a node
    failure under TAS): the eviction is logged in Kueue's words and counted in ``evictions``,
    and more than ``--max-restarts`` of them fail the step (exit 4).
    """

    def __init__(self, workload: WorkloadSpec, what: str) -> None:
        self.workload, self.what = workload, what
        self.since = Deadline(0)  # this wait's stopwatch
        self.queued_s = 0.0  # seconds queued in the waits before this one
        self.evictions = 0  # times Kueue took the admission back
        self.running = False  # admitted, and not suspended since
        self.logged = False
        self.said = ""  # Kueue's last logged verdict
        self.eviction_said = True  # the last eviction logged with Kueue's reason

    def check(self, obj: dict[str, Any], workloads: Objects | None) -> bool:
        """The check of the suspended workload ``obj``; True on the first check after an
        eviction, when the caller forgets its admitted phase (deadlines, pods, rank 0's log)."""
        evicted_now = self.running
        if evicted_now:
            self.running, self.since = False, Deadline(0)
            self.evictions, self.eviction_said = self.evictions + 1, False
        ns, text = self.workload.namespace, queue_text(self.what, obj)
        if not self.logged:
            self.logged = True
            logger.info("%s", text)
        if workloads is not None:
            raise_if_inadmissible(workloads, ns, self.workload.queue_name)
            said = describe(workloads)
            if said != self.said:  # each change of Kueue's verdict, not every event
                self.said = said
                logger.info("Kueue: %s", said)
        self._evicted(workloads)
        left = self.left_s()
        if left is not None and left <= 0:
            waits = f", over {self.evictions + 1} waits" if self.evictions else ""
            kueue = f" (Kueue: {self.said})" if self.said else ""
            raise WaitTimeout(
                f"{text} for more than {self.workload.deadlines.admission_timeout_s:g} s in "
                f"all{waits}{kueue} (--admission-timeout-s); check `kubectl get workloads -n "
                f"{ns}` and the queue's ClusterQueue quota"
            )
        return evicted_now

    def _evicted(self, workloads: Objects | None) -> None:
        """Name an eviction once Kueue's words arrived (the workload's own watch may have told
        of it first); fail past ``--max-restarts`` evictions."""
        why = evicted(workloads or {})
        if not self.evictions or not (why or workloads is None):
            return
        ns, limit = self.workload.namespace, self.workload.recovery.max_restarts
        if not self.eviction_said:
            self.eviction_said = True
            logger.warning(
                "%s was suspended again (%s); waiting for re-admission (eviction %d, at most %d: "
                "--max-restarts)",
                self.what,
                why or "Kueue's Workload unreadable",
                self.evictions,
                limit,
            )
        if self.evictions > limit:
            raise WorkloadFailed(
                f"Kueue evicted {self.what} {self.evictions} time(s), more than --max-restarts "
                f"{limit} ({why or 'suspended again'}); a workload evicted for its PodsReady "
                "timeout has pods that do not get Ready within Kueue's "
                "waitForPodsReady.timeout (30 min by default from Kueue v0.19): check "
                f"`kubectl get workloads -n {ns} -o yaml` and the pods' events, or raise "
                "--max-restarts"
            )

    def admitted(self) -> None:
        """The workload is admitted (not suspended): logs how long it waited, once per wait."""
        if self.running:
            return
        if self.logged:
            again = f"re-admitted after eviction {self.evictions}" if self.evictions else "admitted"
            logger.info("%s %s after %.0f s", self.what, again, self.since.elapsed())
        self.queued_s += self.since.elapsed()
        self.running = True

    def left_s(self) -> float | None:
        """Seconds of ``admission_timeout_s`` left over every wait; None without a limit."""
        limit = self.workload.deadlines.admission_timeout_s
        return limit - self.queued_s - self.since.elapsed() if limit > 0 else None

    def progress(self, obj: dict[str, Any], workloads: Objects | None) -> str:
        line = f"{queue_text(self.what, obj)} for {self.since.elapsed():.0f} s"
        if self.evictions:
            line += f" since eviction {self.evictions} ({self.queued_s:.0f} s before)"
        return line + (f"; Kueue: {describe(workloads)}" if workloads is not None else "")
