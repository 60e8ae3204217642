"""Pure ownership rules: what the spec hash covers, and which runs a reap may call dead."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from mnnvl.driver.ownership import FAILURE_ANNOTATION
from mnnvl.driver.reaper import RunObjects, Verdict, activity_times
from mnnvl.errors import SpecError
from mnnvl.inputs.spec import DomainSpec, OwnerRef, WorkloadSpec
from mnnvl.manifests import (
    SPEC_HASH_ANNOTATION,
    compute_domain,
    hash_of,
    indexed_job,
    spec_hash,
    with_spec_hash,
)

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_spec_hash_changes_with_the_module_but_not_with_owner_or_server_fields():
    workload = WorkloadSpec(run_id="r1", nodes=2, gpus_per_node=0)
    train = indexed_job(workload, "mnnvl.runtime.train", [])
    owned = indexed_job(
        WorkloadSpec(
            run_id="r1",
            nodes=2,
            gpus_per_node=0,
            owner=OwnerRef(api_version="v1", kind="Pod", name="launcher-2", uid="u2"),
        ),
        "mnnvl.runtime.train",
        [],
    )
    served = copy.deepcopy(with_spec_hash(train))
    served["status"] = {"active": 2}
    served["metadata"]["uid"] = "abc"
    assert spec_hash(owned) == spec_hash(train) == hash_of(served)
    assert spec_hash(indexed_job(workload, "mnnvl.runtime.verify", [])) != spec_hash(train)
    assert spec_hash(indexed_job(workload, "mnnvl.runtime.train", ["--steps", "9"])) != (
        spec_hash(train)
    )
    single = compute_domain(DomainSpec(run_id="r1"))
    every = compute_domain(DomainSpec(run_id="r1", allocation_mode="All"))
    assert spec_hash(single) != spec_hash(every)
    assert with_spec_hash(single)["metadata"]["annotations"] == {
        SPEC_HASH_ANNOTATION: spec_hash(single)
    }
    assert "annotations" not in single["metadata"]  # the builder's dict is not changed
    assert hash_of(single) == ""


@pytest.mark.parametrize(
    ("live", "all_dead", "older_than_s", "phrase"),
    [
        (frozenset(), False, 0.0, "is empty, which would reap every run"),
        (None, False, 0.0, "reap needs to know which runs are dead"),
        (frozenset({"a"}), True, 0.0, "contradicts live_run_ids"),
        (None, False, -1.0, "out of range"),
    ],
)
def test_reap_without_a_clear_dead_set_is_bad_input(live, all_dead, older_than_s, phrase):
    with pytest.raises(SpecError, match=phrase):
        Verdict(live_run_ids=live, all_dead=all_dead, older_than_s=older_than_s)


def run_idle_for(seconds: float, run_id: str = "r1") -> RunObjects:
    run = RunObjects(run_id, "ns")
    run.saw(NOW - timedelta(seconds=seconds))
    return run


def test_reap_dead_means_not_live_and_idle_long_enough():
    live_and_age = Verdict(live_run_ids=frozenset({"r1"}), all_dead=False, older_than_s=60)
    assert not live_and_age.is_dead(run_idle_for(3600, "r1"), NOW)  # listed live: kept
    assert live_and_age.is_dead(run_idle_for(120, "r2"), NOW)
    assert not live_and_age.is_dead(run_idle_for(10, "r2"), NOW)  # too fresh to judge
    everything = Verdict(live_run_ids=frozenset(), all_dead=True, older_than_s=0)
    assert everything.is_dead(run_idle_for(0), NOW)
    age_only = Verdict(live_run_ids=None, all_dead=False, older_than_s=60)
    assert age_only.is_dead(run_idle_for(61), NOW) and not age_only.is_dead(run_idle_for(59), NOW)


def test_a_run_queued_for_admission_longer_than_the_age_bound_is_not_reaped():
    """The shipped hourly reaper (--older-than-s) must not delete a run whose Job waits in a
    Kueue queue (suspended) with no limit: waiting for admission is activity now. The record of
    a failed step is suspended too, and is a leftover."""
    hourly = Verdict(live_run_ids=None, all_dead=False, older_than_s=172800)
    queued = {
        "kind": "Job",
        "metadata": {"creationTimestamp": stamp(3 * 86400), "annotations": {}},
        "spec": {"suspend": True},
        "status": {"conditions": [{"type": "Suspended", "lastTransitionTime": stamp(3 * 86400)}]},
    }
    run = RunObjects("r1", "ns")
    for when in activity_times(queued, NOW):
        run.saw(when)
    assert not hourly.is_dead(run, NOW)

    record = copy.deepcopy(queued)
    record["metadata"]["annotations"][FAILURE_ANNOTATION] = "{}"
    left = RunObjects("r2", "ns")
    for when in activity_times(record, NOW):
        left.saw(when)
    assert hourly.is_dead(left, NOW)


def test_activity_is_the_latest_object_or_pod_transition_and_running_is_now():
    finished = {
        "kind": "Pod",
        "metadata": {"creationTimestamp": stamp(3600)},
        "status": {
            "phase": "Succeeded",
            "startTime": stamp(3590),
            "conditions": [{"type": "Ready", "lastTransitionTime": stamp(600)}],
            "containerStatuses": [
                {"state": {"terminated": {"startedAt": stamp(3590), "finishedAt": stamp(30)}}}
            ],
        },
    }
    run = RunObjects("r1", "ns")
    for when in activity_times(finished, NOW):
        run.saw(when)
    assert run.idle_s(NOW) == 30
    running = {"kind": "Pod", "metadata": {"creationTimestamp": stamp(86400)}}
    running["status"] = {"phase": "Running", "startTime": stamp(86400)}
    assert activity_times(running, NOW) == [NOW]
