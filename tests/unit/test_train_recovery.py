"""A lost or hung worker on CPU, through the pod's launcher: a killed worker's run resumes
from its checkpoint to the loss of an uninterrupted run; a stopped peer fails the others'
collective within the collective timeout with the retriable exit 11 naming where."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mnnvl.runtime.train import SIGNAL_AT_ENV

pytestmark = pytest.mark.slow

TINY = ["--model", "tiny", "--log-every", "2", "--lr", "3e-3", "--warmup-steps", "2"]
STEPS = ["--steps", "12", "--checkpoint-every", "4"]


def launch(ckpt: Path, *args: str, signal_at: str = "") -> subprocess.CompletedProcess[str]:
    """One pod: two gloo workers under ``mnnvl.runtime.launch``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop(SIGNAL_AT_ENV, None)
    if signal_at:
        env[SIGNAL_AT_ENV] = signal_at
    cmd = [sys.executable, "-m", "mnnvl.runtime.launch", "--nproc-per-node=2", "--grace-s=5"]
    cmd += ["-m", "mnnvl.runtime.train", *TINY, "--checkpoint-dir", str(ckpt), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, check=False)


def result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    found: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return found


def test_a_killed_worker_resumes_to_the_loss_of_an_uninterrupted_run(tmp_path: Path) -> None:
    plain = [result(launch(tmp_path / f"plain-{i}", *STEPS))["final_loss"] for i in (0, 1)]
    noise = abs(plain[0] - plain[1])  # run-to-run noise floor of the same seed
    killed = launch(tmp_path / "killed", *STEPS, signal_at="6:1:SIGKILL")
    assert killed.returncode != 0 and "SIGKILL to rank 1 after step 6" in killed.stderr
    resumed = result(launch(tmp_path / "killed", *STEPS))  # the restart of the same pod
    assert resumed["start_step"] == 4  # the last checkpoint before the kill
    assert [s for s, _ in resumed["losses"]] == [5, 6, 8, 10, 12]
    assert abs(resumed["final_loss"] - plain[0]) <= max(noise, 1e-6), (resumed, plain)


def test_a_stopped_peer_fails_the_collective_with_exit_11_naming_the_step(tmp_path: Path) -> None:
    proc = launch(
        tmp_path,
        *STEPS,
        "--collective-timeout-s=3",
        "--stall-timeout-s=120",
        signal_at="5:1:SIGSTOP",
    )
    assert proc.returncode == 11, proc.stderr[-4000:]
    assert "rank 0: a collective in" in proc.stderr and "timed out" in proc.stderr
    assert "--collective-timeout-s 3" in proc.stderr
    assert "ranks that did not arrive: rank 1 (pod" in proc.stderr


def test_a_rank_that_starts_first_waits_for_a_late_rank_0_past_the_collective_timeout(
    tmp_path: Path,
) -> None:
    """Two pods of a gang start seconds apart (a restarted rank 0 is rescheduled): the rank
    already up waits for rank 0's rendezvous store instead of failing the gang again."""
    from mnnvl.ports import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop(SIGNAL_AT_ENV, None)
    port = str(free_port())

    def node(rank: int) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "mnnvl.runtime.launch", "--nnodes=2", f"--node-rank={rank}",
               "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "mnnvl.runtime.train",
               *TINY, "--steps", "4", "--collective-timeout-s=2", "--stall-timeout-s=60",
               "--checkpoint-dir", str(tmp_path / f"ckpt-{rank}")]  # fmt: skip
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    late = node(1)
    time.sleep(6)  # three collective timeouts: rank 1 must still be waiting for rank 0
    assert late.poll() is None, late.communicate()[1][-3000:]
    first = node(0)
    out, err = first.communicate(timeout=180)
    assert first.returncode == 0, err[-3000:]
    assert late.wait(timeout=60) == 0, late.communicate()[1][-3000:]
    assert any(line.startswith("RESULT ") for line in out.splitlines())
