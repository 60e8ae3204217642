"""``make run`` ends with the summary ``mnnvl run`` logs: a line per task in run order, each
restart with what it cost, the goodput, then where the reports are and whether anything is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnnvl.pipelines import local_run

FAULT = {"n": 1, "at": "step 15", "how": "in-place", "pod": "train-1-x", "exit_code": 137}
FAULT |= {"detect_s": 1.5, "restart_s": 3.0, "recovery_s": 9.5, "steps_lost": 5}
VERIFY = {"verdict": "PASS", "threshold_gbps": 1.0, "judged_busbw_gbps": 2.0}


def test_make_runs_summary_names_each_restart_its_cost_and_the_goodput_in_run_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    train = {"steps": 40, "final_loss": 4.9, "tokens_per_s": 2000.0, "goodput": 0.61}
    results = {  # as kfp.local's run directory lists them: by task folder name
        "train": train | {"faults": [FAULT]},
        "verify-post": VERIFY | {"peak_busbw_gbps": 2.5},
        "verify-pre": VERIFY | {"peak_busbw_gbps": 2.4},
    }
    outcome = local_run.RunOutcome(True, "", 60.0, tmp_path, results)

    local_run._summary(outcome, ["Job default/x"], [], tmp_path / "kfp-local.log", "mnnvl-training")

    out = capsys.readouterr().out
    summary = out[out.index("\nSummary:\n") :].splitlines()[2:6]
    assert [line.split()[0] for line in summary] == [
        "verify-pre",
        "train",
        "restart",
        "verify-post",
    ]
    assert "40 steps, loss 4.9000, 2000 tokens/s; goodput 61% of the train step's wall time" in out
    assert "1 restart (1 in place), steps redone: 5" in summary[1]
    assert "restart 1 at step 15: in-place pod train-1-x" in summary[2]
    assert "exit code 137" in summary[2] and "steps redone: 5" in summary[2]
    assert out.rstrip().endswith("nothing of the run is left: no object, no process of its pods.")


def test_a_task_that_failed_once_and_succeeded_on_its_retry_is_no_error_of_the_run(
    tmp_path: Path,
) -> None:
    tap = local_run.KfpLogTap(
        (tmp_path / "log").open("w"), echo=None, start=0.0, pipeline="mnnvl-training"
    )
    for line in (
        "Executing task 'provision-training'",
        "[ERROR]: provision failed: the API server is restarting",
        "Task 'provision-training' finished with status FAILURE",
        "Executing task 'provision-training'",
        "Task 'provision-training' finished with status SUCCESS",
        "Executing task 'train-sharded'",
        "[ERROR]: train failed: pod x exit 3",
        "Task 'train-sharded' finished with status FAILURE",
    ):
        tap.write(line + "\n")
    assert tap.task_errors == {"train": "pod x exit 3"}
