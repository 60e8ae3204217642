"""The train step as a Kubeflow Trainer TrainJob (``--workload trainjob``): create or adopt it,
wait until Trainer reports it ``Complete``, return rank 0's RESULT."""

from __future__ import annotations

import logging
from typing import Any

from mnnvl.driver.api import POD, RESOURCE_CLAIM_TEMPLATE, Api
from mnnvl.driver.diagnose import (
    LOG_TAIL_LINES,
    Grace,
    describe_pods,
    pod_index,
    pod_phase,
    raise_on_stuck_pod,
)
from mnnvl.driver.gpus import resolve_gpu_mode
from mnnvl.driver.kueue import QueuedWait, workload_source
from mnnvl.driver.lifecycle import JobOutcome, require_domain, running_indexes
from mnnvl.driver.ownership import create_or_adopt
from mnnvl.driver.trainjob import JOBSET_NAME_LABEL, TRAINJOB
from mnnvl.driver.wait import Deadline, Objects, Source, View, timeout_error, watch_until
from mnnvl.driver.workload import LogFollower, parse_result
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import gpu_claim_template, wants_gpu_claim
from mnnvl.manifests.trainjob import NODE, take_trainjob, trainjob

logger = logging.getLogger(__name__)
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
TERMINAL = ("Succeeded", "Failed")


def run_trainjob(
    api: Api,
    workload: WorkloadSpec,
    module: str,
    args: list[str],
    runtime: str,
    own: dict[str, Any] | None = None,
) -> JobOutcome:
    """Create (or adopt) the step's TrainJob, wait until Trainer reports it ``Complete``, and
    return rank 0's RESULT, as :func:`mnnvl.driver.run_job` does for the Indexed Job.

    Restarts are the runtime's (its JobSet ``failurePolicy``), so only pods that cannot start
    fail the wait early, with the Job path's diagnoses; a failed pod is left to the JobSet,
    and a TrainJob that turns ``Failed`` ends the wait with Trainer's reason. Each restart is
    counted from the pods' ``jobset.sigs.k8s.io/restart-attempt`` label. ``own``: a team's
    TrainJob, run as given but for the run's name, labels, claims and placement
    (:func:`mnnvl.manifests.trainjob.take_trainjob`; ``module``, ``args`` and ``runtime`` unused).
    """
    require_domain(api, workload)
    workload = resolve_gpu_mode(api, workload)
    if wants_gpu_claim(workload):
        create_or_adopt(api, RESOURCE_CLAIM_TEMPLATE, gpu_claim_template(workload))
    body = take_trainjob(own, workload) if own else trainjob(workload, module, args, runtime)
    runtime = str(body["spec"]["runtimeRef"]["name"])
    name, ns = body["metadata"]["name"], workload.namespace
    found, adopted = create_or_adopt(api, TRAINJOB, body)
    wait = TrainJobWait(api, workload, name, runtime)
    pods = wait.run()
    attempt = max((restart_attempt(p) for p in pods.values()), default=0)
    rank0 = [k for k, p in pods.items() if pod_index(p) == "0" and restart_attempt(p) == attempt]
    follower = wait.follower if wait.follower is not None and wait.follower.pod in rank0 else None
    text = follower.drained() if follower is not None else ""
    if rank0 and parse_result(text) is None:  # the stream cut or not followed: the stored log
        text = api.pod_log(ns, rank0[0], NODE)
    return JobOutcome(
        job=name,
        pods=sorted(pods),
        result=parse_result(text),
        log_tail="\n".join(text.splitlines()[-LOG_TAIL_LINES:]),
        restarts=[{"attempt": i + 1} for i in range(attempt)],
        adopted=("complete" if finished(found) else "running") if adopted else "",
        evictions=wait.queue.evictions,
    )


class TrainJobWait:
    """Until the TrainJob is ``Complete`` (``run`` returns its pods then). While it is suspended
    (queued by Kueue, or evicted and queued again) the Job path's queued phase applies
    (:class:`mnnvl.driver.kueue.QueuedWait`); from each admission, ``pods_running_timeout_s +
    job_timeout_s``. Raises on ``Failed``, on a pod that cannot start (after its grace where
    one applies) and at either deadline."""

    def __init__(self, api: Api, workload: WorkloadSpec, name: str, runtime: str) -> None:
        self.api, self.workload, self.name, self.runtime = api, workload, name, runtime
        self.grace = Grace(workload.deadlines.unschedulable_grace_s)
        self.queue = QueuedWait(workload, f"TrainJob {workload.namespace}/{name}")
        self.deadline: Deadline | None = None  # from admission
        self.evicted: set[str] = set()  # uids of the pods of admissions Kueue took back
        self.running_logged = -1
        self.follower: LogFollower | None = None  # rank 0's log, of its current pod

    def run(self) -> Objects:
        ns, name = self.workload.namespace, self.name
        sources = {
            "tj": Source(TRAINJOB, name=name),
            "pods": Source(POD, label_selector=f"{JOBSET_NAME_LABEL}={name}"),
        }
        kueue = workload_source(self.api, ns, sources["tj"]) if self.workload.queue_name else None
        if kueue is not None:
            sources["workloads"] = kueue
        pods: Objects = watch_until(
            self.api,
            ns,
            sources,
            self.check,
            deadline=Deadline(0),  # none overall: queued, then from admission
            on_timeout=lambda view: AssertionError(),
            progress=self.progress,
            recheck_in=self.recheck_in,
        )
        return pods

    def check(self, view: View) -> Objects | None:
        ns, name, workload = self.workload.namespace, self.name, self.workload
        tj = view["tj"].get(name)
        if tj is None:
            raise WorkloadFailed(f"TrainJob {ns}/{name} was deleted while the step waited")
        done = finished(tj)
        if done and done["type"] == "Failed":
            pods = describe_pods(self.api, workload, name, view["pods"], self.since)
            raise WorkloadFailed(
                f"TrainJob {ns}/{name} failed: {done.get('reason')}: {done.get('message')}; "
                f"pods: {pods}; the runtime's JobSet failurePolicy decides restarts "
                f"(kubectl get clustertrainingruntime {self.runtime} -o yaml)"
            )
        if done:
            return self._current(view["pods"])
        if suspended(tj):
            if self.queue.check(tj, view.get("workloads")):
                # Kueue evicted it: Trainer suspends its JobSet and the pods go; new ones follow
                # the next admission, with a new deadline.
                self.evicted |= {p["metadata"]["uid"] for p in view["pods"].values()}
                self.deadline, self.running_logged, self.follower = None, -1, None
            return None
        if self.deadline is None:
            self.queue.admitted()
            self.deadline = Deadline(
                workload.deadlines.pods_running_timeout_s + workload.job_timeout_s
            )
        if self.deadline.expired:
            raise timeout_error(
                f"TrainJob {ns}/{name} to complete",
                self.deadline,
                describe_pods(self.api, workload, name, view["pods"], self.deadline),
                f"check the TrainJob's and its JobSet's conditions (kubectl -n {ns} describe "
                f"trainjob {name}; kubectl -n {ns} describe jobset {name})",
            )
        current = self._current(view["pods"])
        live = {k: p for k, p in current.items() if pod_phase(p) not in TERMINAL}
        raise_on_stuck_pod(self.api, workload, live, {}, self.grace)
        self._follow(live)
        running = running_indexes(live)
        if running != self.running_logged:  # as the Job path: none and all at info level
            self.running_logged = running
            level = logging.INFO if running in (0, workload.nodes) else logging.DEBUG
            logger.log(level, "pods %d/%d Running", running, workload.nodes)
        return None

    def _follow(self, live: Objects) -> None:
        """Follow rank 0's log once its pod runs, and its new pod after a restart: its
        progress line, as the Job path shows it."""
        running0 = sorted(
            (restart_attempt(p), k)
            for k, p in live.items()
            if pod_index(p) == "0" and pod_phase(p) == "Running"
        )
        if running0 and (self.follower is None or self.follower.pod != running0[-1][1]):
            ns = self.workload.namespace
            self.follower = LogFollower(self.api, ns, running0[-1][1], container=NODE)

    def _current(self, pods: Objects) -> Objects:
        """The pods of the current admission: an evicted admission's and any pod being deleted
        are leaving."""
        return {
            k: p
            for k, p in pods.items()
            if p["metadata"]["uid"] not in self.evicted
            and not p["metadata"].get("deletionTimestamp")
        }

    def recheck_in(self, view: View) -> float | None:
        tj = view["tj"].get(self.name) or {}
        if suspended(tj):
            left = self.queue.left_s()
            return None if left is None else max(0.0, left)
        times = [self.grace.grace_s / 2 or None]
        times += [max(0.0, self.deadline.remaining())] if self.deadline is not None else []
        return min((t for t in times if t is not None), default=None)

    def progress(self, view: View) -> str:
        tj = view["tj"].get(self.name) or {}
        if suspended(tj):
            return self.queue.progress(tj, view.get("workloads"))
        ns, name = self.workload.namespace, self.name
        pods = describe_pods(self.api, self.workload, name, view["pods"], self.since)
        follower = f"; {self.follower.describe()}" if self.follower is not None else ""
        return f"TrainJob {ns}/{name}: {pods}{follower}"

    @property
    def since(self) -> Deadline:
        """The running phase's deadline, or the queued phase's stopwatch before admission."""
        return self.deadline or self.queue.since


def suspended(tj: dict[str, Any]) -> bool:
    """Suspended: queued by Kueue until it admits the TrainJob (``spec.suspend``)."""
    return bool((tj.get("spec") or {}).get("suspend"))


def finished(tj: dict[str, Any]) -> dict[str, Any] | None:
    """Trainer's ``Complete`` or ``Failed`` condition, when one is True."""
    for cond in (tj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return dict(cond)
    return None


def restart_attempt(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0"))
