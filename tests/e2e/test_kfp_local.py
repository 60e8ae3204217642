"""The mnnvl-training KFP pipeline end to end: kfp.local (SubprocessRunner) against SimCluster."""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mnnvl.components import kfp_components as kc
from mnnvl.inputs import surface
from mnnvl.inputs.names import RunNames
from mnnvl.pipelines import kfp_pipeline as kp
from mnnvl.pipelines import local_run
from mnnvl.sim import SimCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    cluster = SimCluster(nodes=2, gpus_per_node=0, local_gpus=[]).start()
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig_path))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """kfp.local's waits between the attempts of a failed task, recorded instead of slept: the
    task is still retried as the pipeline declares, without the minute of back-off."""
    from kfp.local.orchestrator import task_executor

    waited: list[float] = []
    monkeypatch.setattr(task_executor, "time", SimpleNamespace(sleep=waited.append))
    return waited


def _arguments(min_busbw_gbps: float = 0.0, pipeline: str = "training") -> dict[str, Any]:
    args = argparse.Namespace(nodes=2, steps=10, min_busbw_gbps=min_busbw_gbps)
    return local_run.pipeline_arguments(args, gpus_per_node=0, pipeline=pipeline)


def _metrics(run_dir: Path, task: str) -> dict[str, float]:
    output = json.loads((run_dir / task / "executor_output.json").read_text())
    return dict(output["artifacts"]["metrics"]["artifacts"][0]["metadata"])


def _run_ids(outcome: local_run.RunOutcome) -> set[str]:
    return {str(r["run_id"]) for r in outcome.results.values()}


def test_training_pipeline_succeeds_and_teardown_leaves_nothing(sim: Any, tmp_path: Path) -> None:
    outcome = local_run.run_pipeline(_arguments(), tmp_path, start=time.monotonic(), verbose=False)

    assert outcome.succeeded, outcome.error
    assert outcome.run_dir is not None
    assert set(outcome.results) == {"verify-pre", "train", "verify-post"}
    for purpose in ("verify-pre", "train", "verify-post"):
        report = Path(outcome.reports[purpose])
        assert report.is_file() and "<html" in report.read_text().lower()
    train = _metrics(outcome.run_dir, "train-sharded")
    assert train["steps"] == 10 and train["tokens_per_s"] > 0 and "final_loss" in train
    for task in ("verify-nvlink", "verify-nvlink-2"):
        verify = _metrics(outcome.run_dir, task)
        # CPU/gloo: no NVLink to judge; make run allows NOT_JUDGED, which is no PASS.
        assert verify["verdict_pass"] == 0.0 and verify["verdict_not_judged"] == 1.0
        assert verify["peak_busbw_gbps"] > 0
        assert any(name.startswith("busbw_gbps_") for name in verify)
    (run_id,) = _run_ids(outcome)
    assert sim.objects(label_selector=f"mnnvl.io/run-id={run_id}") == []
    assert sim.objects() == []


def test_training_pipeline_with_workload_trainjob_trains_as_a_trainjob_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The shipped mnnvl-training pipeline, workload=trainjob, on a cluster with Kubeflow
    Trainer's stand-in: verified before and after, trained as a TrainJob, nothing left."""
    args = argparse.Namespace(nodes=2, steps=10, min_busbw_gbps=0.001, workload="trainjob")
    arguments = local_run.pipeline_arguments(args, gpus_per_node=0)
    with SimCluster(nodes=2, gpus_per_node=0, local_gpus=[], trainer=True) as sim:
        monkeypatch.setenv("KUBECONFIG", str(sim.kubeconfig_path))
        outcome = local_run.run_pipeline(arguments, tmp_path, start=time.monotonic(), verbose=False)
        trainer_requests = {r for r in sim.rbac_requests if r[1] == "trainer.kubeflow.org"}
        left = (sim.objects(), sim.processes())

    assert outcome.succeeded, outcome.error
    results = outcome.results
    assert results["verify-pre"]["verdict"] == results["verify-post"]["verdict"] == "PASS"
    (run_id,) = _run_ids(outcome)
    assert results["train"]["job"] == RunNames.for_run(run_id).job("train")
    assert results["train"]["steps"] == 10 and results["train"]["final_loss"] is not None
    assert ("create", "trainer.kubeflow.org", "trainjobs") in trainer_requests
    assert ("delete", "trainer.kubeflow.org", "trainjobs") in trainer_requests
    assert left == ([], [])


def test_impossible_threshold_fails_the_pipeline_and_still_tears_down(
    sim: Any, tmp_path: Path, backoffs: list[float]
) -> None:
    # 1e5 GB/s is the largest threshold the spec accepts: a real FAIL verdict, not bad input.
    outcome = local_run.run_pipeline(
        _arguments(min_busbw_gbps=1e5), tmp_path, start=time.monotonic(), verbose=False
    )

    assert not outcome.succeeded
    assert "verify-nvlink" in outcome.error
    assert "train" not in outcome.results  # the pre-flight gate stopped the run
    assert outcome.run_dir is not None
    assert not (outcome.run_dir / "train-sharded").exists()
    assert sim.objects() == []
    # retried as declared (each retry fails at once on the failure recorded on its Job)
    declared = surface.STEP_RETRY_BACKOFF_S, surface.STEP_RETRY_FACTOR
    assert backoffs == [declared[0] * declared[1] ** n for n in range(surface.STEP_RETRIES)]


BAD_PARAMETERS = [
    ({"verify": {"min_busbw_gbps": 1e9}}, "verify.min_busbw_gbps"),  # in a group
    ({"model": "70b"}, "model"),  # a train parameter
    ({"nodes": 0}, "nodes"),  # every step's
    ({"verify_timeout_s": 0}, "verify_timeout_s"),  # the verify steps' job_timeout_s
    ({"train": {"warmup_steps": 50}}, "train.warmup_steps"),  # more than steps: the hint too
]


def _with(bad: dict[str, Any]) -> dict[str, Any]:
    """The local run's arguments with ``bad`` in them (a group's keys added to the group's)."""
    args = _arguments()
    return args | {k: args.get(k, {}) | v if isinstance(v, dict) else v for k, v in bad.items()}


@pytest.mark.parametrize(("bad", "message"), BAD_PARAMETERS)
def test_first_task_refuses_a_bad_parameter_of_any_step_before_calling_the_cluster(
    sim: Any, bad: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The provision task's own function, as its pod runs it (KUBECONFIG at the simulator).
    first = kc.FIRST_TASKS["mnnvl-training"].python_func
    before = sim.request_count

    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as exited:
        first(run_id="bad-input", **_with(bad))

    assert exited.value.code == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith(f"provision failed: {message}: ") and "\n" not in line
    assert "--" not in line  # named as KFP names it, no command-line flag
    assert sim.request_count == before
    assert sim.objects() == []


def test_bad_parameter_fails_the_pipeline_in_its_first_task_before_any_object_exists(
    sim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # End to end once (each case above runs the same first task): a train parameter is
    # refused by provision, nothing runs after it, and only teardown talks to the cluster.
    # The shipped pipeline, but for the pause between provision's retries (15 s, then 30 s).
    monkeypatch.setattr(surface, "STEP_RETRY_BACKOFF_S", 0)
    monkeypatch.setattr(kp, "PIPELINES", {"mnnvl-training": kp.build_pipeline("mnnvl-training")})
    bad, message = BAD_PARAMETERS[-1]
    before = sim.request_count
    outcome = local_run.run_pipeline(_with(bad), tmp_path, start=time.monotonic(), verbose=False)

    assert not outcome.succeeded
    error = outcome.errors.get("provision", "")
    assert error.startswith(f"{message}: 50 is more than steps 10") and "\n" not in error
    assert error.endswith("set train.warmup_steps to 10 or fewer")
    provision, exit_handler = _task_logs(tmp_path, "provision-training", "teardown-domain")
    assert "Traceback" not in provision
    assert [line for line in provision if " failed: " in line] == [
        next(line for line in provision if f"provision failed: {error}" in line)
    ]
    assert "Task 'teardown-domain' finished with status SUCCESS" in exit_handler[-1]
    assert outcome.run_dir is not None
    assert not (outcome.run_dir / "verify-nvlink").exists()  # nothing ran after provision
    assert sim.objects() == []
    # Only the exit handler's teardown talked to the cluster (it found nothing to delete).
    assert sim.objects(label_selector="app.kubernetes.io/managed-by=mnnvl-pipelines") == []
    assert sim.request_count > before


def _task_logs(out: Path, *tasks: str) -> list[list[str]]:
    """Each task's lines of the kfp.local log, from its start to its status line."""
    lines = local_run.ANSI.sub("", (out / "kfp-local.log").read_text()).splitlines()
    found = []
    for task in tasks:
        start = next(i for i, line in enumerate(lines) if f"Executing task '{task}'" in line)
        end = next(i for i in range(start, len(lines)) if f"Task '{task}' finished" in lines[i])
        found.append(lines[start : end + 1])
    return found


@pytest.mark.parametrize("namespace", ["Not_A_Name", "no-such-namespace"])
def test_a_namespace_that_can_hold_nothing_fails_in_one_line_and_the_exit_handler_succeeds(
    sim: Any, tmp_path: Path, namespace: str
) -> None:
    start = time.monotonic()
    outcome = local_run.run_pipeline(
        {**_arguments(), "namespace": namespace}, tmp_path, start=start, verbose=False
    )

    assert not outcome.succeeded
    # Not a name: refused as input (exit 2); absent: the namespaced Role is refused there (5).
    assert namespace in outcome.errors["provision"] and "\n" not in outcome.errors["provision"]
    provision, exit_handler = _task_logs(tmp_path, "provision-training", "teardown-domain")
    assert "Traceback" not in "\n".join(provision + exit_handler)
    assert "Task 'teardown-domain' finished with status SUCCESS" in exit_handler[-1]
    assert any("teardown: nothing to delete: namespace: " in line for line in exit_handler)
    assert time.monotonic() - start < 60  # no retries of the exit handler
    assert sim.objects() == []


def test_a_broken_kubeconfig_is_one_line_in_every_task(
    sim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nclusters: [\n  - bad: : :\n")
    monkeypatch.setenv("KUBECONFIG", str(broken))
    monkeypatch.setattr(surface, "STEP_RETRY_BACKOFF_S", 0)
    monkeypatch.setattr(kp, "PIPELINES", {"mnnvl-training": kp.build_pipeline("mnnvl-training")})
    outcome = local_run.run_pipeline(_arguments(), tmp_path, start=time.monotonic(), verbose=False)

    assert not outcome.succeeded
    assert outcome.errors["provision"].startswith(f"kubeconfig {broken} is not valid YAML (")
    provision, exit_handler = _task_logs(tmp_path, "provision-training", "teardown-domain")
    logged = "\n".join(provision + exit_handler)
    assert "Traceback" not in logged and "yaml.parser" not in logged
    (failed,) = [line for line in exit_handler if "teardown failed: " in line]
    assert f"kubeconfig {broken} is not valid YAML" in failed


def test_custom_pipeline_runs_a_user_program_outside_the_package(sim: Any, tmp_path: Path) -> None:
    # What earlier runs left (`make run`, then `make run PIPELINE=custom` twice).
    for pipeline in ("mnnvl-training", "mnnvl-custom"):
        (tmp_path / "reports" / pipeline).mkdir(parents=True)
        (tmp_path / "reports" / pipeline / "train.html").write_text("<html>an earlier run</html>")
    outcome = local_run.run_pipeline(
        _arguments(pipeline="custom"),
        tmp_path,
        start=time.monotonic(),
        verbose=False,
        name="mnnvl-custom",
    )

    assert outcome.succeeded, outcome.error
    assert outcome.run_dir is not None
    assert set(outcome.results) == {"verify-pre", "job"}
    job = outcome.results["job"]
    assert job["exit_code"] == 0 and job["elapsed_s"] > 0
    result = job["result"]
    assert result["kind"] == "custom" and result["world_size"] == 2
    assert abs(result["slope"] - 3.0) < 0.3 and result["final_loss"] < 0.01
    metrics = _metrics(outcome.run_dir, "launch-workload")
    assert metrics["exit_code"] == 0 and metrics["world_size"] == 2
    assert metrics["slope"] == result["slope"]
    assert "RESULT " in job["log_tail"]
    # Its reports only: none of the training pipeline's, none of an earlier run's.
    mine = tmp_path / "reports" / "mnnvl-custom"
    assert sorted(p.name for p in mine.iterdir()) == ["verify-pre.html"]
    assert set(outcome.reports.values()) == {str(mine / "verify-pre.html")}
    assert sim.objects() == []
