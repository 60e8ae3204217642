"""Find and delete what runs left behind when their exit handler never ran.

KFP Terminate and Argo ``terminate`` can skip exit handlers; every object we create carries
``app.kubernetes.io/managed-by=mnnvl-pipelines`` and the run id, so the reaper groups objects
by run and deletes the runs the caller says are dead (or that are older than a cutoff),
workload first, then the domain, exactly as teardown does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from mnnvl.driver.api import COMPUTE_DOMAIN, JOB, RESOURCE_CLAIM_TEMPLATE, SERVICE, Api
from mnnvl.driver.domain import delete_domain
from mnnvl.driver.errors import NotFound
from mnnvl.driver.wait import Deadline
from mnnvl.driver.workload import age_s, delete_workload
from mnnvl.names import LABEL_MANAGED_BY, LABEL_RUN_ID, MANAGED_BY, MANAGED_SELECTOR

logger = logging.getLogger(__name__)


@dataclass
class RunObjects:
    """What one run has left in one namespace."""

    run_id: str
    namespace: str
    names: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    newest_age_s: float = float("inf")


def find_runs(api: Api, namespace: str) -> dict[str, RunObjects]:
    """Objects we manage in ``namespace``, grouped by run id."""
    runs: dict[str, RunObjects] = {}
    for kind in (COMPUTE_DOMAIN, JOB, SERVICE, RESOURCE_CLAIM_TEMPLATE):
        try:
            items: list[dict[str, Any]] = api.list(
                kind, namespace, label_selector=MANAGED_SELECTOR
            )["items"]
        except NotFound:
            # No ComputeDomain CRD: nothing of that kind can be left over.
            continue
        for obj in items:
            labels = obj["metadata"].get("labels") or {}
            run_id = labels.get(LABEL_RUN_ID)
            if not run_id:
                continue
            run = runs.setdefault(run_id, RunObjects(run_id, namespace))
            run.names.append(f"{kind.kind} {namespace}/{obj['metadata']['name']}")
            run.newest_age_s = min(run.newest_age_s, age_s(obj))
            if kind is COMPUTE_DOMAIN:
                run.domains.append(obj["metadata"]["name"])
    return runs


def is_dead(run: RunObjects, live_run_ids: set[str] | None, older_than_s: float) -> bool:
    """Dead = not among the live runs the caller listed, or untouched for ``older_than_s``."""
    if live_run_ids is not None and run.run_id not in live_run_ids:
        return True
    return older_than_s > 0 and run.newest_age_s >= older_than_s


def reap_namespace(
    api: Api,
    namespace: str,
    *,
    live_run_ids: set[str] | None,
    older_than_s: float,
    timeout_s: float,
) -> tuple[list[str], list[str]]:
    """Delete dead runs in one namespace; return (run ids reaped, objects deleted)."""
    reaped: list[str] = []
    deleted: list[str] = []
    for run_id, run in sorted(find_runs(api, namespace).items()):
        if not is_dead(run, live_run_ids, older_than_s):
            continue
        logger.info("reaping run %s in %s: %s", run_id, namespace, ", ".join(run.names))
        deadline = Deadline(timeout_s)
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_RUN_ID}={run_id}"
        deleted += delete_workload(api, namespace, selector, deadline)
        for name in run.domains:
            if delete_domain(api, namespace, name, deadline):
                deleted.append(f"ComputeDomain {namespace}/{name}")
        reaped.append(run_id)
    return reaped, deleted
