"""Which transport NCCL used, from its INFO lines, and the private log file's life cycle."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnnvl.runtime.nccl_log import NcclLog, classify, summarize

HEADER = "h200-0:123:123 [0] NCCL INFO NCCL version 2.28.9+cuda13.0"
P2P = "h200-0:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
SHM = "h200-0:123:456 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct"
NET = "n1:1:2 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA"
MNNVL_ON = "h200-0:1:2 [0] NCCL INFO MNNVL 1 cliqueId 7 cliqueSize 8 cliqueRank 0 "
MNNVL_OFF = "h200-0:1:2 [0] NCCL INFO MNNVL 0 cliqueId 0 cliqueSize 1 cliqueRank 0 "


def test_p2p_between_nvlinked_gpus_is_nvlink_p2p_with_the_logged_version() -> None:
    found = classify([HEADER, MNNVL_OFF, P2P, P2P], nvlink_active=True)
    assert found["transport"] == "NVLink P2P" and found["log_version"] == "2.28.9"
    assert found["connections"] == {"P2P/CUMEM/read": 2} and not found["mnnvl"]


def test_p2p_without_nvlink_is_pcie() -> None:
    assert classify([P2P], nvlink_active=False)["transport"] == "PCIe P2P"


def test_the_slowest_connection_names_the_transport() -> None:
    assert classify([P2P, SHM], nvlink_active=True)["transport"] == "SHM"
    assert classify([P2P, NET, SHM], nvlink_active=True)["transport"] == "network (NET/IB)"


def test_p2p_on_an_mnnvl_communicator_is_mnnvl() -> None:
    found = classify([MNNVL_ON, P2P], nvlink_active=True)
    assert found["transport"] == "MNNVL" and found["mnnvl"]


def test_no_connection_at_all_is_none() -> None:
    assert classify([HEADER], nvlink_active=True)["transport"] == "none"


def test_summary_takes_the_slowest_rank() -> None:
    ranks = [{"transport": "NVLink P2P"}, {"transport": "SHM"}, {"transport": "unknown"}]
    summary = summarize(ranks, "2.28.9")
    assert summary["transport"] == "SHM" and summary["version"] == "2.28.9"
    assert summary["per_rank"] == ["NVLink P2P", "SHM", "unknown"]
    assert summarize([{"transport": "unknown"}], None)["transport"] == "unknown"


def test_log_goes_to_a_private_file_and_back_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"NCCL_DEBUG": "INFO"}
    log = NcclLog(env).start()
    path = Path(env["NCCL_DEBUG_FILE"])
    path.write_text(f"{HEADER}\n{P2P}\n")
    assert log.finish() == [HEADER, P2P]
    assert P2P in capsys.readouterr().err  # the pod log still shows NCCL's lines
    assert not path.exists() and not log.active


def test_without_info_the_log_is_turned_on_but_only_warnings_are_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env: dict[str, str] = {}
    log = NcclLog(env).start()
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT"
    warn = "h:1:1 [0] NCCL WARN Cuda failure 'out of memory'"
    Path(env["NCCL_DEBUG_FILE"]).write_text(f"{P2P}\n{warn}\n")
    log.finish()
    assert capsys.readouterr().err == warn + "\n"


def test_a_users_own_debug_file_is_left_alone() -> None:
    env = {"NCCL_DEBUG_FILE": "/var/log/nccl.%h.%p"}
    log = NcclLog(env).start()
    assert not log.active and env == {"NCCL_DEBUG_FILE": "/var/log/nccl.%h.%p"}
    assert log.finish() == []
