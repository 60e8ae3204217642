"""The verdict of a verification from its measurements (pure functions on RESULT data).

Checks, each PASS, FAIL or NOT_JUDGED (RESULT ``checks``): NVML links (an inactive link of a
GPU that has NVLink), fabric state (not registered, an error status, ranks in different
fabrics or cliques, a COMPLETED fabric without an IMEX channel), fabric health (``healthMask``:
degraded bandwidth, an unhealthy route, an incorrect configuration), transport (the one NCCL
built the measured communicator over, against the one the GPUs offer), all-reduce
correctness and bandwidth against a threshold: the user's ``--min-busbw-gbps``, else a
matching baseline (``mnnvl.inputs.baselines``) x (1 - tolerance), else active links x link speed x
efficiency. The verdict is FAIL when any check fails, NOT_JUDGED when nothing failed but no
bandwidth could be judged, else PASS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mnnvl.contract import exit_codes
from mnnvl.contract.result import FAIL, NOT_JUDGED, PASS, verdict_accepted
from mnnvl.inputs import baselines
from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime import collectives, nccl_log, nvml


def judge(
    cfg: VerifyConfig,
    summaries: Sequence[dict[str, Any]],
    sizes: Sequence[dict[str, Any]],
    world_size: int,
    backend: str = "nccl",
    nccl: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The verdict part of RESULT: verdict, reasons, checks, threshold and judged bandwidth.

    ``nccl`` (RESULT's ``nccl`` entry, when known) lets the transport be judged and a
    baseline be matched; the transport's FAIL, if any, is the first reason.
    """
    nodes = len({s.get("host") for s in summaries}) or 1
    checks = _health_checks(summaries, sizes, nccl, nodes)
    topo = nvml.topology(summaries)
    baseline = _baseline_for(summaries, world_size, nodes, nccl, backend)
    threshold, source = threshold_gbps(cfg, topo, baseline)
    if world_size < 2:
        threshold, source = None, "none"
    judged = collectives.judged_busbw(sizes, cfg.judge_min_bytes)
    unjudged = _why_unjudged(cfg, summaries, sizes, world_size, backend, threshold, source)
    if unjudged is None and threshold is not None and judged < threshold:
        checks[BANDWIDTH] = [
            f"busbw {_gbps(judged)} GB/s is below the {source} threshold {_gbps(threshold)} GB/s"
            + (f" (baseline {baseline.key})" if source == "baseline" and baseline else "")
            + (f" (link limit {topo['link_limit_gbps']} GB/s)" if topo["link_limit_gbps"] else "")
        ]
    reasons = [r for problems in checks.values() for r in problems]
    notes = _notes(summaries)
    if unjudged:
        notes.insert(0, f"NOT_JUDGED: {unjudged}; bandwidth was not judged")
    applied = threshold is not None and unjudged is None
    return {
        "verdict": FAIL if reasons else NOT_JUDGED if unjudged else PASS,
        "reasons": reasons + notes,
        "checks": _check_rows(checks, bool(topo["gpus_per_rank"]), nccl, unjudged),
        "threshold_gbps": threshold,
        "threshold_source": source,
        "threshold_margin": round(judged / threshold - 1.0, 4) if applied and threshold else None,
        "baseline": baselines.as_dict(baseline) if baseline and source == "baseline" else None,
        "judged_busbw_gbps": judged,
        "judge_min_bytes": cfg.judge_min_bytes,
        "peak_busbw_gbps": max((row["busbw_gbps"] for row in sizes), default=0.0),
        "topology": topo,
    }


def _health_checks(
    summaries: Sequence[dict[str, Any]],
    sizes: Sequence[dict[str, Any]],
    nccl: dict[str, Any] | None,
    nodes: int,
) -> dict[str, list[str]]:
    """FAIL reasons per check, bandwidth aside; the transport first."""
    checks: dict[str, list[str]] = {
        TRANSPORT: (
            nccl_log.transport_problems(nccl, **_transport_facts(summaries, nodes)) if nccl else []
        ),
        nvml.LINKS: [],
        nvml.FABRIC: [],
        nvml.HEALTH: [],
    }
    for rank, summary in enumerate(summaries):
        for check, problems in nvml.local_checks(summary, summary.get("rank", rank)).items():
            checks[check] += problems
    checks[nvml.FABRIC] += nvml.fabric_problems(summaries)
    checks[CORRECTNESS] = [
        f"all_reduce of {row['bytes']} bytes returned a wrong sum"
        for row in sizes
        if not row["correct"]
    ]
    return checks


def _why_unjudged(
    cfg: VerifyConfig,
    summaries: Sequence[dict[str, Any]],
    sizes: Sequence[dict[str, Any]],
    world_size: int,
    backend: str,
    threshold: float | None,
    source: str,
) -> str | None:
    """Why bandwidth cannot be judged, or None when it can."""
    largest = max((row["bytes"] for row in sizes), default=0)
    if world_size < 2:
        return "one rank: bus bandwidth is 0 by definition"
    if threshold is None:
        if backend == "gloo":
            return "no NVLink (CPU/gloo run) and no --min-busbw-gbps given"
        missing = [r for r, s in enumerate(summaries) if not str(s["nvml"]).startswith("ok")]
        if missing:
            return f"NVML unavailable on ranks {missing}, so no NVLink detected"
        return "no NVLink detected and no --min-busbw-gbps given"
    if source in PLATEAU_SOURCES and sizes and largest < cfg.judge_min_bytes:
        # Derived and baseline thresholds are large-message plateau figures: a shorter
        # sweep would fail healthy links (on 2 x H200, 256 MiB reaches 296 GB/s).
        return (
            f"the sweep stopped at {largest} bytes, below judge_min_bytes "
            f"{cfg.judge_min_bytes}, where the {source} threshold applies; raise max_bytes, "
            "or give min_busbw_gbps for this sweep"
        )
    return None


PLATEAU_SOURCES = ("derived", "baseline")
TRANSPORT, CORRECTNESS, BANDWIDTH = "transport", "all_reduce correctness", "bandwidth"


def _check_rows(
    checks: dict[str, list[str]], gpus: bool, nccl: dict[str, Any] | None, unjudged: str | None
) -> list[dict[str, Any]]:
    """RESULT ``checks``: ``{name, status, messages}`` per check, status PASS, FAIL or
    NOT_JUDGED (nothing to look at: no NVML GPU, no NCCL log, no threshold)."""
    nothing = {
        nvml.LINKS: not gpus,
        nvml.FABRIC: not gpus,
        nvml.HEALTH: not gpus,
        TRANSPORT: not nccl or str(nccl.get("transport")).startswith(("unknown", "none")),
        BANDWIDTH: unjudged is not None,
    }
    rows = []
    for name in (nvml.LINKS, nvml.FABRIC, nvml.HEALTH, TRANSPORT, CORRECTNESS, BANDWIDTH):
        problems = checks.get(name, [])
        status = FAIL if problems else NOT_JUDGED if nothing.get(name) else PASS
        rows.append({"name": name, "status": status, "messages": problems})
    return rows


def _transport_facts(summaries: Sequence[dict[str, Any]], nodes: int) -> dict[str, Any]:
    gpus = [g for s in summaries for g in s.get("gpus", [])]
    return {
        "nodes": nodes,
        "mnnvl_fabric": bool(gpus) and all(nvml.is_mnnvl_fabric(g["fabric"]) for g in gpus),
        "nvlink": bool(gpus) and all(g["nvlink"]["active"] for g in gpus),
    }


def _baseline_for(
    summaries: Sequence[dict[str, Any]],
    world_size: int,
    nodes: int,
    nccl: dict[str, Any] | None,
    backend: str,
) -> baselines.Baseline | None:
    """The baseline of the system as built: keyed by the transport the GPUs offer, so a
    communicator that fell back to a slower one is judged against what it should reach."""
    if backend != "nccl" or not nccl:
        return None
    names = [g["name"] for s in summaries for g in s.get("gpus", [])]
    expected = nccl_log.expected_transport(**_transport_facts(summaries, nodes))
    if expected and str(nccl.get("transport")) not in nccl_log.NVLINK_TRANSPORTS:
        nccl = {**nccl, "transport": expected}
    return baselines.match(names, world_size, nodes, nccl)


def _gbps(value: float) -> str:
    """One decimal for NVLink figures, three significant digits for small (CPU) ones."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def exit_code(verdict: str, allow_unjudged: bool) -> int:
    """0 on PASS, and on NOT_JUDGED where the caller allowed it; 4 otherwise."""
    return exit_codes.OK if verdict_accepted(verdict, allow_unjudged) else exit_codes.FAILED


def threshold_gbps(
    cfg: VerifyConfig, topo: dict[str, Any], baseline: baselines.Baseline | None = None
) -> tuple[float | None, str]:
    """In order: the user's threshold, a matching baseline x (1 - tolerance), active links x
    link speed x efficiency, else none."""
    if cfg.min_busbw_gbps > 0:
        return cfg.min_busbw_gbps, "user"
    if baseline is not None:
        return baseline.floor_gbps, "baseline"
    if topo["active_links"] and topo["link_speed_gbps"]:
        derived = topo["active_links"] * topo["link_speed_gbps"] * cfg.efficiency
        return round(derived, 3), "derived"
    return None, "none"


def _notes(summaries: Sequence[dict[str, Any]]) -> list[str]:
    notes = []
    for rank, summary in enumerate(summaries):
        notes += nvml.health_warnings(summary, summary.get("rank", rank))
        if summary["nvml"].startswith("unavailable"):
            notes.append(f"note: rank {rank} NVML {summary['nvml']}; NVLink checks skipped")
        for gpu in summary.get("gpus", []):
            errors = {k: v for k, v in gpu["nvlink"]["errors"].items() if v}
            if errors:
                notes.append(
                    f"note: rank {rank} NVLink error counters since driver load {errors} "
                    "(reported, not judged)"
                )
    return notes
