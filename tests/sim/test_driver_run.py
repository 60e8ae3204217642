"""`mnnvl run` as a process: SIGTERM mid-run still tears everything down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mnnvl.inputs.names import RunNames
from mnnvl.sim import SimCluster


def test_sigterm_during_run_still_tears_down_and_reports(tmp_path):
    run_id = "sigterm-run"
    with SimCluster(nodes=2, imex_delay_s=60) as sim:
        # IMEX never gets ready, so the run is certainly mid-wait when the signal comes.
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mnnvl",
                "run",
                "--run-id",
                run_id,
                "--nodes",
                "2",
                "--gpus-per-node",
                "0",
                "--skip-verify",
                "--kubeconfig",
                sim.kubeconfig_path,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        for line in proc.stderr:
            if "pods 0/2 Running" in line or time.monotonic() > deadline:
                break
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err
        result = json.loads(out.splitlines()[-1])
        assert result["ok"] is False and result["exit_code"] == 143
        assert "SIGTERM" in result["error"]
        assert sim.objects(RunNames.for_run(run_id).selector) == []
        assert "gone after" in err  # teardown waited for the domain's 404


@pytest.mark.slow
def test_run_that_succeeds_but_cannot_tear_down_fails_with_the_teardown_error(capsys):
    from mnnvl.cli import main as cli

    run_id = "stuck-teardown"
    domain = RunNames.for_run(run_id).domain
    with SimCluster(nodes=2) as sim:
        sim.faults.stick_finalizer("ComputeDomain", domain)
        code = cli.main(
            [
                "run",
                "--run-id",
                run_id,
                "--nodes",
                "2",
                "--gpus-per-node",
                "0",
                "--skip-verify",
                "--steps",
                "2",
                "--warmup-steps",
                "1",
                "--delete-timeout-s",
                "2",
                "--kubeconfig",
                sim.kubeconfig_path,
            ]
        )
        result = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert code == 3, result  # the teardown's timeout, not success
        assert result["ok"] is False
        assert "resource.nvidia.com/computeDomain" in result["error"]
        sim.faults.unstick_finalizer("ComputeDomain", domain)
