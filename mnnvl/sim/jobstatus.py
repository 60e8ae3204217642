"""Pure Job-status arithmetic of the simulated Job controller: how pods count, when a Job
has failed or completed, and the status it reports (no store access, no threads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mnnvl.sim.scheduler import INDEX_LABEL, TERMINAL
from mnnvl.sim.store import Obj


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


@dataclass
class Progress:
    """What a Job's pods say, counted the way the real Job controller counts them."""

    indexed: bool
    completions: int
    per_index: Any  # spec.backoffLimitPerIndex (None when the Job has no per-index limit)
    active: list[Obj]  # neither terminal nor being deleted
    done: set[int]  # completed indexes
    succeeded: int  # completed indexes (Indexed) or Succeeded pods (NonIndexed)
    counted: list[tuple[Obj, str]]  # failed pods not Ignored by podFailurePolicy, with action
    failed_idx: set[int]  # indexes out of retries (backoffLimitPerIndex or FailIndex)


def count_progress(job: Obj, pods: list[Obj]) -> Progress:
    spec = job["spec"]
    indexed = spec.get("completionMode") == "Indexed"
    per_index = spec.get("backoffLimitPerIndex")
    active = [
        p for p in pods if phase(p) not in TERMINAL and not p["metadata"].get("deletionTimestamp")
    ]
    done = {pod_index(p) for p in pods if phase(p) == "Succeeded"}
    failed_pods = [p for p in pods if phase(p) == "Failed"]
    actions = [(p, failure_action(job, p)) for p in failed_pods]
    counted = [(p, a) for p, a in actions if a != "Ignore"]
    succeeded = len(done) if indexed else len([p for p in pods if phase(p) == "Succeeded"])
    return Progress(
        indexed=indexed,
        completions=int(spec.get("completions") or 1),
        per_index=per_index,
        active=active,
        done=done,
        succeeded=succeeded,
        counted=counted,
        failed_idx=failed_indexes(counted, per_index),
    )


def failed_indexes(counted: list[tuple[Obj, str]], per_index: Any) -> set[int]:
    per_count: dict[int, int] = {}
    failed_idx: set[int] = set()
    for p, a in counted:
        i = pod_index(p)
        per_count[i] = per_count.get(i, 0) + 1
        if per_index is not None and (a == "FailIndex" or per_count[i] > int(per_index)):
            failed_idx.add(i)
    return failed_idx


def limit_failure(job: Obj, progress: Progress) -> tuple[str, str] | None:
    """A FailJob verdict, else BackoffLimitExceeded once more pods failed than allowed."""
    per_index = progress.per_index
    limit = int(job["spec"].get("backoffLimit", 6 if per_index is None else 2**31 - 1))
    if any(a == "FailJob" for _, a in progress.counted):
        return ("PodFailurePolicy", "Container failed with an exit code matched by a FailJob rule")
    if len(progress.counted) > limit:
        return ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    max_failed = job["spec"].get("maxFailedIndexes")
    if per_index is not None and max_failed is not None and len(progress.failed_idx) > max_failed:
        return (
            "MaxFailedIndexesExceeded",
            "Job has exceeded the specified maximal number of failed indexes",
        )
    return None


def failed_indexes_failure(progress: Progress) -> tuple[str, str] | None:
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


def job_status(
    start: str, progress: Progress, active: list[Obj], fail: tuple[str, str] | None, now: str
) -> Obj:
    """The Job's new status (conditions only when this sync decided the Job's end)."""
    st: Obj = {
        "startTime": start,
        "active": len(active),
        "succeeded": progress.succeeded,
        "failed": len(progress.counted),
        "terminating": 0,
        "uncountedTerminatedPods": {},
        "ready": len([p for p in active if ready(p)]),
    }
    if progress.indexed:
        st["completedIndexes"] = compress_indexes(progress.done)
    if progress.per_index is not None:
        st["failedIndexes"] = compress_indexes(progress.failed_idx)
    if fail is not None:
        st["conditions"] = [condition("FailureTarget", fail, now), condition("Failed", fail, now)]
    elif len(progress.done) >= progress.completions:
        st["conditions"] = [
            condition("SuccessCriteriaMet", None, now),
            condition("Complete", None, now),
        ]
        st["completionTime"] = now
    return st


def condition(type_: str, fail: tuple[str, str] | None, now: str) -> Obj:
    c: Obj = {"type": type_, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
    if fail is not None:
        c["reason"], c["message"] = fail
    return c


def finished(status: Obj) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def pod_index(pod: Obj) -> int:
    return int((pod["metadata"].get("labels") or {}).get(INDEX_LABEL, -1))


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
