"""KFP components and pipelines: compile, round-trip through YAML, and carry the right wiring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler, components, dsl

from mnnvl.components import kfp_components as kc
from mnnvl.inputs import defaults
from mnnvl.pipelines import kfp_pipeline as kp

RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"
EXPECTED_OUTPUTS = {
    "provision_domain": ({"Output"}, set()),
    "train_sharded": (set(), {"metrics", "report", "result"}),
    "verify_nvlink": (set(), {"metrics", "report", "result", "ctrf"}),
    "launch_workload": (set(), {"metrics", "result"}),
    "teardown_domain": (set(), set()),
    "preflight_cluster": (set(), {"result", "ctrf"}),
}
FIRST = "provision-training"


def _compile(func: Any, path: Path) -> list[dict[str, Any]]:
    compiler.Compiler().compile(func, str(path))
    return list(yaml.safe_load_all(path.read_text()))


@pytest.fixture(scope="module")
def training_ir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _compile(kp.training_pipeline, tmp_path_factory.mktemp("ir") / "t.yaml")[0]


@pytest.fixture(scope="module")
def verify_only_ir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _compile(kp.verify_only_pipeline, tmp_path_factory.mktemp("ir") / "v.yaml")[0]


def _all_tasks(ir: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tasks = dict(ir["root"]["dag"]["tasks"])
    for comp in ir["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return {name: t for name, t in tasks.items() if not name.startswith("exit-handler")}


@pytest.mark.parametrize("name", sorted(kc.COMPONENTS))
def test_component_round_trips_through_yaml(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yaml"
    compiler.Compiler().compile(kc.COMPONENTS[name], str(path))
    loaded = components.load_component_from_file(str(path))
    original = kc.COMPONENTS[name].component_spec
    assert loaded.name == name.replace("_", "-")
    assert set(loaded.component_spec.inputs or {}) == set(original.inputs or {})
    params, artifacts = EXPECTED_OUTPUTS[name]
    outputs = loaded.component_spec.outputs or {}
    assert set(outputs) == params | artifacts
    assert "run_id" in (loaded.component_spec.inputs or {})


@pytest.mark.parametrize("name", sorted(kc.COMPONENTS))
def test_checked_in_component_yaml_loads(name: str) -> None:
    path = Path(kc.__file__).resolve().parent / f"{name}.yaml"
    loaded = components.load_component_from_file(str(path))
    assert loaded.name == name.replace("_", "-")


def test_every_component_runs_the_same_few_embedded_lines_in_the_launcher_image(
    tmp_path: Path,
) -> None:
    """Nothing per component is embedded (no signature, no docstring): each task's pod looks
    its component up in the launcher image's mnnvl, so no component source is generated."""
    programs = set()
    for name, component in {**kc.COMPONENTS, **kc.FIRST_TASKS}.items():
        (ir,) = _compile(component, tmp_path / f"{name}.yaml")
        (executor,) = ir["deploymentSpec"]["executors"].values()
        container = executor["container"]
        assert container["image"] == defaults.DEFAULT_LAUNCHER_IMAGE
        assert "pip install" not in " ".join(container["command"])
        assert container["args"][-1] == component.component_spec.name.replace("-", "_")
        programs.add(container["command"][-1])
    (program,) = programs
    assert len(program.splitlines()) < 15
    assert "mnnvl.components.kfp_entry" in program


@pytest.mark.parametrize(
    ("name", "code", "line"),
    [
        ("teardown_domain", 0, "teardown: nothing to delete: namespace"),
        ("provision_verify_only", 2, "provision failed: namespace"),
    ],
)
def test_the_embedded_program_runs_the_components_body_as_its_pod_does(
    name: str, code: int, line: str, tmp_path: Path
) -> None:
    """The component's container command, run as its pod runs it (KFP's executor in its
    runtime mode): it finds the component's function in mnnvl and hands it the task's
    inputs. A namespace that is no name needs no cluster: teardown deletes nothing, the
    first task refuses it."""
    (component,) = [
        c
        for c in [*kc.COMPONENTS.values(), *kc.FIRST_TASKS.values()]
        if c.python_func.__name__ == name
    ]
    container = component.component_spec.implementation.container
    executor_input = {
        "inputs": {"parameterValues": {"run_id": "r1", "namespace": "Not_A_Name"}},
        "outputs": {"outputFile": str(tmp_path / "output.json")},
    }
    shell, flag, script, program = container.command
    assert "import mnnvl.components.kfp_entry" in program  # the same lines for every component
    script = script.replace("python3 ", f"{sys.executable} ")
    args = [json.dumps(executor_input) if a == "{{$}}" else a for a in container.args]
    done = subprocess.run(
        [shell, flag, script, program, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, done.stdout + done.stderr
    assert line in done.stdout + done.stderr


def test_metrics_and_report_artifact_types(tmp_path: Path) -> None:
    for name in ("train_sharded", "verify_nvlink"):
        (ir,) = _compile(kc.COMPONENTS[name], tmp_path / f"{name}.yaml")
        (comp,) = ir["components"].values()
        artifacts = comp["outputDefinitions"]["artifacts"]
        assert artifacts["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
        assert artifacts["report"]["artifactType"]["schemaTitle"] == "system.HTML"


def test_caching_is_off_for_every_task(training_ir: dict[str, Any]) -> None:
    tasks = _all_tasks(training_ir)
    assert len(tasks) == 5
    for name, task in tasks.items():
        assert task["cachingOptions"] == {}, name


def test_exit_handler_runs_teardown_after_everything(training_ir: dict[str, Any]) -> None:
    root = training_ir["root"]["dag"]["tasks"]
    teardown = root["teardown-domain"]
    assert teardown["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert teardown["dependentTasks"] == ["exit-handler-1"]
    assert root["exit-handler-1"]["taskInfo"]["name"] == "mnnvl-run"


def test_run_id_placeholder_is_wired_into_every_task(training_ir: dict[str, Any]) -> None:
    for name, task in _all_tasks(training_ir).items():
        run_id = task["inputs"]["parameters"]["run_id"]
        assert run_id["runtimeValue"]["constant"] == RUN_ID_PLACEHOLDER, name
    assert dsl.PIPELINE_JOB_ID_PLACEHOLDER == RUN_ID_PLACEHOLDER


def test_training_order_and_purposes(training_ir: dict[str, Any]) -> None:
    tasks = _all_tasks(training_ir)
    assert "dependentTasks" not in tasks[FIRST]
    assert tasks["verify-nvlink"]["dependentTasks"] == [FIRST]
    assert tasks["train-sharded"]["dependentTasks"] == ["verify-nvlink"]
    assert tasks["verify-nvlink-2"]["dependentTasks"] == ["train-sharded"]
    purposes = {
        tasks[n]["inputs"]["parameters"]["purpose"]["runtimeValue"]["constant"]
        for n in ("verify-nvlink", "verify-nvlink-2")
    }
    assert purposes == {"verify-pre", "verify-post"}
    names = {n: t["taskInfo"]["name"] for n, t in tasks.items()}
    assert names["verify-nvlink"] == "verify-pre" and names["verify-nvlink-2"] == "verify-post"


def test_a_bad_parameter_fails_in_one_attempt_and_teardown_retries_for_an_hour(
    training_ir: dict[str, Any],
) -> None:
    """The first task validates every parameter: retrying it would only repeat exit 2 after
    each backoff. Teardown retries within the window Argo's teardown uses; the workload
    tasks retry (a retry adopts their Job, or repeats a recorded failure at once) within
    the longest Job timeout, as a task may be lost late in its Job."""
    tasks = _all_tasks(training_ir)
    retried = {n for n, t in tasks.items() if "retryPolicy" in t}
    assert retried == {"teardown-domain", "train-sharded", "verify-nvlink", "verify-nvlink-2"}
    policy = tasks["teardown-domain"]["retryPolicy"]
    assert policy["maxRetryCount"] == 2 and policy["backoffMaxDuration"] == "3600s"
    policy = tasks["train-sharded"]["retryPolicy"]
    assert policy["maxRetryCount"] == 2 and policy["backoffMaxDuration"] == "604800s"
    assert set(policy) == {
        "maxRetryCount",
        "backoffDuration",
        "backoffFactor",
        "backoffMaxDuration",
    }


def test_pipeline_parameters_reach_the_tasks(training_ir: dict[str, Any]) -> None:
    tasks = _all_tasks(training_ir)
    inputs = training_ir["root"]["inputDefinitions"]["parameters"]
    for param in (
        "namespace",
        "nodes",
        "gpus_per_node",
        "image",
        "placement",
        "model",
        "steps",
        "verify",
        "train_timeout_s",
        "recovery",
    ):
        assert param in inputs, param

    def source(task: str, name: str) -> str:
        return tasks[task]["inputs"]["parameters"][name]["componentInputParameter"]

    assert source("train-sharded", "model") == "pipelinechannel--model"
    assert source("train-sharded", "job_timeout_s") == "pipelinechannel--train_timeout_s"
    assert source("verify-nvlink", "verify") == "pipelinechannel--verify"
    assert source("verify-nvlink-2", "job_timeout_s") == "pipelinechannel--verify_timeout_s"
    assert source(FIRST, "placement") == "pipelinechannel--placement"
    # The first task gets every pipeline parameter, to validate them all before provisioning.
    assert set(tasks[FIRST]["inputs"]["parameters"]) == set(inputs) | {"run_id"}
    assert tasks["teardown-domain"]["inputs"]["parameters"]["namespace"] == {
        "componentInputParameter": "namespace"
    }


def test_exit_task_consumes_no_task_outputs(training_ir: dict[str, Any]) -> None:
    params = training_ir["root"]["dag"]["tasks"]["teardown-domain"]["inputs"]["parameters"]
    for value in params.values():
        assert "taskOutputParameter" not in value


def test_verify_only_pipeline_shape(verify_only_ir: dict[str, Any]) -> None:
    tasks = _all_tasks(verify_only_ir)
    assert set(tasks) == {"provision-verify-only", "verify-nvlink", "teardown-domain"}
    root = verify_only_ir["root"]["dag"]["tasks"]
    assert root["teardown-domain"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert all(t["cachingOptions"] == {} for t in tasks.values())
    assert verify_only_ir["pipelineInfo"]["name"] == "mnnvl-verify-only"


def test_a_float_input_takes_an_int_in_a_users_pipeline(tmp_path: Path) -> None:
    """``job_timeout_s=3600`` means 3600.0: KFP's own type check refuses an int for a float."""

    @dsl.pipeline(name="mine")
    def mine():  # KFP reads a "None" return annotation as an output
        kc.verify_nvlink(run_id="r1", job_timeout_s=3600, nodes=2)

    (ir,) = _compile(mine, tmp_path / "mine.yaml")
    given = _all_tasks(ir)["verify-nvlink"]["inputs"]["parameters"]
    assert given["job_timeout_s"]["runtimeValue"]["constant"] == 3600.0
    assert given["nodes"]["runtimeValue"]["constant"] == 2  # an int input stays an int


def test_a_local_pipeline_run_takes_an_int_for_a_float_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``verify_timeout_s=3600`` from Python reaches the run, whose first task judges the
    parameters (here it refuses the namespace, so no cluster is needed)."""
    from kfp import local

    monkeypatch.setattr(local.config.LocalExecutionConfig, "instance", None)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path))
    with pytest.raises(RuntimeError, match="provision"):
        kp.verify_only_pipeline(verify_timeout_s=3600, namespace="Not_A_Name")
    out = capfd.readouterr()
    assert "provision failed: namespace" in out.out + out.err


@pytest.mark.parametrize(
    "body",
    ["provision_domain", "train_sharded", "verify_nvlink", "launch_workload", "preflight_cluster"],
)
def test_every_step_body_fails_a_broken_kubeconfig_in_one_line(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mnnvl.components import bodies

    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nclusters: [\n  - bad: : :\n")
    monkeypatch.setenv("KUBECONFIG", str(broken))
    with pytest.raises(SystemExit) as exited:
        params = {"run_id": "one-line", "namespace": "default"}
        if body == "launch_workload":
            params["module"] = "mnnvl.examples.custom_train"
        getattr(bodies, body)(params)
    assert exited.value.code == 5
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= 40]
    step = body.split("_")[0]
    assert line.startswith(f"{step} failed: kubeconfig {broken} is not valid YAML"), line
