"""A hung verification worker on CPU, through two pods' launchers (gloo): the stopped rank's
pod ends with the retriable exit 12 at its stall timeout, its peer's collective times out
with exit 11 naming the sweep size, and rank 0's log gives the driver's progress line the
last sweep size. The stall inputs reach the verify step on every surface."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mnnvl.cli.parser import build_parser
from mnnvl.driver.rank0 import Rank0Progress
from mnnvl.inputs import surface
from mnnvl.inputs.flags import to_args
from mnnvl.inputs.spec import EVERY_SURFACE, VerifyConfig
from mnnvl.runtime.local import free_port
from mnnvl.runtime.verify import SIGNAL_AT_ENV, parse_config

ROOT = Path(__file__).resolve().parents[2]
STALL = ("collective_timeout_s", "stall_timeout_s")


def node(rank: int, port: int, *args: str, signal_at: str = "") -> subprocess.Popen[str]:
    """One pod of a two-node verification: one gloo worker under ``mnnvl.runtime.launch``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop(SIGNAL_AT_ENV, None)
    if signal_at:
        env[SIGNAL_AT_ENV] = signal_at
    cmd = [sys.executable, "-m", "mnnvl.runtime.launch", "--nnodes=2", f"--node-rank={rank}"]
    cmd += [f"--master-port={port}", "--grace-s=5", "-m", "mnnvl.runtime.verify", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_stopped_verify_worker_ends_its_pod_with_12_and_its_peer_times_out_naming_the_size() -> (
    None
):
    args = ["--collective-timeout-s=4", "--stall-timeout-s=8", "--allow-unjudged"]
    port = free_port()
    started = time.monotonic()
    pods = [node(r, port, *args, signal_at="2048:1:SIGSTOP") for r in (0, 1)]
    try:
        out = [p.communicate(timeout=240) for p in pods]
    finally:
        for p in pods:
            p.kill()
    codes = [p.returncode for p in pods]
    assert codes == [11, 12], (codes, out[0][1][-3000:], out[1][1][-3000:])
    # Both pods end well within the stall timeout plus start-up (two torch imports).
    assert time.monotonic() - started < 200
    stalled = out[1][1]
    assert "SIGSTOP to rank 1 after sweep size 2048" in stalled
    assert "rank 1 made no progress for" in stalled and "--stall-timeout-s 8" in stalled
    assert "last progress: sweep size 2048 bytes done" in stalled
    peer = out[0][1]
    assert "a collective in the all-reduce of 4096 bytes in the sweep across all ranks" in peer
    assert "timed out after --collective-timeout-s 4" in peer
    assert '"verdict":"FAIL","reasons":["the all-reduce of 4096 bytes' in out[0][0]  # reported
    # The driver follows rank 0's log: its progress line names the last size rank 0 finished.
    progress = Rank0Progress()
    for line in peer.splitlines():
        progress.line(line)
    assert progress.describe().startswith("rank 0 done with sweep size 2048 bytes, ")


def test_the_stall_inputs_are_inputs_of_the_verify_step_on_every_surface() -> None:
    inputs = {i.name: i for i in surface.step_inputs("verify")}
    for name in STALL:
        assert inputs[name].surfaces == frozenset(EVERY_SURFACE), name
    # CLI: `mnnvl verify` takes the flags; the worker gets them back as its own flags.
    sub = next(a for a in build_parser()._actions if a.dest == "command_name")
    flags = {s for a in sub.choices["verify"]._actions for s in a.option_strings}  # type: ignore[attr-defined]
    assert {"--collective-timeout-s", "--stall-timeout-s"} <= flags
    cfg = VerifyConfig(collective_timeout_s=30, stall_timeout_s=90)
    assert parse_config(to_args(cfg)) == cfg and cfg.stall_s == 90
    assert VerifyConfig(collective_timeout_s=30).stall_s == 2 * 30 + 60
    # KFP component and Argo template of the verify step, and the verify-only pipeline.
    kfp = yaml.safe_load((ROOT / "components" / "verify_nvlink.yaml").read_text())
    recovery = kfp["root"]["inputDefinitions"]["parameters"]["recovery"]["defaultValue"]
    argo = (ROOT / "pipelines" / "compiled" / "mnnvl-verify-only.workflowtemplate.yaml").read_text()
    for name in STALL:
        assert name in recovery, name  # the recovery group's
        assert f'"{name}": ' in argo, name
    assert {p.name for p in surface.PIPELINES["mnnvl-verify-only"].parameters()} >= set(STALL)


def test_a_stall_timeout_not_above_the_collective_timeout_is_refused_for_verify() -> None:
    with pytest.raises(
        ValueError, match=r"stall_timeout_s.*must exceed recovery.collective_timeout_s"
    ):
        VerifyConfig(collective_timeout_s=60, stall_timeout_s=30)
