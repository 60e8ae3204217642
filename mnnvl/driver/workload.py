"""The multi-node workload's parts: create Service + Indexed Job, follow rank 0's log, read
its RESULT, delete. :mod:`mnnvl.driver.lifecycle` puts them together with the waits.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from mnnvl.contract.result import parse_result as worker_result
from mnnvl.driver.api import JOB, POD, RESOURCE_CLAIM_TEMPLATE, SERVICE, Api, Kind
from mnnvl.driver.diagnose import container_started, pod_index, pod_phase
from mnnvl.driver.gpus import with_gpu_mode
from mnnvl.driver.ownership import (
    FAILURE_ANNOTATION,
    Deletions,
    StaleObject,
    create_or_adopt,
    failed_reason,
    owned_by_run,
)
from mnnvl.driver.progress_line import ProgressLine
from mnnvl.driver.rank0 import Rank0Progress
from mnnvl.driver.trainjob import delete_trainjobs, trainjob_pods_selector
from mnnvl.driver.wait import Deadline, Objects, wait_gone
from mnnvl.errors import MnnvlError, NotAdoptable, WorkloadFailed
from mnnvl.inputs.defaults import PURPOSES
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import (
    JOB_NAME_LABEL,
    KUEUE_QUEUE_LABEL,
    gpu_claim_template,
    headless_service,
    indexed_jobs,
    wants_gpu_claim,
    with_spec_hash,
)

logger = logging.getLogger(__name__)


def create_workload(
    api: Api, workload: WorkloadSpec, module: str, args: list[str]
) -> tuple[list[str], str]:
    """Create (or adopt, when a step is retried) GPU template, Service and the Job (one per
    clique group); return the Jobs' names, rank 0's Job first, and, when this adopted rank 0's
    Job, its state then (``job_state``: "complete since …"; "" when this created it).

    An adopted Job is logged with its state and since when (running, complete, failed): the
    lifecycle's waits then carry on from there, and a Job that failed fails the step with its
    own diagnosis. The record of this step's earlier failure with the same inputs
    (:func:`record_failure`) raises that failure again at once. A failed Job or record made
    from other input is deleted (with its pods, waited gone within the pods-running timeout)
    and created again. Any other object in the way is a
    ``NotAdoptable`` naming it (see ``create_or_adopt``).
    """
    bodies: list[tuple[Kind, dict[str, Any]]] = []
    if wants_gpu_claim(workload):
        bodies.append((RESOURCE_CLAIM_TEMPLATE, gpu_claim_template(workload)))
    bodies.append((SERVICE, headless_service(workload)))
    jobs = [with_gpu_mode(job, workload) for job in indexed_jobs(workload, module, args)]
    bodies += [(JOB, job) for job in jobs]
    rank0_adopted = ""
    for kind, body in bodies:
        try:
            found, adopted = create_or_adopt(api, kind, body)
        except StaleObject as stale:
            if kind is not JOB:
                raise
            _replace_failed_job(api, workload, stale)
            found, adopted = create_or_adopt(api, kind, body)
        meta = body["metadata"]
        what = f"{kind.kind} {meta['namespace']}/{meta['name']}"
        if not adopted:
            # The Job is what a person follows; its Service and GPU template only under -v.
            logger.log(logging.INFO if kind is JOB else logging.DEBUG, "created %s", what)
        elif kind is JOB:
            raise_recorded_failure(found)
            state = job_state(found)
            logger.info("adopted %s, %s", what, state)
            rank0_adopted = rank0_adopted or (state if body is jobs[0] else "")
        else:
            logger.info("adopted %s", what)
    return [str(job["metadata"]["name"]) for job in jobs], rank0_adopted


def job_state(job: dict[str, Any]) -> str:
    """What an adopted Job is doing and since when, from its status."""
    status = job.get("status") or {}
    created = f"created {job['metadata'].get('creationTimestamp')}"
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            since = cond.get("lastTransitionTime") or status.get("completionTime")
            return f"{cond['type'].lower()} since {since} ({created})"
    if (job.get("spec") or {}).get("suspend"):
        return f"suspended ({created})"
    return f"running since {status.get('startTime') or 'its creation'} ({created})"


def _replace_failed_job(api: Api, workload: WorkloadSpec, stale: StaleObject) -> None:
    """Delete a Failed Job of this step (uid precondition) and wait until it and its pods are
    gone, so the new pods never meet the old ones on a node's IMEX channel or hostname."""
    job = str(stale.existing["metadata"]["name"])
    logger.info(
        "Job %s/%s of this step failed earlier (%s); deleting it and creating it again",
        workload.namespace,
        job,
        failed_reason(stale.existing),
    )
    ns, gone = workload.namespace, Deletions(workload.run_id)
    deadline = Deadline(workload.deadlines.pods_running_timeout_s)
    what = f"the failed Job {ns}/{job}"
    _delete_job_and_wait(api, gone, ns, job, what, deadline, existing=stale.existing)
    if gone.skipped:
        raise NotAdoptable(f"cannot replace the failed Job: {gone.skipped[0]}") from stale


RECORD_MAX_BYTES = 64 * 1024  # an object's annotations may hold 256 KiB in all


def record_failure(
    api: Api, workload: WorkloadSpec, job: dict[str, Any], err: MnnvlError, kind: Kind = JOB
) -> None:
    """Leave the record of a step that failed for good where its Job was (the step deleted it:
    a Job that a teardown or a person deleted leaves none): a Job of the same name and spec
    hash that never runs a pod (suspended, parallelism 0, outside any Kueue queue),
    annotated with the failure (``kind`` TrainJob: the step's TrainJob, suspended, so that
    Trainer keeps its JobSet suspended and makes no pod). A retry of the step with the same
    inputs meets it on create and fails again at once with this failure
    (:func:`raise_recorded_failure`) instead of running the workload again; other input
    replaces it; teardown deletes it with the run.

    Only a permanent failure is recorded (``WorkloadFailed.permanent``: a worker's exit that
    ended the step, with a code a restart cannot change or its restarts spent; a refusal no
    waiting clears). A deadline that passed (exit 3) and a cause the cluster may clear (a pod
    that could not be placed, a quota, a node held by another domain, a pod stranded on a lost
    node, an IMEX daemon not Ready) leave no record: the rerun runs the step again, with the
    timeouts and graces it is given then. Best effort: the step's own error stands whatever
    happens here."""
    if not isinstance(err, WorkloadFailed) or not err.permanent:
        logger.info("the failure may clear: a rerun of the step runs it again")
        return
    body = with_spec_hash(job)  # the hash of the Job as created, not of the record
    meta = body["metadata"]
    labels = {k: v for k, v in meta["labels"].items() if k != KUEUE_QUEUE_LABEL}
    failure = {
        "message": str(err),
        "exit_code": err.exit_code,
        "pod_exit_code": getattr(err, "pod_exit_code", None),
        "result": getattr(err, "result", None),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    text = json.dumps(failure)
    if len(text) > RECORD_MAX_BYTES:  # a long training RESULT: only verify's is used again
        text = json.dumps({**failure, "result": None})
    annotations = {**meta["annotations"], FAILURE_ANNOTATION: text}
    idle = {"suspend": True} | ({"parallelism": 0} if kind is JOB else {})
    record = {
        **body,
        "metadata": {**meta, "labels": labels, "annotations": annotations},
        "spec": {**body["spec"], **idle},
    }
    what = f"{kind.kind} {workload.namespace}/{meta['name']}"
    try:
        api.create(kind, workload.namespace, record)
    except MnnvlError as e:
        logger.warning("could not record the failure on %s (a retry runs it again): %s", what, e)
        return
    logger.info("recorded the failure on %s: a retry with the same inputs fails at once", what)


def raise_recorded_failure(job: dict[str, Any]) -> None:
    """Raise the failure a record of this step holds (see :func:`record_failure`)."""
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(FAILURE_ANNOTATION)
    if not text:
        return
    failure = json.loads(text)
    message = (
        f"{failure['message']} (the step failed so at {failure['at']}: a retry with the same "
        "inputs fails the same way; run it with other inputs, or tear the run down and "
        "provision again)"
    )
    raise WorkloadFailed(message, result=failure["result"], pod_exit_code=failure["pod_exit_code"])


FAILED_JOB_DELETE_S = 120.0  # how long a failed step waits for its Job's pods to be gone


def delete_step_jobs(
    api: Api, workload: WorkloadSpec, module: str, args: list[str], deadline: Deadline
) -> list[str]:
    """Delete the step's Jobs (complete, running or the record of a failure; only the run's)
    and wait until they and their pods are gone, so that the step runs them anew; returns
    what was deleted. The domain and everything else of the run stay."""
    gone, ns = Deletions(workload.run_id), workload.namespace
    for body in indexed_jobs(workload, module, args):
        job = str(body["metadata"]["name"])
        _delete_job_and_wait(api, gone, ns, job, f"Job {ns}/{job}", deadline)
    return gone.deleted


def _delete_job_and_wait(
    api: Api,
    gone: Deletions,
    ns: str,
    job: str,
    what: str,
    deadline: Deadline,
    existing: dict[str, Any] | None = None,
) -> None:
    """Delete a Job of the run in the foreground and wait until it and its pods are gone;
    ``existing``: the Job as already read, deleted only while it is still that object (uid
    precondition), not whatever bears its name by then."""
    if existing is not None:
        deleted = gone.delete(api, JOB, existing, propagation="Foreground")
    else:
        deleted = gone.delete_named(api, JOB, ns, job, propagation="Foreground")
    if deleted:
        wait_gone(
            api,
            JOB,
            ns,
            name=job,
            what=f"{what} and its pods",
            deadline=deadline,
            hint="check the pods' finalizers and the kubelet on their nodes",
        )


def remove_failed_jobs(
    api: Api, workload: WorkloadSpec, jobs: list[str], *, wait: bool = True
) -> tuple[str, bool]:
    """Delete a failed step's Jobs (foreground: each is gone only once its pods are) and wait
    for that (``wait``); returns what was removed, or why not, for the step's error message,
    and whether this deleted rank 0's Job (False: someone else had, e.g. a teardown)."""
    gone = Deletions(workload.run_id)
    ns, deadline = workload.namespace, Deadline(FAILED_JOB_DELETE_S)
    try:
        for job in jobs:
            if not wait:
                gone.delete_named(api, JOB, ns, job, propagation="Background")
                continue
            _delete_job_and_wait(api, gone, ns, job, f"the failed Job {ns}/{job}", deadline)
    except MnnvlError as e:
        logger.warning("could not remove the failed step's Jobs: %s", e)
        return (
            f"removing its Jobs failed ({e}); `mnnvl teardown --run-id {workload.run_id} "
            f"--namespace {ns}` removes them"
        ), False
    removed = ", ".join(gone.deleted) or "nothing (already gone)"
    rank0 = f"Job {ns}/{jobs[0]}" in gone.deleted
    if not wait:
        logger.info("failed step: deleted %s; its pods go as their nodes allow", removed)
        text = f"deleted {removed}; its pod on the lost node goes once the node is dealt with"
        return text, rank0
    logger.info("failed step: removed %s and its pods", removed)
    return f"removed {removed} and its pods, so the run's next step finds the nodes free", rank0


LOG_DRAIN_S = 10.0  # how long the rank-0 log stream may take to finish after the Job ended


class LogFollower:
    """Follows one pod's log in a thread, keeping its lines: each is logged at DEBUG with the
    pod as prefix, its progress as one line at INFO (:class:`ProgressLine`)."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        pod: str,
        on_line: Callable[[str], None] | None = None,
        container: str | None = None,  # None: the worker container of the step's Job
    ) -> None:
        self.api, self.namespace, self.pod, self.container = api, namespace, pod, container
        self.on_line = on_line  # also handed every line (in-place restarts)
        self.lines: list[str] = []
        self.progress = Rank0Progress()  # the steps the pod logged, for restarts' records
        self.shown = ProgressLine()
        self._thread = threading.Thread(target=self._run, name=f"log-{pod}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            args = (self.container,) if self.container else ()
            for line in self.api.follow_log(self.namespace, self.pod, *args):
                self.lines.append(line)
                self.progress.line(line)
                if self.on_line is not None:
                    self.on_line(line)
                logger.debug("[%s] %s", self.pod, line)
                first = self.shown.line(line)
                if first:
                    logger.info("%s", first)
        except MnnvlError as e:
            # The stream is a convenience; the launcher re-reads the log when it needs it.
            logger.debug("log stream of %s ended: %s", self.pod, e)

    def describe(self) -> str:
        """Rank 0's progress for the wait's progress line."""
        return self.shown.text or self.progress.describe()

    def drained(self) -> str:
        """The log followed, once the stream ended within ``LOG_DRAIN_S`` (else "")."""
        self._thread.join(LOG_DRAIN_S)
        return "" if self._thread.is_alive() else "\n".join(self.lines)


def parse_result(log_text: str) -> dict[str, Any] | None:
    """The last ``RESULT {json}`` line of a log, or None when there is none."""
    try:
        return worker_result(log_text)
    except ValueError as e:
        raise WorkloadFailed(str(e)) from e


def result_of_failed_job(
    api: Api, workload: WorkloadSpec, job: str, follower: LogFollower | None
) -> dict[str, Any] | None:
    """Rank 0's RESULT from a failed Job's log, if it printed one before exiting; else that of
    a failed pod (a worker that found its node unusable, e.g. no GPUs, reports before the
    process group exists, and its pod may fail the Job before rank 0 has printed)."""
    found = parse_result(follower.drained()) if follower is not None else None
    if found is not None:
        return found
    pods = api.list(POD, workload.namespace, label_selector=f"{JOB_NAME_LABEL}={job}")["items"]
    failed = [p for p in pods if pod_phase(p) == "Failed"]
    rank0 = [p for p in pods if pod_index(p) == "0"]
    for pod in rank0 + sorted((p for p in failed if p not in rank0), key=pod_index):
        if not container_started(pod):
            continue  # never ran (unscheduled, still creating): no log and no result yet
        try:
            text = api.pod_log(workload.namespace, pod["metadata"]["name"])
        except MnnvlError as e:
            logger.warning("could not read the log of %s: %s", pod["metadata"]["name"], e)
            continue
        found = parse_result(text)
        if found is not None:
            return found
    return None


def rank0_pod(pods: Objects, job: str) -> str:
    """The running pod with index 0 of ``job`` (rank 0's Job), the oldest first."""
    for name, pod in sorted(
        pods.items(), key=lambda kv: str(kv[1]["metadata"].get("creationTimestamp"))
    ):
        in_job = (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == job
        if in_job and pod_index(pod) == "0" and pod_phase(pod) in ("Running", "Succeeded"):
            return name
    raise WorkloadFailed(f"no running pod with index 0 among {sorted(pods)}")


def skip_foreign_namesakes(api: Api, namespace: str, gone: Deletions) -> None:
    """Name every Job or Service that has one of the run's names but not its labels in
    ``gone.skipped``: it is left alone, and the user learns why the run's step could not
    create its own (``delete_workload`` lists by label and never sees it)."""
    names = RunNames.for_run(gone.run_id)
    ours = re.compile(rf"^{re.escape(names.base)}-({'|'.join(map(re.escape, PURPOSES))})(-g\d+)?$")
    for kind in (JOB, SERVICE):
        for obj in api.list(kind, namespace)["items"]:
            if ours.match(obj["metadata"]["name"]) and not owned_by_run(obj, gone.run_id):
                gone.delete(api, kind, obj)  # refuses, and records it as skipped


def delete_workload(api: Api, namespace: str, gone: Deletions, deadline: Deadline) -> None:
    """Delete the run's TrainJobs, Jobs (with their pods), Services and GPU templates.

    Each object is deleted as listed, with a uid precondition; results go to ``gone``.
    Waits until every pod of the run is gone, so the domain can be deleted after without
    pulling IMEX from under a running process.
    """
    selector = RunNames.for_run(gone.run_id).selector
    trainjobs = delete_trainjobs(api, namespace, gone)
    for kind in (JOB, SERVICE, RESOURCE_CLAIM_TEMPLATE):
        for obj in api.list(kind, namespace, label_selector=selector)["items"]:
            gone.delete(api, kind, obj, propagation="Background" if kind is JOB else None)

    for pods in [selector] + ([trainjob_pods_selector(trainjobs)] if trainjobs else []):
        wait_gone(
            api,
            POD,
            namespace,
            label_selector=pods,
            what=f"pods matching {pods}",
            deadline=deadline,
            hint="check the pods' finalizers and the kubelet on their nodes",
        )
