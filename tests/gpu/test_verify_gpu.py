"""Verification on real GPUs: PASS on healthy NVLink, FAIL with peer-to-peer turned off."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from mnnvl.runtime.result import torchrun_command

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs at least 2 CUDA GPUs",
    ),
]


def run_verify(extra_env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    cmd = torchrun_command("mnnvl.runtime.verify", list(args), torch.cuda.device_count())
    env = {**os.environ, **extra_env}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-4000:]
    return proc.returncode, json.loads(lines[-1][len("RESULT ") :])


def test_healthy_nvlink_passes_the_derived_threshold() -> None:
    code, result = run_verify({}, "--max-bytes", "1G")
    assert result["verdict"] == "PASS", result["reasons"]
    assert code == 0
    assert result["backend"] == "nccl"
    assert all(row["correct"] for row in result["sizes"])
    if result["topology"]["active_links"]:
        assert result["threshold_source"] == "derived"


def test_peer_to_peer_disabled_fails() -> None:
    code, result = run_verify({"NCCL_P2P_DISABLE": "1"}, "--max-bytes", "1G")
    if not result["topology"]["active_links"]:
        pytest.skip("no NVLink detected: the derived threshold does not apply")
    assert result["verdict"] == "FAIL"
    assert code != 0
    assert any("below the derived threshold" in r for r in result["reasons"])
