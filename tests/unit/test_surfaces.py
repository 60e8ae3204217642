"""One parameter surface: every input of a step exists on the CLI, in KFP and in Argo with the
same default, unless its declaration says why not; pipelines agree across orchestrators."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import pytest
import yaml

from mnnvl.cli.main import build_parser
from mnnvl.components import argo_templates as at
from mnnvl.components import kfp_components as kc
from mnnvl.errors import SpecError
from mnnvl.inputs import surface
from mnnvl.inputs.flags import from_namespace, ns_values
from mnnvl.inputs.spec import (
    ARGO,
    CLI,
    EVERY_SURFACE,
    KFP,
    DomainSpec,
    TrainConfig,
    VerifyConfig,
    WorkloadSpec,
    leaves,
)
from mnnvl.pipelines import argo_workflow as aw
from mnnvl.pipelines import kfp_pipeline as kp
from mnnvl.pipelines.compile import COMPILED_DIR

STEP_COMPONENT = kc.STEP_COMPONENTS
NO_RUN_ID = {"preflight"}  # reads the cluster only: the CLI takes no --run-id
CLI_ARGS = {"launch": ["--module", "pkg.entry"]}
ARTIFACTS = {"run_id", "metrics", "report", "result", "ctrf"}


def _as_surface(value: Any) -> Any:
    if isinstance(value, dict):
        return [f"{k}={v}" for k, v in value.items()]
    return list(value) if isinstance(value, tuple) else value


def _ungrouped(values: dict[str, Any], *, kebab: bool = False) -> dict[str, Any]:
    """A surface's inputs with each group's (a dict, or Argo's JSON) in their own right."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in surface.GROUP_HELP:
            out[name] = value
            continue
        for key, member in (json.loads(value) if kebab else value).items():
            out[key.replace("_", "-") if kebab else key] = member
    return out


def _kfp_defaults(step: str) -> dict[str, Any]:
    params = inspect.signature(STEP_COMPONENT[step].python_func).parameters
    return _ungrouped({n: p.default for n, p in params.items() if n not in ARTIFACTS})


def _argo_defaults(step: str) -> dict[str, Any]:
    doc = yaml.safe_load((COMPILED_DIR / "mnnvl-launch.workflowtemplate.yaml").read_text())
    (template,) = [t for t in doc["spec"]["templates"] if t["name"] == step]
    transport = {at.LAUNCHER_IMAGE_INPUT, at.DEADLINE_INPUT}
    params = {p["name"]: p["default"] for p in template["inputs"]["parameters"]}
    return _ungrouped({k: v for k, v in params.items() if k not in transport}, kebab=True)


def _cli_values(step: str) -> dict[str, Any]:
    run_id = [] if step in NO_RUN_ID else ["--run-id", "r1"]
    ns = build_parser().parse_args([step, *run_id, *CLI_ARGS.get(step, [])])
    values: dict[str, Any] = {}
    given = ns_values(ns) | ({"command": ["x"]} if step == "launch" else {})
    for obj in surface.step_specs(step, "r1", given):  # as the CLI builds them
        values |= {f.name: _as_surface(value) for f, value in leaves(obj)}
    if "namespace" in values:  # the specs resolve '' to the pod's own: compare what was given
        values["namespace"] = ns.namespace or ""
    return values


def _resolved_defaults(step: str) -> dict[str, Any]:
    """The specs the surface defaults build (a model preset resolves its auto inputs)."""
    values: dict[str, Any] = {}
    for obj in surface.step_specs(step, "r1", {"command": ["x"]} if step == "launch" else {}):
        values |= {f.name: _as_surface(value) for f, value in leaves(obj)}
    if "namespace" in values:
        values["namespace"] = ""  # as given, like _cli_values
    return values


@pytest.mark.parametrize("step", sorted(surface.STEP_CLASSES))
def test_every_step_input_is_on_every_surface_with_the_same_default(step: str) -> None:
    inputs = surface.step_inputs(step)
    kfp, argo, cli = _kfp_defaults(step), _argo_defaults(step), _cli_values(step)
    resolved = _resolved_defaults(step)
    assert set(kfp) == {i.name for i in inputs if KFP in i.surfaces}
    assert set(argo) == {i.kebab for i in inputs if ARGO in i.surfaces}
    for item in inputs:
        if KFP in item.surfaces:
            assert kfp[item.name] == item.default, (step, item.name)
        if ARGO in item.surfaces:  # a string of its own, a JSON value in a group
            assert argo[item.kebab] == (item.default if item.group else item.text()), item.name
        given = item.flag in CLI_ARGS.get(step, []) or item.name == "command"
        if CLI in item.surfaces and not item.required and not given:
            # The CLI's defaults and the pipelines' defaults build the same spec.
            assert cli[item.name] == resolved[item.name], (step, item.name)


def test_an_input_missing_from_a_surface_says_why() -> None:
    for cls in surface.SPEC_CLASSES:
        for item in surface.class_inputs(cls):
            if item.surfaces != frozenset(EVERY_SURFACE):
                assert item.why, f"{cls.__name__}.{item.name} is not everywhere and says no why"
    for step, overrides in surface.STEP_DEFAULTS.items():
        assert all(why for _, why in overrides.values()), step
    for plan in surface.PIPELINES.values():
        assert all(why for _, why in plan.defaults.values()), plan.name


def test_the_cli_has_a_flag_for_every_cli_input() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command_name")
    for step in surface.STEP_CLASSES:
        flags = {s for a in sub.choices[step]._actions for s in a.option_strings}  # type: ignore[attr-defined]
        missing = [
            i.flag
            for i in surface.step_inputs(step, CLI)
            if i.name != "command" and i.flag not in flags
        ]
        assert missing == [], step


@pytest.mark.parametrize("name", sorted(surface.PIPELINES))
def test_kfp_and_argo_pipelines_take_the_same_parameters_and_defaults(name: str) -> None:
    kfp = next(yaml.safe_load_all((COMPILED_DIR / f"{name}.kfp.yaml").read_text()))
    kfp_params = {
        k.replace("_", "-"): v.get("defaultValue")
        for k, v in kfp["root"]["inputDefinitions"]["parameters"].items()
    }
    argo = yaml.safe_load((COMPILED_DIR / f"{name}.workflowtemplate.yaml").read_text())
    argo_params = {p["name"]: p["value"] for p in argo["spec"]["arguments"]["parameters"]}
    argo_only = set(aw.ARGO_ONLY) & set(argo_params)
    assert set(argo_params) - argo_only == set(kfp_params)
    kfp_flat = _ungrouped(kfp_params)
    argo_flat = _ungrouped({k: v for k, v in argo_params.items() if k not in argo_only}, kebab=True)
    for p in surface.PIPELINES[name].parameters():
        assert argo_flat[p.kebab] == (p.default if p.group else p.text()), p.name
        kfp_default = kfp_flat[p.name if p.group else p.kebab]
        assert kfp_default == p.default or float(kfp_default) == p.default, p.name


def test_argo_offers_every_closed_set_of_values_as_a_drop_down_holding_its_default() -> None:
    doc = yaml.safe_load((COMPILED_DIR / "mnnvl-training.workflowtemplate.yaml").read_text())
    enums = {p["name"]: p.get("enum") for p in doc["spec"]["arguments"]["parameters"]}
    training = surface.grouped(surface.PIPELINES["mnnvl-training"].parameters())
    closed = {p.kebab: p for p in training if p.choices}
    assert {"model", "nccl-profile"} <= set(closed)
    for name, item in closed.items():
        assert enums[name] == list(item.choices), name
        assert item.text() in enums[name], name
    assert enums["train"] is None  # a group's values are a JSON object
    for template in doc["spec"]["templates"]:
        for p in (template.get("inputs") or {}).get("parameters") or []:
            if p["name"] in closed:
                assert p.get("enum") == list(closed[p["name"]].choices), (template["name"], p)


def test_pipeline_functions_take_the_declared_parameters() -> None:
    for name, func in kp.PIPELINES.items():
        params = inspect.signature(func.pipeline_func).parameters  # type: ignore[attr-defined]
        assert list(params) == [
            p.name for p in surface.grouped(surface.PIPELINES[name].parameters())
        ]


def test_env_with_commas_and_equals_travels_through_argo_to_the_workload() -> None:
    doc = yaml.safe_load((COMPILED_DIR / "mnnvl-training.workflowtemplate.yaml").read_text())
    (train,) = [t for t in doc["spec"]["templates"] if t["name"] == "train"]
    env = json.dumps(["NCCL_IB_HCA=mlx5_0,mlx5_1", "NCCL_DEBUG_SUBSYS=INIT,ENV", "X=a=b"])
    values = {p["name"]: p.get("default", "") for p in train["inputs"]["parameters"]}
    values["env"] = env
    args = []
    for arg in train["container"]["args"]:
        if arg.startswith("{{="):
            name = arg.split("'")[1]
            arg = f"--{name}" if values[name] == "true" else f"--no-{name}"
        for key, value in values.items():
            arg = arg.replace(f"{{{{inputs.parameters.{key}}}}}", value)
        args.append(arg.replace("{{workflow.uid}}", "r1"))
    workload = from_namespace(WorkloadSpec, build_parser().parse_args(args))
    assert workload.env == {
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV",
        "X": "a=b",
    }


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"model": "70b"}, "model"),
        ({"nodes": 0}, "nodes"),
        ([{"name": "nodes", "value": "0"}], "nodes"),  # Argo's {{workflow.parameters.json}}
        ({"train-timeout-s": "soon"}, "train_timeout_s"),
        ({"env": '["NOEQUALS"]'}, "env"),
        ({"verify": {"max_bytes": "lots"}}, "verify.max_bytes"),
        ([{"name": "verify", "value": '{"max_bytes": "lots"}'}], "verify.max_bytes"),
        ({"verify": {"max_byte": 1}}, "verify.max_byte"),
        ([{"name": "train", "value": "[1]"}], "train"),
    ],
)
def test_pipeline_check_names_the_bad_parameter(values: Any, field: str) -> None:
    with pytest.raises(SpecError) as err:
        surface.check_pipeline("mnnvl-training", values)
    assert err.value.field == field


def test_a_bad_size_is_named_once_as_the_surface_spells_it() -> None:
    with pytest.raises(SpecError) as err:
        surface.check_pipeline(
            "mnnvl-training", [{"name": "verify", "value": '{"min_bytes": "1X"}'}]
        )
    assert str(err.value) == "verify.min_bytes: '1X' is not a size like 1M, 64MiB or 4G"


def test_custom_pipeline_needs_a_module_or_a_command() -> None:
    with pytest.raises(SpecError, match=r"^command: .*give a module or a command"):
        surface.check_pipeline("mnnvl-custom", {})
    surface.check_pipeline("mnnvl-custom", {"command": ["python3", "train.py"]})


def test_step_specs_build_what_the_step_runs() -> None:
    workload, config = surface.step_specs("verify", "r1", {"nodes": 3, "iters": "7"})
    assert isinstance(workload, WorkloadSpec) and isinstance(config, VerifyConfig)
    assert (workload.nodes, workload.purpose, workload.job_timeout_s) == (3, "verify", 1800.0)
    assert config.iters == 7
    (domain,) = surface.step_specs("teardown", "r1", {"delete_timeout_s": 5})
    assert isinstance(domain, DomainSpec) and domain.delete_timeout_s == 5
    assert isinstance(surface.step_specs("train", "r1", {})[1], TrainConfig)


def test_the_argo_preflight_template_reads_no_run_id_and_saves_its_ctrf_report() -> None:
    for name in ("mnnvl-launch", "mnnvl-training"):
        doc = yaml.safe_load((COMPILED_DIR / f"{name}.workflowtemplate.yaml").read_text())
        (template,) = [t for t in doc["spec"]["templates"] if t["name"] == "preflight"]
        args = template["container"]["args"]
        assert args[0] == "preflight" and "--run-id" not in args and "--report-dir" in args
        (ctrf,) = template["outputs"]["artifacts"]
        assert ctrf["path"].endswith("/preflight.ctrf.json")


@pytest.mark.parametrize("name", sorted(surface.PIPELINES))
def test_every_kfp_form_parameter_explains_itself_with_its_valid_values(name: str) -> None:
    kfp = next(yaml.safe_load_all((COMPILED_DIR / f"{name}.kfp.yaml").read_text()))
    params = kfp["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {p.name for p in surface.grouped(surface.PIPELINES[name].parameters())}
    for key, param in params.items():
        description = param.get("description", "")
        assert ". Valid: " in description, key
        if param["parameterType"] == "LIST":
            example = description.split("e.g. ", 1)[1].rstrip(".")
            assert json.loads(example) and all(isinstance(i, str) for i in json.loads(example))


def test_argo_parameters_say_whose_they_are_and_accounts_cannot_be_confused() -> None:
    doc = yaml.safe_load((COMPILED_DIR / "mnnvl-training.workflowtemplate.yaml").read_text())
    described = {
        p["name"]: p.get("description", "") for p in doc["spec"]["arguments"]["parameters"]
    }
    assert described["verify-timeout-s"] != described["train-timeout-s"]
    assert "worker_service_account: service account of the worker pods" in described["pod"]
    assert described["verify-timeout-s"].startswith("verify step: deadline")
    assert described["train-timeout-s"].startswith("train step: deadline")
    assert "launcher" in described["launcher-service-account"]
    assert "service-account" not in described


def test_readme_and_usage_say_where_the_pipelines_defaults_differ_from_the_clis() -> None:
    root = COMPILED_DIR.parents[1]
    for doc in (root / "README.md", root / "docs" / "usage.md"):
        text = " ".join(doc.read_text().split())
        for plan in surface.PIPELINES.values():
            for name, (default, _why) in plan.defaults.items():
                cli = next(i.default for i in surface.step_inputs("train") if i.name == name)
                assert f"`{name}` `{default}` (CLI `{cli}`" in text, (doc.name, name)


def test_components_readme_shows_list_inputs_as_lists() -> None:
    text = (COMPILED_DIR.parents[1] / "components" / "README.md").read_text()
    lists = {
        i.name for c in surface.SPEC_CLASSES for i in surface.class_inputs(c) if i.kind == "list"
    }
    for name in sorted(lists):
        for example in re.findall(rf"`{name}` \(([^)]*)\)", text):
            assert example.startswith(("a list", "`[")), (name, example)
    assert '`env` (a list: `["' in text


# A value other than the default for inputs whose range or choices do not give one alone.
OTHER = {
    "namespace": "team-a",
    "image": "registry.example/train:2",
    "env": ["NCCL_DEBUG=INFO"],
    "node_selector": ["pool=gb200"],
    "tolerations": ["gpu:NoSchedule"],
    "pvc": ["ckpt:/ckpt"],
    "shm_size": "8Gi",
    "max_nodes_per_clique": 16,
    "nodes_per_clique": 1,
    "checkpoint_dir": "/ckpt/run",
    "data": "synthetic",
    "gpu_device_class": "gpu.example.com",
    "clique_label": "example.com/clique",
    "queue_name": "team-queue",
    "worker_service_account": "trainer",
    "priority_class": "high",
    "trainjob_runtime": "gang-step",
    "min_bytes": 1 << 20,
    "judge_min_bytes": 1 << 22,
    "activation_checkpointing": "every-2",
    "warmup_steps": 2,
    "module": "pkg.entry",
    "command": ["python3", "y.py"],
}


# What an input needs beside it to be valid.
COMPANIONS: dict[str, dict[str, Any]] = {
    "topology_aware": {"queue_name": "team-queue"},
    "checkpoint_dir": {"pvc": ["ckpt:/ckpt"]},
    "checkpoint_every": {"checkpoint_dir": "/ckpt/run", "pvc": ["ckpt:/ckpt"]},
    "allow_local_checkpoint": {"nodes": 1},
}


def _given(plan: surface.Pipeline, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as the form takes them, with a command where the custom pipeline needs one."""
    given: dict[str, Any] = {}
    for name, value in values.items():  # each grouped input inside its group, as KFP has it
        group, _, key = surface.PATHS.get(name, name).rpartition(".")
        given.update({key: value} if not group else {group: given.get(group, {}) | {key: value}})
    if plan.name == "mnnvl-custom" and not {"module", "command"} & set(values):
        given["command"] = ["python3", "x.py"]
    return given


def _other(item: surface.Input) -> Any:
    if item.name in OTHER:
        return OTHER[item.name]
    if item.kind == "bool":
        return not item.default
    if item.choices:
        return next(c for c in item.choices if c != item.default)
    assert item.kind in ("int", "float"), f"give {item.name} a value in OTHER"
    low, high = item.valid if isinstance(item.valid, tuple) else (0, 10)
    value = (low + high) / 2 if item.kind == "float" else int(low + (high - low) // 3)
    return value if value != item.default else low


@pytest.mark.parametrize("name", sorted(surface.PIPELINES))
def test_a_form_of_at_most_20_parameters_still_sets_every_input(name: str) -> None:
    """The KFP form holds the essential inputs and one parameter per group; every input is
    still settable, through its group where it has one, and reaches the step's specs."""
    plan = surface.PIPELINES[name]
    form = surface.grouped(plan.parameters())
    assert len(form) <= 20, [p.name for p in form]
    declared = {i.name for cls in surface.SPEC_CLASSES for i in surface.class_inputs(cls)}
    assert set(surface.PATHS) <= declared  # every grouped name is an input
    for item in plan.parameters():
        value = _other(item)
        given = _given(plan, {**COMPANIONS.get(item.name, {}), item.name: value})
        reached = False
        for task, specs in plan.plan(given, "r1"):
            field = (
                "job_timeout_s" if item.name == task.parameter_name("job_timeout_s") else item.name
            )
            if field not in {i.name for i in surface.step_inputs(task.step)}:
                continue
            for spec in specs:
                values = {f.name: v for f, v in leaves(spec)}
                if field in values:
                    got = values[field]
                    got = [f"{k}={v}" for k, v in got.items()] if isinstance(got, dict) else got
                    assert _as_surface(got) == value, (item.name, task.name)
                    reached = True
        assert reached, item.name


def _argo_parameters(pipeline: str, **overrides: str) -> list[dict[str, Any]]:
    """The Argo workflow's parameters as the first task gets them
    ({{workflow.parameters.json}}): the shipped defaults, with ``overrides``."""
    from mnnvl.pipelines import argo_workflow as aw

    params = aw.workflow_parameters(surface.PIPELINES[pipeline])
    values = {p.name: str(p.value) for p in params} | overrides
    return [{"name": name, "value": value} for name, value in values.items()]


def test_a_training_longer_than_its_launcher_pods_deadline_is_refused_naming_both() -> None:
    """On Argo the train launcher pod's deadline (8 h) would stop a 7-day training and tear it
    down: the first task refuses the combination before anything is created."""
    surface.check_pipeline("mnnvl-training", _argo_parameters("mnnvl-training"))
    with pytest.raises(SpecError) as err:
        surface.check_pipeline(
            "mnnvl-training", _argo_parameters("mnnvl-training", **{"train-timeout-s": "604800"})
        )
    message = str(err.value)
    assert err.value.field == "train-deadline-s" and "\n" not in message
    assert "train_timeout_s 604800 s" in message and "deadlines.pods_running_timeout_s" in message
    assert "raise train-deadline-s to at least 606000 or lower train_timeout_s" in message
    surface.check_pipeline(
        "mnnvl-training",
        _argo_parameters(
            "mnnvl-training", **{"train-timeout-s": "604800", "train-deadline-s": "606000"}
        ),
    )


def test_a_queue_with_no_admission_limit_under_a_launcher_deadline_is_refused() -> None:
    queued = {"queue-name": "team-a"}
    with pytest.raises(SpecError) as err:
        surface.check_pipeline("mnnvl-training", _argo_parameters("mnnvl-training", **queued))
    # The tightest step is named: verify's 1 h pod deadline leaves 600 s of queueing.
    assert err.value.field == "verify-deadline-s"
    assert "set deadlines.admission_timeout_s to at most 600 s" in str(err.value)
    limited = '{"admission_timeout_s": 600}'
    surface.check_pipeline(
        "mnnvl-training", _argo_parameters("mnnvl-training", **queued, deadlines=limited)
    )
