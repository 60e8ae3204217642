"""Verification across several NVLink cliques (one clique group per Job of the run).

Inside each group: an all-reduce sweep on the group's own communicator (all groups at
once, as HSDP's sharding traffic runs), judged like a single-clique run against the
NVLink-derived (or ``--min-busbw-gbps``) threshold: one verdict per clique. Across groups:
a sweep on the communicator of all ranks and one on the group leaders (first rank of each
group), judged against ``--min-inter-clique-busbw-gbps`` when given, else NOT_JUDGED for
that part. The run FAILs when any clique or a judged cross-clique part fails; it is
NOT_JUDGED when a clique is; the report names the worst clique and the worst node.

Worst node of a clique: a node with an NVML problem, else the straggler, the rank the
others waited for (the most time per call spent outside the collective, CPU sweeps only),
when it is late by more than a tenth of a call.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from mnnvl.contract.result import FAIL, NOT_JUDGED, PASS
from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime import collectives, nvml
from mnnvl.runtime.groups import Groups
from mnnvl.runtime.progress import SweepProgress
from mnnvl.runtime.verdict import judge

STRAGGLER_SHARE = 0.1  # late by more than this share of a call's time: named as straggler


def _sweeps(
    plan: collectives.SweepPlan, device: torch.device, placed: Groups, timeout_s: float
) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows per group, rows across all ranks, rows across the group leaders)."""
    # Every rank creates every group, in the same order (a collective call). A new group
    # takes the backend's default timeout (NCCL 10 min, gloo 30), not the default group's.
    timeout = datetime.timedelta(seconds=timeout_s)
    subgroups = [dist.new_group(placed.ranks(g), timeout=timeout) for g in range(placed.count)]
    leaders = dist.new_group(placed.leaders, timeout=timeout)
    mine = collectives.run_sweep(
        _labelled(plan, f"clique group {placed.index}'s sweep"),
        device,
        group=subgroups[placed.index],
    )
    spanning = collectives.run_sweep(_labelled(plan, "the sweep across cliques"), device)
    rank = dist.get_rank()
    led = []
    if rank in placed.leaders:
        plan = _labelled(plan, "the group leaders' sweep")
        led = collectives.run_sweep(plan, device, group=leaders)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (placed.index, mine, led))
    per_group = {g: rows for g, rows, _ in reversed(everyone)}
    return per_group, spanning, everyone[0][2]


def _labelled(plan: collectives.SweepPlan, label: str) -> collectives.SweepPlan:
    """The plan, its progress reports now naming the sweep about to run."""
    if isinstance(plan.progress, SweepProgress):
        plan.progress.label = label
    return plan


def worst_node(summaries: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict | None:
    """The node to look at first in one clique: an NVML problem, else a clear straggler."""
    for summary in summaries:
        checks = nvml.local_checks(summary, summary["rank"]).values()
        problems = [problem for found in checks for problem in found]
        if problems:
            return {"pod": summary["host"], "rank": summary["rank"], "why": problems[0]}
    timed = [row for row in rows if row.get("rank_own_us")]
    if not timed:
        return None
    row = max(timed, key=lambda r: r["bytes"])
    own = row["rank_own_us"]
    late = max(range(len(own)), key=lambda i: own[i])
    lag = own[late] - min(own)
    if lag <= STRAGGLER_SHARE * row["time_us"]:
        return None
    summary = summaries[late]
    return {
        "pod": summary["host"],
        "rank": summary["rank"],
        "why": f"straggler: the other ranks waited {lag:.0f} µs per all-reduce of "
        f"{row['bytes']} bytes ({row['time_us']:.0f} µs per call) for it",
    }


def judge_inter(cfg: VerifyConfig, rows: Sequence[dict[str, Any]], what: str) -> dict[str, Any]:
    """A cross-clique sweep against ``min_inter_clique_busbw_gbps`` (0: NOT_JUDGED)."""
    judged = collectives.judged_busbw(rows, cfg.judge_min_bytes)
    threshold = cfg.min_inter_clique_busbw_gbps or None
    reasons = [f"{what}: all_reduce of {r['bytes']} bytes returned a wrong sum" for r in rows]
    reasons = [r for r, row in zip(reasons, rows, strict=True) if not row["correct"]]
    if threshold is not None and judged < threshold:
        reasons.append(
            f"{what}: busbw {judged:.3g} GB/s is below the inter-clique threshold "
            f"{threshold:.3g} GB/s"
        )
    verdict = FAIL if reasons else PASS if threshold is not None else NOT_JUDGED
    return {
        "verdict": verdict,
        "reasons": reasons,
        "threshold_gbps": threshold,
        "judged_busbw_gbps": judged,
        "peak_busbw_gbps": max((r["busbw_gbps"] for r in rows), default=0.0),
        "sizes": list(rows),
    }


def measure(
    cfg: VerifyConfig,
    plan: collectives.SweepPlan,
    summaries: Sequence[dict[str, Any]],
    device: torch.device,
    placed: Groups,
    backend: str,
) -> dict[str, Any]:
    """Sweep and judge per clique and across cliques; the RESULT fields of a grouped run."""
    per_group, spanning, led = _sweeps(plan, device, placed, cfg.collective_timeout_s)
    cliques = []
    for g in range(placed.count):
        ranks = placed.ranks(g)
        members = [summaries[r] for r in ranks]
        verdict = judge(cfg, members, per_group[g], placed.size, backend)
        cliques.append(
            {
                "group": g,
                "ranks": ranks,
                "nodes": sorted({m["host"] for m in members}),
                **verdict,
                "sizes": per_group[g],
                "worst_node": worst_node(members, per_group[g]),
            }
        )
    inter = {
        "spanning": judge_inter(cfg, spanning, "all ranks across cliques"),
        "leaders": judge_inter(cfg, led, "group leaders across cliques"),
    }
    return combine(cliques, inter)


def _badness(clique: dict[str, Any]) -> tuple[int, float]:
    order = {FAIL: 0, NOT_JUDGED: 1, PASS: 2}
    return order[clique["verdict"]], clique["judged_busbw_gbps"]


def combine(cliques: list[dict[str, Any]], inter: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One verdict for the run: the worst clique's figures head the result."""
    worst = min(cliques, key=_badness)
    verdicts = [c["verdict"] for c in cliques] + [
        part["verdict"] for part in inter.values() if part["verdict"] != NOT_JUDGED
    ]
    verdict = FAIL if FAIL in verdicts else NOT_JUDGED if NOT_JUDGED in verdicts else PASS
    reasons = [
        f"clique {c['group']} ({', '.join(c['nodes'])}): {r}"
        for c in cliques
        for r in c["reasons"]
        if c["verdict"] == FAIL and not r.startswith(NOT_JUDGED)
    ]
    reasons += [r for part in inter.values() for r in part["reasons"]]
    if verdict == NOT_JUDGED:
        reasons += [r for c in cliques for r in c["reasons"] if r.startswith(NOT_JUDGED)][:1]
    if inter["spanning"]["verdict"] == NOT_JUDGED:
        reasons.append("inter-clique bandwidth NOT_JUDGED: no --min-inter-clique-busbw-gbps given")
    node = worst["worst_node"] or next((c["worst_node"] for c in cliques if c["worst_node"]), None)
    return {
        "verdict": verdict,
        "reasons": reasons,
        "threshold_gbps": worst["threshold_gbps"],
        "threshold_source": worst["threshold_source"],
        "judged_busbw_gbps": worst["judged_busbw_gbps"],
        "peak_busbw_gbps": worst["peak_busbw_gbps"],
        "topology": worst["topology"],
        "sizes": worst["sizes"],
        "cliques": cliques,
        "inter_clique": inter,
        "worst_clique": {
            "group": worst["group"],
            "nodes": worst["nodes"],
            "verdict": worst["verdict"],
            "judged_busbw_gbps": worst["judged_busbw_gbps"],
        },
        "worst_node": node,
    }
