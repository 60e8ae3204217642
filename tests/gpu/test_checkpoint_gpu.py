"""Background checkpoints on one GPU through the pods' entry: repeated saves staged in pinned
memory (buffers reused, or a new stager per save); a worker killed during a save resumes from
the one before and continues the loss curve of an uninterrupted run, from its pod's host copy
when it restarts in the same pod."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from mnnvl.contract.env import HOST_COPY_DIR, POD_NAME, RUN_ID
from mnnvl.runtime.checkpoint import DELAY_ENV
from mnnvl.runtime.local import pod_entry_command
from mnnvl.runtime.train import SIGNAL_AT_ENV

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ARGS = ["--model", "small", "--steps", "12", "--checkpoint-every", "2", "--log-every", "1"]


def train(ckpt: Path, mode: str, **hooks: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MNNVL_TRAIN_TUNING": f"ckpt={mode}", **hooks}
    args = [*ARGS, "--lr", "3e-3", "--warmup-steps", "2", "--checkpoint-dir", str(ckpt)]
    cmd = pod_entry_command("mnnvl.runtime.train", args, 1)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    found: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return found


@pytest.mark.parametrize("mode", ["async", "async-fresh"])
def test_six_saves_and_a_kill_during_one_resume_from_the_save_before(
    tmp_path: Path, mode: str
) -> None:
    straight = result(train(tmp_path / "straight", mode))
    assert straight["device"] == "cuda" and straight["checkpoint_stall_s"]["saves"] == 6
    assert (tmp_path / "straight" / "latest").read_text().strip() == "step-12"
    ckpt = tmp_path / "killed"
    # The write of step 6 starts 5 s late; the worker is killed after step 7, mid-save.
    killed = train(ckpt, mode, **{DELAY_ENV: "6:0:5", SIGNAL_AT_ENV: "7:0:SIGKILL"})
    assert killed.returncode != 0
    assert (ckpt / "latest").read_text().strip() == "step-4"
    resumed = result(train(ckpt, mode))
    assert resumed["start_step"] == 4
    want = {int(s): loss for s, loss in straight["losses"]}
    for step, loss in resumed["losses"]:  # GPU kernels are not bit-deterministic
        assert abs(loss - want[int(step)]) <= 1e-2 * abs(want[int(step)]), (step, loss)


@pytest.mark.parametrize(("pod", "source"), [("pod-a", "host"), ("pod-b", "disk")])
def test_a_restart_in_the_same_pod_resumes_from_its_host_copy(
    tmp_path: Path, pod: str, source: str
) -> None:
    # The killed worker's pod is pod-a: the same pod resumes from the copy in its /dev/shm
    # (pinned staging -> the copy -> the GPU), another pod (recreated) from the disk.
    run_id = f"gpu-{uuid.uuid4().hex[:8]}"
    copies = Path(HOST_COPY_DIR) / run_id
    try:
        straight = result(train(tmp_path / "straight", "async"))
        ckpt = tmp_path / "killed"
        first = {RUN_ID: run_id, POD_NAME: "pod-a"}
        hooks = {DELAY_ENV: "6:0:5", SIGNAL_AT_ENV: "7:0:SIGKILL"}  # killed mid-save of step 6
        killed = train(ckpt, "async", **first, **hooks)
        assert killed.returncode != 0
        assert (ckpt / "latest").read_text().strip() == "step-4"
        assert (copies / "pod-a" / "step-4.rank-0.pt").is_file()  # kept while step 6 was written
        resumed = result(train(ckpt, "async", **{RUN_ID: run_id, POD_NAME: pod}))
        assert (resumed["start_step"], resumed["resume_source"]) == (4, source)
        want = {int(s): loss for s, loss in straight["losses"]}
        for step, loss in resumed["losses"]:  # GPU kernels are not bit-deterministic
            assert abs(loss - want[int(step)]) <= 1e-2 * abs(want[int(step)]), (step, loss)
        assert not copies.exists()  # the run ended normally
    finally:
        shutil.rmtree(copies, ignore_errors=True)
