"""`mnnvl run` walks the pipeline declaration the compiled pipelines are built from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mnnvl.cli import main as cli
from mnnvl.inputs import surface
from mnnvl.inputs.spec import from_inputs
from mnnvl.run import RUN_PIPELINE

COMPILED = Path(__file__).resolve().parents[2] / "pipelines" / "compiled"
EDGE = {"run_id", "namespace"}  # resolved at the CLI edge, not a step default


def compiled_defaults(name: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((COMPILED / f"{name}.kfp.yaml").read_text())
    spec = next(d for d in docs if d and "root" in d)
    params = spec["root"]["inputDefinitions"]["parameters"]
    return {k: p["defaultValue"] for k, p in params.items() if "defaultValue" in p}


def run_plan(*argv: str) -> list[Any]:
    ns = cli.build_parser().parse_args(["run", "--run-id", "r1", *argv])
    return cli._run_plan(ns)[0]  # the tasks (the team's TrainJob is None here)


def test_mnnvl_run_has_the_compiled_pipelines_tasks_in_order() -> None:
    planned = run_plan()
    assert [p.task.name for p in planned] == [t.name for t in surface.PIPELINES[RUN_PIPELINE].tasks]
    assert [p.task.name for p in run_plan("--skip-verify")] == ["provision", "train", "teardown"]


def test_mnnvl_run_and_the_compiled_pipeline_use_the_same_step_defaults() -> None:
    """Every task's specs under `mnnvl run` without flags equal those the compiled pipeline's
    parameter defaults give, except the training pipeline's own GPU-sized defaults."""
    pipeline = surface.PIPELINES[RUN_PIPELINE]
    params = {p.name: p for p in pipeline.parameters()}
    flat: dict[str, Any] = {}
    for name, value in compiled_defaults(RUN_PIPELINE).items():
        flat |= value if name in surface.GROUP_HELP else {name: value}
    compiled = {  # KFP writes every number as a float (18.0)
        name: int(value) if params[name].kind == "int" else params[name].coerce(value)
        for name, value in flat.items()
        if name not in pipeline.defaults and name not in EDGE
    }
    for planned in run_plan():
        task = planned.task
        expected = surface.step_specs(task.step, "r1", pipeline.task_arguments(task, compiled))
        assert list(planned.specs) == expected, task.name


def test_mnnvl_run_gives_verification_the_verify_steps_job_timeout() -> None:
    by_task = {p.task.name: p.specs for p in run_plan()}
    verify_default = compiled_defaults(RUN_PIPELINE)["verify_timeout_s"]
    assert by_task["verify-pre"][0].job_timeout_s == verify_default == 1800.0
    assert by_task["verify-post"][0].job_timeout_s == verify_default
    assert by_task["train"][0].job_timeout_s == compiled_defaults(RUN_PIPELINE)["train_timeout_s"]
    assert by_task["verify-pre"][0].purpose == "verify-pre"


def test_a_longer_training_deadline_leaves_the_verifications_at_theirs() -> None:
    by_task = {p.task.name: p.specs for p in run_plan("--train-timeout-s", "28800")}
    assert by_task["train"][0].job_timeout_s == 28800
    assert by_task["verify-pre"][0].job_timeout_s == 1800.0
    assert by_task["verify-post"][0].job_timeout_s == 1800.0


def test_a_failed_verification_across_clique_groups_names_rank_0s_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The verify worker exits non-zero after printing a FAIL RESULT; the error and the
    result name the Job it ran in: clique group 0's, as the run created it."""
    from mnnvl import steps
    from mnnvl.errors import VerificationFailed, WorkloadFailed
    from mnnvl.inputs.names import RunNames
    from mnnvl.inputs.spec import VerifyConfig, WorkloadSpec

    result = {"kind": "verify", "verdict": "FAIL", "reasons": ["busbw below threshold"]}

    def failed(*_: Any, **__: Any) -> Any:
        raise WorkloadFailed("verify exited 4", result=result)

    monkeypatch.setattr(steps, "launch", failed)
    monkeypatch.setattr(steps, "_require_result", lambda launched, kind: launched.result)
    workload = from_inputs(WorkloadSpec, run_id="r1", nodes=4, nodes_per_clique=2, gpus_per_node=0)
    job = RunNames.for_run("r1").job("verify", 0)
    with pytest.raises(VerificationFailed, match=f"Job {job}\\)"):
        steps.verify(workload, VerifyConfig())
    assert steps.verify(workload, VerifyConfig(), fail_on_fail=False).job == job
