"""What the KFP components do: inputs -> specs -> ``mnnvl.steps`` -> artifacts.

Each body takes the component's arguments as one dict and imports no kfp. A deliberate failure
logs ``<step> failed: <input>: <why>`` and exits with the CLI's exit code (``one_line``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from mnnvl import report, steps
from mnnvl.components.artifacts import (
    kubeconfig,
    publish_launch,
    publish_train,
    publish_verify,
    write_result,
)
from mnnvl.contract.result import verdict_accepted
from mnnvl.errors import MnnvlError, SpecError, VerificationFailed, WorkloadFailed
from mnnvl.inputs import surface
from mnnvl.inputs.namespace import resolve_namespace

log = logging.getLogger(__name__)


@contextlib.contextmanager
def one_line(step: str) -> Iterator[None]:
    """``step``'s deliberate failures end the task with one log line and the error's exit
    code (2 bad input, 3 timeout, 4 workload, 5 cluster), not a traceback. A decorator of
    a body too."""
    try:
        yield
    except MnnvlError as e:  # an input by its group path: verify.min_bytes
        log.error("%s failed: %s", step, surface.named(e) if isinstance(e, SpecError) else e)
        raise SystemExit(e.exit_code) from None


def _specs(step: str, params: dict[str, Any]) -> list[Any]:
    """The step's specs from the component's arguments (the step's defaults for inputs left
    out of a group); an empty namespace is the launcher pod's own (else default), resolved here."""
    values = params | {"namespace": resolve_namespace(params.get("namespace"))}
    return surface.step_specs(step, values.pop("run_id"), values)


@one_line("provision")
def provision_domain(params: dict[str, Any]) -> str:
    (domain,) = _specs("provision", params)
    return steps.provision(domain, kubeconfig=kubeconfig()).domain


def provision_for_pipeline(pipeline: str, params: dict[str, Any]) -> str:
    """Validate every parameter of ``pipeline`` (all tasks' specs), then provision."""
    run_id = params.pop("run_id")
    plan = surface.PIPELINES[pipeline]
    with one_line("provision"):
        plan.plan(params, run_id)
    (task,) = [t for t in plan.tasks if t.step == "provision"]
    return provision_domain({**plan.component_arguments(task, params), "run_id": run_id})


@one_line("train")
def train_sharded(params: dict[str, Any]) -> None:
    workload, config = _specs("train", params)
    report.preload_plotting()  # the report follows the Job; its import need not
    outcome = steps.train(workload, config, kubeconfig=kubeconfig())
    publish_train(workload.run_id, outcome, params)


@one_line("verify")
def verify_nvlink(params: dict[str, Any]) -> None:
    workload, config = _specs("verify", params)
    report.preload_plotting()  # the report follows the Job; its import need not
    outcome = steps.verify(workload, config, kubeconfig=kubeconfig(), fail_on_fail=False)
    purpose = workload.purpose
    publish_verify(workload.run_id, outcome, purpose, params)
    if not verdict_accepted(outcome.verdict, config.allow_unjudged):
        raise VerificationFailed(
            f"{purpose}: verdict {outcome.verdict}: {report.verdict_numbers(outcome.raw)}; "
            f"reasons: {'; '.join(outcome.raw.get('reasons') or []) or 'none given'}"
        )


@one_line("launch")
def launch_workload(params: dict[str, Any]) -> None:
    """Run the user's workload; the result artifact is written even when it fails."""
    workload, launch = _specs("launch", params)
    try:
        outcome = steps.launch(
            workload, launch.module, list(launch.command), kubeconfig=kubeconfig()
        )
    except WorkloadFailed as err:
        # The failed pod's own exit code when the driver saw one; else the step's.
        code = err.pod_exit_code if err.pod_exit_code is not None else err.exit_code
        failed = {"exit_code": code, "error": str(err), "result": err.result}
        write_result(params["result"], workload.run_id, workload.purpose, failed)
        raise
    publish_launch(workload.run_id, outcome, params)


def preflight_cluster(params: dict[str, Any]) -> None:
    """Check the cluster (read-only); the result and CTRF report are written before a failing
    row fails the task."""
    import shutil
    import tempfile

    (workload,) = _specs("preflight", params)
    with tempfile.TemporaryDirectory(prefix="mnnvl-preflight-") as tmp:
        outcome = steps.preflight(
            workload, kubeconfig=kubeconfig(), report_dir=tmp, fail_on_fail=False
        )
        shutil.copyfile(outcome.report_files["ctrf"], params["ctrf"].path)
    write_result(params["result"], workload.run_id, "preflight", outcome.to_dict())
    if not outcome.passed:
        raise VerificationFailed(f"preflight: {steps.preflight_failure(outcome.rows)}")


@one_line("teardown")
def teardown_domain(params: dict[str, Any]) -> None:
    """The exit handler. Its inputs are the pipeline's, which the first task validated before
    it created anything: inputs it refuses (a namespace that is no name, or that does not
    exist) mean this run created nothing, so it returns at once with nothing deleted."""
    try:
        (spec,) = _specs("teardown", params)
        steps.teardown(spec, kubeconfig=kubeconfig())
    except SpecError as e:
        log.warning("teardown: nothing to delete: %s", e)
