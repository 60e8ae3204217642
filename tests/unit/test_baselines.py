"""Baselines with provenance: which threshold a verdict uses, and the table command."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mnnvl.cli import main as cli
from mnnvl.inputs import baselines
from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime import nvml
from mnnvl.runtime.verdict import judge
from tests.unit.fake_pynvml import FakeGpu, FakeNvml, gb200, h200

P2P_2_28 = {"version": "2.28.9", "transport": "NVLink P2P", "mnnvl": False, "nvls": False}


def summaries(gpus: list[FakeGpu], per_node: int, tmp_path: Path) -> list[dict[str, Any]]:
    imex = tmp_path / "channel0"
    imex.write_text("")
    fake = FakeNvml(gpus)
    out = []
    for rank, gpu in enumerate(gpus):
        summary = nvml.check_gpus([gpu.uuid], nvml=fake, imex_path=str(imex))
        summary.update(rank=rank, host=f"worker-{rank // per_node}")
        out.append(summary)
    return out


def sweep(busbw: float) -> list[dict[str, Any]]:
    return [
        {"bytes": s, "time_us": 1.0, "algbw_gbps": busbw, "busbw_gbps": busbw, "correct": True}
        for s in (1 << 20, 1 << 30, 4 << 30)
    ]


def test_every_row_states_its_source_and_a_sane_floor() -> None:
    for row in baselines.BASELINES:
        assert row.source in ("published", "measured") and row.citation
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", row.date)
        assert 0 < row.tolerance < 0.5 and row.floor_gbps < row.busbw_gbps
        if row.source == "measured":
            assert "2026-" in row.citation  # a date and a method
        else:
            assert "github.com/" in row.citation
    gb200_row = next(r for r in baselines.BASELINES if "GB200" in r.models)
    assert gb200_row.floor_gbps == 600.0  # the validation floor in use


def test_h200_pair_is_judged_against_our_measured_baseline(tmp_path: Path) -> None:
    pair = summaries([h200("GPU-a"), h200("GPU-b")], 2, tmp_path)
    # 300 GB/s clears the derived 296.4 but not 346.7 x (1 - 0.10): the baseline is stricter.
    verdict = judge(VerifyConfig(), pair, sweep(300.0), 2, "nccl", P2P_2_28)
    assert verdict["verdict"] == "FAIL"
    assert verdict["threshold_source"] == "baseline"
    assert verdict["threshold_gbps"] == pytest.approx(312.0)
    assert verdict["baseline"]["key"] == "h200x2-nv18-p2p"
    assert any("below the baseline threshold 312.0" in r for r in verdict["reasons"])
    healthy = judge(VerifyConfig(), pair, sweep(340.0), 2, "nccl", P2P_2_28)
    assert healthy["verdict"] == "PASS"
    assert healthy["threshold_margin"] == pytest.approx(340.0 / 312.0 - 1, abs=1e-3)
    # A fallback to shared memory is judged against what the NVLink pair should reach.
    shm = judge(VerifyConfig(), pair, sweep(27.9), 2, "nccl", {**P2P_2_28, "transport": "SHM"})
    assert shm["threshold_source"] == "baseline" and shm["verdict"] == "FAIL"


def test_the_users_threshold_comes_before_a_baseline(tmp_path: Path) -> None:
    pair = summaries([h200("GPU-a"), h200("GPU-b")], 2, tmp_path)
    verdict = judge(VerifyConfig(min_busbw_gbps=250.0), pair, sweep(300.0), 2, "nccl", P2P_2_28)
    assert (verdict["verdict"], verdict["threshold_source"]) == ("PASS", "user")
    assert verdict["baseline"] is None


@pytest.mark.parametrize(
    "nccl",
    [
        {**P2P_2_28, "version": "2.27.7"},  # outside the row's NCCL range
        {**P2P_2_28, "version": None},  # unknown NCCL
    ],
    ids=["old-nccl", "unknown-nccl"],
)
def test_no_matching_row_falls_back_to_the_derived_threshold(
    tmp_path: Path, nccl: dict[str, Any]
) -> None:
    pair = summaries([h200("GPU-a"), h200("GPU-b")], 2, tmp_path)
    verdict = judge(VerifyConfig(min_busbw_gbps=0.0), pair, sweep(340.0), 2, "nccl", nccl)
    assert verdict["threshold_source"] == "derived"


def test_gh200_is_not_an_h200() -> None:
    assert baselines.match(["NVIDIA GH200 480GB"], 2, 1, P2P_2_28) is None
    assert baselines.match(["NVIDIA H200"], 2, 1, P2P_2_28) is not None


def test_a_full_gb200_rack_over_mnnvl_with_nvls_uses_the_600_floor(tmp_path: Path) -> None:
    rack = summaries([gb200(f"GPU-{i}") for i in range(72)], 4, tmp_path)
    nccl = {"version": "2.28.9", "transport": "MNNVL", "mnnvl": True, "nvls": True}
    verdict = judge(VerifyConfig(), rack, sweep(590.0), 72, "nccl", nccl)
    assert verdict["threshold_source"] == "baseline"
    assert verdict["threshold_gbps"] == pytest.approx(600.0)
    assert verdict["verdict"] == "FAIL"


def test_baselines_command_prints_the_table_with_sources(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["baselines"]) == 0
    out, err = capsys.readouterr()
    assert "h200x2-nv18-p2p" in err and "346.7" in err and "312.0" in err
    assert "github.com/NVIDIA/aicr" in err
    # Like every command: exactly one JSON line on stdout, last.
    (line,) = out.strip().splitlines()
    result = json.loads(line)
    assert result["ok"] and result["command"] == "baselines"
    assert len(result["baselines"]) == len(baselines.BASELINES)


NVLS = {"version": "2.28.9", "transport": "MNNVL", "mnnvl": True, "nvls": True}


@pytest.mark.parametrize("nodes", [2, 4, 8, 16, 18])
def test_a_partial_gb200_rack_is_judged_against_the_racks_floor(tmp_path: Path, nodes: int) -> None:
    slice_ = summaries([gb200(f"GPU-{i}") for i in range(4 * nodes)], 4, tmp_path)
    verdict = judge(VerifyConfig(), slice_, sweep(590.0), 4 * nodes, "nccl", NVLS)
    assert verdict["threshold_source"] == "baseline"
    assert verdict["baseline"]["key"] == "gb200-nvl72-mnnvl-nvls"
    assert verdict["threshold_gbps"] == pytest.approx(600.0) and verdict["verdict"] == "FAIL"


@pytest.mark.parametrize(
    ("gpus", "nodes"),
    [(8, 4), (76, 19), (6, 4)],
    ids=["partial-nodes", "more-than-a-rack", "uneven"],
)
def test_shapes_outside_a_rows_range_match_no_row(gpus: int, nodes: int) -> None:
    assert baselines.match(["NVIDIA GB200"] * gpus, gpus, nodes, NVLS) is None


def test_gb300_racks_get_aicrs_floors_the_eks_one_only_when_asked_for() -> None:
    generic = baselines.match(["NVIDIA GB300"] * 8, 8, 2, NVLS)
    assert generic is not None and generic.key == "gb300-nvl72-mnnvl-nvls"
    assert (generic.busbw_gbps, generic.floor_gbps) == (895.08, 823.0)
    eks = baselines.match(["NVIDIA GB300"] * 8, 8, 2, NVLS, platform="eks")
    assert eks is not None and (eks.platform, eks.floor_gbps) == ("eks", 700.0)
    assert "aicr" in generic.citation and "aicr" in eks.citation


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["--system", "gb200", "--nodes", "4", "--gpus-per-node", "4"], "gb200-nvl72-mnnvl-nvls"),
        (["--system", "gb300", "--nodes", "16", "--gpus-per-node", "4"], "gb300-nvl72-mnnvl-nvls"),
        (
            ["--system", "gb300", "--nodes", "2", "--gpus-per-node", "4", "--platform", "eks"],
            "gb300-nvl72-mnnvl-nvls-eks",
        ),
        (["--system", "h200", "--nodes", "1", "--gpus-per-node", "2"], "h200x2-nv18-p2p"),
        (["--system", "gb200", "--nodes", "4", "--gpus-per-node", "2"], None),
    ],
)
def test_baselines_command_shows_the_row_a_shape_gets(
    capsys: pytest.CaptureFixture[str], argv: list[str], key: str | None
) -> None:
    assert cli.main(["baselines", *argv]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["row"] or {}).get("key") == key
    if key:
        assert f"row {key}" in err and f"{result['row']['floor_gbps']:.1f} GB/s" in err
    else:
        assert "no baseline row; verify derives its threshold" in err
