"""A worker that finished its work exits 0: nothing it started is still running into the
interpreter's exit, where a thread inside torch aborts the process (``terminate called
without an active exception``, exit 134) and turns a finished rank into a failed one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mnnvl.contract import env as contract_env
from mnnvl.runtime.local import free_port

pytestmark = pytest.mark.slow  # a torch process (several seconds)

# The worker entry as torchrun runs it, and, once the interpreter has joined its threads and
# is about to tear itself down, the threads still running (the last exit function to run is
# the first registered).
WORKER = """
import atexit, json, sys, threading

def left():
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print("THREADS AT EXIT " + json.dumps(alive), flush=True)

atexit.register(left)
from mnnvl.runtime.train import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_worker_that_saved_checkpoints_exits_0_with_nothing_left_running(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        # A pod of a run: the saves also keep a host copy, in this pod's /dev/shm.
        contract_env.RUN_ID: "exit-run",
        contract_env.POD_NAME: "pod-a",
        contract_env.SHM_DIR: str(tmp_path / "shm"),
    }
    (tmp_path / "shm").mkdir()
    args = ["--model", "tiny", "--steps", "4", "--warmup-steps", "1", "--log-every", "2"]
    args += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step-4"
    assert "host copy of the checkpoint: " in proc.stderr  # of step 2 (the final save has none)
    assert not (tmp_path / "shm" / "mnnvl-hostcopy" / "exit-run").exists()  # ended normally
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("THREADS AT EXIT ")]
    assert json.loads(line.removeprefix("THREADS AT EXIT ")) == []
