"""``mnnvl run``: the tasks of the ``mnnvl-training`` pipeline in order, with teardown always.

The shape is ``surface.PIPELINES[RUN_PIPELINE]``, the same declaration the KFP and Argo
pipelines are built from: provision -> verify-pre -> train -> verify-post, then teardown, also
when a task failed or a signal interrupted the run. Each task's specs come from the step's
own inputs and defaults (``surface.step_specs``), so a verification Job gets the verify
step's Job timeout here as in the pipelines and ``mnnvl verify``. The CLI parses; this module
builds every task's specs before anything is created, then sequences the steps.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mnnvl import steps
from mnnvl.errors import Interrupted, MnnvlError, NoCluster, SpecError, TeardownIncomplete
from mnnvl.inputs import surface
from mnnvl.manifests import compute_domain, render_run, render_trainjob
from mnnvl.report_train import summary_lines

logger = logging.getLogger(__name__)

RUN_PIPELINE = surface.RUN_PIPELINE


@dataclass(frozen=True)
class PlannedTask:
    """One task of the run with the validated specs its step takes."""

    task: surface.Task
    specs: tuple[Any, ...]

    @property
    def key(self) -> str:
        """The task's key in the run's result (``verify-pre`` -> ``verify_pre``)."""
        return self.task.name.replace("-", "_")


def plan(values: dict[str, Any], run_id: str, *, skip_verify: bool = False) -> list[PlannedTask]:
    """Every task of the run's pipeline with its specs from ``values`` (pipeline parameter
    names; unset ones take the step's default), and every object each task would create
    built. Raises ``SpecError`` before anything exists."""
    planned = [
        PlannedTask(task, tuple(specs))
        for task, specs in surface.PIPELINES[RUN_PIPELINE].plan(values, run_id)
        if not (skip_verify and task.step == "verify")
    ]
    objects(planned)
    return planned


def objects(
    planned: list[PlannedTask], own_trainjob: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Everything the planned run creates, in creation order, each object once (what
    ``mnnvl render`` prints); the train step as a TrainJob where its workload is one, or as
    ``own_trainjob`` taken (``--trainjob-file``)."""
    domain = planned[0].specs[0]
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for item in planned:
        workload, config = item.specs[0], item.specs[-1]
        if item.task.step == "train" and (workload.trainer_runtime or own_trainjob):
            runtime = workload.trainer_runtime
            made = render_trainjob(domain, workload, config, runtime, own_trainjob)
        elif item.task.step == "train":
            made = render_run(domain, workload, config, None)
        elif item.task.step == "verify":
            made = render_run(domain, workload, None, config)
        else:
            made = [compute_domain(domain)]
        for obj in made:
            out.setdefault((obj["kind"], obj["metadata"]["name"]), obj)
    return list(out.values())


def _step_call(
    planned: PlannedTask,
    kubeconfig: str | None,
    report_dir: str | None,
    own_trainjob: dict[str, Any] | None = None,
) -> Callable[[], Any]:
    """The step function of a task, bound to its specs; with ``own_trainjob``, a team's
    TrainJob is the train step (``steps.launch``: its own program, its RESULT if any)."""
    specs, step = planned.specs, planned.task.step
    reports = f"{report_dir}/{planned.task.name}" if report_dir else None
    calls: dict[str, Callable[[], Any]] = {
        "provision": lambda: steps.provision(specs[0], kubeconfig=kubeconfig),
        "verify": lambda: steps.verify(*specs, kubeconfig=kubeconfig, report_dir=reports),
        "train": lambda: (
            steps.launch(specs[0], "", [], kubeconfig=kubeconfig, own_trainjob=own_trainjob)
            if own_trainjob
            else steps.train(*specs, kubeconfig=kubeconfig, report_dir=reports)
        ),
        "launch": lambda: steps.launch(
            specs[0], specs[1].module, list(specs[1].command), kubeconfig=kubeconfig
        ),
        "teardown": lambda: steps.teardown(specs[0], kubeconfig=kubeconfig),
    }
    return calls[step]


def run_all(
    planned: list[PlannedTask],
    *,
    kubeconfig: str | None,
    report_dir: str | None,
    own_trainjob: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the planned tasks in order; the last one (teardown) runs always, also on signals.
    With ``own_trainjob`` (``mnnvl run --trainjob-file``), that TrainJob is the train step.

    Returns the run id and each task's result dict by task key. Reports of a task go to
    ``<report_dir>/<task name>`` when ``report_dir`` is set (``report_dir`` in the result).
    """
    *work, last = planned
    out: dict[str, Any] = {"run_id": last.specs[0].run_id}
    if report_dir:
        out["report_dir"] = os.path.abspath(report_dir)
    error: BaseException | None = None
    try:
        for item in work:
            call = _step_call(item, kubeconfig, report_dir, own_trainjob)
            out[item.key] = call().to_dict()
    except BaseException as e:  # a step's error or a signal: teardown below, then re-raised
        error = e
        raise
    finally:
        if isinstance(error, NoCluster) and not set(out) - {"run_id", "report_dir"}:
            # The first step found no cluster to talk to: the run created nothing.
            logger.info("teardown skipped: no cluster was reached, so the run created nothing")
        else:
            _teardown_after(last, error, out, kubeconfig)
    _log_summary(out)
    return out


def _teardown_after(
    last: PlannedTask, error: BaseException | None, out: dict[str, Any], kubeconfig: str | None
) -> None:
    """The run's teardown; after a failure (``error``) its own failure is logged, not raised."""
    try:
        out[last.key] = _step_call(last, kubeconfig, None)().to_dict()
    except MnnvlError as e:
        if error is None:
            raise  # the run itself went well: the teardown failure is the result
        if isinstance(e, SpecError):  # e.g. the namespace does not exist: nothing is there
            logger.info("teardown: nothing to delete (%s)", e)
            return
        # Raising here would replace the step's error (or the signal) with this one; it
        # carries what the teardown may have left instead (the CLI reports it last).
        logger.error("teardown after failure also failed: %s", e)
        if isinstance(e, TeardownIncomplete) and isinstance(error, MnnvlError | Interrupted):
            error.leftovers, error.cleanup = e.leftovers, e.cleanup


def _log_summary(out: dict[str, Any]) -> None:
    """The run in a few lines (``report_train.summary_lines``) and where the reports are. The
    verdict tables, the progress and the teardown's count came with each step."""
    logger.info("run %s summary:", out["run_id"])
    tasks = {key.replace("_", "-"): out.get(key) for key in ("verify_pre", "train", "verify_post")}
    for line in summary_lines(tasks):
        logger.info("  %s", line)
    if "report_dir" in out:
        logger.info("  %-12s %s/<task>", "reports", out["report_dir"])
