"""The verdict as a CTRF report, validated against a schema written from the CTRF spec; the
report's first screen; the plot of a run that could not be judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mnnvl import ctrf, report
from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime import nccl_log, nvml
from mnnvl.runtime.cliques import combine, judge_inter
from mnnvl.runtime.verdict import judge
from tests.unit.ctrf_schema import SCHEMA
from tests.unit.fake_pynvml import FakeNvml, h200
from tests.unit.test_report_cliques import ROW, clique

SHM = "h200-0:123:456 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"
P2P = "h200-0:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"


def sizes(busbw: float) -> list[dict[str, Any]]:
    return [
        {"bytes": s, "time_us": 10.0, "algbw_gbps": busbw, "busbw_gbps": busbw, "correct": True}
        for s in (1 << 20, 64 << 20, 1 << 30, 4 << 30)
    ]


def h200_pair_result(tmp_path: Path, line: str, busbw: float) -> dict[str, Any]:
    imex = tmp_path / "channel0"
    imex.write_text("")
    fake = FakeNvml([h200("GPU-a"), h200("GPU-b")])
    summaries = []
    for rank, uuid in enumerate(("GPU-a", "GPU-b")):
        summary = nvml.check_gpus([uuid], nvml=fake, imex_path=str(imex))
        summaries.append({**summary, "rank": rank, "host": "h200-0"})
    nccl = nccl_log.summarize([nccl_log.classify([line], nvlink_active=True)] * 2, "2.28.9")
    rows = sizes(busbw)
    result = {"kind": "verify", **judge(VerifyConfig(), summaries, rows, 2, "nccl", nccl)}
    result.update(nccl=nccl, world_size=2, backend="nccl", sizes=rows, nodes=summaries)
    result.update(wall_s=4.2, started_unix=1_796_000_000.0, timings_s={"nvml": 0.1, "sweep": 3.0})
    return result


def test_p2p_off_verdict_as_ctrf_validates_and_lists_every_check(tmp_path: Path) -> None:
    result = h200_pair_result(tmp_path, SHM, 27.9)
    files = report.write_verify_report(result, str(tmp_path / "out"))
    doc = json.loads(Path(files["ctrf"]).read_text())
    jsonschema.validate(doc, SCHEMA)
    tests = {t["name"]: t for t in doc["results"]["tests"]}
    for check in ("NVML links", "fabric state", "fabric health", "transport", "bandwidth"):
        assert check in tests
    assert tests["transport"]["status"] == "failed"
    assert "SHM" in tests["transport"]["message"]
    assert tests["bandwidth"]["status"] == "failed"
    assert tests["NVML links"]["status"] == "passed"
    assert tests["bandwidth large (judged against the threshold)"]["status"] == "failed"
    assert tests["bandwidth small (latency-bound, < 64 MiB)"]["status"] == "other"
    summary = doc["results"]["summary"]
    assert summary["tests"] == len(tests)
    assert summary["failed"] == sum(t["status"] == "failed" for t in tests.values())
    assert summary["stop"] - summary["start"] == 4200
    assert doc["extra"]["verdict"] == "FAIL" and doc["extra"]["threshold_source"] == "baseline"


def test_a_grouped_run_has_a_test_per_clique_and_across_cliques() -> None:
    cfg = VerifyConfig()
    cliques = [
        clique(0, "PASS", 340.0, []),
        clique(1, "FAIL", 27.0, ["busbw 27.0 GB/s is below the derived threshold 296.4 GB/s"]),
    ]
    inter = {"spanning": judge_inter(cfg, [ROW], "all"), "leaders": judge_inter(cfg, [], "l")}
    result = {"kind": "verify", **combine(cliques, inter), "world_size": 4, "wall_s": 1.0}
    doc = ctrf.verify_report(result)
    jsonschema.validate(doc, SCHEMA)
    statuses = {t["name"]: t["status"] for t in doc["results"]["tests"]}
    assert statuses["clique 0 (pod-g0-0, pod-g0-1)"] == "passed"
    assert statuses["clique 1 (pod-g1-0, pod-g1-1)"] == "failed"
    assert statuses["across cliques, spanning"] == "skipped"  # no inter-clique threshold


def test_an_aborted_run_is_one_failed_test(tmp_path: Path) -> None:
    aborted = {"kind": "verify", "verdict": "FAIL", "reasons": ["aborted: NCCL error"]}
    doc = ctrf.verify_report({**aborted, "sizes": [], "wall_s": 0.5})
    jsonschema.validate(doc, SCHEMA)
    (test,) = doc["results"]["tests"]
    assert test["status"] == "failed" and test["message"] == "aborted: NCCL error"


def test_the_schema_rejects_what_ctrf_forbids() -> None:
    doc = ctrf.verify_report({"kind": "verify", "verdict": "FAIL", "reasons": ["x"]})
    doc["results"]["tests"][0]["status"] = "FAIL"  # not a CTRF status
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def test_first_screen_says_verdict_failed_checks_threshold_source_and_transport(
    tmp_path: Path,
) -> None:
    result = h200_pair_result(tmp_path, SHM, 27.9)
    head = report.verify_table(result).splitlines()[:4]
    assert head[0] == "verdict: FAIL"
    assert head[1] == "failed checks: transport, bandwidth"
    assert head[2].startswith("busbw 27.9 GB/s vs threshold 312.0 GB/s (baseline: ")
    assert "our measurement, 2026-11-30" in head[2] and "margin -91.1%" in head[2]
    assert head[3] == "transport: NCCL 2.28.9 over SHM"
    healthy = h200_pair_result(tmp_path, P2P, 340.0)
    assert report.verify_table(healthy).splitlines()[1] == "failed checks: none"


def test_a_one_rank_run_plots_why_it_was_not_judged_instead_of_a_zero_line(
    tmp_path: Path,
) -> None:
    one_rank = {
        "kind": "verify",
        "verdict": "NOT_JUDGED",
        "reasons": ["NOT_JUDGED: one rank: bus bandwidth is 0 by definition; bandwidth was not"],
        "threshold_gbps": None,
        "world_size": 1,
        "sizes": [{**row, "busbw_gbps": 0.0, "algbw_gbps": None} for row in sizes(0.0)],
    }
    series, note = report.busbw_plot(one_rank)
    assert series == [] and note.startswith("NOT_JUDGED: one rank")
    files = report.write_verify_report(one_rank, str(tmp_path))
    assert Path(files["png"]).stat().st_size > 0
    judged_series, judged_note = report.busbw_plot(h200_pair_result(tmp_path, P2P, 340.0))
    assert judged_series[0][2] == [340.0] * 4 and judged_note == ""
