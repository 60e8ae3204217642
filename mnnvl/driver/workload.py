"""The multi-node workload: create Service + Indexed Job, wait for pods and completion, delete.

Waits fail fast with the pod's recent events, the ComputeDomain's ``status.nodes`` and the next
thing to check, instead of sitting out a deadline on something that will not recover.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from mnnvl.driver.api import (
    EVENT,
    JOB,
    POD,
    RESOURCE_CLAIM_TEMPLATE,
    SERVICE,
    Api,
    Kind,
    create_or_adopt,
)
from mnnvl.driver.domain import KUBELET_PLUGIN_LOGS, domain_nodes, domain_state
from mnnvl.driver.errors import MnnvlError, WorkloadFailed
from mnnvl.driver.wait import Deadline, Objects, wait_for
from mnnvl.manifests import (
    CONTAINER,
    JOB_NAME_LABEL,
    gpu_claim_template,
    headless_service,
    indexed_job,
    wants_gpu_claim,
)
from mnnvl.names import RunNames
from mnnvl.spec import WorkloadSpec

logger = logging.getLogger(__name__)

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
FATAL_WAITING = (
    "ImagePullBackOff",
    "ErrImagePull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
)
RESULT_PREFIX = "RESULT "
LOG_TAIL_LINES = 20


def create_workload(api: Api, workload: WorkloadSpec, module: str, args: list[str]) -> str:
    """Create (or adopt, when a step is retried) GPU template, Service and Job; return the Job."""
    bodies: list[tuple[Kind, dict[str, Any]]] = []
    if wants_gpu_claim(workload):
        bodies.append((RESOURCE_CLAIM_TEMPLATE, gpu_claim_template(workload)))
    bodies.append((SERVICE, headless_service(workload)))
    job = indexed_job(workload, module, args)
    bodies.append((JOB, job))
    for kind, body in bodies:
        _, adopted = create_or_adopt(api, kind, body)
        meta = body["metadata"]
        logger.info(
            "%s %s %s/%s",
            "adopted" if adopted else "created",
            kind.kind,
            meta["namespace"],
            meta["name"],
        )
    return str(job["metadata"]["name"])


def pod_index(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return str(
        (meta.get("annotations") or {}).get(INDEX_ANNOTATION)
        or (meta.get("labels") or {}).get(INDEX_ANNOTATION, "")
    )


def _waiting_reason(pod: dict[str, Any]) -> str:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason") or "")
    return ""


def _unschedulable(pod: dict[str, Any]) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        scheduled = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if scheduled and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "Unschedulable")
    return ""


def _exit_code(pod: dict[str, Any]) -> int | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            return int(term.get("exitCode", 0))
    return None


def pod_events(api: Api, namespace: str, pod: str, limit: int = 5) -> str:
    """The pod's most recent events as one line (diagnostics; never raises)."""
    try:
        lst = api.list(EVENT, namespace, field_selector=f"involvedObject.name={pod}")
    except MnnvlError as e:
        return f"events unreadable ({e})"
    events = sorted(lst["items"], key=_event_order)[-limit:]
    if not events:
        return "no events"
    return "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events)


def _event_order(event: dict[str, Any]) -> tuple[str, int]:
    stamp = str(event.get("lastTimestamp") or event.get("eventTime") or "")
    version = str(event.get("metadata", {}).get("resourceVersion") or "0")
    return stamp, int(version) if version.isdigit() else 0


def _pod_state(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    reason = _waiting_reason(pod) or (_unschedulable(pod) and "Unschedulable")
    node = (pod.get("spec") or {}).get("nodeName") or "unscheduled"
    return f"{pod['metadata']['name']} {phase}{'/' + reason if reason else ''} on {node}"


def wait_for_pods_running(
    api: Api, workload: WorkloadSpec, job: str, deadline: Deadline
) -> Objects:
    """Block until every index of ``job`` has a pod Running (or already Succeeded)."""
    names = RunNames.for_run(workload.run_id)
    seen = {"n": -1}

    def ready(objects: Objects) -> int:
        return len(
            {
                pod_index(p)
                for p in objects.values()
                if p.get("status", {}).get("phase") in ("Running", "Succeeded")
            }
        )

    def done(objects: Objects) -> bool:
        n = ready(objects)
        if n != seen["n"]:
            seen["n"] = n
            logger.info("pods %d/%d Running", n, workload.nodes)
        return n >= workload.nodes

    # Unschedulable is often transient (claims being allocated, a previous Job's pods still
    # releasing their nodes' channel, an autoscaler adding nodes): fatal only once it lasted.
    unschedulable_since: dict[str, float] = {}

    def still_unschedulable(pod: dict[str, Any]) -> float | None:
        name = pod["metadata"]["name"]
        if not _unschedulable(pod):
            unschedulable_since.pop(name, None)
            return None
        since = unschedulable_since.setdefault(name, time.monotonic())
        return workload.unschedulable_grace_s - (time.monotonic() - since)

    def fail(objects: Objects) -> None:
        for pod in objects.values():
            left = still_unschedulable(pod)
            problem = _pod_problem(
                pod,
                retries=workload.backoff_limit_per_index > 0,
                unschedulable_fatal=left is not None and left <= 0,
            )
            if problem:
                raise WorkloadFailed(
                    _failure_message(api, workload.namespace, names.domain, pod, problem)
                )

    def recheck_in(objects: Objects) -> float | None:
        left = [t for t in map(still_unschedulable, objects.values()) if t is not None]
        return max(0.0, min(left)) if left else None

    return wait_for(
        api,
        POD,
        workload.namespace,
        label_selector=f"{JOB_NAME_LABEL}={job}",
        what=f"{workload.nodes} pods of Job {workload.namespace}/{job} to be Running",
        done=done,
        fail=fail,
        describe=lambda objects: _describe_pods(api, workload, job, objects, deadline),
        deadline=deadline,
        recheck_in=recheck_in,
        hint=(
            f"check `kubectl get computedomain {names.domain} -n {workload.namespace} -o yaml` "
            f"and the driver's kubelet-plugin logs ({KUBELET_PLUGIN_LOGS})"
        ),
    )


def _describe_pods(
    api: Api, workload: WorkloadSpec, job: str, objects: Objects, deadline: Deadline
) -> str:
    """Each pod's phase and node; for a pod stuck ContainerCreating, why (IMEX) and its events."""
    ns, domain = workload.namespace, RunNames.for_run(workload.run_id).domain
    if not objects:
        return f"no pods of Job {job} ({pod_events(api, ns, job)})"
    states = [_pod_state(p) for p in sorted(objects.values(), key=pod_index)]
    summary, imex = domain_nodes(api, domain, ns)
    stuck = [p for p in objects.values() if _waiting_reason(p) == "ContainerCreating"]
    detail = ""
    if stuck:
        pod = sorted(stuck, key=pod_index)[0]
        name, node = pod["metadata"]["name"], pod["spec"].get("nodeName")
        why = (
            f"IMEX daemon on node {node} not ready ({imex.get(node, 'not in status.nodes')})"
            if imex.get(node) != "Ready"
            else "its claims are still being prepared"
        )
        detail = (
            f"; pod {name} stuck ContainerCreating {deadline.elapsed():.0f} s: {why}; "
            f"events: {pod_events(api, ns, name)}"
        )
    return f"{', '.join(states)}{detail}; {summary}"


def _pod_problem(pod: dict[str, Any], *, retries: bool, unschedulable_fatal: bool) -> str:
    """Why this pod will not get to Running by itself, or "" when it still may."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Failed" and not retries:
        return f"Failed with exit code {_exit_code(pod)}"
    reason = _waiting_reason(pod)
    if reason in FATAL_WAITING:
        return reason
    unschedulable = _unschedulable(pod)
    if unschedulable and unschedulable_fatal:
        return f"Unschedulable: {unschedulable}"
    return ""


def _failure_message(
    api: Api, namespace: str, domain: str, pod: dict[str, Any], problem: str
) -> str:
    name = pod["metadata"]["name"]
    node = (pod.get("spec") or {}).get("nodeName") or "no node"
    hint = {
        "ImagePullBackOff": "check the image name and the pull secret",
        "ErrImagePull": "check the image name and the pull secret",
        "CrashLoopBackOff": f"check `kubectl logs -n {namespace} {name}`",
        "CreateContainerConfigError": "check the pod's env, secrets and config maps",
    }.get(problem.split(":")[0], f"check `kubectl logs -n {namespace} {name}`")
    if problem.startswith("Unschedulable"):
        hint = (
            "check free GPUs and channel devices per node (one pod per node per domain) and "
            "the nvidia.com/gpu.clique labels"
        )
    message = (
        f"pod {namespace}/{name} on {node}: {problem}; events: {pod_events(api, namespace, name)}; "
        f"{domain_state(api, domain, namespace)}; {hint}"
    )
    if (pod.get("status") or {}).get("phase") == "Failed":
        message += f"; last log lines:\n{_log_tail(api, namespace, name)}"
    return message


def _log_tail(api: Api, namespace: str, pod: str) -> str:
    try:
        lines = api.pod_log(namespace, pod, container=CONTAINER).splitlines()
    except MnnvlError as e:
        return f"(log unreadable: {e})"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"


class LogFollower:
    """Follows one pod's log in a thread, echoing lines to stderr with a prefix and keeping them."""

    def __init__(
        self, api: Api, namespace: str, pod: str, *, sink: Callable[[str], None] | None = None
    ) -> None:
        self.api, self.namespace, self.pod = api, namespace, pod
        self.lines: list[str] = []
        self.error: str = ""
        self._sink = sink or (lambda line: print(line, file=sys.stderr, flush=True))
        self._thread = threading.Thread(target=self._run, name=f"log-{pod}", daemon=True)

    def start(self) -> LogFollower:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for line in self.api.follow_log(self.namespace, self.pod, container=CONTAINER):
                self.lines.append(line)
                self._sink(f"[{self.pod}] {line}")
        except MnnvlError as e:
            # The stream is a convenience; the launcher re-reads the log when it needs it.
            self.error = str(e)
            logger.debug("log stream of %s ended: %s", self.pod, e)

    def join(self, timeout_s: float) -> bool:
        """Wait for the stream to end; True when it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def wait_for_job_done(
    api: Api, workload: WorkloadSpec, job: str, deadline: Deadline
) -> dict[str, Any]:
    """Block until the Job is Complete; raise ``WorkloadFailed`` (with the evidence) if it fails."""
    names = RunNames.for_run(workload.run_id)

    def condition(objects: Objects, kind: str) -> dict[str, Any] | None:
        for cond in (objects.get(job, {}).get("status") or {}).get("conditions") or []:
            if cond.get("type") == kind and cond.get("status") == "True":
                return dict(cond)
        return None

    def fail(objects: Objects) -> None:
        failed = condition(objects, "Failed")
        if failed is not None:
            raise WorkloadFailed(_job_failure(api, workload, job, names.domain, failed))

    objects = wait_for(
        api,
        JOB,
        workload.namespace,
        name=job,
        what=f"Job {workload.namespace}/{job} to complete",
        done=lambda objects: condition(objects, "Complete") is not None,
        fail=fail,
        deadline=deadline,
        describe=lambda objects: json.dumps((objects.get(job) or {}).get("status") or "absent"),
        hint=f"raise --job-timeout-s or check "
        f"`kubectl logs -n {workload.namespace} -l {JOB_NAME_LABEL}={job}`",
    )
    logger.info("Job %s/%s complete after %.1f s", workload.namespace, job, deadline.elapsed())
    return objects[job]


def _job_failure(
    api: Api, workload: WorkloadSpec, job: str, domain: str, failed: dict[str, Any]
) -> str:
    ns = workload.namespace
    pods = api.list(POD, ns, label_selector=f"{JOB_NAME_LABEL}={job}")["items"]
    bad = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    message = f"Job {ns}/{job} failed ({failed.get('reason')}: {failed.get('message')})"
    if not bad:
        return f"{message}; no failed pod left to inspect; {domain_state(api, domain, ns)}"
    pod = sorted(bad, key=pod_index)[0]
    name = pod["metadata"]["name"]
    tail = _log_tail(api, ns, name)
    return (
        f"{message}; pod {name} (index {pod_index(pod)}) exited with code {_exit_code(pod)}; "
        f"events: {pod_events(api, ns, name)}; last log lines:\n{tail}"
    )


def parse_result(log_text: str) -> dict[str, Any] | None:
    """The last ``RESULT {json}`` line of a log, or None when there is none."""
    for line in reversed(log_text.splitlines()):
        line = line.strip()
        if line.startswith(RESULT_PREFIX):
            try:
                result = json.loads(line[len(RESULT_PREFIX) :])
            except ValueError as e:
                raise WorkloadFailed(
                    f"the RESULT line is not valid JSON ({e}): {line[:200]}"
                ) from e
            return result if isinstance(result, dict) else {"value": result}
    return None


def result_of_failed_job(
    api: Api,
    workload: WorkloadSpec,
    job: str,
    follower: LogFollower | None,
    *,
    drain_s: float = 5.0,
) -> dict[str, Any] | None:
    """Rank 0's RESULT from a failed Job's log, if it printed one before exiting."""
    if follower is not None and follower.join(drain_s):
        found = parse_result(follower.text)
        if found is not None:
            return found
    pods = api.list(POD, workload.namespace, label_selector=f"{JOB_NAME_LABEL}={job}")["items"]
    for pod in pods:
        if pod_index(pod) != "0":
            continue
        try:
            text = api.pod_log(workload.namespace, pod["metadata"]["name"], container=CONTAINER)
        except MnnvlError as e:
            logger.warning("could not read the log of %s: %s", pod["metadata"]["name"], e)
            continue
        found = parse_result(text)
        if found is not None:
            return found
    return None


def rank0_pod(pods: Objects) -> str:
    for name, pod in sorted(
        pods.items(), key=lambda item: str(item[1]["metadata"].get("creationTimestamp"))
    ):
        if pod_index(pod) == "0" and pod.get("status", {}).get("phase") in ("Running", "Succeeded"):
            return name
    raise WorkloadFailed(f"no running pod with index 0 among {sorted(pods)}")


def delete_workload(api: Api, namespace: str, selector: str, deadline: Deadline) -> list[str]:
    """Delete the Jobs (with their pods), Services and GPU templates matching ``selector``.

    Waits until every pod of the selector is gone, so the domain can be deleted after
    without pulling IMEX from under a running process.
    """
    deleted: list[str] = []
    for kind in (JOB, SERVICE, RESOURCE_CLAIM_TEMPLATE):
        for obj in api.list(kind, namespace, label_selector=selector)["items"]:
            name = obj["metadata"]["name"]
            policy = "Background" if kind is JOB else None
            if api.delete(kind, namespace, name, propagation=policy):
                deleted.append(f"{kind.kind} {namespace}/{name}")
                logger.info("deleted %s %s/%s", kind.kind, namespace, name)
    wait_for(
        api,
        POD,
        namespace,
        label_selector=selector,
        what=f"pods matching {selector} to be gone",
        done=lambda objects: not objects,
        deadline=deadline,
        hint="check the pods' finalizers and the kubelet on their nodes",
    )
    return deleted


def age_s(obj: dict[str, Any], now: datetime | None = None) -> float:
    """Seconds since the object was created (0 when the server did not say)."""
    stamp = obj.get("metadata", {}).get("creationTimestamp")
    if not stamp:
        return 0.0
    created = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return ((now or datetime.now(UTC)) - created).total_seconds()
