"""A checkpoint directory written for another model fails at load with the non-retriable exit
14, naming the directory, what it holds and what the run is, before any step is trained
(CPU, two gloo workers through the pod's launcher)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mnnvl.contract import exit_codes


def train(ckpt: Path, model: str, steps: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "mnnvl.runtime.launch", "--nproc-per-node=2", "--grace-s=5"]
    cmd += ["-m", "mnnvl.runtime.train", "--model", model, "--steps", str(steps)]
    cmd += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--log-every", "1"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)


def test_a_checkpoint_of_another_preset_exits_14_naming_both_and_the_fix(tmp_path: Path) -> None:
    first = train(tmp_path, "tiny", 2)
    assert first.returncode == 0, first.stderr[-3000:]
    other = train(tmp_path, "small", 4)
    assert other.returncode == exit_codes.CHECKPOINT_MISMATCH, other.stderr[-3000:]
    assert exit_codes.CHECKPOINT_MISMATCH in exit_codes.NON_RETRIABLE_EXIT_CODES
    line = next(ln for ln in other.stderr.splitlines() if "cannot resume from" in ln)
    assert f"{tmp_path}/step-2" in line and "the tiny preset" in line
    assert "this run is the small preset" in line and "--checkpoint-dir" in line
    assert " step 1 " not in other.stderr  # nothing was trained
