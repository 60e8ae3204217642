"""The pure rows of ``mnnvl preflight``: permissions from a rules review, Kueue's queue."""

from __future__ import annotations

from mnnvl.contract import rbac
from mnnvl.driver.preflight import kueue_row, missing_rules, permissions_row
from mnnvl.inputs.spec import WorkloadSpec

WORKLOAD = WorkloadSpec(run_id="r1", namespace="team-a", queue_name="gpu")


def _granted(rules: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...]) -> list[dict]:
    return [{"apiGroups": [g], "resources": list(r), "verbs": list(v)} for g, r, v, _ in rules]


def test_the_runner_role_grants_every_rule_and_a_wildcard_does_too() -> None:
    assert missing_rules(_granted(rbac.RUNNER_RULES), rbac.RUNNER_RULES) == []
    star = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
    assert missing_rules(star, rbac.RUNNER_RULES) == []


def test_a_missing_verb_fails_naming_it_and_manifests_base() -> None:
    granted = _granted(rbac.RUNNER_RULES)
    granted[0]["verbs"] = ["get", "list", "watch"]  # computedomains without create/delete
    row = permissions_row(granted, WORKLOAD)
    assert row.status == "FAIL"
    assert "resource.nvidia.com/computedomains create" in row.saw
    assert "computedomains delete" in row.saw
    assert row.fix.startswith("kubectl apply -n team-a -k manifests/base")


def test_a_queue_without_the_kueue_reader_warns_naming_its_overlay() -> None:
    row = permissions_row(_granted(rbac.RUNNER_RULES), WORKLOAD)
    assert row.status == "WARN" and "manifests/overlays/kueue" in row.fix
    row = permissions_row(_granted(rbac.RUNNER_RULES + rbac.KUEUE_RULES), WORKLOAD)
    assert row.status == "PASS"


def test_a_cluster_queue_without_flavors_fails_and_one_with_them_names_the_mappings() -> None:
    cq = {"metadata": {"name": "cq"}, "spec": {"resourceGroups": []}}
    assert kueue_row("gpu", cq).status == "FAIL"
    cq["spec"] = {
        "resourceGroups": [
            {"coveredResources": ["cpu", "nvidia.com/gpu"], "flavors": [{"name": "gb200"}]}
        ]
    }
    row = kueue_row("gpu", cq)
    assert row.status == "WARN"
    assert "ClusterQueue cq (flavors gb200; covers cpu, nvidia.com/gpu)" in row.saw
    assert "deviceClassMappings" in row.fix
