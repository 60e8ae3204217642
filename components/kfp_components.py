"""KFP lightweight components: one per step, plus the first task of each pipeline.

Built at import from the input declarations (``kfp_entry``); each embeds the same few lines,
which find the component's function in the launcher image. Pass ``run_id`` as
``dsl.PIPELINE_JOB_ID_PLACEHOLDER``. A float input takes an int (``job_timeout_s=3600``).
"""

from __future__ import annotations

import types
from typing import Any

from kfp import dsl
from kfp.dsl.base_component import BaseComponent
from kfp.dsl.python_component import PythonComponent

from mnnvl.components import kfp_entry
from mnnvl.components.kfp_entry import SPECS, Spec
from mnnvl.inputs.defaults import DEFAULT_LAUNCHER_IMAGE


class FloatsTakeInts(BaseComponent):
    """A component or pipeline whose float inputs take ints too: KFP's type check refuses
    ``3600`` for a float input (``kfp/dsl/types/type_utils.py``,
    ``verify_type_compatibility``), where a user means ``3600.0``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self.component_spec.inputs or {}
        floats = {name for name, spec in inputs.items() if spec.type == "Float"}
        for name in floats & set(kwargs):
            if type(kwargs[name]) is int:
                kwargs[name] = float(kwargs[name])
        return super().__call__(*args, **kwargs)


class Component(FloatsTakeInts, PythonComponent):
    """A KFP lightweight component; ``python_func`` is the function its pod runs."""


def _component(spec: Spec) -> Component:
    # KFP embeds the source of the function it is given: kfp_entry's few lines, under the
    # component's name and signature.
    entry = types.FunctionType(kfp_entry.__getattr__.__code__, {}, spec.name)
    built = dsl.component(
        kfp_entry.signed(entry, spec), base_image=DEFAULT_LAUNCHER_IMAGE, install_kfp_package=False
    )
    return Component(
        component_spec=built.component_spec, python_func=kfp_entry.executable(spec.name)
    )


COMPONENTS = {s.name: _component(s) for s in SPECS.values() if not s.pipeline}
"""The reusable components, in pipeline order."""
FIRST_TASKS = {s.pipeline: _component(s) for s in SPECS.values() if s.pipeline}
"""Pipeline name -> its validating first task."""
STEP_COMPONENTS = {SPECS[name].step: c for name, c in COMPONENTS.items()}
"""Step -> its component."""

preflight_cluster = COMPONENTS["preflight_cluster"]
provision_domain = COMPONENTS["provision_domain"]
train_sharded = COMPONENTS["train_sharded"]
verify_nvlink = COMPONENTS["verify_nvlink"]
launch_workload = COMPONENTS["launch_workload"]
teardown_domain = COMPONENTS["teardown_domain"]
