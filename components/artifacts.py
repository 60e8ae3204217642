"""What the KFP component bodies share once a step has returned: metrics, reports, results.

Imported inside component bodies (in the launcher image), so it stays free of kfp at import
time: the artifact arguments are duck-typed (``.path`` and ``.log_metric``) and everything
heavy is imported lazily.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any, Protocol

from mnnvl.contract.result import NOT_JUDGED, PASS
from mnnvl.units import human_bytes

log = logging.getLogger(__name__)


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
    """Log training metrics (each restart's cost summed, goodput), write the training report
    (loss curve, each restart) and the raw result: ``outputs`` are the component's arguments
    (its ``metrics``, ``report`` and ``result`` artifacts)."""
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
    from mnnvl import report

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
