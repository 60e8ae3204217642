"""Which pod states a wait treats as permanent: at once, after a grace period, or never."""

from __future__ import annotations

import pytest

from mnnvl.driver.diagnose import Grace, pod_problem
from mnnvl.errors import ProblemKind
from mnnvl.inputs.spec import from_inputs


def pod(phase="Pending", waiting="", unschedulable="", name="p-0"):
    status: dict = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting}}}]
    if unschedulable:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        ]
    return {"metadata": {"name": name}, "status": status}


def prepare(message):
    return {"reason": "FailedPrepareDynamicResources", "message": message}


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("ErrImageNeverPull", ProblemKind.IMAGE_PULL),
        ("InvalidImageName", ProblemKind.IMAGE_REFERENCE),
        ("ImagePullBackOff", ProblemKind.IMAGE_PULL),
        ("CreateContainerConfigError", ProblemKind.CONFIG),
        ("CrashLoopBackOff", ProblemKind.CRASH_LOOP),
    ],
)
def test_image_and_config_errors_are_fatal_at_once(reason, kind):
    found = pod_problem(pod(waiting=reason), None, retries=True, grace=Grace(60))
    assert found is not None and found.kind is kind and found.permanent and found.pod == "p-0"


def test_container_creating_is_not_a_problem():
    creating = pod(waiting="ContainerCreating")
    assert pod_problem(creating, None, retries=False, grace=Grace(0)) is None


def test_claim_in_another_namespace_than_its_domain_is_fatal_at_once():
    event = prepare("claim namespace team-b does not match ComputeDomain namespace team-a")
    found = pod_problem(pod(waiting="ContainerCreating"), event, retries=False, grace=Grace(60))
    assert found is not None and found.kind is ProblemKind.PREPARE and found.permanent
    assert "claim namespace team-b does not match" in found.message


def test_node_held_by_another_domain_is_fatal_only_after_the_grace(clock):
    event = prepare("error labeling node: label already exists for a different ComputeDomain")
    grace = Grace(30, clock)
    stuck = pod(waiting="ContainerCreating")
    assert pod_problem(stuck, event, retries=False, grace=grace) is None
    clock.sleep(29.5)
    assert pod_problem(stuck, event, retries=False, grace=grace) is None
    assert grace.recheck_in_s() == 0.5
    clock.sleep(0.5)
    found = pod_problem(stuck, event, retries=False, grace=grace)
    assert found is not None and found.kind is ProblemKind.NODE_HELD and not found.permanent
    assert "30 s" in found.message and "different ComputeDomain" in found.message


def test_an_ordinary_not_ready_prepare_error_is_waited_out():
    event = prepare("error asserting ComputeDomain Ready: current node not ready in ComputeDomain")
    grace = Grace(0)
    assert pod_problem(pod(waiting="ContainerCreating"), event, retries=False, grace=grace) is None
    assert grace.recheck_in_s() is None


def test_unschedulable_grace_restarts_when_the_pod_recovers_and_forgets_gone_pods(clock):
    grace = Grace(30, clock)
    bad = pod(unschedulable="0/4 nodes are available")
    assert pod_problem(bad, None, retries=False, grace=grace) is None
    clock.sleep(20)
    pod_problem(pod(), None, retries=False, grace=grace)  # scheduled after all
    assert grace.recheck_in_s() is None
    pod_problem(bad, None, retries=False, grace=grace)
    clock.sleep(20)  # 40 s unschedulable in all, 20 s since it was scheduled
    assert pod_problem(bad, None, retries=False, grace=grace) is None
    assert grace.recheck_in_s() == 10
    grace.retain([])  # the pod is gone
    assert grace.recheck_in_s() is None


def test_a_failed_pod_is_fatal_only_without_retries():
    failed = pod(phase="Failed")
    failed["status"]["containerStatuses"] = [{"state": {"terminated": {"exitCode": 4}}}]
    found = pod_problem(failed, None, retries=False, grace=Grace(0))
    assert found is not None and found.kind is ProblemKind.CRASHED and found.exit_code == 4
    assert found.permanent  # 4 is a code no retry changes
    assert pod_problem(failed, None, retries=True, grace=Grace(0)) is None


def test_a_jobs_index_lists_read_as_sets() -> None:
    from mnnvl.driver.diagnose import index_set

    assert index_set("1,3-5") == {1, 3, 4, 5}
    assert index_set("") == set()
    assert index_set("0") == {0}


def attempt(index: int, failures: int, phase: str = "Failed", code: int = 1) -> dict:
    """A pod of index ``index`` after ``failures`` counted failures of its index."""
    annotations = {
        "batch.kubernetes.io/job-completion-index": str(index),
        "batch.kubernetes.io/job-index-failure-count": str(failures),
    }
    meta = {"name": f"j-{index}-a{failures}", "uid": f"u{index}-{failures}"}
    status: dict = {"phase": phase}
    if phase == "Failed":
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": code}}}]
    return {"metadata": {**meta, "annotations": annotations}, "status": status}


def test_the_last_failures_are_each_index_s_last_attempt_failed_indexes_first() -> None:
    from mnnvl.driver.diagnose import last_failures

    pods = [attempt(1, 0, code=137), attempt(1, 1), attempt(0, 0), attempt(1, 2, "Running")]
    assert [p["metadata"]["name"] for p in last_failures(pods, {1})] == ["j-1-a1", "j-0-a0"]
    assert [p["metadata"]["name"] for p in last_failures(pods, set())] == ["j-1-a1", "j-0-a0"]
    assert [p["metadata"]["name"] for p in last_failures(pods, {0})] == ["j-0-a0", "j-1-a1"]


def test_a_restart_leaves_the_replacement_the_job_already_made_and_costs_one_failure() -> None:
    from mnnvl.driver.gang import Gang
    from mnnvl.inputs.spec import WorkloadSpec

    deleted: list[str] = []

    class Api:
        def get(self, kind, namespace, name):  # the run's ComputeDomain is there
            return {"metadata": {}}

        def delete(self, kind, namespace, name, uid=None):
            deleted.append(name)

    # Index 1 failed and the Job controller replaced it before the driver looked.
    failed, replacement, peer = attempt(1, 0), attempt(1, 1, "Pending"), attempt(0, 0, "Running")
    pods = {p["metadata"]["name"]: p for p in (failed, replacement, peer)}
    gang = Gang(Api(), from_inputs(WorkloadSpec, run_id="r1", max_restarts=1))  # type: ignore[arg-type]
    assert gang.check(pods, None)
    assert deleted == ["j-0-a0"]  # not the replacement: its index would fail a second time
    assert replacement["metadata"]["uid"] not in gang.old  # it is the next generation
