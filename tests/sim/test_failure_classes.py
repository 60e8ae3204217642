"""Failures no restart can change end the step after one attempt, with the worker's own words.

``mnnvl launch`` of a module or a program that does not exist: the workers exit with a code of
the one classification table (``mnnvl.contract.exit_codes``), the Job's podFailurePolicy fails
the Job at once, and the step exits 4 without a gang restart; nothing of the run is left.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec
from mnnvl.sim import SimCluster
from tests.sim.simkit import assert_nothing_left

SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)


@pytest.fixture
def run_id(sim: SimCluster) -> Iterator[str]:
    run_id = f"fc-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    yield run_id
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert_nothing_left(sim, RunNames.for_run(run_id).selector)


def launch(sim: SimCluster, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    common = ["--nodes", "2", "--gpus-per-node", "0", "--job-timeout-s", "120"]
    code = cli.main(["launch", "--kubeconfig", sim.kubeconfig_path, *common, *argv])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == result["exit_code"]
    return result


def pods_created(sim: SimCluster, run_id: str) -> int:
    job = RunNames.for_run(run_id).job("job")
    created = [e for e in sim.events if e.get("reason") == "SuccessfulCreate"]
    return sum(e["involvedObject"]["name"] == job for e in created)


def test_a_missing_module_ends_the_step_after_one_attempt(sim, capsys, run_id):
    result = launch(sim, capsys, "--run-id", run_id, "--module", "no.such.module")
    assert result["exit_code"] == 4, result
    assert "cannot run module 'no.such.module': No module named 'no'" in result["error"]
    assert "restart" not in result["error"] or "0 restart" in result["error"], result["error"]
    assert pods_created(sim, run_id) == 2  # one attempt: no pod was made again


def test_a_missing_program_ends_the_step_after_one_attempt(sim, capsys, run_id):
    result = launch(sim, capsys, "--run-id", run_id, "--command", "--", "nosuchprogram")
    assert result["exit_code"] == 4, result
    assert "nosuchprogram" in result["error"], result["error"]
    assert "restart" not in result["error"] or "0 restart" in result["error"], result["error"]
    assert pods_created(sim, run_id) == 2
