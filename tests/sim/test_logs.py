"""`mnnvl logs`: the log of a run's worker pod of one node rank, and the errors that say what
to check when there is no such run, rank or namespace (exit 2, before any log is read)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.contract.env import NODE_RANK_BASE
from mnnvl.driver.inspect import node_rank
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec
from mnnvl.sim import SimCluster

SAY = "import os; print('hello from node rank', os.environ['NODE_RANK'])"


@pytest.fixture(scope="module")
def launched() -> Iterator[tuple[SimCluster, str]]:
    """A two-node run whose pods each printed their node rank."""
    domain = DomainSpec(run_id="logs-run", delete_timeout_s=30)
    with SimCluster(nodes=2) as sim:
        steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        workload = WorkloadSpec(run_id=domain.run_id, purpose="job", nodes=2, gpus_per_node=0)
        steps.launch(workload, "", ["python3", "-c", SAY], kubeconfig=sim.kubeconfig_path)
        yield sim, domain.run_id
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)


def test_a_clique_groups_pod_has_its_groups_first_rank_plus_its_index():
    def pod(index: str, base: str | None) -> dict:
        env = [{"name": NODE_RANK_BASE, "value": base}] if base else []
        meta = {"annotations": {"batch.kubernetes.io/job-completion-index": index}}
        return {"metadata": meta, "spec": {"containers": [{"env": env}]}}

    ranks = [node_rank(pod(i, base)) for i, base in (("1", None), ("1", "4"), ("", "4"))]
    assert ranks == [1, 5, None]  # group 0's pod 1; group 1 of 4 nodes, pod 1; not indexed


def _logs(sim: SimCluster, *args: str) -> int:
    return cli.main(["logs", "--kubeconfig", sim.kubeconfig_path, *args])


@pytest.mark.parametrize("follow", [[], ["--follow"]])
def test_logs_prints_the_pod_of_the_rank_asked_for_on_stdout(launched, capsys, follow):
    sim, run_id = launched
    assert _logs(sim, "--run-id", run_id, *follow) == 0
    out, err = capsys.readouterr()
    assert "hello from node rank 0" in out and "node rank 1" not in out
    assert json.loads(err.splitlines()[-1])["rank"] == 0  # stdout is the log alone
    assert _logs(sim, "--run-id", run_id, "--rank", "1", *follow) == 0
    assert "hello from node rank 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--run-id", "no-such-run"], "run 'no-such-run' has no worker pods in namespace"),
        (["--run-id", "logs-run", "--rank", "5"], "its pods have ranks 0, 1: pass one"),
        (["--run-id", "logs-run", "--namespace", "nowhere"], "'nowhere' does not exist"),
    ],
)
def test_logs_of_an_unknown_run_rank_or_namespace_exit_2_saying_what_to_check(
    launched, capsys, args, said
):
    sim, _ = launched
    assert _logs(sim, *args) == 2
    error = json.loads(capsys.readouterr().err.splitlines()[-1])["error"]
    assert said in error, error


def test_status_in_a_namespace_that_does_not_exist_is_bad_input(launched, capsys):
    sim, run_id = launched
    args = ["status", "--run-id", run_id, "--namespace", "nowhere"]
    assert cli.main([*args, "--kubeconfig", sim.kubeconfig_path]) == 2
    error = json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
    assert "'nowhere' does not exist" in error, error


def test_verify_again_with_a_new_threshold_names_measure_again(launched, capsys):
    sim, run_id = launched
    argv = ["verify", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0"]
    argv += ["--kubeconfig", sim.kubeconfig_path, "--min-busbw-gbps"]
    assert cli.main([*argv, "0.001"]) == 0
    assert cli.main([*argv, "0.002"]) == 2
    error = json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
    assert "to measure again with these inputs, `mnnvl verify … --measure-again`" in error, error
    assert cli.main([*argv, "0.002", "--measure-again"]) == 0
