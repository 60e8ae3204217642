"""A seed gives the same initial model whatever the sharding (unsharded, FSDP, HSDP)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mnnvl.runtime.local import free_port

WORKER = Path(__file__).with_name("init_layout_worker.py")


@pytest.mark.slow
def test_same_seed_gives_the_same_weights_unsharded_fsdp_and_hsdp() -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    cmd += [f"--master-port={free_port()}", str(WORKER)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [line.split() for line in proc.stdout.splitlines() if line.startswith("LAYOUT ")]
    assert {(name, rank) for _, name, rank, _ in seen} == {
        (name, f"rank{r}") for name in ("unsharded", "fsdp", "hsdp") for r in (0, 1)
    }
    assert len({digest for *_, digest in seen}) == 1, proc.stdout
