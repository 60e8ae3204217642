"""Two gloo ranks through torchrun: the real entry point, RESULT line, report files, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mnnvl.runtime.result import torchrun_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_verify(*args: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MNNVL_NCCL_PROFILE", None)
    cmd = torchrun_command("mnnvl.runtime.verify", ["--max-bytes", "256K", *args], nproc=2)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[0][len("RESULT ") :]), proc.stderr


@pytest.fixture(scope="module")
def passing(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("verify")
    code, result, _ = run_verify("--output-dir", str(out), "--min-busbw-gbps", "0.000001")
    return code, result, out


def test_two_gloo_ranks_pass_with_a_tiny_threshold(passing: Any) -> None:
    code, result, _ = passing
    assert code == 0
    assert result["kind"] == "verify" and result["verdict"] == "PASS"
    assert result["backend"] == "gloo" and result["world_size"] == 2
    assert result["threshold_source"] == "user" and result["threshold_gbps"] == 0.000001
    assert [r["bytes"] for r in result["sizes"]] == [1024 << i for i in range(9)]
    assert all(r["correct"] and r["busbw_gbps"] > 0 for r in result["sizes"])
    assert result["judged_busbw_gbps"] == result["sizes"][-1]["busbw_gbps"]  # all < 1 GiB
    assert [n["rank"] for n in result["nodes"]] == [0, 1]
    assert all(n["nvml"] == "not checked: no GPU" for n in result["nodes"])


def test_report_files_are_written_by_rank_zero(passing: Any) -> None:
    _, _, out = passing
    names = {p.name for p in out.iterdir()}
    assert names == {"verify.json", "verify.md", "busbw.png", "verify.html"}
    assert (out / "busbw.png").read_bytes().startswith(PNG_MAGIC)
    assert json.loads((out / "verify.json").read_text())["verdict"] == "PASS"


def test_unreachable_threshold_fails_with_exit_code_4_and_still_prints_result() -> None:
    code, result, stderr = run_verify(
        "--min-busbw-gbps", "100000"
    )  # the largest VerifyConfig allows
    assert result["verdict"] == "FAIL"
    assert any("below the user threshold" in r for r in result["reasons"])
    # torchrun turns a failed worker into its own exit code 1 and names the worker's code.
    assert code != 0 and "exitcode  : 4" in stderr
