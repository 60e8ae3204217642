"""Find and delete what runs left behind when their exit handler never ran.

KFP Terminate and Argo ``terminate`` can skip exit handlers; every object we create carries
``app.kubernetes.io/managed-by=mnnvl-pipelines`` and the run id, so the reaper groups objects
by run and deletes the runs the caller says are dead, workload first, then the domain,
exactly as teardown does (each delete checks ownership and sends a uid precondition).

A run is dead when it is not among the live run ids the caller listed (or ``all_dead``), and,
with an age bound, when it has been idle at least that long. Idle means since the run's last
activity: its newest object, or the latest transition of any of its pods; a run with a pod
Running, or with a Job waiting for admission (suspended by Kueue: its step waits with no limit
unless ``--admission-timeout-s`` is set, and nothing transitions meanwhile), is active now. A
queued Job whose step is gone goes with its owner (the launcher pod or Workflow, through
garbage collection) or when the caller names its run dead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mnnvl.driver.api import COMPUTE_DOMAIN, JOB, POD, RESOURCE_CLAIM_TEMPLATE, SERVICE, Api
from mnnvl.driver.domain import delete_domain
from mnnvl.driver.ownership import FAILURE_ANNOTATION, Deletions
from mnnvl.driver.wait import Deadline
from mnnvl.driver.workload import delete_workload
from mnnvl.errors import NotFound, SpecError
from mnnvl.inputs.checks import check_range
from mnnvl.inputs.names import LABEL_RUN_ID, MANAGED_SELECTOR

logger = logging.getLogger(__name__)


@dataclass
class RunObjects:
    """What one run has left in one namespace."""

    run_id: str
    namespace: str
    names: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    last_activity: datetime | None = None

    def idle_s(self, now: datetime) -> float:
        """Seconds since the run's last activity (0 when nothing carried a time)."""
        if self.last_activity is None:
            return 0.0
        return max(0.0, (now - self.last_activity).total_seconds())

    def saw(self, when: datetime | None) -> None:
        if when is not None and (self.last_activity is None or when > self.last_activity):
            self.last_activity = when


@dataclass(frozen=True)
class Verdict:
    """Which runs are dead: not live (or all of them), and idle at least ``older_than_s``."""

    live_run_ids: frozenset[str] | None
    all_dead: bool
    older_than_s: float

    def __post_init__(self) -> None:
        """An empty or missing live list must never mean "everything" by accident."""
        check_range("older_than_s", self.older_than_s, 0, 10 * 365 * 86400)
        if self.all_dead and self.live_run_ids:
            raise SpecError("all_dead", "contradicts live_run_ids; set one or the other")
        if self.all_dead or self.older_than_s > 0:
            return
        if self.live_run_ids is None:
            raise SpecError(
                "live_run_ids",
                "reap needs to know which runs are dead: set live_run_ids ID,... (runs "
                "still going), an age bound older_than_s, or all_dead",
            )
        if not self.live_run_ids:
            raise SpecError(
                "live_run_ids",
                "is empty, which would reap every run in the namespace; set all_dead to "
                "mean that, or an age bound (older_than_s)",
            )

    def is_dead(self, run: RunObjects, now: datetime) -> bool:
        if self.live_run_ids and run.run_id in self.live_run_ids:
            return False
        return self.older_than_s <= 0 or run.idle_s(now) >= self.older_than_s


def _parse_time(stamp: Any) -> datetime | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None


def activity_times(obj: dict[str, Any], now: datetime) -> list[datetime | None]:
    """Every moment ``obj`` shows something happened: creation, start/completion, condition
    and container transitions; ``now`` for a Running pod (it is active as we speak)."""
    status = obj.get("status") or {}
    if obj.get("kind") == "Pod" and status.get("phase") == "Running":
        return [now]
    if obj.get("kind") == "Job" and _queued(obj):
        return [now]
    stamps: list[Any] = [
        obj.get("metadata", {}).get("creationTimestamp"),
        status.get("startTime"),
        status.get("completionTime"),
    ]
    stamps += [c.get("lastTransitionTime") for c in status.get("conditions") or []]
    for container in status.get("containerStatuses") or []:
        for state in (container.get("state") or {}).values():
            stamps += [(state or {}).get("startedAt"), (state or {}).get("finishedAt")]
    return [_parse_time(s) for s in stamps]


def _queued(job: dict[str, Any]) -> bool:
    """A Job waiting for admission: suspended, not finished, and not the record of a failed
    step (suspended too, but a leftover)."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    conditions = (job.get("status") or {}).get("conditions") or []
    finished = any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )
    suspended = bool((job.get("spec") or {}).get("suspend"))
    return suspended and not finished and FAILURE_ANNOTATION not in annotations


def find_runs(api: Api, namespace: str, now: datetime) -> dict[str, RunObjects]:
    """Objects we manage in ``namespace``, grouped by run id, with each run's last activity."""
    runs: dict[str, RunObjects] = {}
    for kind in (COMPUTE_DOMAIN, JOB, SERVICE, RESOURCE_CLAIM_TEMPLATE, POD):
        try:
            items = api.list(kind, namespace, label_selector=MANAGED_SELECTOR)["items"]
        except NotFound:
            # No ComputeDomain CRD: nothing of that kind can be left over.
            continue
        for obj in items:
            run_id = (obj["metadata"].get("labels") or {}).get(LABEL_RUN_ID)
            if not run_id:
                continue
            run = runs.setdefault(run_id, RunObjects(run_id, namespace))
            obj.setdefault("kind", kind.kind)  # list items may come without their kind
            for when in activity_times(obj, now):
                run.saw(when)
            if kind is POD:
                continue  # pods go with their Job; they are activity, not leftovers
            run.names.append(f"{kind.kind} {namespace}/{obj['metadata']['name']}")
            if kind is COMPUTE_DOMAIN:
                run.domains.append(obj["metadata"]["name"])
    return runs


@dataclass
class Reaped:
    """What a reap of one namespace did (or, in a dry run, would do)."""

    runs: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    would_delete: list[str] = field(default_factory=list)
    idle_s: dict[str, float] = field(default_factory=dict)


def reap_namespace(
    api: Api, namespace: str, verdict: Verdict, *, timeout_s: float, dry_run: bool = False
) -> Reaped:
    """Delete the dead runs in one namespace (``dry_run``: only say which and what)."""
    out = Reaped()
    now = datetime.now(UTC)
    for run_id, run in sorted(find_runs(api, namespace, now).items()):
        if not run.names or not verdict.is_dead(run, now):
            continue  # only pods left: they go with their Job, which is already gone
        out.runs.append(run_id)
        out.idle_s[run_id] = round(run.idle_s(now), 1)
        if dry_run:
            logger.info("would reap run %s in %s: %s", run_id, namespace, ", ".join(run.names))
            out.would_delete += run.names
            continue
        logger.info("reaping run %s in %s: %s", run_id, namespace, ", ".join(run.names))
        deadline = Deadline(timeout_s)
        gone = Deletions(run_id)
        delete_workload(api, namespace, gone, deadline)
        for name in run.domains:
            delete_domain(api, namespace, name, deadline, gone)
        out.deleted += gone.deleted
        out.skipped += gone.skipped
    return out
