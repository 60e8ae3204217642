"""`mnnvl status` and `mnnvl logs` of a run whose workload is a TrainJob: its TrainJob and pods
are shown, and a node rank's log is read from the TrainJob's `node` container."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.test_trainjob_standin import schemas, sim

__all__ = ["schemas", "sim"]  # the stand-in's module fixtures, used here too

RUN = "tj-inspect"
SAY = "import os; print('hello from node rank', os.environ['PET_NODE_RANK'])"


@pytest.fixture(scope="module")
def trained(sim: SimCluster) -> Iterator[SimCluster]:
    """A two-node TrainJob run whose pods each printed their node rank, not torn down yet."""
    domain = DomainSpec(run_id=RUN, delete_timeout_s=30)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    workload = from_inputs(
        WorkloadSpec,
        run_id=RUN,
        purpose="job",
        nodes=2,
        gpus_per_node=0,
        clique_affinity=False,
        workload="trainjob",
    )
    steps.launch(workload, "", ["python3", "-c", SAY], kubeconfig=sim.kubeconfig_path)
    yield sim
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)


def test_status_shows_the_runs_trainjob_and_its_pods(trained, capsys):
    assert cli.main(["status", "--kubeconfig", trained.kubeconfig_path, "--run-id", RUN]) == 0
    out, err = capsys.readouterr()
    found = json.loads(out.splitlines()[-1])
    name = RunNames.for_run(RUN).job("job")
    assert found["trainjobs"] == [{"name": name, "conditions": ["Complete"]}]
    assert sorted(p["index"] for p in found["pods"]) == ["0", "1"]
    assert {p["phase"] for p in found["pods"]} == {"Succeeded"}
    assert f"TrainJob {name}: Complete" in err


@pytest.mark.parametrize("follow", [[], ["--follow"]])
def test_logs_reads_a_node_ranks_trainjob_pod(trained, capsys, follow):
    argv = ["logs", "--kubeconfig", trained.kubeconfig_path, "--run-id", RUN, *follow]
    assert cli.main(argv) == 0
    assert "hello from node rank 0" in capsys.readouterr().out
    assert cli.main([*argv, "--rank", "1"]) == 0
    out, err = capsys.readouterr()
    assert "hello from node rank 1" in out and "node rank 0" not in out
    assert json.loads(err.splitlines()[-1])["rank"] == 1
