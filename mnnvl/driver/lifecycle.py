"""The Job lifecycle: one function that runs a workload from creation to its RESULT.

``run_job`` checks that the run's ComputeDomain exists, decides ``--gpu-mode auto``
(:mod:`mnnvl.driver.gpus`), creates the Service and Indexed Job,
then watches the Job, its pods and their DRA prepare events together (one watch each) until
the Job is complete, following rank 0's log once its pods run. Phases:

1. **queued**: the Job is suspended (Kueue holds it until it is admitted): progress lines
   name the LocalQueue and, where the Job's Kueue Workload can be read, its conditions
   (:mod:`mnnvl.driver.kueue`); a Workload Kueue will never admit fails the wait at once.
   Otherwise only ``admission_timeout_s`` (0 = no limit) bounds this phase.
2. **starting**: admitted; every index needs a pod Running within ``pods_running_timeout_s``
   counted from admission. Pods that cannot recover fail the wait at once (image errors,
   permanent prepare errors) or after ``unschedulable_grace_s`` (Unschedulable, a node
   held by another domain), re-checked on a timer because no event announces it. Pods the
   API refuses to create show only as ``FailedCreate`` Events on the Job (each Job's own
   Events are watched): the refusal is logged at once and in every progress line; one that
   cannot clear by itself (PodSecurity, a webhook's denial, a missing object, an invalid
   spec) fails the wait at once, a quota refusal after ``unschedulable_grace_s``.
3. **running**: rank 0's log is followed; the Job must complete within ``job_timeout_s``.

In every phase a Job that turns Failed ends the wait at once with the Job's reason and the
failing pod's exit code, events and log tail; a Job that disappears ends it too. Once admitted,
a pod that fails with a retriable code while its index has a retry left restarts the whole
gang (:mod:`mnnvl.driver.gang`): the other pods are deleted at once and rank 0's log is
followed again when its new pod runs; progress lines show rank 0's last step and its age.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mnnvl.driver.api import COMPUTE_DOMAIN, EVENT, JOB, POD, Api
from mnnvl.driver.attempts import job_failure
from mnnvl.driver.diagnose import (
    LOG_TAIL_LINES,
    PREPARE_FAILED,
    Grace,
    describe_pods,
    hint,
    imex_not_ready,
    pod_index,
    pod_phase,
    pods_progress,
    raise_on_stuck_pod,
)
from mnnvl.driver.domain import KUBELET_PLUGIN_LOGS
from mnnvl.driver.gang import Gang
from mnnvl.driver.gpus import resolve_gpu_mode
from mnnvl.driver.inplace import check_budget, merged, restarts_words
from mnnvl.driver.kueue import QueuedWait, workload_source
from mnnvl.driver.refusal import create_refusal, refusal_fix, refusal_problem
from mnnvl.driver.wait import Deadline, Objects, Source, View, timeout_error, watch_until
from mnnvl.driver.workload import (
    LogFollower,
    create_workload,
    parse_result,
    rank0_pod,
    record_failure,
    remove_failed_jobs,
    result_of_failed_job,
)
from mnnvl.errors import (
    NotFound,
    NotProvisioned,
    ProblemKind,
    WaitTimeout,
    WorkloadFailed,
)
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import JOB_NAME_LABEL, indexed_jobs, step_selector

logger = logging.getLogger(__name__)

PREPARE_EVENTS = f"involvedObject.kind=Pod,reason={PREPARE_FAILED}"
JOB_EVENTS = "involvedObject.kind=Job,involvedObject.name={job}"


@dataclass(frozen=True)
class JobOutcome:
    """A completed Job: its name, pods, rank 0's RESULT (None if it printed none), log tail."""

    job: str
    pods: list[str]
    result: dict[str, Any] | None
    log_tail: str
    restarts: list[dict[str, Any]]  # one per gang restart (mnnvl.driver.gang.Gang.summary)
    adopted: str = ""  # rank 0's Job as this step found it ("complete since …"); "": created
    evictions: int = 0  # admissions Kueue took back (mnnvl.driver.kueue.QueuedWait)


def run_job(api: Api, workload: WorkloadSpec, module: str, args: list[str]) -> JobOutcome:
    """Create the workload, wait for it (Job-, queue- and pod-aware), return rank 0's RESULT.

    Raises ``NotProvisioned`` (exit 2) before creating anything when the run has no domain,
    ``WorkloadFailed`` (with any RESULT rank 0 printed) when the Job fails or cannot start,
    ``WaitTimeout`` when a phase outlives its deadline. Completed Jobs stay until teardown,
    so their logs remain inspectable. Run again with the same inputs (an orchestrator's retry
    after the step's pod was lost), it adopts the step's Job and carries on from where the
    Job is: waiting, following rank 0, restarting the gang, or reading the result of a Job
    that completed meanwhile. A failed step removes its Jobs and leaves the record of its
    failure, which such a retry raises again at once (:func:`record_failure`); a SIGTERM or
    SIGINT leaves the Job as it is.
    """
    require_domain(api, workload)
    workload = resolve_gpu_mode(api, workload)
    jobs, adopted = create_workload(api, workload, module, args)
    job = jobs[0]  # rank 0's Job (clique group 0 when the step has several)

    watch = JobWatch(api, workload, jobs, follow=True)
    try:
        pods = watch.run()
        rank0 = rank0_pod(pods, job)
        text, result = completed_log(api, workload, watch, rank0)
    except (WorkloadFailed, WaitTimeout) as err:
        if isinstance(err, WorkloadFailed):
            err.result = err.result or result_of_failed_job(api, workload, job, watch.follower)
        # The failed Job's pods would hold their nodes' IMEX channel (and GPUs) until the
        # teardown, so the run's next step would wait on them: remove them now.
        # A pod stranded on a lost node never goes while the Node exists: delete, do not wait.
        wait = err.problem is not ProblemKind.STRANDED
        removed, deleted = remove_failed_jobs(api, workload, jobs, wait=wait)
        err.args = (f"{err}; {removed}",)
        if deleted:  # not when a teardown took the Job: the run is ending
            record_failure(api, workload, indexed_jobs(workload, module, args)[0], err)
        raise
    except KeyboardInterrupt:  # SIGTERM or SIGINT: the step's pod is going, not the workload
        logger.warning(
            "stopped while waiting: Job %s/%s is left as it is; the step run again with the "
            "same inputs adopts it, the run's teardown removes it",
            workload.namespace,
            job,
        )
        raise
    return JobOutcome(
        job=job,
        pods=sorted(pods),
        result=result,
        log_tail="\n".join(text.splitlines()[-LOG_TAIL_LINES:]),
        restarts=merged(watch.gang.restarts, watch.in_place),
        adopted=adopted,
        evictions=watch.queue.evictions,
    )


def completed_log(
    api: Api, workload: WorkloadSpec, watch: JobWatch, pod: str
) -> tuple[str, dict[str, Any] | None]:
    """Rank 0's log once its Job completed, and its RESULT: the followed stream, else (cut,
    unfinished, or never followed: a recreated gang that completed before the driver saw its
    rank 0 run) the stored log, whose in-place restarts count too. Raises past
    ``--max-restarts``, as the wait does when it reads the restart in time."""
    follower = watch.follower
    text = follower.drained() if follower is not None and follower.pod == pod else ""
    result = parse_result(text)
    if result is None:
        text = api.pod_log(workload.namespace, pod)
        result = parse_result(text)
        for line in text.splitlines():
            watch.in_place.line(line)
    budget = workload.recovery.max_restarts
    check_budget(watch.gang.restarts, watch.in_place, budget, workload.namespace)
    return text, result


def wait_for_job(api: Api, workload: WorkloadSpec, job: str | list[str]) -> Objects:
    """The lifecycle's waits for an existing Job, until it is complete; returns its pods."""
    return JobWatch(api, workload, job).run()


def require_domain(api: Api, workload: WorkloadSpec) -> None:
    """Fail in seconds, before creating anything, when the run's ComputeDomain is missing."""
    names = RunNames.for_run(workload.run_id)
    where = f"ComputeDomain {workload.namespace}/{names.domain} of run {workload.run_id}"
    provision = f"`mnnvl provision --run-id {workload.run_id} --namespace {workload.namespace}`"
    try:
        cd = api.get(COMPUTE_DOMAIN, workload.namespace, names.domain)
    except NotFound as e:
        raise NotProvisioned(f"{where} does not exist; provision first ({provision})") from e
    if cd.get("metadata", {}).get("deletionTimestamp"):
        raise NotProvisioned(
            f"{where} is being deleted (a teardown is running); wait for it to finish, then "
            f"provision first ({provision})"
        )


def _condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def running_indexes(pods: Objects) -> int:
    """How many distinct (Job, completion index) pairs have a pod Running or Succeeded."""
    return len(
        {
            ((p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL), pod_index(p))
            for p in pods.values()
            if pod_phase(p) in ("Running", "Succeeded")
        }
    )


class JobWatch:
    """The lifecycle's check over ``job`` (the step's Jobs: one, or one per clique group),
    ``pods`` and ``events`` (prepare errors). ``self.job`` is rank 0's Job; ``follow``: follow
    rank 0's log once its pod runs."""

    def __init__(
        self, api: Api, workload: WorkloadSpec, jobs: str | list[str], *, follow: bool = False
    ) -> None:
        self.jobs = [jobs] if isinstance(jobs, str) else list(jobs)
        self.api, self.workload, self.job = api, workload, self.jobs[0]
        self.follow = follow
        self.grace = Grace(workload.deadlines.unschedulable_grace_s)
        self.refusal_grace = Grace(workload.deadlines.unschedulable_grace_s)
        self.refusals: dict[str, str] = {}  # Job -> its latest refused create's message
        self.queue = QueuedWait(workload, f"Job {workload.namespace}/{self.job}")
        self.evicted: set[str] = set()  # uids of the pods of admissions Kueue took back
        self.pods_deadline: Deadline | None = None  # from admission
        self.job_deadline: Deadline | None = None  # from all pods Running
        self.running_logged = -1
        self.gang = Gang(api, workload, self.jobs)
        self.in_place = self.gang.in_place  # restarts inside the pods, from rank 0's log
        self.follower: LogFollower | None = None  # rank 0's log, of its current pod

    def run(self) -> Objects:
        ns = self.workload.namespace
        if len(self.jobs) == 1:
            job_src = Source(JOB, name=self.job)
            pod_src = Source(POD, label_selector=f"{JOB_NAME_LABEL}={self.job}")
        else:  # one watch over every group's Jobs, one over their pods
            step = ",".join(f"{k}={v}" for k, v in step_selector(self.workload).items())
            job_src, pod_src = Source(JOB, label_selector=step), Source(POD, label_selector=step)
        events = Source(EVENT, field_selector=PREPARE_EVENTS)
        sources = {"job": job_src, "pods": pod_src, "events": events}
        for name in self.jobs:  # the Job controller's FailedCreate Events, per Job
            sources[f"created/{name}"] = Source(EVENT, field_selector=JOB_EVENTS.format(job=name))
        kueue = workload_source(self.api, ns, job_src) if self.workload.queue_name else None
        if kueue is not None:
            sources["workloads"] = kueue
        pods: Objects = watch_until(
            self.api,
            ns,
            sources,
            self.check,
            deadline=Deadline(0),  # none overall: each phase keeps its own
            on_timeout=lambda view: AssertionError(),
            progress=self.progress,
            recheck_in=self.recheck_in,
        )
        logger.info("Job %s/%s complete", ns, self.job)
        return pods

    # ---- the check -------------------------------------------------------------------

    def check(self, view: View) -> Objects | None:
        ns = self.workload.namespace
        for name in self.jobs:
            found = view["job"].get(name)
            if found is None and self.gang.nodes.exclusion is not None:
                continue  # made again with a node kept out (Kubernetes < 1.36)
            if found is None:
                raise WorkloadFailed(
                    f"Job {ns}/{name} was deleted while the step waited for it (a teardown, "
                    f"a reaper or a person); check `kubectl get events -n {ns}`"
                )
            # FailureTarget (Kubernetes >= 1.31) comes first; Failed only once the pods are gone.
            failed = _condition(found, "Failed") or _condition(found, "FailureTarget")
            if failed is not None:
                culprits = str((found.get("status") or {}).get("failedIndexes") or "")
                restarts = len(self.gang.restarts)
                why = job_failure(self.api, self.workload, name, failed, culprits, restarts)
                if why.kind is ProblemKind.DEADLINE:  # the Job's activeDeadlineSeconds: exit 3
                    raise WaitTimeout(
                        f"deadline passed: Job {ns}/{name} ran longer than --job-timeout-s "
                        f"{self.workload.job_timeout_s:g} s and the Job controller stopped it "
                        f"({why.message}); raise --job-timeout-s or check "
                        f"`kubectl logs -n {ns} -l {JOB_NAME_LABEL}={name}`"
                    )
                raise why.error(why.message)
        self.gang.nodes.adopt(view["job"])
        leaving = self.gang.nodes.excluding(view["job"], view["pods"])
        if leaving is not None:
            self.gang.old |= leaving
            return None  # suspended by the step itself to keep a node out: no Kueue eviction
        if all(_condition(view["job"][name], "Complete") for name in self.jobs):
            return dict(view["pods"])
        # Suspended first: a Job Kueue evicted loses its pods, which is no gang restart.
        job = self._suspended(view)
        if job is not None:  # any group still queued: the step is queued
            self._queued(job, view)
            return None
        if self.pods_deadline is not None and self._restarted(view):
            return None
        if self.pods_deadline is None:
            self.queue.admitted()
            self.pods_deadline = Deadline(self.workload.deadlines.pods_running_timeout_s)
        if self.job_deadline is None:
            self._starting(view)
        elif self.job_deadline.expired:
            raise timeout_error(
                f"Job {ns}/{self.job} to complete",
                self.job_deadline,
                f"Job status {view['job'][self.job].get('status') or {}}",
                f"raise --job-timeout-s or check "
                f"`kubectl logs -n {ns} -l {JOB_NAME_LABEL}={self.job}`",
            )
        return None

    def _queued(self, job: dict[str, Any], view: View) -> None:
        if self.queue.check(job, view.get("workloads")):
            # Kueue evicted the Workload (its PodsReady timeout, preemption, ...): its pods go,
            # which is no gang restart; the admitted ones will be new.
            self.evicted |= {p["metadata"]["uid"] for p in view["pods"].values()}
            self.gang.old |= self.evicted
            self.pods_deadline = self.job_deadline = self.follower = None

    def _refused(self, view: View) -> None:
        """Log each Job's refused pod creates once as they appear; fail on one that cannot
        clear (at once) or on a quota refusal past the grace."""
        for name in self.jobs:
            message = create_refusal(view["job"][name], view[f"created/{name}"], view["pods"])
            if not message:
                self.refusal_grace.left_s(f"refused/{name}", False)
                self.refusals.pop(name, None)
                continue
            if self.refusals.get(name) != message:
                logger.warning("Job %s/%s: %s", self.workload.namespace, name, message)
            self.refusals[name] = message
            found = refusal_problem(self.workload, name, message, self.refusal_grace)
            if found is not None:
                fix = refusal_fix(found, self.workload.namespace, message)
                raise found.error(f"{found.message}; {fix}")

    def _current(self, pods: Objects) -> Objects:
        """The pods of the current admission and generation: an evicted admission's pods, a
        restarted generation's and any pod being deleted are leaving, not starting."""
        gone = self.evicted | self.gang.old
        return {
            k: p
            for k, p in pods.items()
            if p["metadata"]["uid"] not in gone and not p["metadata"].get("deletionTimestamp")
        }

    def _starting(self, view: View) -> None:
        pods, workload = self._current(view["pods"]), self.workload
        self._refused(view)
        self.gang.nodes.check_placed(pods)
        raise_on_stuck_pod(self.api, workload, pods, view["events"], self.grace)
        running = running_indexes(pods)
        if running != self.running_logged:  # once per change, not per event
            self.running_logged = running
            # None and all are the state changes; counts between under -v (the 15 s
            # progress line says which pods wait and why).
            level = logging.INFO if running in (0, workload.nodes) else logging.DEBUG
            logger.log(level, "pods %d/%d Running", running, workload.nodes)
        if running >= workload.nodes:
            self.job_deadline = Deadline(workload.job_timeout_s)
            if self.follow:
                self.follower = LogFollower(
                    self.api, workload.namespace, rank0_pod(pods, self.job), self.in_place.line
                )
            return
        if self.pods_deadline is not None and self.pods_deadline.expired:
            names = RunNames.for_run(workload.run_id)
            stuck = imex_not_ready(self.api, workload, pods, self.pods_deadline)
            err = timeout_error(
                f"{workload.nodes} pods of Job {workload.namespace}/{self.job} to be Running",
                self.pods_deadline,
                describe_pods(self.api, workload, self.job, pods, self.pods_deadline),
                f"check `kubectl get computedomain {names.domain} -n {workload.namespace} -o "
                f"yaml` and the driver's kubelet-plugin logs ({KUBELET_PLUGIN_LOGS})",
            )
            if stuck is None:
                raise err
            raise stuck.error(f"{err}; {stuck.message}: {hint(stuck, workload.namespace, '')}")

    def _restarted(self, view: View) -> bool:
        """Gang restart on a retriable pod failure (True: the pods are being replaced); after
        one, follow rank 0's new pod once it runs."""
        pods = view["pods"]
        self.gang.check_stranded(pods)
        if self.gang.check(pods, self.follower.progress if self.follower is not None else None):
            self.follower = None
            return True
        if not self.gang.restarts or self.job_deadline is None:
            return False
        self._replacements_placed(view)
        if self.follow and self.follower is None:
            rank0 = [
                name
                for name, pod in sorted(pods.items())
                if (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == self.job
                and pod_index(pod) == "0"
                and pod_phase(pod) == "Running"
                and pod["metadata"]["uid"] not in self.gang.old
                and not pod["metadata"].get("deletionTimestamp")
            ]
            if rank0:
                self.follower = LogFollower(
                    self.api, self.workload.namespace, rank0[0], self.in_place.line
                )
                self.gang.restarts[-1].after = self.follower.progress
        return False

    def _replacements_placed(self, view: View) -> None:
        """After a restart the replacement pods face the same checks as the first ones (an
        unschedulable pod fails the step after the grace), naming the nodes the run lost."""
        fresh = {k: p for k, p in view["pods"].items() if p["metadata"]["uid"] not in self.gang.old}
        self.gang.nodes.check_placed(fresh)
        try:
            raise_on_stuck_pod(self.api, self.workload, fresh, view["events"], self.grace)
        except WorkloadFailed as e:
            if not self.gang.lost_nodes:
                raise
            # The diagnosis stands: a replacement that could not be placed may fit once a node
            # is back (not permanent: no record replays it), an image that cannot run never.
            raise WorkloadFailed(
                f"{self.gang.lost()}, and its replacement has nowhere to go: {e}",
                pod_exit_code=e.pod_exit_code,
                problem=e.problem,
                permanent=e.permanent,
            ) from e

    # ---- timers and progress -----------------------------------------------------------

    def _suspended(self, view: View) -> dict[str, Any] | None:
        jobs = (view["job"].get(name) or {} for name in self.jobs)
        return next((j for j in jobs if (j.get("spec") or {}).get("suspend")), None)

    def recheck_in(self, view: View) -> float | None:
        if self._suspended(view) is not None:
            left = self.queue.left_s()
            return None if left is None else max(0.0, left)
        deadline = self.job_deadline or self.pods_deadline
        times = [
            self.grace.recheck_in_s(),
            self.refusal_grace.recheck_in_s(),
            self.gang.stranded.recheck_in_s(),
            None if deadline is None else max(0.0, deadline.remaining()),
        ]
        return min((t for t in times if t is not None), default=None)

    def progress(self, view: View) -> str:
        job = self._suspended(view)
        if job is not None:
            return self.queue.progress(job, view.get("workloads"))
        if self.job_deadline is not None:
            line = (
                f"Job {self.workload.namespace}/{self.job} running for "
                f"{self.job_deadline.elapsed():.0f} s of at most {self.job_deadline.timeout_s:g} s"
            )
            if self.gang.restarts or self.in_place:
                line += f"; {restarts_words(len(self.gang.restarts), len(self.in_place))}"
            if self.follower is not None:
                line += f"; {self.follower.describe()}"
            return line
        pods = self._current(view["pods"])
        refused = "; ".join(f"Job {job}: {text}" for job, text in self.refusals.items())
        return pods_progress(
            self.api, self.workload, pods, running_indexes(pods), refused, view["events"]
        )
