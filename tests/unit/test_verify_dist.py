"""Two gloo ranks through torchrun: the real entry point, RESULT line, report files, exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mnnvl import report
from mnnvl.contract.result import parse_result, schema_problems
from mnnvl.runtime.local import torchrun_command

# Every test here runs torch processes (several seconds each).
pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_verify(
    *args: str, env_extra: dict[str, str] | None = None, nproc: int = 2
) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env_extra or {})}
    env.pop("MNNVL_NCCL_PROFILE", None)
    cmd = torchrun_command("mnnvl.runtime.verify", ["--max-bytes", "256K", *args], nproc=nproc)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT ") :])
    assert schema_problems(result) == []  # what the launcher side reads is all there
    return proc.returncode, result, proc.stderr


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
    figures = {name for name, _ in report.KEY_FIGURES.values()}
    assert names == {"verify.json", "verify.md", "verify.ctrf.json", "busbw.png", "verify.html"} | (
        figures
    )
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


def test_gloo_without_a_threshold_is_not_judged_and_exits_4() -> None:
    code, result, stderr = run_verify()
    assert result["verdict"] == "NOT_JUDGED"
    assert result["reasons"][0].startswith("NOT_JUDGED: no NVLink (CPU/gloo run)")
    assert result["nccl"]["transport"].startswith("none (gloo")
    assert code != 0 and "exitcode  : 4" in stderr
    assert "--allow-unjudged was not given" in stderr


def test_allow_unjudged_accepts_not_judged_with_exit_0() -> None:
    code, result, _ = run_verify("--allow-unjudged")
    assert code == 0 and result["verdict"] == "NOT_JUDGED" and result["allow_unjudged"]


def test_result_carries_the_time_breakdown_and_comes_before_the_plot() -> None:
    code, result, stderr = run_verify("--min-busbw-gbps", "0.000001")
    assert code == 0
    phases = result["timings_s"]
    assert {"imports", "nvml", "process_group", "sweep", "judge"} <= set(phases)
    assert all(row["wall_ms"] > 0 and row["path"] == "eager" for row in result["sizes"])
    assert "report" not in phases  # written after the verdict went out
    assert "after the verdict: report and plot took" in stderr


def test_pod_that_asked_for_gpus_and_sees_none_fails_naming_the_pod() -> None:
    env = {"MNNVL_GPUS_PER_NODE": "4", "HOSTNAME": "run-verify-pre-0-abcde"}
    code, result, stderr = run_verify("--allow-unjudged", env_extra=env)
    assert result["verdict"] == "FAIL"
    (reason,) = result["reasons"]
    assert reason.startswith("pod run-verify-pre-0-abcde requested 4 GPU(s) but the worker sees")
    assert result["sizes"] == []  # never a silent gloo sweep
    assert code != 0 and "exitcode  : 4" in stderr


def run_pod_entry(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MNNVL_NCCL_PROFILE", None)
    cmd = [sys.executable, "-m", "mnnvl.runtime.launch", "--nproc-per-node", "2", "-m"]
    cmd += ["mnnvl.runtime.verify", "--max-bytes", "64K", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_pod_entry_starts_two_ranks_from_one_import_and_keeps_the_exit_code() -> None:
    ok = run_pod_entry("--allow-unjudged")
    assert ok.returncode == 0, ok.stderr[-3000:]
    result = parse_result(ok.stdout)
    assert result is not None and result["world_size"] == 2
    assert result["verdict"] == "NOT_JUDGED"
    gated = run_pod_entry()  # NOT_JUDGED without --allow-unjudged: the container exits 4
    assert gated.returncode == 4
    # Both ranks exit 4 after the shared verdict; whichever ends first gets its peer stopped
    # (exit 143 once past the barrier that follows rank 0's RESULT), so either may be named.
    assert re.search(r"rank [01]: exit 4\b", gated.stderr), gated.stderr[-2000:]
    assert "exiting with 4" in gated.stderr
    assert parse_result(gated.stdout) is not None  # rank 0's RESULT is out before any stop


GROUPS_2x2 = {"MNNVL_NUM_GROUPS": "2", "MNNVL_NODES_PER_GROUP": "1"}


def test_two_clique_groups_get_a_verdict_and_a_table_per_clique() -> None:
    code, result, stderr = run_verify("--min-busbw-gbps", "0.000001", env_extra=GROUPS_2x2, nproc=4)
    assert code == 0, stderr[-3000:]
    assert result["verdict"] == "PASS" and result["world_size"] == 4
    assert [(c["group"], c["ranks"], c["verdict"]) for c in result["cliques"]] == [
        (0, [0, 1], "PASS"),
        (1, [2, 3], "PASS"),
    ]
    assert all(c["sizes"] and all(r["correct"] for r in c["sizes"]) for c in result["cliques"])
    inter = result["inter_clique"]
    assert inter["spanning"]["verdict"] == "NOT_JUDGED" and inter["spanning"]["sizes"]
    assert inter["leaders"]["verdict"] == "NOT_JUDGED" and inter["leaders"]["sizes"]
    assert "inter-clique bandwidth NOT_JUDGED" in result["reasons"][-1]
    assert "clique 0 (" in stderr and "clique 1 (" in stderr and "across cliques, leaders" in stderr


def test_a_slowed_rank_fails_its_clique_and_is_named_as_the_worst_node() -> None:
    env = {**GROUPS_2x2, "MNNVL_TEST_SLOW_RANK": "3:200"}
    args = ("--min-bytes", "64K", "--max-bytes", "64K", "--min-busbw-gbps", "0.005")
    code, result, stderr = run_verify(*args, env_extra=env, nproc=4)
    assert code != 0 and "exitcode  : 4" in stderr
    assert result["verdict"] == "FAIL"
    assert [c["verdict"] for c in result["cliques"]] == ["PASS", "FAIL"]
    assert result["worst_clique"]["group"] == 1
    assert result["worst_node"]["rank"] == 3
    assert result["worst_node"]["why"].startswith("straggler: the other ranks waited")
    assert any(
        r.startswith("clique 1 (") and "below the user threshold" in r for r in result["reasons"]
    )
    assert "worst node:" in stderr and "(rank 3)" in stderr


def test_inter_clique_threshold_judges_the_sweeps_across_cliques() -> None:
    args = ("--min-busbw-gbps", "0.000001", "--min-inter-clique-busbw-gbps", "100000")
    code, result, _ = run_verify(*args, env_extra=GROUPS_2x2, nproc=4)
    assert code != 0 and result["verdict"] == "FAIL"
    assert [c["verdict"] for c in result["cliques"]] == ["PASS", "PASS"]
    assert result["inter_clique"]["spanning"]["verdict"] == "FAIL"
    assert any("all ranks across cliques: busbw" in r for r in result["reasons"])


def test_worker_help_renders_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from mnnvl.runtime.verify import parse_config

    with pytest.raises(SystemExit) as info:
        parse_config(["--help"])
    assert info.value.code == 0
    assert "--allow-unjudged" in capsys.readouterr().out
