"""Verification on real GPUs: PASS on healthy NVLink, FAIL with peer-to-peer turned off."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mnnvl import report
from mnnvl.runtime.local import pod_entry_command

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu]
two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs at least 2 CUDA GPUs",
)
one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run_verify(extra_env: dict[str, str], *args: str, nproc: int = 0) -> tuple[int, dict[str, Any]]:
    cmd = pod_entry_command("mnnvl.runtime.verify", list(args), nproc or torch.cuda.device_count())
    env = {**os.environ, **extra_env}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-4000:]
    return proc.returncode, json.loads(lines[-1][len("RESULT ") :])


@two_gpus
def test_healthy_nvlink_passes_the_derived_threshold() -> None:
    code, result = run_verify({}, "--max-bytes", "1G")
    assert result["verdict"] == "PASS", result["reasons"]
    assert code == 0
    assert result["backend"] == "nccl"
    assert all(row["correct"] for row in result["sizes"])
    if result["topology"]["active_links"]:
        # 2 x H200 over NVLink P2P has a measured baseline; other machines derive one.
        assert result["threshold_source"] in ("baseline", "derived")
        assert report.headline(result)[2].startswith("busbw ")


@two_gpus
def test_peer_to_peer_disabled_fails() -> None:
    code, result = run_verify({"NCCL_P2P_DISABLE": "1"}, "--max-bytes", "1G")
    if not result["topology"]["active_links"]:
        pytest.skip("no NVLink detected: the derived threshold does not apply")
    assert result["verdict"] == "FAIL"
    assert code == 4
    first = result["reasons"][0]
    assert first.startswith("transport: NCCL used SHM between GPUs of one host"), first
    assert "expected NVLink P2P" in first
    assert any("below the" in r and "threshold" in r for r in result["reasons"])


@two_gpus
def test_nvlink_transport_and_nccl_version_are_recorded() -> None:
    code, result = run_verify({}, "--max-bytes", "16M", "--min-busbw-gbps", "1")
    assert code == 0 and result["verdict"] == "PASS"
    nccl = result["nccl"]
    assert nccl["version"] == ".".join(map(str, torch.cuda.nccl.version()))
    expected = "NVLink P2P" if result["topology"]["active_links"] else "PCIe P2P"
    assert nccl["transport"] in (expected, "MNNVL"), nccl
    small = result["sizes"][0]
    assert small["correct"] and small["path"] in ("eager", "direct")


@two_gpus
def test_shared_memory_transport_is_named_when_peer_to_peer_is_off() -> None:
    _, result = run_verify({"NCCL_P2P_DISABLE": "1"}, "--max-bytes", "4M", "--min-busbw-gbps", "1")
    assert result["nccl"]["transport"] == "SHM", result["nccl"]


@one_gpu
def test_one_gpu_is_not_judged_and_exits_4(tmp_path: Path) -> None:
    code, result = run_verify({}, "--max-bytes", "4M", "--output-dir", str(tmp_path), nproc=1)
    assert result["verdict"] == "NOT_JUDGED" and code == 4
    assert result["reasons"][0].startswith("NOT_JUDGED: one rank")
    assert result["nccl"]["transport"] == "none"
    # A no-op all-reduce's time is no bandwidth: the rows and the table say so.
    assert all(row["algbw_gbps"] is None and row["busbw_gbps"] == 0 for row in result["sizes"])
    assert "n/a: one rank" in (tmp_path / "verify.md").read_text()
    # The plot says why instead of drawing busbw 0 as a line.
    series, note = report.busbw_plot(result)
    assert series == [] and note.startswith("NOT_JUDGED: one rank")
    assert (tmp_path / "busbw.png").exists() and (tmp_path / "verify.ctrf.json").exists()
