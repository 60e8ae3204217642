"""Diagnosis is data: callers decide exit codes and fail-fast from a Problem's kind, so rewording
every sentence changes no decision, and nothing parses the driver's own sentences back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from mnnvl.driver import problem as problem_module
from mnnvl.driver.diagnose import Grace, raise_on_stuck_pod
from mnnvl.driver.problem import TEMPLATES
from mnnvl.driver.refusal import refusal_problem
from mnnvl.errors import MnnvlError, ProblemKind
from mnnvl.inputs.names import LABEL_CLIQUE_GROUP
from mnnvl.inputs.spec import WorkloadSpec, from_inputs

DRIVER = Path(problem_module.__file__).parent
RUN = "run-a"


class QuietApi:
    """An API that has no events, no domain and no logs (diagnostics never raise)."""

    def list(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"items": []}

    def get(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise MnnvlError("not found")

    def pod_log(self, *args: Any, **kwargs: Any) -> str:
        return "boom"


def _pod(
    *,
    phase: str = "Pending",
    waiting: str = "",
    said: str = "",
    unschedulable: str = "",
    code: int | None = None,
    reason: str = "Error",
    pod_reason: str = "",
    group: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting, "message": said}}}]
    if code is not None:
        term = {"exitCode": code, "reason": reason}
        status["containerStatuses"] = [{"state": {"terminated": term}}]
    if pod_reason:
        status["reason"], status["message"] = pod_reason, "IMEX daemon of node n1 gone"
    if unschedulable:
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        status["conditions"] = [cond | {"message": unschedulable}]
    labels = {LABEL_CLIQUE_GROUP: group} if group is not None else {}
    meta = {"name": "p-0", "uid": "u0", "labels": labels}
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": status}


POD_CASES = {
    "image": _pod(waiting="ImagePullBackOff"),
    "config": _pod(waiting="CreateContainerConfigError", said='secret "creds" not found'),
    "crash loop": _pod(phase="Running", waiting="CrashLoopBackOff"),
    "crashed": _pod(phase="Failed", code=1),
    "bad input": _pod(phase="Failed", code=2),
    "oom": _pod(phase="Failed", code=137, reason="OOMKilled"),
    "stalled": _pod(phase="Failed", code=12),
    "collective": _pod(phase="Failed", code=11),
    "lost node": _pod(phase="Failed", code=137, pod_reason="IMEXDomainLost"),
    "missing claim": _pod(
        unschedulable='0/4 nodes are available: persistentvolumeclaim "data" not found.'
    ),
    "unschedulable": _pod(unschedulable="0/4 nodes are available: 4 Insufficient nvidia.com/gpu"),
    "no clique room": _pod(unschedulable="0/4 nodes are available", group="1"),
}
REFUSALS = {
    "pod security": 'pods "p" is forbidden: violates PodSecurity "restricted:latest": '
    "runAsNonRoot != true",
    "webhook": 'admission webhook "deny.example.com" denied the request: no GPUs on Fridays',
    "service account": 'pods "p" is forbidden: error looking up service account ns/trainer: '
    'serviceaccount "trainer" not found',
    "invalid": 'Pod "p" is invalid: spec.containers[0].image: Required value',
    "quota": 'pods "p" is forbidden: exceeded quota: q1, requested: pods=1, used: pods=1, '
    "limited: pods=1",
    "unknown": "Internal error occurred: failed calling webhook",
}


def _pod_outcome(case: str) -> tuple[Any, ...]:
    """What a caller decides for the pod: the error class, exit code and pod exit code, after
    a first check (fail at once?) and a second one past a grace of 0 s (fail after it?)."""
    workload = from_inputs(WorkloadSpec, run_id=RUN, namespace="ns", max_restarts=0, nodes=2)
    pods = {"p-0": POD_CASES[case]}
    seen: list[Any] = []
    for grace in (Grace(60), Grace(0)):
        try:
            raise_on_stuck_pod(QuietApi(), workload, pods, {}, grace)  # type: ignore[arg-type]
            seen.append(None)
        except MnnvlError as err:
            seen.append((type(err).__name__, err.exit_code, getattr(err, "pod_exit_code", None)))
    return tuple(seen)


def _refusal_outcome(case: str) -> tuple[Any, ...]:
    workload = WorkloadSpec(run_id=RUN, namespace="ns")
    seen: list[Any] = []
    for grace in (Grace(60), Grace(0)):
        found = refusal_problem(workload, "job-a", REFUSALS[case], grace)
        if found is None:
            seen.append(None)
        else:
            err = found.error(found.message)
            seen.append((found.kind, found.permanent, type(err).__name__, err.exit_code))
    return tuple(seen)


def _outcomes() -> dict[str, tuple[Any, ...]]:
    out = {f"pod {case}": _pod_outcome(case) for case in POD_CASES}
    out |= {f"refusal {case}": _refusal_outcome(case) for case in REFUSALS}
    return out


def test_rewording_every_message_changes_no_exit_code_and_no_fail_fast_decision(monkeypatch):
    before = _outcomes()
    for kind, template in list(TEMPLATES.items()):
        fields = " ".join(sorted(set(re.findall(r"\{[a-z_]+(?::[^}]*)?\}", template))))
        monkeypatch.setitem(TEMPLATES, kind, f"zz {kind.name.lower()} reworded {fields}")
    assert _outcomes() == before


def test_decisions_follow_the_kind():
    outcome = _outcomes()
    failed_now = ("WorkloadFailed", 4, None)
    for case in ("image", "config", "crash loop", "missing claim"):
        assert outcome[f"pod {case}"] == (failed_now, failed_now), case
    # A pod's own exit code travels with the error; retriable crashes fail too (no retries).
    assert outcome["pod oom"][0] == ("WorkloadFailed", 4, 137)
    assert outcome["pod stalled"][0] == ("WorkloadFailed", 4, 12)
    # Unschedulable waits out the grace, then fails.
    assert outcome["pod unschedulable"] == (None, failed_now)
    assert outcome["pod no clique room"] == (None, failed_now)
    for case in ("pod security", "webhook", "service account", "invalid"):
        first = outcome[f"refusal {case}"][0]
        assert first is not None and first[1:] == (True, "WorkloadFailed", 4), case
    assert outcome["refusal quota"] == (None, (ProblemKind.QUOTA, False, "WorkloadFailed", 4))
    assert outcome["refusal unknown"][0] is None


@pytest.mark.parametrize(
    ("case", "kind"),
    [
        ("crashed", ProblemKind.CRASHED),
        ("oom", ProblemKind.OOM_KILLED),
        ("stalled", ProblemKind.STALLED),
        ("collective", ProblemKind.COLLECTIVE_TIMEOUT),
        ("lost node", ProblemKind.LOST_NODE),
        ("missing claim", ProblemKind.MISSING_CLAIM),
    ],
)
def test_each_failure_has_its_own_kind(case, kind):
    from mnnvl.driver.diagnose import pod_problem

    found = pod_problem(POD_CASES[case], None, retries=False, grace=Grace(60))
    assert found is not None and found.kind is kind and found.pod == "p-0"


def test_a_gang_past_its_restarts_fails_with_the_pods_exit_code_however_it_is_worded(
    monkeypatch,
):
    from mnnvl.driver.diagnose import FAILURE_COUNT
    from mnnvl.driver.gang import Gang

    # The one restart was for a lost node (DisruptionTarget: no retry used), so the next
    # pod still has a retry on its index; the driver's own count ends the step.
    workload = from_inputs(WorkloadSpec, run_id=RUN, max_restarts=1)
    lost = _pod(phase="Failed", code=137)
    lost["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}
    ]
    failed = _pod(phase="Failed", code=1)
    failed["metadata"].update(name="p-0b", uid="u1", annotations={FAILURE_COUNT: "0"})

    class DomainThere(QuietApi):
        def get(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"metadata": {}}

    def outcome() -> tuple[Any, ...]:
        gang = Gang(DomainThere(), workload)  # type: ignore[arg-type]
        assert gang.check({"p-0": lost}, None)
        with pytest.raises(MnnvlError) as info:
            gang.check({"p-0": lost, "p-0b": failed}, None)
        err = info.value
        return type(err).__name__, err.exit_code, getattr(err, "pod_exit_code", None)

    assert outcome() == ("WorkloadFailed", 4, 1)
    monkeypatch.setitem(TEMPLATES, ProblemKind.RESTARTS_EXHAUSTED, "zz {code}")
    assert outcome() == ("WorkloadFailed", 4, 1)
