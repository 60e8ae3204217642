"""Every input of every step and pipeline, from the spec fields' declarations (``spec.opt``):
the CLI flags (``flags``), the KFP components and pipelines and the Argo templates and
workflows. A step's or pipeline's default that differs from the field's is written here once,
with its reason. On KFP and Argo a list input is a list of strings (an Argo JSON list).
Standard library only.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mnnvl.errors import SpecError
from mnnvl.inputs.checks import check_range, parse_bytes, parse_env, parse_list, plain
from mnnvl.inputs.spec import (
    CLI,
    KFP,
    DomainSpec,
    LaunchSpec,
    TrainConfig,
    VerifyConfig,
    WorkloadSpec,
    fields_of,
    from_inputs,
)
from mnnvl.inputs.storage import check_shared_storage

SIZE_FIELDS = frozenset({"min_bytes", "max_bytes", "judge_min_bytes"})
SPEC_CLASSES: tuple[type, ...] = (DomainSpec, WorkloadSpec, TrainConfig, VerifyConfig, LaunchSpec)


@dataclass(frozen=True)
class Input:
    """One input as a surface sees it: ``kind`` is int, float, str, bool or list."""

    name: str
    kind: str
    default: Any
    help: str
    surfaces: frozenset[str]
    why: str = ""
    choices: tuple[str, ...] = ()
    valid: tuple[float, float] | str | None = None
    example: tuple[str, ...] = ()
    group: str = ""  # the group it is in on KFP and Argo ('' = a parameter of its own)
    members: tuple[Input, ...] = ()  # a group's inputs (kind dict)

    @property
    def description(self) -> str:
        """The help and the values a form takes: the choices, a range, a list's form."""
        if self.choices:
            values = "one of " + ", ".join(self.choices)
        elif self.kind == "bool":
            values = "true or false"
        elif isinstance(self.valid, str):
            values = self.valid
        elif self.valid:
            whole = "a whole number" if self.kind == "int" else "a number"
            values = f"{whole} from {plain(self.valid[0])} to {plain(self.valid[1])}"
        elif self.kind == "list":
            values = f"a list of strings, e.g. {json.dumps(list(self.example))}"
        elif self.kind == "dict":
            values = "a JSON object of some of these keys (the rest keep their defaults): "
            values += "; ".join(f"{m.name}: {m.description}" for m in self.members)
        else:
            return self.help
        return f"{self.help}. Valid: {values}"

    @property
    def kebab(self) -> str:
        return self.name.replace("_", "-")

    @property
    def flag(self) -> str:
        return "--" + self.kebab

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    def text(self, value: Any = None) -> str:
        """A value as an Argo parameter string (the default when none is given)."""
        value = self.default if value is None else value
        if self.kind == "bool":
            return "true" if value else "false"
        if self.kind in ("list", "dict"):
            return json.dumps(value)  # a tuple too, as a JSON list
        return str(value)

    def coerce(self, value: Any) -> Any:
        """A single value (typed from KFP, text from Argo and the CLI) as this input's kind;
        lists are ``build``'s."""
        if self.kind == "int" and isinstance(value, float) and value.is_integer():
            return int(value)  # a JSON number inside a group: KFP writes 3 as 3.0
        if not isinstance(value, str) or self.kind not in ("bool", "int", "float"):
            return value
        text = value.strip()
        try:
            if self.kind == "bool":
                if text.lower() not in ("true", "false"):
                    raise ValueError("expected true or false")
                return text.lower() == "true"
            if self.kind == "int":
                return parse_bytes(self.name, text) if self.name in SIZE_FIELDS else int(text)
            return float(text)
        except SpecError:
            raise  # a size's own check already names the input and the forms it takes
        except ValueError as e:
            raise SpecError(self.name, f"{value!r} is not a valid {self.kind} ({e})") from None


@functools.cache
def class_inputs(cls: type) -> tuple[Input, ...]:
    """The inputs a spec dataclass declares, in declaration order (a nested group's in place);
    a dict or tuple field is a list of strings on every surface."""
    out = []
    for owner, f, nest in fields_of(cls):  # a group: where it nests, else as declared
        hint = typing.get_type_hints(owner)[f.name]
        listed = typing.get_origin(hint) in (dict, tuple)
        kind = "list" if listed else getattr(hint, "__name__", "object")
        default: Any = [] if f.default_factory is not dataclasses.MISSING else f.default
        meta = {
            k: f.metadata[k] for k in ("help", "surfaces", "why", "choices", "valid", "example")
        }
        group = nest or f.metadata["group"]
        out.append(Input(f.name, kind, list(default) if listed else default, group=group, **meta))
    return tuple(out)


# ---- groups: how KFP and Argo carry the inputs past the essential ones -----------------------

# On KFP and Argo, each group is one parameter (a KFP dict, an Argo JSON object) holding its
# inputs by name; the rest are parameters of their own. The CLI keeps one flag per input and
# lists them under these groups in --help. Which inputs a group holds comes from the specs:
# a nested group's fields (``WorkloadSpec.placement``) and the fields declared in it.
GROUP_HELP = {
    "placement": "where the worker pods run: NVLink clique groups, GPUs and node selection",
    "pod": "the worker pods' template",
    "deadlines": "deadlines and graces, in seconds",
    "recovery": "gang restarts, hang detection and checkpoints",
    "train": "the training run's optimiser, numerics and logging",
    "verify": "the verification sweep and its thresholds",
}
# Where a grouped input stands on KFP and Argo, and how every surface names it in errors:
# max_restarts -> recovery.max_restarts.
PATHS = {
    i.name: f"{i.group}.{i.name}" for cls in SPEC_CLASSES for i in class_inputs(cls) if i.group
}


def grouped(inputs: list[Input]) -> list[Input]:
    """``inputs`` as KFP and Argo have them: the ungrouped ones, then one input per group."""
    members: dict[str, list[Input]] = {}
    for item in inputs:
        members.setdefault(item.group, []).append(item)
    groups = [
        Input(
            group,
            "dict",
            {m.name: m.default for m in members[group]},
            help,
            frozenset().union(*(m.surfaces for m in members[group])),
            members=tuple(members[group]),
        )
        for group, help in GROUP_HELP.items()
        if group in members
    ]
    return [*members.get("", []), *groups]


def group_values(group: str, value: Any) -> dict[str, Any]:
    """A group's value (a dict, or its JSON from Argo and ``--<group>-json``) by input name;
    a key that is no input of the group is refused with a guess."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as e:
            raise SpecError(group, f"is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise SpecError(group, f"must be a JSON object of input: value, not {value!r}")
    known = [path for path in PATHS.values() if path.startswith(f"{group}.")]
    for key in value:
        if f"{group}.{key}" not in known:
            close = difflib.get_close_matches(f"{group}.{key}", known, n=1)
            guess = f"did you mean {close[0]}? " if close else ""
            raise SpecError(
                f"{group}.{key}", f"is not a key of {group}; {guess}its keys: {', '.join(known)}"
            )
    return value


def pick(values: dict[str, Any], inputs: Iterable[Input]) -> dict[str, Any]:
    """The set values of ``inputs``, each given on its own or inside its group."""
    groups = {g: group_values(g, values[g]) for g in GROUP_HELP if values.get(g) is not None}
    out = {}
    for item in inputs:
        own, inner = values.get(item.name), groups.get(item.group, {}).get(item.name)
        if own is not None and inner is not None and own != inner:
            raise SpecError(item.name, f"is given twice: on its own and in {item.group}")
        if own is not None or inner is not None:
            out[item.name] = inner if own is None else own
    return out


def named(error: SpecError, flags: Mapping[str, str] | None = None) -> SpecError:
    """``error`` naming its input as every surface does: its group path where it has one
    (``recovery.max_restarts``), then, on the CLI, the flag that sets it (``flags``: input
    name -> flag)."""
    head, dot, rest = error.field.partition(".")
    flag = (flags or {}).get(head)
    field = PATHS.get(head, head) + dot + rest + (f" ({flag})" if flag else "")
    return SpecError(field, error.detail)


# ---- steps ---------------------------------------------------------------------------------

STEP_CLASSES: dict[str, tuple[type, ...]] = {
    "provision": (DomainSpec,),
    "train": (WorkloadSpec, TrainConfig),
    "verify": (WorkloadSpec, VerifyConfig),
    "launch": (WorkloadSpec, LaunchSpec),
    "teardown": (DomainSpec,),
    "preflight": (WorkloadSpec,),
}
# What preflight checks a run's shape against; the rest of a workload's inputs it ignores.
PREFLIGHT_INPUTS = frozenset(
    {"namespace", "nodes", "nodes_per_clique", "max_nodes_per_clique", "gpus_per_node"}
    | {"gpu_mode", "gpu_device_class", "clique_label", "queue_name", "api_outage_s"}
    | {"workload", "trainjob_runtime"}
)
# Inputs of a class that a step does not use.
STEP_SKIPS: dict[str, frozenset[str]] = {
    "provision": frozenset({"delete_timeout_s"}),
    "train": frozenset({"purpose"}),
    "verify": frozenset({"workload", "trainjob_runtime"}),  # always an Indexed Job
    "teardown": frozenset({"allocation_mode", "rct_timeout_s"}),
    "preflight": frozenset(i.name for i in class_inputs(WorkloadSpec)) - PREFLIGHT_INPUTS,
}
# Step defaults that differ from the dataclass's, with the reason.
STEP_DEFAULTS: dict[str, dict[str, tuple[Any, str]]] = {
    "verify": {
        "purpose": ("verify", "a verification Job is named verify, verify-pre or verify-post"),
        "job_timeout_s": (1800.0, "a sweep takes minutes; a hung one must not hold GPUs 2 h"),
    },
    "launch": {"purpose": ("job", "a user's Job is named job, apart from train and verify")},
}


def step_inputs(step: str, surface: str | None = None) -> list[Input]:
    """The inputs of one step (optionally only those ``surface`` exposes), step defaults applied."""
    seen: dict[str, Input] = {}
    overrides = STEP_DEFAULTS.get(step, {})
    for cls in STEP_CLASSES[step]:
        for item in class_inputs(cls):
            if item.name in seen or item.name in STEP_SKIPS.get(step, ()) or not item.surfaces:
                continue
            if item.name in overrides:
                item = dataclasses.replace(item, default=overrides[item.name][0])
            seen[item.name] = item
    return [i for i in seen.values() if surface is None or surface in i.surfaces]


def build(cls: type, values: dict[str, Any], **extra: Any) -> Any:
    """A validated ``cls`` from surface values by input name, each given on its own or inside
    its group (lists -> dict/tuple, the rest as ``Input.coerce`` takes them); unset inputs keep
    the dataclass default."""
    kwargs: dict[str, Any] = {}
    values = pick(values, class_inputs(cls))
    for (_, f, _), item in zip(fields_of(cls), class_inputs(cls), strict=True):
        value = values.get(f.name)
        if value is None:
            continue
        if f.default_factory is dict:
            value = parse_env(value, f.name)
        elif item.kind == "list":
            value = parse_list(value, f.name)
        else:
            value = item.coerce(value)
        kwargs[f.name] = value
    return from_inputs(cls, **(kwargs | extra))


def step_specs(step: str, run_id: str, values: dict[str, Any], *classes: type) -> list[Any]:
    """Every spec a step builds from its inputs (or only ``classes``), each given on its own
    or inside its group (raises ``SpecError`` on the first bad one)."""
    inputs = step_inputs(step)
    full = {i.name: i.default for i in inputs if not i.required} | pick(values, inputs)
    out = [
        build(cls, full, run_id=run_id) if cls in (DomainSpec, WorkloadSpec) else build(cls, full)
        for cls in classes or STEP_CLASSES[step]
    ]
    if step == "train":
        check_shared_storage(*out)
    if step == "launch" and out[0].purpose != "job":
        # train and verify* name those steps' Jobs: the same name would adopt or conflict.
        raise SpecError(
            "purpose",
            f"{out[0].purpose!r} names the {out[0].purpose.split('-')[0]} step's Job; a "
            "launched workload's Job is job (leave purpose unset)",
        )
    return out


# ---- pipelines -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One task of a pipeline: which step, and inputs fixed per task."""

    name: str
    step: str
    fixed: dict[str, Any] = field(default_factory=dict)

    def parameter_name(self, input_name: str) -> str:
        """The pipeline parameter of a step input: its own name, but for the one input steps
        share with other values, each Job's deadline (``train_timeout_s``, ``verify_timeout_s``)."""
        if input_name == "job_timeout_s" and self.step in ("train", "verify", "launch"):
            return f"{self.step}_timeout_s"
        return input_name


@dataclass(frozen=True)
class Pipeline:
    """A pipeline: tasks in order (the last one is the exit handler's teardown)."""

    name: str
    description: str
    tasks: tuple[Task, ...]
    defaults: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def parameters(self, surface: str = KFP, *, own_defaults: bool = True) -> list[Input]:
        """The pipeline parameters (KFP and Argo; ``mnnvl run`` with ``CLI``): every task input,
        renamed (its help says whose), once; ``own_defaults`` False keeps the steps' defaults."""
        params: dict[str, Input] = {}
        for task in self.tasks:
            for item in step_inputs(task.step, surface):
                if item.name in task.fixed:
                    continue
                name, default, help = task.parameter_name(item.name), item.default, item.help
                if own_defaults and name in self.defaults:
                    default, why = self.defaults[name]
                    help += f" (here {default}; the step's own is {item.default}: {why})"
                if name != item.name:  # a rename names one step's input
                    help = f"{task.step} step: {help}"
                renamed = dataclasses.replace(item, name=name, default=default, help=help)
                known = params.setdefault(name, renamed)
                if (known.default, known.kind) != (renamed.default, renamed.kind):
                    raise ValueError(f"{self.name}: parameter {name} has two defaults; rename one")
        return list(params.values())

    def component_arguments(self, task: Task, values: dict[str, Any]) -> dict[str, Any]:
        """The task's component (or template) inputs from the grouped pipeline parameters:
        a group goes whole to every task with inputs in it."""
        return self.task_arguments(task, values, grouped(step_inputs(task.step, KFP)))

    def task_arguments(
        self, task: Task, values: dict[str, Any], inputs: list[Input] | None = None
    ) -> dict[str, Any]:
        """The task's step inputs (or ``inputs``) from the pipeline's parameter values; the
        task's fixed inputs win."""
        return {
            item.name: task.fixed.get(item.name, values.get(task.parameter_name(item.name)))
            for item in (step_inputs(task.step) if inputs is None else inputs)
            if item.name in task.fixed or task.parameter_name(item.name) in values
        }

    def plan(self, values: dict[str, Any], run_id: str) -> list[tuple[Task, list[Any]]]:
        """Every task with the specs its step builds from pipeline parameter values (strings
        are fine; unset parameters take the step's default). The one walk over a pipeline's
        tasks: ``mnnvl run``, ``mnnvl render`` and the pipelines' first-task check use it."""
        params = {p.name: p for p in self.parameters(CLI) + grouped(self.parameters())}
        unknown = sorted(set(values) - set(params))
        if unknown:
            raise SpecError(unknown[0], f"is not a parameter of pipeline {self.name}")
        flat = pick(values, [p for p in params.values() if p.kind != "dict"])
        planned = []
        for task in self.tasks:
            try:
                planned.append(
                    (task, step_specs(task.step, run_id, self.task_arguments(task, flat)))
                )
            except SpecError as e:  # named as the pipeline's parameter, not the step's input
                raise SpecError(task.parameter_name(e.field), e.detail) from None
        return planned


# How the pipelines retry a task (KFP ``set_retry``, Argo ``retryStrategy``): 2 retries, 15 s
# then 30 s apart; new attempts start within an hour of the first (three attempts of up to
# ``delete_timeout_s``, 300 s by default, plus the backoff fit). A workload task may be lost
# hours into its Job: KFP gives it the longest job_timeout_s as its window, Argo none (its
# ``activeDeadlineSeconds`` bounds each attempt).
STEP_RETRIES = 2
STEP_RETRY_BACKOFF_S = 15
STEP_RETRY_FACTOR = 2
STEP_RETRY_WINDOW = "3600s"  # as KFP and Argo write a duration

_PROVISION = Task("provision", "provision")
_TEARDOWN = Task("teardown", "teardown")
_PRE = Task("verify-pre", "verify", {"purpose": "verify-pre"})
_GPU_RUN = "the shipped pipeline runs on GPU clusters; the CLI's default is a smoke test"

PIPELINES: dict[str, Pipeline] = {
    p.name: p
    for p in (
        Pipeline(
            "mnnvl-training",
            "Provision a ComputeDomain, verify NVLink (gate), run sharded multi-node training, "
            "verify again, and always tear down.",
            (
                _PROVISION,
                _PRE,
                Task("train", "train"),
                Task("verify-post", "verify", {"purpose": "verify-post"}),
                _TEARDOWN,
            ),
            {"model": ("1b", _GPU_RUN), "steps": (100, _GPU_RUN), "batch_size": (4, _GPU_RUN)},
        ),
        Pipeline(
            "mnnvl-verify-only",
            "Provision a ComputeDomain, verify NVLink across its nodes, and always tear down.",
            (_PROVISION, Task("verify", "verify", {"purpose": "verify"}), _TEARDOWN),
        ),
        Pipeline(
            "mnnvl-custom",
            "Provision a ComputeDomain, verify NVLink (gate), run your own image and command "
            "on its nodes, and always tear down.",
            (_PROVISION, _PRE, Task("launch", "launch", {"purpose": "job"}), _TEARDOWN),
        ),
    )
}


RUN_PIPELINE = "mnnvl-training"  # what `mnnvl run` runs and `mnnvl render` prints


def run_parameters() -> list[Input]:
    """The flags of ``mnnvl run`` and ``mnnvl render``: the pipeline's parameters as the CLI
    has them (renamed as in KFP and Argo, e.g. ``train_timeout_s``), with the steps' defaults."""
    pipeline = PIPELINES[RUN_PIPELINE]
    # The run's reports go to --report-dir on this side; the workers' own output dir is not used.
    return [p for p in pipeline.parameters(CLI, own_defaults=False) if p.name != "output_dir"]


# Workflow parameters only the Argo workflows have (the launcher pods' account, image and
# deadlines, ``pipelines.argo_workflow.ARGO_ONLY``): in ``{{workflow.parameters.json}}``, but
# no step input.
ARGO_ONLY_PARAMETERS = frozenset(
    {"launcher-service-account", "launcher-image"}
    | {f"{s}-deadline-s" for s in ("train", "verify", "launch")}
)
# A workload step's launcher beyond its waits: creating the Job, reading its result, and for a
# failed one removing its Jobs (at most 120 s) and leaving the record of the failure.
LAUNCHER_MARGIN_S = 300.0
LAUNCHER_DEADLINE_HELP = (
    "activeDeadlineSeconds of each {step} launcher pod (Argo stops the step at it, without a "
    "retry, and the exit handler tears the run down); it must cover the step's own timeouts, "
    "deadlines.admission_timeout_s (set one when queue-name is) + "
    "deadlines.pods_running_timeout_s + {step}-timeout-s + {margin:g} s, which the first task "
    "checks"
)


def check_launcher_deadlines(planned: list[tuple[Task, list[Any]]], values: dict[str, Any]) -> None:
    """Refuse a launcher pod deadline (Argo's ``<step>-deadline-s``) shorter than what its
    workload step may take by its own timeouts: Argo would stop the step while its Job still
    runs, and the exit handler would tear the training down. The tightest step is named."""
    problems = []
    for task, specs in planned:
        name, timeout = f"{task.step}-deadline-s", task.parameter_name("job_timeout_s")
        workload = next((s for s in specs if isinstance(s, WorkloadSpec)), None)
        if workload is None or values.get(name) is None:
            continue
        try:
            deadline_s = int(str(values[name]))
        except ValueError:
            text = f"must be a whole number of seconds, got {values[name]!r}"
            raise SpecError(name, text) from None
        check_range(name, deadline_s, 1, 30 * 86400, integer=True)
        limits = workload.deadlines
        waits = limits.pods_running_timeout_s + workload.job_timeout_s + LAUNCHER_MARGIN_S
        room, need = deadline_s - waits, waits + limits.admission_timeout_s
        took = f"{timeout} {workload.job_timeout_s:g} s + deadlines.pods_running_timeout_s "
        took += f"{limits.pods_running_timeout_s:g} s"
        if workload.queue_name and not limits.admission_timeout_s:
            text = (
                f"{deadline_s:g} s bounds the {task.step} launcher pod, but queue_name is set and "
                "deadlines.admission_timeout_s is 0 (no limit): a Job queued long would be cut by "
                f"the pod's deadline; set deadlines.admission_timeout_s to at most "
                f"{max(0.0, room):g} s ({name} less {took} and {LAUNCHER_MARGIN_S:g} s), or "
                f"raise {name}"
            )
        elif deadline_s < need:
            text = (
                f"{deadline_s:g} s, the {task.step} launcher pod's deadline, is shorter than the "
                f"step may take: {took} + deadlines.admission_timeout_s "
                f"{limits.admission_timeout_s:g} s + {LAUNCHER_MARGIN_S:g} s = {need:g} s; raise "
                f"{name} to at least {need:.0f} or lower {timeout}"
            )
        else:
            continue
        problems.append((room, SpecError(name, text)))
    if problems:
        raise min(problems, key=lambda p: p[0])[1]


def check_pipeline(name: str, values: dict[str, Any] | list[dict[str, Any]] | str) -> None:
    """Validate a pipeline's parameters: a dict, Argo's ``[{name, value}]`` list (kebab case
    names), or its JSON."""
    if isinstance(values, str):
        try:
            values = json.loads(values) if values.strip() else {}
        except ValueError as e:
            raise SpecError("pipeline_parameters", f"is not JSON ({e})") from None
    argo = isinstance(values, list) and all(isinstance(p, dict) and "name" in p for p in values)
    if argo:
        values = {str(p["name"]): p.get("value") for p in values}  # type: ignore
    if not isinstance(values, dict):
        raise SpecError(
            "pipeline_parameters",
            f"must be a JSON object of name: value or Argo's [{{name, value}}] list, "
            f"not {json.dumps(values)[:60]}",
        )
    extra = ARGO_ONLY_PARAMETERS if argo else frozenset()
    snake = {k.replace("-", "_"): v for k, v in values.items() if k not in extra}
    try:
        planned = PIPELINES[name].plan(snake, "check")
    except SpecError as e:
        raise named(e) from None
    if argo:
        check_launcher_deadlines(planned, values)
