"""NVML checks and the verdict on fake hosts (no GPU, no NVML library needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime import nvml
from mnnvl.runtime.collectives import judged_busbw
from mnnvl.runtime.verdict import exit_code, judge, threshold_gbps
from tests.unit.fake_pynvml import (
    CLUSTER_B,
    FakeGpu,
    FakeNvml,
    degraded_h200,
    gb200,
    h200,
)


@pytest.fixture
def imex(tmp_path: Path) -> str:
    path = tmp_path / "channel0"
    path.write_text("")
    return str(path)


def summaries_for(gpus: list[FakeGpu], imex_path: str) -> list[dict[str, Any]]:
    """One rank per GPU, as torchrun runs it."""
    fake = FakeNvml(gpus)
    return [nvml.check_gpus([g.uuid], nvml=fake, imex_path=imex_path) for g in gpus]


def sweep(busbw: float) -> list[dict[str, Any]]:
    return [
        {"bytes": s, "time_us": 1.0, "algbw_gbps": busbw, "busbw_gbps": busbw, "correct": True}
        for s in (1 << 20, 1 << 30, 4 << 30)
    ]


def test_h200_reports_eighteen_nvlink4_links_and_no_fabric(tmp_path: Path) -> None:
    fake = FakeNvml([h200()])
    summary = nvml.check_gpus([0], nvml=fake, imex_path=str(tmp_path / "absent"))
    assert summary["nvml"] == "ok"
    (gpu,) = summary["gpus"]
    assert gpu["nvlink"]["links"] == 18 and gpu["nvlink"]["active"] == 18
    assert gpu["nvlink"]["version"] == 4
    assert gpu["nvlink"]["speed_gbps"] == 26.562
    assert gpu["nvlink"]["speed_source"] == "version"
    assert gpu["nvlink"]["errors"] == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    assert gpu["fabric"]["state"] == "NOT_SUPPORTED"
    assert not nvml.fabric_present(summary)
    assert fake.initialised == 0  # nvmlShutdown always follows nvmlInit


def test_speed_field_wins_over_the_version_table() -> None:
    fake = FakeNvml([h200(speed_mbps=25000)])
    link = nvml.check_gpus([0], nvml=fake)["gpus"][0]["nvlink"]
    assert (link["speed_gbps"], link["speed_source"]) == (25.0, "nvml-field")


def test_fabric_call_not_supported_reads_as_no_fabric() -> None:
    fake = FakeNvml([h200(fabric_state=None)])
    fabric = nvml.check_gpus([0], nvml=fake)["gpus"][0]["fabric"]
    assert fabric["state"] == "NOT_SUPPORTED" and fabric["cluster_uuid"] == "0" * 32


def test_missing_pynvml_is_reported_and_the_verdict_is_not_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nvml, "load_nvml", lambda: None)
    summary = nvml.check_gpus([0])
    assert summary["nvml"].startswith("unavailable") and summary["gpus"] == []
    verdict = judge(VerifyConfig(), [summary, summary], sweep(300.0), 2)
    # Nothing detected, nothing judged: never a PASS.
    assert verdict["verdict"] == "NOT_JUDGED" and verdict["threshold_source"] == "none"
    assert verdict["reasons"][0].startswith("NOT_JUDGED: NVML unavailable on ranks [0, 1]")


def test_missing_nvml_with_a_user_threshold_is_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "load_nvml", lambda: None)
    summary = nvml.check_gpus([0])
    verdict = judge(VerifyConfig(min_busbw_gbps=200.0), [summary, summary], sweep(300.0), 2)
    assert verdict["verdict"] == "PASS" and verdict["threshold_source"] == "user"


def test_one_rank_is_not_judged_even_with_a_threshold(imex: str) -> None:
    summaries = summaries_for([h200("GPU-a")], imex)
    verdict = judge(VerifyConfig(min_busbw_gbps=1.0), summaries, sweep(300.0), 1)
    assert verdict["verdict"] == "NOT_JUDGED" and verdict["threshold_gbps"] is None
    assert verdict["reasons"][0].startswith("NOT_JUDGED: one rank")


def test_gloo_without_a_threshold_states_no_nvlink() -> None:
    empty = {"nvml": "not checked: no GPU", "gpus": []}
    verdict = judge(VerifyConfig(), [empty, empty], sweep(1.0), 2, "gloo")
    assert verdict["verdict"] == "NOT_JUDGED"
    assert verdict["reasons"][0].startswith("NOT_JUDGED: no NVLink")


def test_not_judged_exits_4_unless_allowed() -> None:
    assert exit_code("PASS", allow_unjudged=False) == 0
    assert exit_code("NOT_JUDGED", allow_unjudged=False) == 4
    assert exit_code("NOT_JUDGED", allow_unjudged=True) == 0
    assert exit_code("FAIL", allow_unjudged=True) == 4


def test_healthy_h200_pair_passes_with_derived_threshold(imex: str) -> None:
    summaries = summaries_for([h200("GPU-a"), h200("GPU-b")], imex)
    verdict = judge(VerifyConfig(), summaries, sweep(340.0), 2)
    assert verdict["verdict"] == "PASS", verdict["reasons"]
    assert verdict["threshold_source"] == "derived"
    assert verdict["threshold_gbps"] == pytest.approx(18 * 26.562 * 0.62, abs=1e-3)
    assert verdict["threshold_gbps"] == pytest.approx(296.431, abs=1e-2)
    topo = verdict["topology"]
    assert topo["active_links"] == 18 and topo["link_limit_gbps"] == pytest.approx(478.116)
    assert topo["fabric"] is None


def test_sweep_stopping_below_the_judged_sizes_is_not_judged_against_the_derived_threshold(
    imex: str,
) -> None:
    summaries = summaries_for([h200("GPU-a"), h200("GPU-b")], imex)
    short = [row for row in sweep(296.0) if row["bytes"] < 1 << 30]  # e.g. --max-bytes 256M
    verdict = judge(VerifyConfig(), summaries, short, 2)
    assert verdict["verdict"] == "NOT_JUDGED"  # not a FAIL of healthy links
    assert "raise max_bytes, or give min_busbw_gbps" in verdict["reasons"][0]
    judged = judge(VerifyConfig(min_busbw_gbps=250.0), summaries, short, 2)
    assert judged["verdict"] == "PASS" and judged["threshold_source"] == "user"
    lowered = judge(VerifyConfig(judge_min_bytes=1 << 20), summaries, short, 2)
    assert lowered["verdict"] == "FAIL"  # judged at 1 MiB against the plateau: the user's call


def test_h200_pair_below_derived_threshold_fails(imex: str) -> None:
    summaries = summaries_for([h200("GPU-a"), h200("GPU-b")], imex)
    verdict = judge(VerifyConfig(), summaries, sweep(27.9), 2)  # NCCL_P2P_DISABLE=1 figure
    assert verdict["verdict"] == "FAIL"
    assert any("below the derived threshold 296.4" in r for r in verdict["reasons"])


def test_degraded_gpu_with_links_down_fails_and_reports_counters(imex: str) -> None:
    summaries = summaries_for([h200("GPU-a"), degraded_h200("GPU-bad")], imex)
    gpu = summaries[1]["gpus"][0]
    assert gpu["nvlink"]["inactive_links"] == [3, 7] and gpu["nvlink"]["active"] == 16
    assert gpu["nvlink"]["errors"]["replay"] == 12 * 16  # summed over the active links
    verdict = judge(VerifyConfig(), summaries, sweep(340.0), 2)
    assert verdict["verdict"] == "FAIL"
    assert any("2 of 18 NVLink links inactive" in r for r in verdict["reasons"])
    assert any("error counters" in r and "not judged" in r for r in verdict["reasons"])
    # The weakest GPU sets the derived threshold: 16 active links.
    assert verdict["threshold_gbps"] == pytest.approx(16 * 26.562 * 0.62, abs=1e-3)


def test_error_counters_alone_do_not_fail(imex: str) -> None:
    noisy = h200("GPU-noisy", errors={3: 182})  # CRC counts seen on a healthy H200
    verdict = judge(VerifyConfig(), summaries_for([h200("GPU-a"), noisy], imex), sweep(340.0), 2)
    assert verdict["verdict"] == "PASS"


def test_gb200_fabric_consistent_passes(imex: str) -> None:
    summaries = summaries_for([gb200(f"GPU-{i}") for i in range(4)], imex)
    assert all(nvml.fabric_present(s) for s in summaries)
    verdict = judge(VerifyConfig(), summaries, sweep(800.0), 4)
    assert verdict["verdict"] == "PASS", verdict["reasons"]
    assert verdict["threshold_gbps"] == pytest.approx(18 * 53.125 * 0.62, abs=1e-3)
    fabric = verdict["topology"]["fabric"]
    assert fabric == {
        "state": "COMPLETED",
        "cluster_uuid": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        "clique_id": 32766,
    }


@pytest.mark.parametrize(
    "odd_one",
    [gb200("GPU-3", cluster=CLUSTER_B), gb200("GPU-3", clique=1), h200("GPU-3")],
    ids=["cluster-uuid", "clique-id", "no-fabric"],
)
def test_fabric_mismatch_across_ranks_fails(imex: str, odd_one: FakeGpu) -> None:
    gpus = [gb200("GPU-0"), gb200("GPU-1"), gb200("GPU-2"), odd_one]
    verdict = judge(VerifyConfig(), summaries_for(gpus, imex), sweep(800.0), 4)
    assert verdict["verdict"] == "FAIL"
    assert any("fabric mismatch across ranks" in r for r in verdict["reasons"])


def test_fabric_completed_without_imex_channel_fails(tmp_path: Path) -> None:
    summaries = summaries_for([gb200("GPU-0"), gb200("GPU-1")], str(tmp_path / "missing"))
    verdict = judge(VerifyConfig(), summaries, sweep(800.0), 2)
    assert verdict["verdict"] == "FAIL"
    assert any("no IMEX channel" in r for r in verdict["reasons"])


def test_fabric_still_in_progress_fails(imex: str) -> None:
    starting = gb200("GPU-1")
    starting.fabric_state = 2
    verdict = judge(VerifyConfig(), summaries_for([gb200("GPU-0"), starting], imex), sweep(800), 2)
    assert verdict["verdict"] == "FAIL"
    assert any("IN_PROGRESS" in r for r in verdict["reasons"])


def test_user_threshold_beats_derived_one() -> None:
    topo = {"active_links": 18, "link_speed_gbps": 26.562}
    assert threshold_gbps(VerifyConfig(min_busbw_gbps=100.0), topo) == (100.0, "user")
    assert threshold_gbps(VerifyConfig(), {"active_links": 0, "link_speed_gbps": None}) == (
        None,
        "none",
    )


def test_judged_busbw_uses_sizes_from_judge_min_bytes_or_the_largest() -> None:
    rows = [
        {"bytes": 1 << 20, "busbw_gbps": 50.0},
        {"bytes": 1 << 30, "busbw_gbps": 330.0},
        {"bytes": 4 << 30, "busbw_gbps": 320.0},
    ]
    assert judged_busbw(rows, 1 << 30) == 330.0
    assert judged_busbw(rows[:1], 1 << 30) == 50.0  # sweep stopped below judge_min_bytes


def test_wrong_sum_fails_even_without_a_threshold() -> None:
    rows = sweep(1.0)
    rows[0]["correct"] = False
    empty = {"nvml": "not checked: no GPU", "gpus": []}
    verdict = judge(VerifyConfig(), [empty, empty], rows, 2)
    assert verdict["verdict"] == "FAIL"
    assert any("wrong sum" in r for r in verdict["reasons"])
