"""Which node a failed attempt counts against, and when it is kept out of the next one."""

from __future__ import annotations

from typing import Any

from mnnvl.contract.exit_codes import COLLECTIVE_TIMEOUT
from mnnvl.driver.attempts import Attempt
from mnnvl.driver.exclude import EXCLUDING, NodeBlame, excluded_nodes, without_node
from mnnvl.driver.gang import Gang
from mnnvl.inputs.spec import WorkloadSpec, from_inputs
from tests.unit.test_gang_adoption import DeletingApi, by_name, pod


def attempt(node: str, code: int = 137, hardware: bool = False) -> Attempt:
    return Attempt(
        pod="p",
        node=node,
        rank=0,
        gpu=None,
        exit_code=code,
        reason="",
        evidence="",
        at="2026-12-01T10:00:00Z",
        detect_s=None,
        hardware=hardware,
    )


def blame() -> NodeBlame:
    return NodeBlame(None, "ns", ["j"])  # type: ignore[arg-type]


def test_a_node_is_excluded_at_its_second_failed_attempt_or_at_once_with_hardware_evidence() -> (
    None
):
    nodes = blame()
    assert nodes.suspect(attempt("a")) is None
    assert nodes.suspect(attempt("b")) is None
    assert nodes.suspect(attempt("a")) == "a"
    assert blame().suspect(attempt("c", code=1, hardware=True)) == "c"


def test_a_collective_timeout_does_not_count_against_the_waiting_rank_s_node() -> None:
    nodes = blame()
    for _ in range(3):  # rank 0 waited for a hung peer each time
        assert nodes.suspect(attempt("a", code=COLLECTIVE_TIMEOUT)) is None
    assert nodes.suspect(attempt("a", code=COLLECTIVE_TIMEOUT, hardware=True)) == "a"


def test_the_not_in_term_narrows_every_required_term_and_reads_back() -> None:
    clique = {"matchExpressions": [{"key": "nvidia.com/gpu.clique", "operator": "Exists"}]}
    required = {"nodeSelectorTerms": [clique]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    once = without_node(affinity, "a")
    twice = without_node(once, "b")
    (term,) = twice["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0] == clique["matchExpressions"][0]  # the clique stays
    assert term["matchExpressions"][1]["values"] == ["a", "b"]
    job = {"spec": {"template": {"spec": {"affinity": twice}}}}
    assert excluded_nodes(job) == ["a", "b"]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == required
    assert without_node(None, "a")["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"]}
            ]
        }
    ]


class Patches:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def patch(self, kind: Any, namespace: str, name: str, body: dict[str, Any]) -> Any:
        self.sent.append((name, body))
        return {}


def test_a_rerun_resumes_a_job_an_earlier_attempt_suspended_to_keep_a_node_out() -> None:
    # The step suspended its Job to keep node a out, and was lost before it resumed it.
    api = Patches()
    nodes = NodeBlame(api, "ns", ["j"])  # type: ignore[arg-type]
    job = {
        "metadata": {"name": "j", "uid": "u", "annotations": {EXCLUDING: "a"}},
        "spec": {"suspend": True, "template": {"spec": {}}},
        "status": {"conditions": [{"type": "Suspended", "status": "True"}], "active": 0},
    }
    nodes.adopt({"j": job})
    assert nodes.excluding({"j": job}, {}) == set()  # resumed; the view still shows it suspended
    ((name, body),) = api.sent
    assert name == "j" and body["spec"]["suspend"] is False
    assert body["metadata"]["annotations"] == {EXCLUDING: None}
    assert excluded_nodes({"spec": body["spec"]}) == ["a"]
    assert list(nodes.excluded) == ["a"]
    resumed = {**job, "spec": {**job["spec"], "suspend": False}}
    assert nodes.excluding({"j": resumed}, {}) is None


def test_a_failure_another_node_shares_is_the_programs_not_the_nodes() -> None:
    def failed(name: str, index: int, node: str, at: int) -> Any:
        p = pod(name, index, "Failed", created=0, finished=at)
        p["spec"] = {"nodeName": node}
        return p

    workload = from_inputs(WorkloadSpec, run_id="r", namespace="ns", nodes=2, max_restarts=4)
    gang = Gang(DeletingApi(), workload)  # type: ignore[arg-type]
    # Both ranks of each attempt die the same way (137) on their own, node a first each time.
    first = [failed("j-0-a", 0, "a", 10), failed("j-1-a", 1, "b", 11)]
    assert gang.check(by_name(*first), None)
    second = [failed("j-0-b", 0, "a", 20), failed("j-1-b", 1, "b", 21)]
    assert gang.check(by_name(*first, *second), None)
    assert [r.excluded for r in gang.restarts] == [None, None]
    assert gang.nodes.blamed.get("a", 0) == 0 and gang.nodes.exclusion is None
