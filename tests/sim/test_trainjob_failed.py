"""A TrainJob step that fails: ``--max-restarts`` caps the runtime's restarts, the failed
TrainJob and its pods are removed at once (the nodes' IMEX channels and GPUs are free for the
run's next step), a retry with the same inputs repeats the failure without running again, and
one with other input runs; a step stopped by SIGTERM leaves its TrainJob running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mnnvl.cli import main as cli
from mnnvl.inputs.names import RunNames
from tests.sim.simkit import Raw, wait_for
from tests.sim.test_trainjob_standin import TJ_PATH, gang_runtime, pods, raw, schemas, sim

__all__ = ["raw", "schemas", "sim"]  # the stand-in's module fixtures, used here too


def launch_argv(
    sim, run_id: str, runtime: str, *more: str, code: str = "raise SystemExit(3)"
) -> list[str]:
    """``mnnvl launch`` of a TrainJob whose workers run ``code`` (by default: exit 3)."""
    argv = ["launch", "--kubeconfig", sim.kubeconfig_path, "--run-id", run_id, "--nodes", "2"]
    argv += ["--gpus-per-node", "0", "--no-clique-affinity", "--purpose", "job"]
    argv += ["--workload", "trainjob", "--trainjob-runtime", runtime, *more]
    return [*argv, "--command", "--", "python3", "-c", code]


def error_of(capsys: pytest.CaptureFixture[str]) -> str:
    return str(json.loads(capsys.readouterr().out.splitlines()[-1])["error"])


def test_restarts_beyond_max_restarts_fail_the_step_below_the_runtimes_limit(
    sim, raw: Raw, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gang_runtime(raw, "gang-cap", 3)
    for run in ("tj-cap-ok", "tj-cap"):
        assert cli.main(["provision", "--kubeconfig", sim.kubeconfig_path, "--run-id", run]) == 0
    marker = tmp_path / "failed-once"
    once = f"import os, sys; p = {str(marker)!r}\n"
    once += "if not os.path.exists(p): open(p, 'w').close(); sys.exit(3)\n"
    capsys.readouterr()
    # Restarted as often as --max-restarts allows: the step goes on and counts it.
    within = launch_argv(sim, "tj-cap-ok", "gang-cap", "--max-restarts", "1", code=once)
    assert cli.main(within) == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[-1])["restarts"]) == 1

    name = RunNames.for_run("tj-cap").job("job")
    assert cli.main(launch_argv(sim, "tj-cap", "gang-cap", "--max-restarts", "1")) == 4
    error = error_of(capsys)
    assert error.startswith(
        f"TrainJob default/{name} restarted 2 times, more than --max-restarts 1 "
        "(the runtime allows 3); pods: "
    )
    assert "raise --max-restarts" in error and "\n" not in error
    for run in ("tj-cap-ok", "tj-cap"):
        assert cli.main(["teardown", "--kubeconfig", sim.kubeconfig_path, "--run-id", run]) == 0


def test_a_failed_trainjob_is_removed_at_once_and_a_retry_repeats_its_failure(
    sim, raw: Raw, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = ["--kubeconfig", sim.kubeconfig_path, "--run-id", "tj-gone"]
    assert cli.main(["provision", *kube]) == 0
    name = RunNames.for_run("tj-gone").job("job")
    argv = launch_argv(sim, "tj-gone", "torch-distributed")  # no restarts: Trainer's Failed
    capsys.readouterr()

    assert cli.main(argv) == 4
    error = error_of(capsys)
    assert "FailedJobs" in error and f"removed TrainJob default/{name} and its pods" in error
    assert pods(raw, name) == []  # the nodes are free before the run's teardown
    record = raw.get(f"{TJ_PATH}/{name}")
    assert record["spec"]["suspend"] is True  # the failure's record, which runs no pod

    assert cli.main(argv) == 4  # the orchestrator's retry, same inputs
    again = error_of(capsys)
    assert "FailedJobs" in again and "a retry with the same inputs fails the same way" in again
    assert pods(raw, name) == []  # nothing ran again
    assert raw.get(f"{TJ_PATH}/{name}")["metadata"]["uid"] == record["metadata"]["uid"]

    fixed = [*argv[: argv.index("--command")], "--command", "--", "python3", "-c", "pass"]
    assert cli.main(fixed) == 0  # other input: the record is replaced and the step runs
    assert raw.get(f"{TJ_PATH}/{name}")["metadata"]["uid"] != record["metadata"]["uid"]
    assert cli.main(["teardown", *kube]) == 0
    assert raw.gone(f"{TJ_PATH}/{name}")


def test_a_sigtermed_trainjob_step_leaves_its_trainjob_running_for_the_retry(sim, raw: Raw) -> None:
    kube = ["--kubeconfig", sim.kubeconfig_path, "--run-id", "tj-term"]
    assert cli.main(["provision", *kube]) == 0
    name = RunNames.for_run("tj-term").job("job")
    argv = launch_argv(sim, "tj-term", "torch-distributed", code="import time; time.sleep(120)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def running() -> bool:
        phases = [(p.get("status") or {}).get("phase") for p in pods(raw, name)]
        return phases == ["Running", "Running"] or proc.poll() is not None

    wait_for(running, timeout=60, what="the TrainJob's pods Running")
    proc.send_signal(signal.SIGTERM)  # a node drain: the step's pod is deleted gracefully
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    assert f"TrainJob default/{name} is left as it is; the step run again" in err
    assert "deletionTimestamp" not in raw.get(f"{TJ_PATH}/{name}")["metadata"]
    assert [(p.get("status") or {}).get("phase") for p in pods(raw, name)] == ["Running"] * 2
    assert cli.main(["teardown", *kube]) == 0
