"""The in-pod entry keeps the worst worker exit code through real torchrun (CPU, 2 workers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mnnvl.contract.exit_codes import worst_exit_code
from mnnvl.runtime.local import free_port

WORKER = textwrap.dedent(
    """
    import os, sys, time
    rank, code = int(os.environ["RANK"]), int(sys.argv[1])
    if rank == 1:
        sys.exit(code)
    time.sleep(2)  # rank 0 is still running when rank 1 fails: torchrun stops it
    """
)


def launch(tmp_path, entry: str, code: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "exit_worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", entry, "--nproc-per-node=2", f"--master-port={free_port()}"]
    return subprocess.run(
        [*cmd, "-m", "exit_worker", str(code)],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("code", [4, 2, 3, 0])
def test_container_exits_with_the_worker_exit_code_not_torchruns_1(tmp_path, code):
    done = launch(tmp_path, "mnnvl.runtime.launch", code)
    assert done.returncode == code, done.stderr[-2000:]
    if code:
        assert f"rank 1: exit {code}" in done.stderr


def test_plain_torchrun_reports_every_worker_failure_as_1(tmp_path):
    # Why the entry exists: this is what a Job's podFailurePolicy would otherwise see.
    assert launch(tmp_path, "torch.distributed.run", 4).returncode == 1


def test_a_non_retriable_code_beats_an_earlier_crash_and_signals_come_last():
    assert worst_exit_code([(1.0, 1), (2.0, 4)]) == 4
    assert worst_exit_code([(5.0, -15), (5.0, 1)]) == 1  # the SIGTERM'd survivor is no cause
    assert worst_exit_code([(5.0, -9)]) == 137
    assert worst_exit_code([]) == 0
