"""The mnnvl-training KFP pipeline end to end: kfp.local (SubprocessRunner) against SimCluster."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


def _arguments(min_busbw_gbps: float = 0.0) -> dict[str, Any]:
    args = argparse.Namespace(nodes=2, steps=10, min_busbw_gbps=min_busbw_gbps)
    return local_run.pipeline_arguments(args, gpus_per_node=0)


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


def test_impossible_threshold_fails_the_pipeline_and_still_tears_down(
    sim: Any, tmp_path: Path
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


def test_out_of_range_threshold_fails_before_creating_workloads(sim: Any, tmp_path: Path) -> None:
    outcome = local_run.run_pipeline(
        _arguments(min_busbw_gbps=1e9), tmp_path, start=time.monotonic(), verbose=False
    )

    assert not outcome.succeeded
    assert "SpecError" in outcome.errors.get("verify-pre", "")
    assert sim.objects() == []
