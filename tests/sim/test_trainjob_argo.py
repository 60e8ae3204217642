"""The compiled Argo WorkflowTemplate ``mnnvl-training`` with ``workload=trainjob``: each task
of its DAG, then its exit handler, run as the template's own command line (workflow and task
parameters filled in as Argo fills them) against the simulator with Trainer's stand-in. The
train task runs as a TrainJob between two verifications, and teardown leaves nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mnnvl.cli import main as cli
from mnnvl.inputs.names import RunNames
from mnnvl.pipelines.local_run import LOCAL_IMAGE
from mnnvl.sim import SimCluster
from tests.conftest import REPO_ROOT
from tests.sim.test_trainjob_standin import schemas, sim

__all__ = ["schemas", "sim"]  # the stand-in's module fixtures, used here too

COMPILED = REPO_ROOT / "pipelines" / "compiled" / "mnnvl-training.workflowtemplate.yaml"
RUN = "argo-trainjob-0001"  # {{workflow.uid}}
PARAMETERS = {  # what `argo submit -p` would set: a CPU-sized run
    "workload": "trainjob",
    "nodes": "2",
    "gpus-per-node": "0",
    "image": LOCAL_IMAGE,
    "model": "tiny",
    "steps": "10",
    "batch-size": "2",
    "pod": json.dumps({"shm_size": "1Gi"}),
    "verify": json.dumps({"min_busbw_gbps": 0.001}),
}


def _fill(text: str, values: dict[str, str], prefix: str) -> str:
    for name, value in values.items():
        text = text.replace(f"{{{{{prefix}.{name}}}}}", value)
    return text.replace("{{workflow.uid}}", RUN)


def task_commands(out: Path) -> list[tuple[str, list[str]]]:
    """(task, the `mnnvl` arguments its pod runs) of the main DAG, then the exit handler."""
    spec = yaml.safe_load(COMPILED.read_text())["spec"]
    workflow = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]} | PARAMETERS
    # Argo's {{workflow.parameters.json}}: the parameters as a [{name, value}] list
    listed = [{"name": k, "value": v} for k, v in workflow.items()]
    workflow_values = workflow | {"json": json.dumps(listed)}
    templates = {t["name"]: t for t in spec["templates"]}
    tasks = templates["main"]["dag"]["tasks"] + templates["exit-handler"]["dag"]["tasks"]
    commands = []
    for task in tasks:
        inputs = {
            p["name"]: _fill(p["value"], workflow_values, "workflow.parameters")
            for p in task["arguments"]["parameters"]
        }
        container = templates[task["template"]]["container"]
        assert container["command"] == ["mnnvl"]
        args = [_fill(a, inputs, "inputs.parameters") for a in container["args"]]
        commands.append((task["name"], [a.replace("/tmp/", f"{out}/") for a in args]))
    return commands


def test_the_compiled_argo_training_template_trains_as_a_trainjob_and_leaves_nothing(
    sim: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results: dict[str, Any] = {}
    for task, args in task_commands(tmp_path):
        assert "{{" not in " ".join(args), (task, args)  # every parameter was filled in
        assert cli.main([*args, "--kubeconfig", sim.kubeconfig_path]) == 0, task
        results[task] = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert list(results) == ["provision", "verify-pre", "train", "verify-post", "teardown"]
    assert results["verify-pre"]["verdict"] == results["verify-post"]["verdict"] == "PASS"
    name = RunNames.for_run(RUN).job("train")
    assert results["train"]["job"] == name and results["train"]["steps"] == 10
    assert f"TrainJob default/{name}" in results["teardown"]["deleted"]
    assert sim.objects(label_selector=f"mnnvl.io/run-id={RUN}") == []
    assert sim.processes(f"mnnvl.io/run-id={RUN}") == []
