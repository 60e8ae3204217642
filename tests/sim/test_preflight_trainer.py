"""Preflight's TrainJob rows on the simulator: Trainer's API, the runtime and the
``resourceClaimsPerNode`` field, each PASS where the cluster is ready, else the fix named."""

from __future__ import annotations

import json

import pytest

from mnnvl.cli import main as cli
from mnnvl.contract.result import FAIL, PASS
from mnnvl.driver.api import Api
from mnnvl.driver.preflight import SKIPPED, WARN
from mnnvl.driver.preflight_trainer import trainer_rows
from mnnvl.sim import SimCluster


def rows(sim: SimCluster, runtime: str = "torch-distributed", max_restarts: int = 0) -> dict:
    with Api.connect(sim.kubeconfig_path) as api:
        found = trainer_rows(api, "default", runtime, max_restarts)
    return {r.check: r for r in found}


@pytest.fixture(scope="module")
def trainer_cluster():
    with SimCluster(nodes=1, trainer=True, cluster_reader=True) as sim:
        yield sim


def test_a_cluster_with_trainer_v2_4_passes_every_row(trainer_cluster):
    found = rows(trainer_cluster)
    assert {k: r.status for k, r in found.items()} == {
        "trainjob-api": PASS,
        "trainjob-runtime": PASS,
        "trainjob-claims-field": PASS,
    }, found
    assert "maxRestarts 0" in found["trainjob-runtime"].saw


def test_a_runtime_that_restarts_less_than_asked_warns_naming_its_failure_policy(trainer_cluster):
    row = rows(trainer_cluster, max_restarts=2)["trainjob-runtime"]
    assert row.status == WARN and "failurePolicy.maxRestarts" in row.fix


def test_a_missing_runtime_fails_naming_the_flag(trainer_cluster):
    row = rows(trainer_cluster, runtime="no-such-runtime")["trainjob-runtime"]
    assert row.status == FAIL and "--trainjob-runtime" in row.fix


def test_a_trainer_without_the_claim_field_fails_naming_the_feature_gate():
    with SimCluster(
        nodes=1, trainer=True, trainer_claims_per_node=False, cluster_reader=True
    ) as sim:
        row = rows(sim)["trainjob-claims-field"]
    assert row.status == FAIL and "DynamicResourceAllocation" in row.fix


def test_without_trainer_the_api_and_runtime_rows_fail_with_the_install_step():
    with SimCluster(nodes=1) as sim:
        found = rows(sim)
    assert (
        found["trainjob-api"].status == FAIL
        and "install Kubeflow Trainer" in found["trainjob-api"].fix
    )
    assert found["trainjob-runtime"].status == FAIL
    assert found["trainjob-claims-field"].status == SKIPPED  # no cluster reader: CRDs unreadable


def test_mnnvl_preflight_with_workload_trainjob_adds_the_rows(trainer_cluster, capsys):
    argv = ["preflight", "--kubeconfig", trainer_cluster.kubeconfig_path, "--nodes", "1"]
    assert cli.main([*argv, "--gpus-per-node", "0", "--workload", "trainjob"]) == 0
    rows_seen = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]
    found = {r["check"]: r["status"] for r in rows_seen}
    assert found["trainjob-api"] == found["trainjob-claims-field"] == PASS, found
    # --max-restarts defaults to 3, torch-distributed restarts never: a warning, not a failure
    assert found["trainjob-runtime"] == WARN, found
    assert cli.main([*argv, "--gpus-per-node", "0"]) == 0  # the Indexed Job: no Trainer rows
    plain = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]
    assert not [r for r in plain if r["check"].startswith("trainjob")]
