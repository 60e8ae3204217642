"""Two gloo processes under torchrun: learning, checkpoint/resume, and NaN fail-fast."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mnnvl.contract.result import schema_problems
from mnnvl.runtime.local import torchrun_command
from mnnvl.runtime.train import INJECT_NAN_ENV, main

# Every test here runs torch processes (several seconds each).
pytestmark = pytest.mark.slow

TINY = ["--model", "tiny", "--log-every", "2", "--lr", "3e-3", "--warmup-steps", "2"]


def _torchrun(args: list[str], extra_env: dict[str, str] | None = None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(extra_env or {})}
    cmd = torchrun_command("mnnvl.runtime.train", [*TINY, *args], nproc=2)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    result: dict[str, Any] = json.loads(lines[0][len("RESULT ") :])
    assert schema_problems(result) == []  # what the launcher side reads is all there
    return result


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    """Run 6 steps with checkpoints every 3, then the same directory again with 12 steps."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    flags = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"]
    first = _result(_torchrun(["--steps", "6", *flags]))
    second = _result(_torchrun(["--steps", "12", *flags]))
    return first, second, ckpt


def test_two_rank_run_reports_every_result_key(two_runs) -> None:
    first, _, ckpt = two_runs
    assert first["kind"] == "train"
    assert first["world_size"] == 2
    assert first["device"] == "cpu"
    assert first["mfu"] is None
    assert first["steps"] == 6 and first["start_step"] == 0
    assert first["params"] == 164160
    assert first["tokens_per_s"] > 0
    assert first["tokens_per_s_per_gpu"] == pytest.approx(first["tokens_per_s"] / 2)
    assert first["checkpoint"] == str(ckpt / "step-6")
    assert [s for s, _ in first["losses"]] == [1, 2, 4, 6]
    split = first["step_split_ms"]  # steps 3..6 measured; 1 and 2 warm up
    assert split["steps_measured"] == 4
    assert all(split[k] > 0 for k in ("forward", "backward", "optimizer", "step"))
    assert first["tuning"]["optim"] == "fused"


def test_loss_decreases_across_the_run_and_its_resume(two_runs) -> None:
    first, second, _ = two_runs
    losses = [loss for _, loss in first["losses"] + second["losses"]]
    assert losses[-1] < losses[0] - 1.0
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert second["final_loss"] == losses[-1]


def test_resume_starts_from_the_latest_checkpoint_and_keeps_two(two_runs) -> None:
    _, second, ckpt = two_runs
    assert second["start_step"] == 6
    assert second["steps"] == 12
    assert [s for s, _ in second["losses"]] == [7, 8, 10, 12]
    assert second["checkpoint"] == str(ckpt / "step-12")
    assert (ckpt / "latest").read_text().strip() == "step-12"
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["step-12", "step-9"]


def test_injected_nan_fails_every_rank_with_a_clear_message() -> None:
    proc = _torchrun(["--steps", "8"], {INJECT_NAN_ENV: "3"})
    assert proc.returncode != 0
    assert "non-finite loss or gradient norm by step 4" in proc.stderr
    assert "RESULT" not in proc.stdout


def test_bad_flag_value_exits_with_the_input_error_code() -> None:
    assert main(["--model", "huge"]) == 2


def test_selective_checkpointing_and_explicit_prefetch_keep_the_same_losses() -> None:
    base = _result(_torchrun(["--steps", "4", "--activation-checkpointing", "full"]))
    levers = ["--activation-checkpointing", "every-2", "--reshard-after-forward", "false"]
    bench_only = {"MNNVL_TRAIN_TUNING": "prefetch=1,optim=foreach"}
    tuned = _result(_torchrun(["--steps", "4", *levers], bench_only))
    assert (base["activation_checkpointing"], base["reshard_after_forward"]) == ("full", True)
    assert (tuned["activation_checkpointing"], tuned["reshard_after_forward"]) == ("every-2", False)
    assert tuned["tuning"] == {
        "prefetch": "1",
        "optim": "foreach",
        "ckpt": "async",
        "hostcopy": "on",
    }
    # Same seed, same math: recomputation, prefetch order and the optimizer kernel do not
    # change the loss curve beyond float noise.
    for (s1, l1), (s2, l2) in zip(base["losses"], tuned["losses"], strict=True):
        assert s1 == s2 and l1 == pytest.approx(l2, rel=1e-4)


def test_unknown_tuning_lever_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNNVL_TRAIN_TUNING", "turbo=1")
    assert main(["--model", "tiny", "--steps", "1"]) == 2


def test_levers_that_became_inputs_are_refused_in_the_tuning_env(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MNNVL_TRAIN_TUNING", "ac=every2")
    assert main(["--model", "tiny", "--steps", "1"]) == 2
    assert "set it with --activation-checkpointing instead" in caplog.text


def test_bad_checkpointing_value_exits_2_before_the_process_group() -> None:
    assert main(["--model", "tiny", "--activation-checkpointing", "half"]) == 2


def test_pod_that_asked_for_gpus_and_sees_none_fails_naming_the_pod() -> None:
    env = {"MNNVL_GPUS_PER_NODE": "2", "HOSTNAME": "run-train-1-xyz"}
    proc = _torchrun(["--steps", "2"], env)
    assert proc.returncode != 0 and "exitcode  : 4" in proc.stderr
    assert "pod run-train-1-xyz requested 2 GPU(s) but the worker sees none" in proc.stderr
    assert "RESULT" not in proc.stdout


def _torchrun4(args: list[str], extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra_env}
    cmd = torchrun_command("mnnvl.runtime.train", [*TINY, *args], nproc=4)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, check=False)


def test_two_clique_groups_train_hsdp_with_the_loss_curve_of_one_group_fsdp() -> None:
    args = ["--steps", "20", "--log-every", "1"]
    fsdp = _result(_torchrun4(args, {}))
    hsdp = _result(_torchrun4(args, {"MNNVL_NUM_GROUPS": "2", "MNNVL_NODES_PER_GROUP": "1"}))
    assert fsdp["mesh"] == {"shape": [4], "dims": ["shard"], "groups": 1, "sharding": "FSDP"}
    assert hsdp["mesh"] == {
        "shape": [2, 2],
        "dims": ["replicate", "shard"],
        "groups": 2,
        "sharding": "HSDP",
    }
    assert [s for s, _ in hsdp["losses"]] == list(range(1, 21))
    for (s1, l1), (s2, l2) in zip(fsdp["losses"], hsdp["losses"], strict=True):
        assert s1 == s2 and l2 == pytest.approx(l1, rel=1e-3)
    assert hsdp["losses"][-1][1] < hsdp["losses"][0][1] - 1.0


def test_worker_placed_in_the_wrong_group_fails_naming_its_pod() -> None:
    # Every rank claims group 1: ranks 0 and 1 belong to group 0 (node ranks overlap).
    env = {"MNNVL_NUM_GROUPS": "2", "MNNVL_GROUP_INDEX": "1", "HOSTNAME": "run-train-g1-0-abc"}
    proc = _torchrun4(["--steps", "2"], env)
    assert proc.returncode != 0
    assert "pod run-train-g1-0-abc (rank 0) was placed in group 1" in proc.stderr
    assert "RESULT" not in proc.stdout
