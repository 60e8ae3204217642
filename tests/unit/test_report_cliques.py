"""Verdict and report of a run over several cliques, from per-clique judgements (pure)."""

from __future__ import annotations

from typing import Any

from mnnvl import report
from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime.cliques import combine, judge_inter, worst_node

ROW = {"bytes": 1 << 30, "time_us": 10.0, "algbw_gbps": 1.0, "busbw_gbps": 300.0, "correct": True}


def clique(group: int, verdict: str, busbw: float, reasons: list[str]) -> dict[str, Any]:
    return {
        "group": group,
        "ranks": [2 * group, 2 * group + 1],
        "nodes": [f"pod-g{group}-0", f"pod-g{group}-1"],
        "verdict": verdict,
        "reasons": reasons,
        "threshold_gbps": 296.4,
        "threshold_source": "derived",
        "judged_busbw_gbps": busbw,
        "peak_busbw_gbps": busbw,
        "topology": {},
        "sizes": [{**ROW, "busbw_gbps": busbw}],
        "worst_node": None,
    }


def test_one_degraded_clique_fails_the_run_and_heads_the_report() -> None:
    cfg = VerifyConfig()
    cliques = [
        clique(0, "PASS", 340.0, []),
        clique(1, "FAIL", 27.0, ["busbw 27.0 GB/s is below the derived threshold 296.4 GB/s"]),
        clique(2, "PASS", 338.0, []),
    ]
    inter = {"spanning": judge_inter(cfg, [ROW], "all"), "leaders": judge_inter(cfg, [ROW], "l")}
    result = combine(cliques, inter)
    assert result["verdict"] == "FAIL"
    assert result["worst_clique"]["group"] == 1 and result["judged_busbw_gbps"] == 27.0
    assert result["reasons"][0] == (
        "clique 1 (pod-g1-0, pod-g1-1): busbw 27.0 GB/s is below the derived threshold 296.4 GB/s"
    )
    markdown = report.verify_markdown({**result, "world_size": 6, "backend": "nccl"})
    assert "## clique 1 (pod-g1-0, pod-g1-1): FAIL, judged busbw 27.000 GB/s" in markdown
    assert "- worst clique: 1 (pod-g1-0, pod-g1-1), FAIL" in markdown
    assert markdown.count("## clique ") == 3 and "## across cliques, leaders" in markdown


def test_all_cliques_passing_pass_with_the_inter_clique_part_not_judged() -> None:
    inter = {"spanning": judge_inter(VerifyConfig(), [ROW], "all")}
    result = combine([clique(0, "PASS", 340.0, []), clique(1, "PASS", 330.0, [])], inter)
    assert result["verdict"] == "PASS" and result["worst_clique"]["group"] == 1
    assert result["reasons"] == [
        "inter-clique bandwidth NOT_JUDGED: no --min-inter-clique-busbw-gbps given"
    ]


def test_inter_clique_threshold_below_the_measured_bandwidth_fails_that_part() -> None:
    cfg = VerifyConfig(min_inter_clique_busbw_gbps=400.0)
    part = judge_inter(cfg, [ROW], "all ranks across cliques")
    assert part["verdict"] == "FAIL" and part["threshold_gbps"] == 400.0
    assert part["reasons"] == [
        "all ranks across cliques: busbw 300 GB/s is below the inter-clique threshold 400 GB/s"
    ]


def test_worst_node_is_a_node_with_an_nvml_problem_before_any_straggler() -> None:
    gpu = {
        "name": "GB200",
        "uuid": "GPU-1",
        "nvlink": {"links": 18, "inactive_links": [3], "active": 17},
        "fabric": {"state": "COMPLETED", "status": 0, "cluster_uuid": "ab", "clique_id": 1},
        "imex_channel": True,
    }
    summaries = [{"rank": 0, "host": "a", "gpus": []}, {"rank": 1, "host": "b", "gpus": [gpu]}]
    rows = [{**ROW, "rank_own_us": [900.0, 1.0]}]
    node = worst_node(summaries, rows)
    assert node is not None and node["pod"] == "b" and "NVLink links inactive" in node["why"]
    node = worst_node([summaries[0], {**summaries[1], "gpus": []}], rows)
    assert node is not None and node["pod"] == "a" and node["why"].startswith("straggler")
    assert worst_node([summaries[0], {**summaries[1], "gpus": []}], [{**ROW}]) is None
