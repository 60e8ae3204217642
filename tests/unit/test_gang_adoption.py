"""A step that adopts a running Job judges the failures it finds: restart the gang only for a
failure some live rank predates (a survivor may be blocked on the lost rank), never for one
every rank was replaced after, nor once an index has succeeded."""

from __future__ import annotations

from typing import Any

import pytest

from mnnvl.driver.gang import Gang
from mnnvl.inputs.spec import WorkloadSpec, from_inputs
from mnnvl.manifests import JOB_NAME_LABEL

INDEX = "batch.kubernetes.io/job-completion-index"
T = "2026-12-01T10:00:{:02d}Z"


class DeletingApi:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def get(self, kind: Any, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}}  # the run's ComputeDomain, not being deleted

    def delete(self, kind: Any, namespace: str, name: str, **kwargs: Any) -> bool:
        self.deleted.append(name)
        return True


def pod(name: str, index: int, phase: str, created: int, finished: int | None = None) -> Any:
    status: dict[str, Any] = {"phase": phase}
    if finished is not None:
        term = {"exitCode": 137, "reason": "Error", "finishedAt": T.format(finished)}
        status["containerStatuses"] = [{"state": {"terminated": term}}]
    meta = {
        "name": name,
        "uid": f"uid-{name}",
        "creationTimestamp": T.format(created),
        "labels": {JOB_NAME_LABEL: "j"},
        "annotations": {INDEX: str(index)},
    }
    return {"metadata": meta, "status": status}


def first_sight(*pods: Any, restarts: bool | None = None) -> list[str]:
    """What a step that adopts the Job deletes on its first look at these pods."""
    api = DeletingApi()
    workload = from_inputs(WorkloadSpec, run_id="r", namespace="ns", nodes=2, max_restarts=4)
    restarted = Gang(api, workload).check({p["metadata"]["name"]: p for p in pods}, None)  # type: ignore[arg-type]
    assert restarted == (bool(api.deleted) if restarts is None else restarts)
    return api.deleted


def test_a_failure_a_live_rank_predates_restarts_the_gang() -> None:
    survivor = pod("j-0-a", 0, "Running", created=0)
    lost = pod("j-1-a", 1, "Failed", created=0, finished=20)
    replacement = pod("j-1-b", 1, "Running", created=21)
    # The replacement the Job controller already made belongs to the next generation: deleting
    # it would count a second failure against its index for one restart.
    assert first_sight(survivor, lost, replacement, restarts=True) == ["j-0-a"]


@pytest.mark.parametrize("created", [20, 21])
def test_a_failure_every_rank_was_replaced_after_is_history_unless_in_the_same_second(
    created: int,
) -> None:
    old = [pod("j-0-a", 0, "Failed", 0, finished=20), pod("j-1-a", 1, "Failed", 0, finished=20)]
    fresh = [pod("j-0-b", 0, "Running", created), pod("j-1-b", 1, "Running", created)]
    # Same second: a doubt counts a restart, which deletes nothing (every pod is a replacement).
    assert first_sight(*old, *fresh, restarts=created == 20) == []


def test_ranks_all_failed_and_not_replaced_yet_count_a_restart_that_deletes_nothing() -> None:
    old = [pod("j-0-a", 0, "Failed", 0, finished=20), pod("j-1-a", 1, "Failed", 0, finished=20)]
    assert first_sight(*old, restarts=True) == []


def test_no_restart_once_an_index_has_succeeded() -> None:
    done = pod("j-1-b", 1, "Succeeded", created=5)
    assert (
        first_sight(pod("j-0-a", 0, "Failed", 0, finished=20), pod("j-0-b", 0, "Running", 3), done)
        == []
    )
