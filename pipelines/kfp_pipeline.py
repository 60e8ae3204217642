"""KFP pipelines ``mnnvl-training``, ``mnnvl-verify-only`` and ``mnnvl-custom``
(``surface.PIPELINES``), their parameters built from the field declarations.

Every task gets the run id from ``dsl.PIPELINE_JOB_ID_PLACEHOLDER`` (the exit task may not read
other tasks' outputs); caching is off. The first task validates every parameter and is not
retried; teardown and the workload tasks are. KFP cannot retry on an exit code, so a workload
task's retry after a permanent failure meets the record of that failure and fails again at once
(``mnnvl.driver.workload.record_failure``); after a lost pod it adopts the step's Job.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl.component_factory import extract_component_interface
from kfp.dsl.graph_component import GraphComponent

from mnnvl.components import kfp_components as kc
from mnnvl.components import kfp_entry
from mnnvl.components import launcher_pod as lp
from mnnvl.inputs import surface

RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER
# Argo, which runs KFP's tasks, counts the window from the first attempt's start, and a
# workload task may be lost late in its Job: the longest job_timeout_s (7 days).
WORKLOAD_RETRY_MAX_DURATION = f"{7 * 86400}s"


class Pipeline(kc.FloatsTakeInts, GraphComponent):
    """A KFP pipeline whose float parameters take ints (``train_timeout_s=3600``)."""


def task_names(name: str) -> dict[str, str]:
    """KFP's name of each task of pipeline ``name`` (its component's, ``-2`` on the second
    use) -> the task's name in ``surface.PIPELINES`` (``verify-nvlink-2`` -> ``verify-post``)."""
    plan = surface.PIPELINES[name]
    components = [kc.FIRST_TASKS[name], *(kc.STEP_COMPONENTS[t.step] for t in plan.tasks[1:])]
    seen: Counter[str] = Counter()
    out = {}
    for task, component in zip(plan.tasks, components, strict=True):
        seen[component.name] += 1
        count = seen[component.name]
        out[component.name + (f"-{count}" if count > 1 else "")] = task.name
    return out


def _configured(
    task: dsl.PipelineTask, step: str, display_name: str, retry_max_duration: str | None
) -> dsl.PipelineTask:
    """``task`` uncached, retried within ``retry_max_duration`` (None: never), with the
    launcher-pod settings of ``launcher_pod`` that kfp-kubernetes can carry: user, group,
    non-root, requests and limits, labels (see that module for the rest)."""
    kubernetes.set_security_context(
        task, run_as_user=lp.UID, run_as_group=lp.GID, run_as_non_root=lp.RUN_AS_NON_ROOT
    )
    for key, value in lp.labels(step).items():
        kubernetes.add_pod_label(task, key, value)
    task.set_cpu_request(lp.CPU_REQUEST).set_memory_request(lp.MEMORY_REQUEST)
    task.set_memory_limit(lp.MEMORY_LIMIT).set_caching_options(False)
    if retry_max_duration is not None:
        task.set_retry(
            num_retries=surface.STEP_RETRIES,
            backoff_duration=f"{surface.STEP_RETRY_BACKOFF_S}s",
            backoff_factor=float(surface.STEP_RETRY_FACTOR),
            backoff_max_duration=retry_max_duration,
        )
    return task.set_display_name(display_name)


def _wire(plan: surface.Pipeline, values: dict[str, Any]) -> None:
    """Create the tasks: provision (validating everything) -> ... ; teardown on exit."""
    teardown_task = plan.tasks[-1]
    teardown = _configured(
        kc.teardown_domain(run_id=RUN_ID, **plan.component_arguments(teardown_task, values)),
        teardown_task.step,
        teardown_task.name,
        surface.STEP_RETRY_WINDOW,
    )
    with dsl.ExitHandler(teardown, name="mnnvl-run"):
        first = kc.FIRST_TASKS[plan.name]
        # Not retried: a bad parameter must fail in one attempt, not after every backoff.
        # Provisioning still rides out API outages (the driver retries each request).
        previous = _configured(first(run_id=RUN_ID, **values), "provision", "provision", None)
        for task in plan.tasks[1:-1]:
            component = kc.STEP_COMPONENTS[task.step]
            current = _configured(
                component(run_id=RUN_ID, **plan.component_arguments(task, values)),
                task.step,
                task.name,
                WORKLOAD_RETRY_MAX_DURATION,
            )
            current.after(previous)
            previous = current


def build_pipeline(name: str) -> Callable[..., None]:
    """The ``@dsl.pipeline`` function of ``name``, its signature from the field declarations."""
    plan = surface.PIPELINES[name]

    def pipeline(*args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(pipeline).bind(*args, **kwargs)
        bound.apply_defaults()
        _wire(plan, dict(bound.arguments))

    kfp_entry.declare(
        pipeline, name.replace("-", "_"), plan.description, surface.grouped(plan.parameters())
    )
    # Finished runs' pods go after a day (success) or a week (failure, kept for `kubectl logs`),
    # as the Argo templates' ttlStrategy. No run-wide active deadline: it would also cut the
    # exit handler's teardown; each step has its own deadline (job_timeout_s).
    config = dsl.PipelineConfig(
        ttl_seconds_after_success=86400, ttl_seconds_after_failure=7 * 86400
    )
    # What @dsl.pipeline does (kfp/dsl/component_factory.py, create_graph_component_from_func),
    # with floats that take ints.
    spec = extract_component_interface(pipeline, name=name, description=plan.description)
    return Pipeline(component_spec=spec, pipeline_func=pipeline, pipeline_config=config)


PIPELINES = {name: build_pipeline(name) for name in surface.PIPELINES}
"""Every pipeline by name, built at import (a fraction of a second in all)."""
training_pipeline = PIPELINES["mnnvl-training"]
verify_only_pipeline = PIPELINES["mnnvl-verify-only"]
