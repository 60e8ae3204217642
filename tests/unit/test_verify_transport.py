"""The transport NCCL built the measured communicator over is judged, from recorded INFO logs.

The log lines follow NCCL 2.28's formats (src/transport/p2p.cc, shm.cc, net.cc, src/mnnvl.cc,
src/init.cc): what each rank's private NCCL_DEBUG_FILE holds in each case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mnnvl.inputs.spec import VerifyConfig
from mnnvl.runtime import nccl_log, nvml
from mnnvl.runtime.verdict import judge
from tests.unit.fake_pynvml import FakeGpu, FakeNvml, gb200, h200

VERSION = "gb200-n0:311:311 [0] NCCL INFO NCCL version 2.28.9+cuda13.0"
FABRIC = (
    "gb200-n0:311:402 [0] NCCL INFO MNNVL busId 0x1b000 fabric UUID 7869a5b4c3d2e1f0."
    "f0e1d2c3b4a59687 cliqueId 0x7ffe state 3 healthMask 0x0"
)
MNNVL_ON = "gb200-n0:311:402 [0] NCCL INFO MNNVL 1 cliqueId 7ffe cliqueSize 8 cliqueRank 0"
P2P_MNNVL = "gb200-n0:311:405 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] via P2P/MNNVL/read"
P2P_CUMEM = "gb200-n0:311:405 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
NET_IB = "gb200-n0:311:405 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA"
NET_SOCKET = "gb200-n0:311:405 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/Socket/0"
H200_VERSION = "h200-0:123:123 [0] NCCL INFO NCCL version 2.28.9+cuda13.0"
H200_P2P = "h200-0:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
H200_SHM = "h200-0:123:456 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"


@pytest.fixture
def imex(tmp_path: Path) -> str:
    path = tmp_path / "channel0"
    path.write_text("")
    return str(path)


def summaries_on_nodes(gpus: list[FakeGpu], per_node: int, imex: str) -> list[dict[str, Any]]:
    fake = FakeNvml(gpus)
    out = []
    for rank, gpu in enumerate(gpus):
        summary = nvml.check_gpus([gpu.uuid], nvml=fake, imex_path=imex)
        summary.update(rank=rank, host=f"worker-{rank // per_node}")
        out.append(summary)
    return out


def recorded(lines: list[str], *, nvlink: bool, ranks: int) -> dict[str, Any]:
    """RESULT's ``nccl`` entry as the ranks' logs give it."""
    mine = nccl_log.classify(lines, nvlink_active=nvlink)
    return nccl_log.summarize([mine] * ranks, "2.28.9")


def sweep(busbw: float) -> list[dict[str, Any]]:
    return [
        {"bytes": s, "time_us": 1.0, "algbw_gbps": busbw, "busbw_gbps": busbw, "correct": True}
        for s in (1 << 20, 1 << 30, 4 << 30)
    ]


def gb200_two_nodes(imex: str) -> list[dict[str, Any]]:
    return summaries_on_nodes([gb200(f"GPU-{i}") for i in range(8)], 4, imex)


@pytest.mark.parametrize(
    ("lines", "found"),
    [
        ([VERSION, FABRIC, P2P_CUMEM, NET_IB], "network (NET/IB)"),
        ([VERSION, FABRIC, P2P_CUMEM, NET_SOCKET], "network (NET/Socket)"),
    ],
    ids=["net-ib", "net-socket"],
)
def test_multi_node_communicator_off_the_completed_fabric_fails_naming_the_transport(
    imex: str, lines: list[str], found: str
) -> None:
    nccl = recorded(lines, nvlink=True, ranks=8)
    verdict = judge(VerifyConfig(), gb200_two_nodes(imex), sweep(800.0), 8, "nccl", nccl)
    assert verdict["verdict"] == "FAIL"
    first = verdict["reasons"][0]
    assert first.startswith(f"transport: NCCL built the 2-node communicator over {found}")
    assert "expected MNNVL" in first
    for cause in ("IMEX channel", "NCCL_CUMEM_ENABLE=0", "NCCL_MNNVL_ENABLE=0", "cliques"):
        assert cause in first
    transport = next(c for c in verdict["checks"] if c["name"] == "transport")
    assert transport["status"] == "FAIL"


def test_multi_node_communicator_over_mnnvl_passes(imex: str) -> None:
    nccl = recorded([VERSION, FABRIC, MNNVL_ON, P2P_MNNVL], nvlink=True, ranks=8)
    assert nccl["transport"] == "MNNVL" and nccl["mnnvl"]
    verdict = judge(VerifyConfig(), gb200_two_nodes(imex), sweep(800.0), 8, "nccl", nccl)
    assert verdict["verdict"] == "PASS", verdict["reasons"]


def test_p2p_lines_naming_mnnvl_count_as_mnnvl_without_the_clique_line() -> None:
    # A log whose INIT lines were cut short still shows MNNVL in every P2P channel line.
    assert nccl_log.classify([P2P_MNNVL], nvlink_active=True)["transport"] == "MNNVL"


def test_one_host_with_nvlink_over_shared_memory_fails_with_the_transport_first(
    imex: str,
) -> None:
    summaries = summaries_on_nodes([h200("GPU-a"), h200("GPU-b")], 2, imex)
    nccl = recorded([H200_VERSION, H200_SHM], nvlink=True, ranks=2)
    verdict = judge(VerifyConfig(), summaries, sweep(27.9), 2, "nccl", nccl)  # P2P off
    assert verdict["verdict"] == "FAIL"
    first = verdict["reasons"][0]
    assert first.startswith("transport: NCCL used SHM between GPUs of one host")
    assert "expected NVLink P2P" in first and "NCCL_P2P_DISABLE=1" in first
    assert any("below the" in r for r in verdict["reasons"][1:])  # bandwidth fails too


def test_one_host_over_nvlink_p2p_passes(imex: str) -> None:
    summaries = summaries_on_nodes([h200("GPU-a"), h200("GPU-b")], 2, imex)
    nccl = recorded([H200_VERSION, H200_P2P], nvlink=True, ranks=2)
    verdict = judge(VerifyConfig(), summaries, sweep(340.0), 2, "nccl", nccl)
    assert verdict["verdict"] == "PASS", verdict["reasons"]


def test_unknown_transport_is_not_judged_but_said(imex: str) -> None:
    summaries = summaries_on_nodes([h200("GPU-a"), h200("GPU-b")], 2, imex)
    nccl = nccl_log.summarize([{"transport": "unknown"}] * 2, "2.28.9")
    verdict = judge(VerifyConfig(min_busbw_gbps=100.0), summaries, sweep(340.0), 2, "nccl", nccl)
    assert verdict["verdict"] == "PASS"
    transport = next(c for c in verdict["checks"] if c["name"] == "transport")
    assert transport["status"] == "NOT_JUDGED"
