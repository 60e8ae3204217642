"""``--trainjob-file`` on ``mnnvl train`` and ``mnnvl run``: a team's own TrainJob runs as the
train step with the run's claim, labels and placement, and goes at teardown; a file that is no
TrainJob of the run's shape is refused in one line before anything is created."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mnnvl.cli import main as cli
from mnnvl.inputs.names import RunNames
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw
from tests.sim.test_trainjob_standin import TJ_PATH, pods, raw, schemas, sim

__all__ = ["raw", "schemas", "sim"]  # the stand-in's module fixtures, used here too

TEAM_PROGRAM = "print('RESULT {\"team\": true}')"  # rank 0's log is read
TEAMS = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "team-llm", "labels": {"team": "a"}},
    "spec": {
        "runtimeRef": {"name": "torch-distributed"},
        "trainer": {"command": ["python3", "-c", TEAM_PROGRAM], "numNodes": 2},
    },
}
BAD_FILES = {
    "not a TrainJob": ({"apiVersion": "batch/v1", "kind": "Job"}, "not a TrainJob"),
    "no trainer": ({**TEAMS, "spec": {"runtimeRef": {"name": "r"}}}, "names no trainer"),
    "wrong apiVersion": ({**TEAMS, "apiVersion": "trainer.kubeflow.org/v1"}, "apiVersion"),
}
SHAPE = ["--nodes", "2", "--gpus-per-node", "0"]


def _file(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _last(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    return dict(json.loads(capsys.readouterr().out.splitlines()[-1]))


def test_train_runs_a_teams_trainjob_as_the_runs_and_teardown_removes_it(
    sim: SimCluster, raw: Raw, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = ["--kubeconfig", sim.kubeconfig_path, "--run-id", "tj-file-train"]
    assert cli.main(["provision", *kube]) == 0
    argv = ["train", *kube, *SHAPE, "--no-clique-affinity"]
    assert cli.main([*argv, "--trainjob-file", _file(tmp_path, TEAMS)]) == 0
    trained = _last(capsys)
    name = RunNames.for_run("tj-file-train").job("train")
    assert trained["job"] == name and trained["result"] == {"team": True}
    tj = raw.get(f"{TJ_PATH}/{name}")
    assert tj["metadata"]["labels"]["mnnvl.io/run-id"] == "tj-file-train"
    assert tj["metadata"]["labels"]["team"] == "a"  # the team's labels stay
    claims = [p["spec"]["resourceClaims"] for p in pods(raw, name)]
    assert len(claims) == 2 and all(c[0]["name"] == "imex-channel" for c in claims)
    assert cli.main(["teardown", *kube]) == 0
    assert raw.gone(f"{TJ_PATH}/{name}") and pods(raw, name) == []
    assert sim.objects(label_selector="mnnvl.io/run-id=tj-file-train") == []


@pytest.mark.parametrize("bad", sorted(BAD_FILES))
def test_train_refuses_a_bad_trainjob_file_in_one_line_before_anything_is_created(
    bad: str, sim: SimCluster, raw: Raw, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc, words = BAD_FILES[bad]
    before = sim.request_count
    argv = ["train", "--kubeconfig", sim.kubeconfig_path, "--run-id", "tj-file-bad", *SHAPE]
    assert cli.main([*argv, "--trainjob-file", _file(tmp_path, doc)]) == 2
    error = _last(capsys)["error"]
    assert (
        error.startswith("trainjob_file (--trainjob-file): ")
        and words in error
        and "\n" not in error
    )
    assert sim.request_count == before  # refused before any request


@pytest.mark.parametrize("bad", sorted(BAD_FILES))
def test_run_refuses_a_bad_trainjob_file_in_one_line_before_anything_is_created(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc, words = BAD_FILES[bad]
    argv = ["run", "--run-id", "tj-run-bad", "--kubeconfig", str(tmp_path / "no-cluster"), *SHAPE]
    assert cli.main([*argv, "--trainjob-file", _file(tmp_path, doc)]) == 2
    error = _last(capsys)["error"]
    assert (
        error.startswith("trainjob_file (--trainjob-file): ")
        and words in error
        and "\n" not in error
    )


def test_run_sim_with_a_teams_trainjob_verifies_before_and_after_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--sim", "--run-id", "tj-file-run", *SHAPE, "--min-busbw-gbps", "0.001"]
    argv += ["--report-dir", str(tmp_path / "reports")]
    assert cli.main([*argv, "--trainjob-file", _file(tmp_path, TEAMS)]) == 0
    out = _last(capsys)
    assert out["verify_pre"]["verdict"] == out["verify_post"]["verdict"] == "PASS"
    name = RunNames.for_run("tj-file-run").job("train")
    assert out["train"]["job"] == name and out["train"]["result"] == {"team": True}
    assert f"TrainJob default/{name}" in out["teardown"]["deleted"]
    assert out["sim"]["leftover"] == [] and out["sim"]["leftover_processes"] == []
