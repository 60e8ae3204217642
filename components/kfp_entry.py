"""What a KFP component's pod runs; ``__getattr__`` below is the one function KFP embeds.

The pod runs the embedded source as a module and calls the function ``--function_to_execute``
names; the module defines none, so Python asks its ``__getattr__`` (PEP 562), which returns the
component's function from the launcher image's ``mnnvl``: signature, defaults and docstring
from the step's inputs, the body in ``mnnvl.components.bodies``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kfp.dsl import HTML, Artifact, Metrics, Output

from mnnvl.inputs import surface
from mnnvl.inputs.spec import KFP
from mnnvl.inputs.surface import Input

# An input's kind -> its KFP type: the builtin of that name; a list is a list of strings.
_TYPE: dict[str, Any] = {t.__name__: t for t in (int, float, str, bool, dict)} | {"list": list[str]}
_OUTPUTS = {
    "metrics": (Output[Metrics], "numbers from the step's result"),
    "report": (Output[HTML], "HTML report"),
    "result": (Output[Artifact], "JSON of the step's result"),
    "ctrf": (Output[Artifact], "the verdict (or the checks) as a CTRF test report (ctrf.io)"),
}
_DOMAIN = "The ComputeDomain name."
_RUN_ID = "run id every object name and label derives from (the KFP job id)"


@dataclass(frozen=True)
class Spec:
    """One component: its name, what it does, its inputs and outputs, and its body."""

    name: str
    step: str
    summary: str
    outputs: tuple[str, ...] = ()
    returns: str = ""
    pipeline: str = ""  # a pipeline's first task: validate all its parameters, then provision

    @property
    def inputs(self) -> list[Input]:
        """The step's inputs, or a first task's: all of its pipeline's parameters (grouped)."""
        plan = surface.PIPELINES.get(self.pipeline)
        return surface.grouped(plan.parameters() if plan else surface.step_inputs(self.step, KFP))


def declare(
    func: Any, name: str, summary: str, inputs: list[Input], first: Any = (), returns: str = ""
) -> Any:
    """``func`` as KFP reads a function: ``name``, a signature of ``first`` (parameter and its
    description) then ``inputs`` (defaults, KFP types), and a Google-style docstring, whose
    ``Args`` KFP shows as each input's description."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [*first] + [
        (
            inspect.Parameter(i.name, kind, default=i.default, annotation=_TYPE[i.kind]),
            i.description,
        )
        for i in inputs
    ]
    back = {"return": str} if returns else {}
    func.__name__ = func.__qualname__ = name
    func.__signature__ = inspect.Signature(
        [p for p, _ in params], return_annotation=back.get("return", inspect.Signature.empty)
    )
    func.__annotations__ = {p.name: p.annotation for p, _ in params} | back
    doc = [summary, "", "Args:", *(f"    {p.name}: {text}." for p, text in params)]
    doc += ["", "Returns:", f"    {returns}"] if returns else []
    func.__doc__ = "\n".join(doc) + "\n"
    return func


def signed(func: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    """``func`` as component ``spec``: its name, signature, annotations and docstring."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    first = [(inspect.Parameter("run_id", kind, annotation=str), _RUN_ID)]
    first += [
        (inspect.Parameter(o, kind, annotation=_OUTPUTS[o][0]), _OUTPUTS[o][1])
        for o in spec.outputs
    ]
    return declare(func, spec.name, spec.summary, spec.inputs, first, spec.returns)


def executable(name: str) -> Callable[..., Any]:
    """Component ``name``'s function as its pod runs it: the arguments, as one dict, to its
    body in ``mnnvl.components.bodies``."""
    if name not in SPECS:
        raise AttributeError(f"no KFP component {name!r}; the components are {sorted(SPECS)}")
    spec = SPECS[name]

    def run(**params: Any) -> Any:
        from mnnvl.components import bodies

        if spec.pipeline:
            return bodies.provision_for_pipeline(spec.pipeline, params)
        return getattr(bodies, spec.name)(params)

    return signed(run, spec)


_STEPS = [
    Spec(
        "preflight_cluster",
        "preflight",
        "Check, read-only, that the cluster is ready for a run (CRD, DeviceClasses, cliques,\n"
        "GPU stack and --gpu-mode, IMEX mode, Kueue queue, own permissions); the result and\n"
        "CTRF report are written before a failing row fails the task.",
        ("result", "ctrf"),
    ),
    Spec(
        "provision_domain",
        "provision",
        "Create (or adopt) the run's ComputeDomain and wait for its channel claim template.",
        returns=_DOMAIN,
    ),
    Spec(
        "train_sharded",
        "train",
        "Run FSDP2 training as a multi-node Indexed Job inside the run's ComputeDomain.",
        ("metrics", "report", "result"),
    ),
    Spec(
        "verify_nvlink",
        "verify",
        "Check NVLink/IMEX health and all-reduce bus bandwidth across the run's nodes; the\n"
        "metrics and report are written before a FAIL verdict fails the task.",
        ("metrics", "report", "result", "ctrf"),
    ),
    Spec(
        "launch_workload",
        "launch",
        "Run your image and command (or a Python module, once per GPU) on every node of the\n"
        "run's ComputeDomain; numbers of its ``RESULT {json}`` line become metrics.",
        ("metrics", "result"),
    ),
    Spec(
        "teardown_domain",
        "teardown",
        "Delete every object of the run (workload first, then the ComputeDomain); idempotent.",
    ),
]
_FIRSTS = [
    Spec(
        "provision_" + name.removeprefix("mnnvl-").replace("-", "_"),  # provision_verify_only
        "provision",
        f"First task of {name}: validate every pipeline parameter, then provision\n"
        "the ComputeDomain, so bad input fails before any object exists.",
        returns=_DOMAIN,
        pipeline=name,
    )
    for name in surface.PIPELINES
]
SPECS = {spec.name: spec for spec in [*_STEPS, *_FIRSTS]}


def __getattr__(name: str) -> Any:
    """Component ``name``'s function, as the launcher image's ``mnnvl`` builds it."""
    import mnnvl.components.kfp_entry as entry  # not `from`: it would ask this for __path__

    return entry.executable(name)
