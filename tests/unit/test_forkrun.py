"""forkrun's rank arithmetic from the Job's environment, and its command line."""

from __future__ import annotations

import pytest

from mnnvl.runtime.forkrun import parse, worker_env


def test_ranks_follow_the_node_index_of_an_indexed_job() -> None:
    job = {
        "NNODES": "3",
        "JOB_COMPLETION_INDEX": "2",
        "MASTER_ADDR": "run-0.svc",
        "MASTER_PORT": "29500",
    }
    env = worker_env(1, 4, job)
    assert env["RANK"] == "9" and env["WORLD_SIZE"] == "12"
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "2"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("run-0.svc", "29500")


def test_a_single_node_without_job_variables_is_rank_zero_based() -> None:
    env = worker_env(0, 2, {"MASTER_PORT": "1234"})
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "2", "127.0.0.1")


def test_module_arguments_are_passed_through_untouched() -> None:
    ns = parse(["--nproc-per-node", "2", "-m", "mnnvl.runtime.verify", "--max-bytes", "1G", "-m"])
    assert ns.nproc_per_node == 2 and ns.module == "mnnvl.runtime.verify"
    assert ns.args == ["--max-bytes", "1G", "-m"]


def test_a_missing_module_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        parse(["--nproc-per-node", "2"])
    assert info.value.code == 2
