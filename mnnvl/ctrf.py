"""A verify RESULT (and a preflight) as a CTRF report (Common Test Report Format, https://ctrf.io).

CTRF is the JSON test report CI dashboards read and NVIDIA's own validation tooling writes:
``{"reportFormat": "CTRF", "specVersion", "results": {"tool", "summary", "tests": [...]}}``,
each test with ``name``, ``status`` (passed, failed, skipped, pending, other) and
``duration`` in ms (specification: https://ctrf.io/docs/specification/overview).

One test per check of the verdict (NVML links, fabric state, fabric health, transport,
all-reduce correctness, bandwidth), one per message-size class of the sweep, one per
clique and one per cross-clique sweep of a grouped run. NOT_JUDGED maps to ``skipped``
(``rawStatus`` keeps the verdict's word); a size class that is measured but not judged is
``other``. Standard library only.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from mnnvl import __version__
from mnnvl.contract.result import FAIL, NOT_JUDGED, ONE_RANK, PASS
from mnnvl.units import human_bytes

SPEC_VERSION = "0.0.0"
TOOL = "mnnvl-verify"
STATUS = {PASS: "passed", FAIL: "failed", NOT_JUDGED: "skipped"}
SMALL_BYTES = 64 << 20  # below: latency-bound sizes
NVML_CHECKS = ("NVML links", "fabric state", "fabric health")


def verify_report(result: dict[str, Any]) -> dict[str, Any]:
    """The CTRF document for one verify RESULT."""
    wall_ms = int(float(result.get("wall_s") or 0.0) * 1000)
    start = int(float(result.get("started_unix") or time.time() - wall_ms / 1000) * 1000)
    tests = _check_tests(result) + _size_tests(result) + _clique_tests(result)
    extra = {
        key: result.get(key)
        for key in (
            "verdict",
            "judged_busbw_gbps",
            "threshold_gbps",
            "threshold_source",
            "threshold_margin",
            "world_size",
        )
    } | {"nccl": result.get("nccl"), "baseline": (result.get("baseline") or {}).get("key")}
    return _document(TOOL, tests, start, wall_ms, extra)


PREFLIGHT_STATUS = {PASS: "passed", FAIL: "failed", "SKIPPED": "skipped", "WARN": "other"}


def preflight_report(rows: list[dict[str, str]], start_s: float, wall_s: float) -> dict[str, Any]:
    """The CTRF document for ``mnnvl preflight``: one test per row (WARN is ``other``)."""
    tests = [
        {
            "name": row["check"],
            "status": PREFLIGHT_STATUS[row["status"]],
            "duration": 0,
            "suite": ["preflight"],
            "rawStatus": row["status"],
            "message": row["saw"] + (f"; fix: {row['fix']}" if row["fix"] else ""),
        }
        for row in rows
    ]
    return _document("mnnvl-preflight", tests, int(start_s * 1000), int(wall_s * 1000), {})


def _document(
    tool: str, tests: list[dict[str, Any]], start: int, wall_ms: int, extra: dict[str, Any]
) -> dict[str, Any]:
    counts = {s: sum(t["status"] == s for t in tests) for s in STATUSES}
    return {
        "reportFormat": "CTRF",
        "specVersion": SPEC_VERSION,
        "timestamp": datetime.datetime.fromtimestamp(start / 1000, datetime.UTC).isoformat(),
        "generatedBy": f"mnnvl-pipelines {__version__}",
        "results": {
            "tool": {"name": tool, "version": __version__},
            "summary": {
                "tests": len(tests),
                **counts,
                "start": start,
                "stop": start + wall_ms,
                "duration": wall_ms,
            },
            "tests": tests,
        },
        "extra": extra,
    }


STATUSES = ("passed", "failed", "skipped", "pending", "other")


def _test(
    name: str, verdict: str, messages: list[str], duration_s: float, suite: str
) -> dict[str, Any]:
    test: dict[str, Any] = {
        "name": name,
        "status": STATUS.get(verdict, "other"),
        "duration": int(duration_s * 1000),
        "suite": ["verify", suite],
        "rawStatus": verdict,
    }
    if messages:
        test["message"] = "; ".join(messages)
    return test


def _check_tests(result: dict[str, Any]) -> list[dict[str, Any]]:
    timings = result.get("timings_s") or {}
    checks = result.get("checks")
    if not checks and result.get("cliques"):
        return []  # a grouped run: each clique is a test (``_clique_tests``)
    if not checks:  # aborted before judging: the reason is the only test
        return [_test("verification", str(result.get("verdict")), result["reasons"], 0.0, "run")]
    return [
        _test(c["name"], c["status"], c["messages"], timings.get(phase, 0), "checks")
        for c in checks
        for phase in ["nvml" if c["name"] in NVML_CHECKS else "sweep"]
    ]


def _busbw(row: dict[str, Any]) -> str:
    return ONE_RANK if row.get("algbw_gbps") is None else f"{row['busbw_gbps']:.1f} GB/s"


def _size_tests(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Bandwidth per size class; the class holding the judged sizes carries the verdict."""
    rows = result.get("sizes") or []
    if not rows:
        return []
    judge_from = int(result.get("judge_min_bytes") or 0)
    largest = max(int(r["bytes"]) for r in rows)
    judged_from = judge_from if judge_from and largest >= judge_from else largest
    classes = {
        "small (latency-bound, < 64 MiB)": [r for r in rows if r["bytes"] < SMALL_BYTES],
        "medium (64 MiB up to the judged sizes)": [
            r for r in rows if SMALL_BYTES <= r["bytes"] < judged_from
        ],
        "large (judged against the threshold)": [r for r in rows if r["bytes"] >= judged_from],
    }
    bandwidth: dict[str, Any] = next(
        (c for c in result.get("checks") or [] if c["name"] == "bandwidth"),
        {"status": NOT_JUDGED, "messages": []},
    )
    tests = []
    for name, members in classes.items():
        if not members:
            continue
        figures = [f"{human_bytes(r['bytes'])} {_busbw(r)}" for r in members]
        wrong = [r for r in members if not r["correct"]]
        messages: list[str] = []
        if wrong:
            verdict = FAIL
            messages = [f"wrong sum at {human_bytes(r['bytes'])}" for r in wrong]
        elif name.startswith("large"):
            verdict, messages = str(bandwidth["status"]), list(bandwidth["messages"])
        else:
            verdict = "RECORDED"  # measured, not judged: CTRF "other"
        tests.append(
            _test(
                f"bandwidth {name}", verdict, [*messages, "busbw " + ", ".join(figures)], 0, "sizes"
            )
        )
    return tests


def _clique_tests(result: dict[str, Any]) -> list[dict[str, Any]]:
    tests = [
        _test(
            f"clique {c['group']} ({', '.join(c['nodes'])})",
            c["verdict"],
            [r for r in c["reasons"] if not r.startswith(NOT_JUDGED)] or c["reasons"][:1],
            0,
            "cliques",
        )
        for c in result.get("cliques") or []
    ]
    for key, part in (result.get("inter_clique") or {}).items():
        tests.append(
            _test(f"across cliques, {key}", part["verdict"], part["reasons"], 0, "cliques")
        )
    return tests
