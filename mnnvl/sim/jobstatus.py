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
    hit = matching_rule(job, pod)
    return "Count" if hit is None else hit[1]


def matching_rule(job: Obj, pod: Obj) -> tuple[int, str, str] | None:
    """(rule index, action, why) of the first podFailurePolicy rule that matches a failed pod."""
    rules = ((job["spec"].get("podFailurePolicy") or {}).get("rules")) or []
    st = pod.get("status") or {}
    codes = [
        (cs.get("name"), ((cs.get("state") or {}).get("terminated") or {}).get("exitCode"))
        for cs in st.get("containerStatuses") or []
    ]
    conds = {(c.get("type"), c.get("status")) for c in st.get("conditions") or []}
    meta = pod["metadata"]
    for i, rule in enumerate(rules):
        on_codes = rule.get("onExitCodes")
        if on_codes:
            vals, op = set(on_codes.get("values") or []), on_codes.get("operator", "In")
            for name, code in codes:
                if (
                    code is not None
                    and code != 0
                    and (code in vals) == (op == "In")
                    and on_codes.get("containerName") in (None, name)
                ):
                    why = (
                        f"Container {name} for pod {meta.get('namespace')}/{meta['name']} "
                        f"failed with exit code {code} matching {rule['action']} rule at index {i}"
                    )
                    return i, str(rule["action"]), why
        for pat in rule.get("onPodConditions") or []:
            if (pat.get("type"), pat.get("status", "True")) in conds:
                why = (
                    f"Pod {meta.get('namespace')}/{meta['name']} has condition {pat.get('type')} "
                    f"matching {rule['action']} rule at index {i}"
                )
                return i, str(rule["action"]), why
    return None


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
    terminating: int = 0  # pods being deleted that have not reached a terminal phase


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
        terminating=len(
            [p for p in pods if p["metadata"].get("deletionTimestamp") and phase(p) not in TERMINAL]
        ),
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
    for pod, action in progress.counted:
        hit = matching_rule(job, pod)
        if action == "FailJob" and hit is not None:
            return ("PodFailurePolicy", hit[2])
    if len(progress.counted) > limit:
        return ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    max_failed = job["spec"].get("maxFailedIndexes")
    if (
        per_index is not None
        and max_failed is not None
        and (len(progress.failed_idx) > int(max_failed))
    ):
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
    start: str | None,
    progress: Progress,
    active: list[Obj],
    fail: tuple[str, str] | None,
    old: Obj,
    now: str,
) -> Obj:
    """The Job's new status. As in batch/v1 since 1.31, FailureTarget / SuccessCriteriaMet come
    first and Failed / Complete only once no pod of the Job is terminating any more."""
    st: Obj = {
        "active": len(active),
        "succeeded": progress.succeeded,
        "failed": len(progress.counted),
        "terminating": progress.terminating,
        "uncountedTerminatedPods": {},
        "ready": len([p for p in active if ready(p)]),
    }
    if start is not None:
        st["startTime"] = start
    if progress.indexed:
        st["completedIndexes"] = compress_indexes(progress.done)
    if progress.per_index is not None:
        st["failedIndexes"] = compress_indexes(progress.failed_idx)
    conds = list(old.get("conditions") or [])
    settled = progress.terminating == 0 and not active
    if fail is not None:
        add_condition(conds, "FailureTarget", fail, now)
        if settled:
            add_condition(conds, "Failed", fail, now)
    elif len(progress.done) >= progress.completions:
        done = ("CompletionsReached", "Reached expected number of succeeded pods")
        add_condition(conds, "SuccessCriteriaMet", done, now)
        if settled:
            add_condition(conds, "Complete", done, now)
            st["completionTime"] = old.get("completionTime") or now
    if conds:
        st["conditions"] = conds
    return st


def add_condition(conds: list[Obj], type_: str, why: tuple[str, str] | None, now: str) -> None:
    """Set condition ``type_`` to True (kept as it is when it already is True)."""
    if any(c.get("type") == type_ and c.get("status") == "True" for c in conds):
        return
    conds[:] = [c for c in conds if c.get("type") != type_]
    conds.append(condition(type_, why, now))


def condition(type_: str, why: tuple[str, str] | None, now: str, status: str = "True") -> Obj:
    c: Obj = {"type": type_, "status": status, "lastProbeTime": now, "lastTransitionTime": now}
    if why is not None:
        c["reason"], c["message"] = why
    return c


def target_failure(status: Obj) -> tuple[str, str] | None:
    """The verdict of a Job already marked FailureTarget (it never changes afterwards)."""
    for c in status.get("conditions") or []:
        if c.get("type") == "FailureTarget" and c.get("status") == "True":
            return str(c.get("reason", "")), str(c.get("message", ""))
    return None


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
