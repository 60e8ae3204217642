"""What a fault cost, as a person sees it: a worker killed mid-training shows in the run's
summary and in the train report (Markdown and HTML) with what failed, the seconds it cost and
the steps done again, and the run's goodput is below 1."""

from __future__ import annotations

import html
import json
import re
import uuid
from pathlib import Path

import pytest

from mnnvl.cli import main as cli
from mnnvl.inputs.names import RunNames
from mnnvl.sim import SimCluster
from tests.sim.simkit import create_claim

SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)
CLAIM = "fc-ckpt"


@pytest.mark.slow
def test_a_killed_worker_shows_in_the_summary_and_the_train_report_with_its_cost(
    sim: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create_claim(sim, CLAIM)
    run_id = f"fc-{uuid.uuid4().hex[:8]}"
    argv = ["run", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0", "--skip-verify"]
    argv += ["--steps", "40", "--log-every", "5", "--checkpoint-every", "10"]
    argv += ["--checkpoint-dir", f"/ckpt/{run_id}", "--pvc", f"{CLAIM}:/ckpt"]
    # Rank 1 kills itself after step 15, once (the worker's test hook); the workers restart
    # in place from the checkpoint of step 10. A short collective timeout only speeds the
    # survivor up.
    argv += ["--env", "MNNVL_TEST_SIGNAL_AT=15:1:SIGKILL", "--collective-timeout-s", "10"]
    argv += ["--report-dir", str(tmp_path), "--kubeconfig", sim.kubeconfig_path]
    assert cli.main(argv) == 0
    said = capsys.readouterr()
    result = json.loads(said.out.splitlines()[-1])["train"]
    assert result["restarts"] == 1 and len(result["faults"]) == 1
    assert 0 < result["goodput"] < 1

    # The summary names the restart and what it cost, and the goodput.
    summary = said.err[said.err.index(f"run {run_id} summary:") :]
    restart = re.search(r"restart 1 at .*: .*pod (\S+) .*exit code 137.*", summary)
    assert restart, summary
    assert restart.group(1).startswith(RunNames.for_run(run_id).job("train") + "-1-")
    assert re.search(r"first resumed step after \d+\.\d s; steps redone: \d+", restart.group(0))
    assert re.search(
        r"goodput \d+% of the train step's wall time; 1 restart \(1 in place\), steps redone: \d+",
        summary,
    )

    # The train report: Markdown and a real HTML table, the same row in both.
    markdown = (tmp_path / "train" / "train.md").read_text()
    row = next(ln for ln in markdown.splitlines() if ln.startswith("| 1 |"))
    assert "| 137 |" in row and re.search(r"\| \d+\.\d \| \d+ \|$", row), row
    assert "goodput" in markdown and "1 restart" in markdown
    page = (tmp_path / "train" / "train.html").read_text()
    assert "<th>first resumed step after s</th>" in page and "<td>137</td>" in page
    assert html.escape(restart.group(1)) in page and "**" not in page
