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
from mnnvl.errors import MnnvlError
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.simkit import assert_nothing_left, create_claim

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


def pods_created(sim: SimCluster, run_id: str, purpose: str = "job") -> int:
    job = RunNames.for_run(run_id).job(purpose)
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


CLAIM, MOUNT = "fc-ckpt", "/ckpt"


def test_a_checkpoint_of_another_model_ends_the_train_step_after_one_attempt(sim, run_id):
    # A run of the tiny preset left its checkpoint in a directory that a run of the small
    # preset is then given: no restart can load it.
    create_claim(sim, CLAIM)
    ckpt = f"{MOUNT}/shared"
    first = f"fc-{uuid.uuid4().hex[:8]}"
    written = DomainSpec(run_id=first, delete_timeout_s=30)
    # The writing run needs the nodes to itself: the fixture's domain comes back after it.
    steps.teardown(DomainSpec(run_id=run_id, delete_timeout_s=30), kubeconfig=sim.kubeconfig_path)
    steps.provision(written, kubeconfig=sim.kubeconfig_path)
    done = steps.train(
        train_workload(first),
        TrainConfig(model="tiny", steps=2, checkpoint_dir=ckpt),
        kubeconfig=sim.kubeconfig_path,
    )
    assert done.steps == 2
    steps.teardown(written, kubeconfig=sim.kubeconfig_path)
    assert_nothing_left(sim, RunNames.for_run(first).selector)
    steps.provision(DomainSpec(run_id=run_id, delete_timeout_s=30), kubeconfig=sim.kubeconfig_path)
    with pytest.raises(MnnvlError) as failed:
        steps.train(
            train_workload(run_id),
            TrainConfig(model="small", steps=4, checkpoint_dir=ckpt),
            kubeconfig=sim.kubeconfig_path,
        )
    assert failed.value.exit_code == 4
    error = str(failed.value)
    # The simulator's kubelet mounts the claim at a folder of its own, not at /ckpt.
    assert "cannot resume from " in error
    assert "/shared/step-2: it was written for the tiny preset" in error
    assert "give another --checkpoint-dir" in error and "restart(s)" not in error
    assert pods_created(sim, run_id, "train") == 2  # one attempt


def train_workload(run_id: str) -> WorkloadSpec:
    return from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="train",
        nodes=2,
        gpus_per_node=0,
        pvc=(f"{CLAIM}:{MOUNT}",),
        pods_running_timeout_s=60,
        job_timeout_s=180,
    )
