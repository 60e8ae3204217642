"""Pure Job-status arithmetic of the simulated Job controller: how pods count, when a Job
has failed or completed, and the status it reports (no store access, no threads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mnnvl.sim.api.store import Obj
from mnnvl.sim.core.scheduler import INDEX_LABEL, TERMINAL


def compress_indexes(indexes: set[int]) -> str:
    """{0,1,2,5} -> "0-2,5" (the format of status.completedIndexes)."""
    runs: list[list[int]] = []
    for i in sorted(indexes):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def failure_action(job: Obj, pod: Obj) -> tuple[str, str]:
    """podFailurePolicy verdict for a failed pod, (FailJob | FailIndex | Ignore | Count, why):
    the first rule that matches, else Count."""
    rules = ((job["spec"].get("podFailurePolicy") or {}).get("rules")) or []
    st = pod.get("status") or {}
    codes = [
        (cs.get("name"), ((cs.get("state") or {}).get("terminated") or {}).get("exitCode"))
        for cs in st.get("containerStatuses") or []
    ]
    conds = {(c.get("type"), c.get("status")) for c in st.get("conditions") or []}
    where = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
    for i, rule in enumerate(rules):
        action = str(rule["action"])
        matching = f"matching {action} rule at index {i}"
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
                    return action, (
                        f"Container {name} for pod {where} failed with exit code {code} {matching}"
                    )
        for pat in rule.get("onPodConditions") or []:
            if (pat.get("type"), pat.get("status", "True")) in conds:
                return action, f"Pod {where} has condition {pat.get('type')} {matching}"
    return "Count", ""


TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
IGNORED_COUNT = "batch.kubernetes.io/job-index-ignored-failure-count"


@dataclass
class Progress:
    """What a Job's pods say, counted the way the real Job controller counts them: the
    counts in the Job's status so far plus the pods that finished since (``fresh``)."""

    indexed: bool
    completions: int
    per_index: Any  # spec.backoffLimitPerIndex (None when the Job has no per-index limit)
    active: list[Obj]  # neither terminal nor being deleted
    done: set[int]  # completed indexes
    succeeded: int  # completed indexes (Indexed) or Succeeded pods (NonIndexed)
    failed: int  # failed pods counted so far (not Ignored by podFailurePolicy)
    counted: list[tuple[Obj, str, str]]  # failed pods counted in this sync: action, why
    failed_idx: set[int]  # indexes out of retries (backoffLimitPerIndex or FailIndex)
    fresh: list[Obj]  # terminal pods not counted before this sync
    terminating: list[Obj]  # pods being deleted that have not reached a terminal phase


def only_replace_failed(job: Obj) -> bool:
    """podReplacementPolicy Failed (the only policy allowed with a podFailurePolicy): a pod
    being deleted is replaced, and counted, only once it reached phase Failed."""
    spec = job["spec"]
    return spec.get("podReplacementPolicy") == "Failed" or bool(spec.get("podFailurePolicy"))


def count_progress(job: Obj, pods: list[Obj], counted_uids: set[str]) -> Progress:
    """``counted_uids``: pods already in the Job's status (the real controller's
    ``uncountedTerminatedPods`` bookkeeping and tracking finalizer)."""
    spec, st = job["spec"], job.get("status") or {}
    indexed = spec.get("completionMode") == "Indexed"
    per_index = spec.get("backoffLimitPerIndex")
    active = [
        p for p in pods if phase(p) not in TERMINAL and not p["metadata"].get("deletionTimestamp")
    ]
    fresh = [p for p in pods if phase(p) in TERMINAL and p["metadata"]["uid"] not in counted_uids]
    wins = [p for p in fresh if phase(p) == "Succeeded"]
    done = parse_indexes(st.get("completedIndexes")) | {pod_index(p) for p in wins}
    verdicts = [(p, *failure_action(job, p)) for p in fresh if phase(p) == "Failed"]
    counted = [(p, action, why) for p, action, why in verdicts if action != "Ignore"]
    failed_idx = parse_indexes(st.get("failedIndexes"))
    if per_index is not None:
        failed_idx |= {
            pod_index(p)
            for p, action, _ in counted
            if action == "FailIndex" or failure_count(p) >= int(per_index)
        }
    return Progress(
        indexed=indexed,
        completions=int(spec.get("completions") or 1),
        per_index=per_index,
        active=active,
        done=done,
        succeeded=len(done) if indexed else int(st.get("succeeded") or 0) + len(wins),
        failed=int(st.get("failed") or 0) + len(counted),
        counted=counted,
        failed_idx=failed_idx,
        fresh=fresh,
        terminating=[
            p for p in pods if p["metadata"].get("deletionTimestamp") and phase(p) not in TERMINAL
        ],
    )


def failure_count(pod: Obj) -> int:
    """The index's counted failures before this pod (its ``job-index-failure-count``)."""
    return _annotation_int(pod, FAILURE_COUNT)


def replacement_counts(job: Obj, replaced: Obj | None) -> dict[str, str]:
    """The failure-count annotations of a new pod replacing ``replaced`` (the index's last
    failed pod): its counts plus its own failure, counted or ignored by podFailurePolicy."""
    if replaced is None:
        return {FAILURE_COUNT: "0"}
    failures, ignored = failure_count(replaced), _annotation_int(replaced, IGNORED_COUNT)
    if failure_action(job, replaced)[0] == "Ignore":
        ignored += 1
    else:
        failures += 1
    out = {FAILURE_COUNT: str(failures)}
    if ignored:
        out[IGNORED_COUNT] = str(ignored)
    return out


def absolute_failures(pod: Obj) -> int:
    """The index's failures before this pod, counted and ignored."""
    return failure_count(pod) + _annotation_int(pod, IGNORED_COUNT)


def _annotation_int(pod: Obj, key: str) -> int:
    text = (pod["metadata"].get("annotations") or {}).get(key, "0")
    return int(text) if str(text).isdigit() else 0


def parse_indexes(text: str | None) -> set[int]:
    """ "0-2,5" -> {0,1,2,5} (the inverse of ``compress_indexes``)."""
    out: set[int] = set()
    for part in (text or "").split(","):
        if part:
            first, _, last = part.partition("-")
            out |= set(range(int(first), int(last or first) + 1))
    return out


def limit_failure(job: Obj, progress: Progress) -> tuple[str, str] | None:
    """A FailJob verdict, else BackoffLimitExceeded once more pods failed than allowed, else
    MaxFailedIndexesExceeded once more indexes failed than allowed."""
    per_index = progress.per_index
    limit = int(job["spec"].get("backoffLimit", 6 if per_index is None else 2**31 - 1))
    for _, action, why in progress.counted:
        if action == "FailJob":
            return ("PodFailurePolicy", why)
    if progress.failed > limit or past_limit_on_failure(job, progress.active, limit):
        return ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    max_failed = job["spec"].get("maxFailedIndexes")  # only valid with backoffLimitPerIndex
    if max_failed is not None and len(progress.failed_idx) > int(max_failed):
        why = "Job has exceeded the specified maximal number of failed indexes"
        return ("MaxFailedIndexesExceeded", why)
    return None


def past_limit_on_failure(job: Obj, active: list[Obj], limit: int) -> bool:
    """With ``restartPolicy: OnFailure`` the kubelet restarts a failed container in its pod,
    and the restarts of the running and pending pods' containers count against
    ``backoffLimit`` (``pkg/controller/job/job_controller.go``, ``pastBackoffLimitOnFailure``)."""
    if job["spec"]["template"]["spec"].get("restartPolicy") != "OnFailure":
        return False
    restarts = sum(
        int(c.get("restartCount") or 0)
        for p in active
        if phase(p) in ("Running", "Pending")
        for c in (p.get("status") or {}).get("containerStatuses") or []
    )
    return restarts > 0 if limit == 0 else restarts >= limit


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
        "failed": progress.failed,
        "terminating": len(progress.terminating),
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
    settled = not progress.terminating and not active
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


def pod_index(pod: Obj) -> int:
    return int((pod["metadata"].get("labels") or {}).get(INDEX_LABEL, -1))


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
