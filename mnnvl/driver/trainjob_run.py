"""The train step as a Kubeflow Trainer TrainJob (``--workload trainjob``): create or adopt it,
wait until Trainer reports it ``Complete``, return rank 0's RESULT."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mnnvl.driver.api import POD, RESOURCE_CLAIM_TEMPLATE, Api
from mnnvl.driver.diagnose import (
    LOG_TAIL_LINES,
    Grace,
    describe_pods,
    pod_index,
    pod_phase,
    raise_on_stuck_pod,
    waiting_state,
)
from mnnvl.driver.gpus import resolve_gpu_mode
from mnnvl.driver.kueue import QueuedWait, workload_source
from mnnvl.driver.lifecycle import JobOutcome, require_domain, running_indexes
from mnnvl.driver.ownership import Deletions, StaleObject, create_or_adopt, failed_reason
from mnnvl.driver.preflight_trainer import CLUSTER_RUNTIME
from mnnvl.driver.trainjob import JOBSET_NAME_LABEL, TRAINJOB
from mnnvl.driver.wait import (
    Deadline,
    Objects,
    Source,
    View,
    timeout_error,
    wait_gone,
    watch_until,
)
from mnnvl.driver.workload import (
    FAILED_JOB_DELETE_S,
    LogFollower,
    parse_result,
    raise_recorded_failure,
    record_failure,
)
from mnnvl.errors import MnnvlError, NotAdoptable, ProblemKind, WaitTimeout, WorkloadFailed
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
    counted from the pods' ``jobset.sigs.k8s.io/restart-attempt`` label; one more than
    ``--max-restarts`` fails the step (the runtime's ``maxRestarts`` is only the ceiling). A
    failed step deletes its TrainJob and waits until its pods are gone, and leaves the record
    of a permanent failure, which a retry with the same inputs raises again at once
    (:func:`mnnvl.driver.workload.record_failure`); a SIGTERM or SIGINT leaves the TrainJob
    as it is. ``own``: a team's
    TrainJob, run as given but for the run's name, labels, claims and placement
    (:func:`mnnvl.manifests.trainjob.take_trainjob`; ``module``, ``args`` and ``runtime`` unused).
    """
    require_domain(api, workload)
    workload = resolve_gpu_mode(api, workload)
    if wants_gpu_claim(workload):
        create_or_adopt(api, RESOURCE_CLAIM_TEMPLATE, gpu_claim_template(workload))
    body = take_trainjob(own, workload) if own else trainjob(workload, module, args, runtime)
    name, ns = body["metadata"]["name"], workload.namespace
    ref = body["spec"]["runtimeRef"]  # Trainer's default kind: ClusterTrainingRuntime
    named = Runtime(str(ref.get("kind") or CLUSTER_RUNTIME.kind), str(ref["name"]), ns)
    try:
        found, adopted = create_or_adopt(api, TRAINJOB, body)
    except StaleObject as stale:  # failed earlier with other input: made again
        replace_failed_trainjob(api, workload, stale)
        found, adopted = create_or_adopt(api, TRAINJOB, body)
    if adopted:
        raise_recorded_failure(found)
    wait = TrainJobWait(api, workload, name, named)
    try:
        pods = wait.run()
    except (WorkloadFailed, WaitTimeout) as err:
        # Its pods would hold their nodes' IMEX channel (and GPUs) until the teardown, so the
        # run's next step would wait on them: remove them now, as the Job path does.
        removed, deleted = remove_failed_trainjob(api, workload, name)
        err.args = (f"{err}; {removed}",)
        if deleted:  # not when a teardown took it: the run is ending
            record_failure(api, workload, body, err, TRAINJOB)
        raise
    except KeyboardInterrupt:  # SIGTERM or SIGINT: the step's pod is going, not the workload
        logger.warning(
            "stopped while waiting: TrainJob %s/%s is left as it is; the step run again with "
            "the same inputs adopts it, the run's teardown removes it",
            ns,
            name,
        )
        raise
    # Rank 0's last pod: the one that succeeded, not one the Job made again after it failed.
    rank0 = sorted(
        (
            pod_phase(p) == "Succeeded",
            restart_attempt(p),
            p["metadata"].get("creationTimestamp", ""),
            k,
        )
        for k, p in pods.items()
        if pod_index(p) == "0"
    )
    last = rank0[-1][-1] if rank0 else ""  # none: its pods were removed meanwhile
    follower = wait.follower if wait.follower is not None and wait.follower.pod == last else None
    text = follower.drained() if follower is not None else ""
    if last and parse_result(text) is None:  # the stream cut or not followed: the stored log
        text = api.pod_log(ns, last, NODE)
    return JobOutcome(
        job=name,
        pods=sorted(pods),
        result=parse_result(text),
        log_tail="\n".join(text.splitlines()[-LOG_TAIL_LINES:]),
        restarts=[{"runtime": "TrainJob"} for _ in range(wait.restarts)],
        adopted=("complete" if finished(found) else "running") if adopted else "",
        evictions=wait.queue.evictions,
    )


class TrainJobWait:
    """Until the TrainJob is ``Complete`` (``run`` returns its pods then). While it is suspended
    (queued by Kueue, or evicted and queued again) the Job path's queued phase applies
    (:class:`mnnvl.driver.kueue.QueuedWait`); from each admission, ``pods_running_timeout_s +
    job_timeout_s``. Raises on ``Failed``, on a pod that cannot start (after its grace where
    one applies) and at either deadline."""

    def __init__(self, api: Api, workload: WorkloadSpec, name: str, runtime: Runtime) -> None:
        self.api, self.workload, self.name, self.runtime = api, workload, name, runtime
        self.grace = Grace(workload.deadlines.unschedulable_grace_s)
        self.queue = QueuedWait(workload, f"TrainJob {workload.namespace}/{name}")
        self.deadline: Deadline | None = None  # from admission
        self.evicted: set[str] = set()  # uids of the pods of admissions Kueue took back
        self.running_logged = -1
        self.follower: LogFollower | None = None  # rank 0's log, of its current pod
        self.followed: tuple[int, str] | None = None  # (restarts in place, pod) it follows
        self.rank0: dict[str, tuple[int, int]] = {}  # uid -> (JobSet attempt, restarts in pod)

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
                f"({self.runtime.kubectl})"
            )
        if done:
            return self._current(view["pods"])
        for pod in view["pods"].values():
            if pod_index(pod) == "0":
                uid = pod["metadata"]["uid"]
                before = self.rank0.get(uid, (0, 0))[1]
                self.rank0[uid] = (restart_attempt(pod), max(before, container_restarts(pod)))
        if self.restarts > workload.recovery.max_restarts:
            raise self._over_cap(self.restarts, view["pods"])
        if suspended(tj):
            if self.queue.check(tj, view.get("workloads")):
                # Kueue evicted it: Trainer suspends its JobSet and the pods go; new ones follow
                # the next admission, with a new deadline.
                self.evicted |= {p["metadata"]["uid"] for p in view["pods"].values()}
                self.deadline, self.running_logged, self.follower = None, -1, None
                self.followed = None
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
        # A container the kubelet restarts waits in CrashLoopBackOff: the runtime's restart,
        # counted above, not a pod that cannot start.
        starting = {k: p for k, p in live.items() if waiting_state(p)[0] != "CrashLoopBackOff"}
        raise_on_stuck_pod(self.api, workload, starting, {}, self.grace)
        self._follow(live)
        running = running_indexes(live)
        if running != self.running_logged:  # as the Job path: none and all at info level
            self.running_logged = running
            level = logging.INFO if running in (0, workload.nodes) else logging.DEBUG
            logger.log(level, "pods %d/%d Running", running, workload.nodes)
        return None

    def _follow(self, live: Objects) -> None:
        """Follow rank 0's log once its pod runs, and again after each restart (a new pod, or
        its container restarted in place): its progress line, as the Job path shows it."""
        running0 = sorted(
            (restart_attempt(p), container_restarts(p), k)
            for k, p in live.items()
            if pod_index(p) == "0" and pod_phase(p) == "Running" and not waiting_state(p)[0]
        )
        if running0 and self.followed != running0[-1][1:]:
            self.followed = running0[-1][1:]
            ns = self.workload.namespace
            self.follower = LogFollower(self.api, ns, running0[-1][-1], container=NODE)

    @property
    def restarts(self) -> int:
        """The training's restarts: every restart starts rank 0 again, in a new pod when the
        runtime's JobSet recreated every pod (``failurePolicy``, the pods'
        ``jobset.sigs.k8s.io/restart-attempt``) or the child Job made a failed pod again, in its
        pod when the kubelet restarted the container (JobSet's default ``restartPolicy:
        OnFailure``: Trainer's ``torch-distributed`` sets neither a failure policy nor a
        restart policy, so the child Job's default ``backoffLimit`` of 6 bounds those; rank 0
        fails once its peer is gone). Restarts inside an attempt the JobSet then replaced are
        not counted again (with ``backoffLimit: 0`` a container's restart fails its Job at
        once), nor are pods of an admission Kueue took back."""
        kept = [v for uid, v in self.rank0.items() if uid not in self.evicted]
        last = max((attempt for attempt, _ in kept), default=0)
        now = [n for attempt, n in kept if attempt == last]
        return last + max(0, len(now) - 1) + sum(now)

    def _over_cap(self, attempt: int, pods: Objects) -> WorkloadFailed:
        """The runtime restarted the TrainJob more often than ``--max-restarts`` allows: a
        runtime patch cannot lower its JobSet's ``failurePolicy.maxRestarts``
        (``JobSetSpecPatch`` holds only ``replicatedJobs``: kubeflow/trainer
        ``pkg/apis/trainer/v1alpha1/trainjob_types.go``), so the step enforces the cap."""
        ns, name, cap = self.workload.namespace, self.name, self.workload.recovery.max_restarts
        allows = self.runtime.max_restarts(self.api)
        return WorkloadFailed(
            f"TrainJob {ns}/{name} restarted {attempt} times, more than --max-restarts {cap} "
            f"({allows}); pods: {describe_pods(self.api, self.workload, name, pods, self.since)}; "
            f"check why its pods fail (kubectl -n {ns} logs -l {JOBSET_NAME_LABEL}={name} "
            f"-c {NODE}) or raise --max-restarts",
            problem=ProblemKind.RESTARTS_EXHAUSTED,
        )

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


@dataclass(frozen=True)
class Runtime:
    """The runtime a TrainJob names (``spec.runtimeRef``), in words for an error."""

    kind: str  # ClusterTrainingRuntime, or a namespaced TrainingRuntime (a team's TrainJob)
    name: str
    namespace: str  # the TrainJob's, where a TrainingRuntime it names lives

    @property
    def kubectl(self) -> str:
        where = "" if self.kind == CLUSTER_RUNTIME.kind else f" -n {self.namespace}"
        return f"kubectl get {self.kind.lower()} {self.name}{where} -o yaml"

    def max_restarts(self, api: Api) -> str:
        """How often the runtime's JobSet restarts; a namespaced TrainingRuntime is not read
        (the shipped RBAC grants only ClusterTrainingRuntimes)."""
        if self.kind != CLUSTER_RUNTIME.kind:
            return f"its JobSet failurePolicy.maxRestarts is in `{self.kubectl}`"
        try:
            found = api.get(CLUSTER_RUNTIME, "", self.name)
        except MnnvlError as e:
            return f"ClusterTrainingRuntime {self.name} unreadable: {e}"
        policy = (found.get("spec") or {}).get("template", {}).get("spec", {}).get("failurePolicy")
        return f"the runtime allows {int((policy or {}).get('maxRestarts', 0))}"


def replace_failed_trainjob(api: Api, workload: WorkloadSpec, stale: StaleObject) -> None:
    """Delete a TrainJob of this step that failed (or the record of its failure) made from
    other input, and wait until it and its pods are gone, so that it can be made anew."""
    ns, name = workload.namespace, str(stale.existing["metadata"]["name"])
    logger.info(
        "TrainJob %s/%s of this step failed earlier (%s); deleting it and creating it again",
        ns,
        name,
        failed_reason(stale.existing),
    )
    gone, deadline = Deletions(workload.run_id), Deadline(workload.deadlines.pods_running_timeout_s)
    delete_trainjob_and_wait(api, gone, ns, name, deadline, existing=stale.existing)
    if gone.skipped:
        raise NotAdoptable(f"cannot replace the failed TrainJob: {gone.skipped[0]}") from stale


def remove_failed_trainjob(api: Api, workload: WorkloadSpec, name: str) -> tuple[str, bool]:
    """Delete a failed step's TrainJob and wait until it and its pods are gone; returns what
    was removed, or why not, for the step's error message, and whether this deleted it
    (False: someone else had, e.g. a teardown)."""
    ns, gone = workload.namespace, Deletions(workload.run_id)
    what = f"TrainJob {ns}/{name}"
    try:
        delete_trainjob_and_wait(api, gone, ns, name, Deadline(FAILED_JOB_DELETE_S))
    except MnnvlError as e:
        logger.warning("could not remove the failed step's TrainJob: %s", e)
        teardown = f"mnnvl teardown --run-id {workload.run_id} --namespace {ns}"
        return f"removing {what} failed ({e}); `{teardown}` removes it", False
    if not gone.deleted:
        return f"{what} was already gone", False
    logger.info("failed step: removed %s and its pods", what)
    return f"removed {what} and its pods, so the run's next step finds the nodes free", True


def delete_trainjob_and_wait(
    api: Api,
    gone: Deletions,
    ns: str,
    name: str,
    deadline: Deadline,
    existing: dict[str, Any] | None = None,
) -> None:
    """Delete the run's TrainJob ``name`` in the foreground and wait until it and its pods are
    gone (they hold their nodes' IMEX channel); ``existing``: the TrainJob as already read,
    deleted only while it is still that object (uid precondition)."""
    if existing is not None:
        deleted = gone.delete(api, TRAINJOB, existing, propagation="Foreground")
    else:
        deleted = gone.delete_named(api, TRAINJOB, ns, name, propagation="Foreground")
    what, hint = (
        f"TrainJob {ns}/{name}",
        "check the pods' finalizers and the kubelet on their nodes",
    )
    if deleted:
        wait_gone(api, TRAINJOB, ns, name=name, what=what, deadline=deadline, hint=hint)
    pods = f"{JOBSET_NAME_LABEL}={name}"
    wait_gone(
        api, POD, ns, label_selector=pods, what=f"pods of {what}", deadline=deadline, hint=hint
    )


def container_restarts(pod: dict[str, Any]) -> int:
    """How often the kubelet restarted the pod's containers in place."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount") or 0) for c in statuses)


def restart_attempt(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0"))
