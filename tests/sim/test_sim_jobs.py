"""The simulated Job controller against batch/v1 semantics (Kubernetes 1.34): per-index
backoff, maxFailedIndexes, podFailurePolicy, the 1.31+ condition sequence and reasons,
suspend, ttlSecondsAfterFinished, and the optional Kueue stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mnnvl.sim import SimCluster
from tests.sim.simkit import GATED, Raw, wait_for

JOBS = "/apis/batch/v1/namespaces/default/jobs"
PODS = "/api/v1/namespaces/default/pods"
EXIT_BY_INDEX = (
    "import os, sys\n"
    "index = int(os.environ['JOB_COMPLETION_INDEX'])\n"
    "sys.exit(int(os.environ['CODES'].split(',')[index]))\n"
)


def job(name: str, codes: str, completions: int = 2, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "sim",
        "command": ["python3", "-c", EXIT_BY_INDEX],
        "env": [{"name": "CODES", "value": codes}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **spec.pop("metadata", {})},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            **spec,
        },
    }


def conditions(raw: Raw, name: str) -> dict[str, dict[str, Any]]:
    st = raw.get(f"{JOBS}/{name}").get("status") or {}
    return {c["type"]: c for c in st.get("conditions") or []}


def finished(raw: Raw, name: str) -> dict[str, dict[str, Any]] | None:
    conds = conditions(raw, name)
    return conds if {"Complete", "Failed"} & set(conds) else None


def pods_of(raw: Raw, name: str) -> list[dict[str, Any]]:
    return list(raw.call("GET", PODS, labelSelector=f"job-name={name}")["items"])


SIM = dict(nodes=4, local_gpus=[], schedule_delay_s=0.05)


def test_complete_job_has_success_criteria_met_then_complete_with_real_reasons(raw: Raw) -> None:
    raw.call("POST", JOBS, job("ok", "0,0"))
    conds = wait_for(lambda: finished(raw, "ok"), what="Job done")
    assert conds["SuccessCriteriaMet"]["reason"] == "CompletionsReached"
    assert conds["Complete"]["reason"] == "CompletionsReached"
    assert "Failed" not in conds
    st = raw.get(f"{JOBS}/ok")["status"]
    assert (st["succeeded"], st["completedIndexes"], st["terminating"]) == (2, "0-1", 0)


def test_fail_job_rule_sets_failure_target_then_failed_naming_the_exit_code(raw: Raw) -> None:
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    body = job("failjob", "42,0", backoffLimit=6, podFailurePolicy=policy)
    raw.call("POST", JOBS, body)
    conds = wait_for(lambda: finished(raw, "failjob"), what="Job failed")
    assert conds["FailureTarget"]["reason"] == conds["Failed"]["reason"] == "PodFailurePolicy"
    assert (
        "failed with exit code 42 matching FailJob rule at index 0" in (conds["Failed"]["message"])
    )
    assert "Complete" not in conds


def test_ignore_rule_does_not_count_and_the_index_is_retried(raw: Raw) -> None:
    policy = {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}}]}
    body = job("ignored", "3", completions=1, backoffLimit=0, podFailurePolicy=policy)
    raw.call("POST", JOBS, body)
    wait_for(lambda: len(pods_of(raw, "ignored")) >= 3, what="retries")  # never counted
    assert raw.get(f"{JOBS}/ignored")["status"]["failed"] == 0
    assert not finished(raw, "ignored")
    raw.call("DELETE", f"{JOBS}/ignored", {"propagationPolicy": "Background"})


def test_backoff_limit_per_index_fails_only_that_index_then_failed_indexes(raw: Raw) -> None:
    raw.call("POST", JOBS, job("perindex", "0,1", backoffLimitPerIndex=1))
    conds = wait_for(lambda: finished(raw, "perindex"), what="Job failed")
    st = raw.get(f"{JOBS}/perindex")["status"]
    assert conds["Failed"]["reason"] == "FailedIndexes"
    assert (st["completedIndexes"], st["failedIndexes"], st["failed"]) == ("0", "1", 2)


def test_on_failure_restarts_in_the_pod_count_against_the_backoff_limit(raw: Raw) -> None:
    # restartPolicy OnFailure: the kubelet restarts index 1's container in its pod; at the
    # limit of those restarts the Job fails, with no pod made again.
    body = job("onfailure", "0,1", backoffLimit=2)
    body["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    raw.call("POST", JOBS, body)
    conds = wait_for(lambda: finished(raw, "onfailure"), what="Job failed")
    assert conds["Failed"]["reason"] == "BackoffLimitExceeded"
    assert sorted(p["metadata"]["labels"][INDEX] for p in pods_of(raw, "onfailure")) <= ["0", "1"]


def test_max_failed_indexes_fails_the_job_early(raw: Raw) -> None:
    body = job("maxfailed", "1,1,1,1", completions=4, backoffLimitPerIndex=0, maxFailedIndexes=1)
    raw.call("POST", JOBS, body)
    conds = wait_for(lambda: finished(raw, "maxfailed"), what="Job failed")
    assert conds["Failed"]["reason"] == "MaxFailedIndexesExceeded"
    assert conds["Failed"]["message"] == (
        "Job has exceeded the specified maximal number of failed indexes"
    )


def test_fail_index_rule_stops_retrying_that_index(raw: Raw) -> None:
    policy = {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [5]}}]}
    body = job("failindex", "5,0", backoffLimitPerIndex=3, podFailurePolicy=policy)
    raw.call("POST", JOBS, body)
    wait_for(lambda: finished(raw, "failindex"), what="Job failed")
    assert len([p for p in pods_of(raw, "failindex") if p["metadata"]["labels"][
        "batch.kubernetes.io/job-completion-index"] == "0"]) == 1  # fmt: skip


SLEEP = "import time; time.sleep(300)"
INDEX = "batch.kubernetes.io/job-completion-index"
FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
TRACKING = "batch.kubernetes.io/job-tracking"


def running_pod(raw: Raw, name: str, index: int) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        return next(
            (
                p
                for p in pods_of(raw, name)
                if p["metadata"]["labels"][INDEX] == str(index)
                and p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            ),
            None,
        )

    return dict(wait_for(find, timeout=20, what=f"index {index} running"))


def test_a_deleted_running_pod_is_failed_and_counted_against_its_index(raw: Raw) -> None:
    # As the driver's gang restart deletes pods: with a podFailurePolicy the kubelet first moves
    # the deleted pod to Failed (exit 143 on SIGTERM) and the Job controller counts it, so two
    # deletions of index 1 use up backoffLimitPerIndex 1 and fail the Job.
    policy = {
        "rules": [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            }
        ]
    }
    body = job(
        "deleted", "0,0", backoffLimitPerIndex=1, maxFailedIndexes=0, podFailurePolicy=policy
    )
    body["spec"]["podReplacementPolicy"] = "Failed"
    body["spec"]["template"]["spec"]["containers"][0]["command"][2] = SLEEP
    raw.call("POST", JOBS, body)
    first = running_pod(raw, "deleted", 1)
    assert first["metadata"]["annotations"][FAILURE_COUNT] == "0"
    raw.call("DELETE", f"{PODS}/{first['metadata']['name']}", {"gracePeriodSeconds": 1})
    second = running_pod(raw, "deleted", 1)
    assert second["metadata"]["annotations"][FAILURE_COUNT] == "1"
    st = raw.get(f"{JOBS}/deleted")["status"]
    assert (st["failed"], st.get("failedIndexes")) == (1, "")
    assert raw.gone(f"{PODS}/{first['metadata']['name']}")  # counted, then removed
    raw.call("DELETE", f"{PODS}/{second['metadata']['name']}", {"gracePeriodSeconds": 1})
    conds = wait_for(lambda: finished(raw, "deleted"), timeout=20, what="Job failed")
    st = raw.get(f"{JOBS}/deleted")["status"]
    assert conds["Failed"]["reason"] == "MaxFailedIndexesExceeded"
    # index 0's pod, deleted by the controller once the Job failed, is counted as well
    assert (st["failed"], st["failedIndexes"]) == (3, "1")
    raw.call("DELETE", f"{JOBS}/deleted", {"propagationPolicy": "Background"})
    wait_for(lambda: pods_of(raw, "deleted") == [], timeout=20, what="pods gone")


def test_suspended_job_creates_no_pods_until_resumed(raw: Raw) -> None:
    raw.call("POST", JOBS, job("parked", "0,0", suspend=True))
    conds = wait_for(lambda: conditions(raw, "parked").get("Suspended"), what="Suspended")
    assert (conds["status"], conds["reason"]) == ("True", "JobSuspended")
    assert pods_of(raw, "parked") == []
    assert "startTime" not in raw.get(f"{JOBS}/parked")["status"]
    raw.call("PATCH", f"{JOBS}/parked", {"spec": {"suspend": False}})
    conds = wait_for(lambda: finished(raw, "parked"), what="Job done")
    assert "Complete" in conds
    assert (conds["Suspended"]["status"], conds["Suspended"]["reason"]) == ("False", "JobResumed")


def test_ttl_after_finished_deletes_the_job(raw: Raw) -> None:
    raw.call("POST", JOBS, job("shortlived", "0", completions=1, ttlSecondsAfterFinished=1))
    wait_for(lambda: raw.gone(f"{JOBS}/shortlived"), timeout=15, what="Job deleted by TTL")


def test_kueue_stand_in_admits_queued_jobs_in_turn_as_capacity_frees(tmp_path: Path) -> None:
    with SimCluster(
        nodes=2, local_gpus=[], schedule_delay_s=0.05, kueue=True, kueue_admission_delay_s=0.3
    ) as sim:
        raw = Raw(sim)
        queue = {"labels": {"kueue.x-k8s.io/queue-name": "team"}}
        sleeper = job("first", "0,0", metadata=queue)
        container = sleeper["spec"]["template"]["spec"]["containers"][0]
        container["command"][2] = GATED  # runs until the test opens the gate
        container["env"] = [{"name": "GATE", "value": str(tmp_path / "gate")}]
        created = raw.call("POST", JOBS, sleeper)
        assert created["spec"]["suspend"] is True  # the webhook suspends on create
        raw.call("POST", JOBS, job("second", "0,0", metadata=queue))
        assert pods_of(raw, "first") == []
        wait_for(lambda: len(pods_of(raw, "first")) == 2, what="first admitted")
        # both nodes are taken: the second waits until the first has finished
        assert raw.get(f"{JOBS}/second")["spec"]["suspend"] is True
        (tmp_path / "gate").touch()
        wait_for(lambda: finished(raw, "first"), what="first done")
        wait_for(lambda: finished(raw, "second"), what="second done")
        first_end = conditions(raw, "first")["Complete"]["lastTransitionTime"]
        second_start = raw.get(f"{JOBS}/second")["status"]["startTime"]
        assert second_start >= first_end


def test_an_orphaned_pod_loses_its_tracking_finalizer_and_no_namesake_does(raw: Raw) -> None:
    # The Job controller releases a pod without a controlling Job by that pod alone: a pod of
    # the same name in another namespace, whose Job still runs, keeps its finalizer.
    raw.call("POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    wait_for(lambda: raw.get("/api/v1/namespaces/other/serviceaccounts/default"))
    body = job("kept", "0", completions=1)
    body["spec"]["template"]["spec"]["containers"][0]["command"][2] = SLEEP
    raw.call("POST", "/apis/batch/v1/namespaces/other/jobs", body)
    pods = "/api/v1/namespaces/other/pods"
    kept = wait_for(lambda: raw.call("GET", pods, labelSelector="job-name=kept")["items"])[0]
    name = kept["metadata"]["name"]
    assert kept["metadata"]["finalizers"] == [TRACKING]
    orphan = {
        "metadata": {"name": name, "finalizers": [TRACKING]},
        "spec": {"containers": [{"name": "main", "image": "sim", "command": ["true"]}]},
    }
    raw.call("POST", PODS, orphan)
    wait_for(lambda: not raw.get(f"{PODS}/{name}")["metadata"].get("finalizers"))
    assert raw.get(f"{pods}/{name}")["metadata"]["finalizers"] == [TRACKING]
    raw.call(
        "DELETE", "/apis/batch/v1/namespaces/other/jobs/kept", {"propagationPolicy": "Background"}
    )
