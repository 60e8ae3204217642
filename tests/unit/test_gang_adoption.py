"""A step that adopts a running Job judges the failures it finds: restart the gang only for a
failure some live rank predates (a survivor may be blocked on the lost rank), never for one
every rank was replaced after, nor once an index has succeeded, nor for the pods a restart
already under way is deleting; and those pods never count as the new generation running."""

from __future__ import annotations

from typing import Any

import pytest

from mnnvl.contract.termination import STOP, Evidence
from mnnvl.driver import lifecycle
from mnnvl.driver.diagnose import FAILURE_COUNT
from mnnvl.driver.gang import Gang
from mnnvl.errors import WorkloadFailed
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


def leaving(p: Any, at: int) -> Any:
    """``p`` deleted at second ``at`` and still Terminating (its container still runs)."""
    p["metadata"]["deletionTimestamp"] = T.format(at)
    return p


def counted(p: Any, failures: int, exit_code: int | None = None) -> Any:
    """``p`` with its index's failures so far (the Job controller's annotation)."""
    p["metadata"]["annotations"][FAILURE_COUNT] = str(failures)
    if exit_code is not None:
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = exit_code
    return p


def test_a_step_adopting_its_job_in_the_middle_of_a_gang_restart_does_not_restart_it_again() -> (
    None
):
    # An earlier attempt of the step restarted the gang and was lost: rank 1 had failed, rank
    # 0 was deleted and is still Terminating, the Job controller has replaced rank 1.
    lost = counted(pod("j-1-a", 1, "Failed", created=0, finished=20), 0)
    old0 = counted(leaving(pod("j-0-a", 0, "Running", created=0), at=21), 0)
    new1 = counted(pod("j-1-b", 1, "Running", created=22), 1)
    api = DeletingApi()
    workload = from_inputs(WorkloadSpec, run_id="r", namespace="ns", nodes=2, max_restarts=1)
    gang = Gang(api, workload)  # type: ignore[arg-type]
    assert gang.check(by_name(lost, old0, new1), None) is False
    # The deleted rank 0 turns Failed (143, its SIGTERM) on its way out and is replaced: that
    # is the restart already under way, not a new fault (it used to delete the healthy
    # replacement of rank 1, or fail the step with --max-restarts 1).
    gone = counted(pod("j-0-a", 0, "Failed", created=0, finished=23), 0, exit_code=143)
    new0 = counted(pod("j-0-b", 0, "Pending", created=24), 1)
    assert gang.check(by_name(lost, gone, new1, new0), None) is False
    assert api.deleted == [] and gang.restarts == []


def by_name(*pods: Any) -> dict[str, Any]:
    return {p["metadata"]["name"]: p for p in pods}


class Followed:
    """Stands in for the log follower: which pod it was asked to follow."""

    pods: list[str] = []

    def __init__(self, api: Any, namespace: str, pod: str, on_line: Any = None) -> None:
        Followed.pods.append(pod)


def test_right_after_a_restart_the_deleted_generation_does_not_count_as_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle, "LogFollower", Followed)
    Followed.pods = []
    workload = from_inputs(WorkloadSpec, run_id="r", namespace="ns", nodes=2, max_restarts=4)
    watch = lifecycle.JobWatch(DeletingApi(), workload, "j", follow=True)  # type: ignore[arg-type]
    job = {"metadata": {"name": "j", "uid": "job-uid"}, "spec": {"parallelism": 2}, "status": {}}
    old0 = leaving(pod("j-0-a", 0, "Running", created=0), at=21)  # deleted by the restart
    old1 = pod("j-1-a", 1, "Failed", created=0, finished=20)
    new1 = pod("j-1-b", 1, "Running", created=22)
    for p in (old0, old1, new1):
        p["spec"] = {"nodeName": "n"}

    def view(*pods: Any) -> Any:
        return {"job": {"j": job}, "pods": by_name(*pods), "events": {}, "created/j": {}}

    assert watch.check(view(old0, old1, new1)) is None
    # Index 0 has no pod of the new generation yet: the job deadline has not started and the
    # old rank 0, on its way out, is not followed.
    assert watch.job_deadline is None and Followed.pods == []
    new0 = pod("j-0-b", 0, "Running", created=24)
    new0["spec"] = {"nodeName": "n"}
    assert watch.check(view(old1, new1, new0)) is None
    assert watch.job_deadline is not None and Followed.pods == ["j-0-b"]


def test_a_failure_the_workers_launcher_says_no_restart_can_change_ends_the_step() -> None:
    said = Evidence(verdict=STOP, reason="module-not-found", rank=1, exit_code=1)
    said.error = "ModuleNotFoundError: No module named 'no.such'"
    lost = pod("j-1-a", 1, "Failed", created=0, finished=20)
    lost["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = said.to_message()
    survivor = pod("j-0-a", 0, "Running", created=0)
    api = DeletingApi()
    workload = from_inputs(WorkloadSpec, run_id="r", namespace="ns", nodes=2, max_restarts=3)
    with pytest.raises(WorkloadFailed) as info:
        Gang(api, workload).check(by_name(survivor, lost), None)  # type: ignore[arg-type]
    assert info.value.exit_code == 4 and api.deleted == []
    assert "no restart can change (module-not-found" in str(info.value)
    assert "No module named 'no.such'" in str(info.value)


def test_a_failure_the_jobs_pod_failure_policy_ends_it_is_never_restarted() -> None:
    # Rank 1 could not start its program (exit 128: FailJob in the Job's podFailurePolicy), and
    # the Job controller took rank 0, which never started, with it. Seen before the Job's
    # FailureTarget condition, rank 0's failure has a retry left; still nothing is restarted:
    # the Job's condition says why it failed.
    cannot_start = pod("j-1-a", 1, "Failed", created=0, finished=20)
    cannot_start["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 128
    taken = pod("j-0-a", 0, "Failed", created=0)  # no container ever ran
    assert first_sight(taken, cannot_start, restarts=False) == []
