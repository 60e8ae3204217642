"""The verify step's outputs other tools read: the KFP CTRF artifact, and the Argo template's
report and CTRF artifacts and key-figure parameters, which must name files the report writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from mnnvl.components import bodies
from mnnvl.pipelines import argo_workflow as aw
from mnnvl.steps import VerifyResult
from tests.unit.ctrf_schema import SCHEMA
from tests.unit.test_report import verify_result

COMPILED = Path(aw.__file__).resolve().parent / "compiled"


class PathArtifact:
    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.metrics: dict[str, float] = {}

    def log_metric(self, metric: str, value: float) -> None:
        self.metrics[metric] = value


def failed_verify() -> dict[str, Any]:
    raw = verify_result("FAIL")
    raw["checks"] = [{"name": "bandwidth", "status": "FAIL", "messages": raw["reasons"]}]
    return raw


def test_kfp_verify_publishes_the_verdict_as_a_ctrf_artifact(tmp_path: Path) -> None:
    raw = failed_verify()
    outcome = VerifyResult(
        job="run-verify",
        verdict="FAIL",
        threshold_gbps=raw["threshold_gbps"],
        peak_busbw_gbps=raw["peak_busbw_gbps"],
        judged_busbw_gbps=raw["judged_busbw_gbps"],
        sizes=raw["sizes"],
        report_files={},
        raw=raw,
        elapsed_s=1.0,
    )
    out = {n: PathArtifact(tmp_path / n / "data") for n in ("metrics", "report", "result", "ctrf")}
    bodies.publish_verify("run", outcome, "verify", out)
    doc = json.loads(Path(out["ctrf"].path).read_text())
    jsonschema.validate(doc, SCHEMA)
    (bandwidth,) = [t for t in doc["results"]["tests"] if t["name"] == "bandwidth"]
    assert bandwidth["status"] == "failed" and "below the derived threshold" in bandwidth["message"]


def verify_template(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((COMPILED / name).read_text())
    return next(t for t in doc["spec"]["templates"] if t["name"] == "verify")


def test_argo_verify_template_exports_reports_and_key_figures_the_report_writes(
    tmp_path: Path,
) -> None:
    from mnnvl.report import write_verify_report

    template = verify_template("mnnvl-verify-only.workflowtemplate.yaml")
    args = template["container"]["args"]
    report_dir = args[args.index("--report-dir") + 1]
    outputs = template["outputs"]
    artifacts_by_name = {a["name"]: a for a in outputs["artifacts"]}
    assert set(artifacts_by_name) == {"report", "ctrf"}
    params = {p["name"]: p["valueFrom"]["path"] for p in outputs["parameters"]}
    assert {"verdict", "judged-busbw-gbps", "threshold-gbps", "threshold-source"} <= set(params)
    # Every path the template reads is a file the report writes, with the expected value.
    write_verify_report(failed_verify(), str(tmp_path))
    local = {
        name: tmp_path / Path(path).relative_to(report_dir)
        for name, path in {**params, **{n: a["path"] for n, a in artifacts_by_name.items()}}.items()
        if name != "result"
    }
    assert all(p.exists() for p in local.values()), local

    def argo_reads(name: str) -> str:
        # Argo's executor trims one trailing newline off a parameter read from a file
        # (workflow/executor/executor.go, SaveParameters); the files end with one for `cat`.
        text = local[name].read_text()
        assert text.endswith("\n"), name
        return text.removesuffix("\n")

    assert argo_reads("verdict") == "FAIL"
    assert argo_reads("threshold-source") == "derived"
    assert float(argo_reads("judged-busbw-gbps")) == 339.1
    jsonschema.validate(json.loads(local["ctrf"].read_text()), SCHEMA)
    assert "<html" in local["report"].read_text().lower()


def test_argo_train_template_lists_each_restart_and_the_goodput_from_the_report(
    tmp_path: Path,
) -> None:
    from mnnvl.report_train import write_train_report

    doc = yaml.safe_load((COMPILED / "mnnvl-training.workflowtemplate.yaml").read_text())
    template = next(t for t in doc["spec"]["templates"] if t["name"] == "train")
    args = template["container"]["args"]
    report_dir = args[args.index("--report-dir") + 1]
    outputs = template["outputs"]
    paths = {p["name"]: p["valueFrom"]["path"] for p in outputs["parameters"]}
    paths |= {a["name"]: a["path"] for a in outputs["artifacts"]}
    assert {"goodput", "restarts", "faults", "report"} <= set(paths)
    fault = {"pod": "job-1-x", "exit_code": 137, "steps_lost": 3, "recovery_s": 9.5}
    result = {"steps": 40, "losses": [], "faults": [fault], "goodput": 0.61}
    write_train_report(result, str(tmp_path))
    local = {
        n: tmp_path / Path(p).relative_to(report_dir) for n, p in paths.items() if n != "result"
    }
    # Argo trims one trailing newline off a parameter read from a file (SaveParameters).
    read = {n: local[n].read_text().removesuffix("\n") for n in ("goodput", "restarts", "faults")}
    assert read == {"goodput": "0.61", "restarts": "1", "faults": json.dumps([fault])}
    assert "<table>" in local["report"].read_text()


def test_kfp_train_logs_restarts_and_goodput_and_its_report_lists_each_restart(
    tmp_path: Path,
) -> None:
    from mnnvl.steps import TrainResult

    fault = {"pod": "job-1-x", "exit_code": 137, "steps_lost": 3, "recovery_s": 9.5}
    raw = {"kind": "train", "steps": 40, "final_loss": 4.9, "tokens_per_s": 2000.0, "losses": []}
    outcome = TrainResult(
        job="run-train",
        final_loss=4.9,
        tokens_per_s=2000.0,
        mfu=None,
        steps=40,
        start_step=10,
        checkpoint="",
        peak_mem_gib=None,
        report_files={},
        raw=raw,
        elapsed_s=30.0,
        restarts=1,
        steps_lost=3,
        recovery_s=9.5,
        faults=[fault],
        goodput=0.61,
    )
    out = {n: PathArtifact(tmp_path / n / "data") for n in ("metrics", "report", "result")}
    bodies.publish_train("run", outcome, out)
    logged = out["metrics"].metrics
    assert {k: logged.get(k) for k in ("restarts", "steps_redone", "goodput")} == {
        "restarts": 1.0,
        "steps_redone": 3.0,
        "goodput": 0.61,
    }
    page = Path(out["report"].path).read_text()
    assert "<td>job-1-x</td><td>—</td><td>—</td><td>137</td>" in page and "goodput 61%" in page
    assert json.loads(Path(out["result"].path).read_text())["faults"] == [fault]


def test_kueues_evictions_of_the_train_step_are_a_kfp_metric_and_an_argo_output(
    tmp_path: Path,
) -> None:
    from mnnvl.report_train import write_train_report
    from mnnvl.steps import TrainResult

    raw = {"kind": "train", "steps": 40, "final_loss": 4.9, "tokens_per_s": 2000.0, "losses": []}
    figures = dict(final_loss=4.9, tokens_per_s=2000.0, mfu=None, steps=40, peak_mem_gib=None)
    outcome = TrainResult(
        job="run-train",
        **figures,
        start_step=0,
        checkpoint="",
        report_files={},
        raw=raw,
        elapsed_s=30.0,
        evictions=2,
    )
    out = {n: PathArtifact(tmp_path / n / "data") for n in ("metrics", "report", "result")}
    bodies.publish_train("run", outcome, out)
    assert out["metrics"].metrics["evictions"] == 2.0
    assert "2 evictions by Kueue" in Path(out["report"].path).read_text()

    doc = yaml.safe_load((COMPILED / "mnnvl-training.workflowtemplate.yaml").read_text())
    template = next(t for t in doc["spec"]["templates"] if t["name"] == "train")
    args = template["container"]["args"]
    report_dir = args[args.index("--report-dir") + 1]
    path = {p["name"]: p["valueFrom"]["path"] for p in template["outputs"]["parameters"]}
    write_train_report(outcome.for_report(), str(tmp_path / "report"))
    written = tmp_path / "report" / Path(path["evictions"]).relative_to(report_dir)
    assert written.read_text().removesuffix("\n") == "2"
