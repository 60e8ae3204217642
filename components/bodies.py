"""What the KFP components do: inputs -> specs -> ``mnnvl.steps`` -> artifacts.

Each body takes the component's arguments as one dict and imports no kfp: the artifact
arguments are duck-typed (``.path`` and ``.log_metric``) and everything heavy is imported
lazily. A deliberate failure logs ``<step> failed: <input>: <why>`` and exits with the CLI's
exit code (``one_line``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any, Protocol

from mnnvl import report, steps
from mnnvl.contract.result import NOT_JUDGED, PASS, verdict_accepted
from mnnvl.errors import MnnvlError, SpecError, VerificationFailed, WorkloadFailed
from mnnvl.inputs import surface
from mnnvl.inputs.namespace import resolve_namespace
from mnnvl.units import human_bytes

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


@one_line("preflight")
def preflight_cluster(params: dict[str, Any]) -> None:
    """Check the cluster (read-only); the result and CTRF report are written before a failing
    row fails the task."""
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


class PathArtifact(Protocol):
    """A KFP output artifact: a local path the launcher uploads after the task."""

    path: str


def kubeconfig() -> str | None:
    """The kubeconfig to use: ``KUBECONFIG`` when set (local runs), else in-cluster config."""
    return os.environ.get("KUBECONFIG") or None


def _log_numbers(metrics: Any, values: dict[str, Any]) -> None:
    # KFP Metrics values must be numbers; a null (e.g. MFU on CPU) is left out, not faked as 0.
    for name, value in values.items():
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)):
            metrics.log_metric(name, float(value))


def write_result(artifact: PathArtifact, run_id: str, purpose: str, result: dict[str, Any]) -> None:
    """Write the step's full result (``to_dict()``) as JSON, tagged with run id and purpose."""
    os.makedirs(os.path.dirname(artifact.path) or ".", exist_ok=True)
    doc = {"run_id": run_id, "purpose": purpose, **result}
    with open(artifact.path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True, default=str)


def _copy(path: str, artifact: PathArtifact) -> None:
    os.makedirs(os.path.dirname(artifact.path) or ".", exist_ok=True)
    shutil.copyfile(path, artifact.path)


def publish_train(run_id: str, result: Any, outputs: dict[str, Any]) -> None:
    """Log training metrics (each restart's cost summed, Kueue's evictions, goodput), write the
    training report (loss curve, each restart) and the raw result: ``outputs`` are the
    component's arguments (its ``metrics``, ``report`` and ``result`` artifacts)."""
    from mnnvl import report_train

    raw = dict(result.raw or {})
    mesh = raw.get("mesh") or {}
    shape = mesh.get("shape") or [raw.get("world_size")]
    _log_numbers(
        outputs["metrics"],
        {
            # Mesh shape as numbers: groups (NVLink cliques, replicated) x ranks sharded in each.
            "mesh_groups": mesh.get("groups", 1),
            "mesh_shard_ranks": shape[-1],
            "tokens_per_s": result.tokens_per_s,
            "tokens_per_s_per_gpu": raw.get("tokens_per_s_per_gpu"),
            "mfu": result.mfu,
            "final_loss": result.final_loss,
            "steps": result.steps,
            "peak_mem_gib": result.peak_mem_gib,
            "world_size": raw.get("world_size"),
            "wall_s": raw.get("wall_s"),
            "restarts": result.restarts,
            "evictions": result.evictions,
            "steps_redone": result.steps_lost,
            "goodput": result.goodput,
        },
    )
    with tempfile.TemporaryDirectory(prefix="mnnvl-train-report-") as tmp:
        _copy(report_train.write_train_report(result.for_report(), tmp)["html"], outputs["report"])
    write_result(outputs["result"], run_id, "train", result.to_dict())


def publish_verify(run_id: str, result: Any, purpose: str, outputs: dict[str, Any]) -> None:
    """Log busbw metrics (peak, judged, per size, verdict 1/0) and write the verify report
    (HTML), the verdict as a CTRF test report (where ``outputs`` has ``ctrf``) and the result."""
    raw = dict(result.raw or {})
    values: dict[str, Any] = {
        "verdict_pass": 1 if result.verdict == PASS else 0,
        "verdict_not_judged": 1 if result.verdict == NOT_JUDGED else 0,
        "peak_busbw_gbps": result.peak_busbw_gbps,
        "judged_busbw_gbps": result.judged_busbw_gbps,
        "threshold_gbps": result.threshold_gbps,
        "world_size": raw.get("world_size"),
    }
    for row in result.sizes or []:  # busbw_gbps_1MiB: short names, sorted by unit
        size = human_bytes(int(row["bytes"])).replace(" ", "")
        values[f"busbw_gbps_{size}"] = row.get("busbw_gbps")
    _log_numbers(outputs["metrics"], values)
    with tempfile.TemporaryDirectory(prefix="mnnvl-verify-report-") as tmp:
        files = report.write_verify_report(raw, tmp)
        _copy(files["html"], outputs["report"])
        if outputs.get("ctrf") is not None:
            _copy(files["ctrf"], outputs["ctrf"])
    write_result(outputs["result"], run_id, purpose, result.to_dict())
    # The table goes to the task log, where a failed verdict is read first.
    log.info("%s: verdict %s\n%s", purpose, result.verdict, report.verify_table(raw))


def publish_launch(run_id: str, result: Any, outputs: dict[str, Any]) -> None:
    """Log the workload's exit code, wall time and every number of its RESULT line."""
    raw = dict(result.result or {})
    numbers = {"exit_code": result.exit_code, "wall_s": result.elapsed_s, **raw}
    _log_numbers(outputs["metrics"], numbers)
    write_result(outputs["result"], run_id, "job", result.to_dict())
    log.info("launch %s: exit code %d, RESULT %s", result.job, result.exit_code, raw or "none")
