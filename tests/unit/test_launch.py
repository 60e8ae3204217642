"""The worker pod's entry with real processes: the workers' environment, stopping them on a
failure or on SIGTERM, exit codes, and a parent that never initialises CUDA (CPU)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mnnvl.runtime.launch import parse, with_node_rank, worker_env

ENV_NAMES = ",".join(
    ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
     "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
     "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"]
)  # fmt: skip

# Each worker writes its pid to pid<rank>; what it does next depends on its rank and argv.
WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    rank, out, mode = int(os.environ["RANK"]), sys.argv[1], sys.argv[2]
    if mode == "stubborn" and rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(out, f"pid{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out, f"pid{rank}.tmp"), os.path.join(out, f"pid{rank}"))
    if mode in ("crash", "stubborn") and rank == 1:
        while not os.path.exists(os.path.join(out, "pid0")):
            time.sleep(0.05)
        sys.exit(3)
    if mode == "raise" and rank == 1:
        raise RuntimeError("boom in rank 1")
    if mode == "stall" and rank == 1:
        from mnnvl.runtime.progress import report
        report("step 3", 2.0)
        os.kill(os.getpid(), signal.SIGSTOP)  # what a hung GPU looks like from outside
    if mode != "raise":
        time.sleep(300)
    """
)


def start(tmp_path, mode: str, *opts: str) -> subprocess.Popen[str]:
    """``sleep``: both workers sleep; ``crash``: rank 1 exits 3 once rank 0 runs;
    ``stubborn``: the same with rank 0 ignoring SIGTERM; ``raise``: rank 1 raises;
    ``stall``: rank 1 reports step 3 with a 2 s stall timeout, then stops itself."""
    (tmp_path / "sleepy_worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", "mnnvl.runtime.launch", "--nproc-per-node=2", *opts]
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        [*cmd, "-m", "sleepy_worker", str(tmp_path), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker_pids(tmp_path, deadline_s: float = 120.0) -> list[int]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        files = [tmp_path / f"pid{r}" for r in (0, 1)]
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.1)
    raise AssertionError("the workers never started")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the launcher hung: {err[-2000:]}") from None
    return proc.returncode, err


def test_sigterm_to_the_pod_stops_every_worker_and_exits_143(tmp_path):
    proc = start(tmp_path, "sleep")
    pids = worker_pids(tmp_path)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143, err[-2000:]
    assert not any(alive(p) for p in pids)
    assert "stopped by SIGTERM" in err


def test_a_crashed_worker_stops_its_sleeping_peer_and_its_code_wins(tmp_path):
    proc = start(tmp_path, "crash")
    pids = worker_pids(tmp_path)
    code, err = finish(proc)
    assert code == 3, err[-2000:]
    assert "rank 0: exit 143, rank 1: exit 3" in err  # the peer was stopped, not the cause
    assert not any(alive(p) for p in pids)


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    proc = start(tmp_path, "stubborn", "--grace-s=1")
    code, err = finish(proc)
    assert code == 3, err[-2000:]
    assert "rank 0: exit 137" in err


def test_an_uncaught_exception_in_a_worker_is_exit_1_with_its_traceback(tmp_path):
    code, err = finish(start(tmp_path, "raise"))
    assert code == 1
    assert "RuntimeError: boom in rank 1" in err and "rank 1: exit 1" in err


def test_a_stopped_worker_is_stalled_and_the_node_exits_12_naming_its_last_progress(tmp_path):
    # A grace period longer than the wait: the stopped worker must take SIGTERM at once.
    proc = start(tmp_path, "stall", "--grace-s=90")
    pids = worker_pids(tmp_path)
    code, err = finish(proc, timeout=60)
    assert code == 12, err[-2000:]
    assert "rank 1 made no progress for" in err and "last progress: step 3" in err
    assert "its process is stopped (SIGSTOP)" in err  # the hang itself, not a waiting peer
    assert not any(alive(p) for p in pids)


PARENT = textwrap.dedent(
    """
    import json, sys
    import torch
    touched = []
    real = torch.cuda._lazy_init
    torch.cuda._lazy_init = lambda: (touched.append(1), real())[1]
    from mnnvl.runtime.launch import main
    code = main(sys.argv[1:])
    print(json.dumps({"code": code, "touched": len(touched),
                      "initialized": torch.cuda.is_initialized()}))
    """
)
ENV_WORKER = textwrap.dedent(
    """
    import json, os, sys, torch
    names = sys.argv[2].split(",")
    seen = {n: os.environ.get(n) for n in names}
    seen["cuda_initialized"] = torch.cuda.is_initialized()
    with open(os.path.join(sys.argv[1], f"env{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
    """
)


def test_workers_get_torchruns_variables_and_the_parent_never_initialises_cuda(tmp_path):
    (tmp_path / "env_worker.py").write_text(ENV_WORKER)
    opts = ["--nnodes=2", "--node-rank=1", "--nproc-per-node=2", "--master-addr=pod-0.svc"]
    worker = ["-m", "env_worker", str(tmp_path), ENV_NAMES]
    done = subprocess.run(
        [sys.executable, "-c", PARENT, *opts, "--master-port=29511", *worker],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    parent = json.loads(done.stdout.splitlines()[-1])
    assert parent == {"code": 0, "touched": 0, "initialized": False}
    envs = [json.loads((tmp_path / f"env{r}.json").read_text()) for r in (2, 3)]
    for local, env in enumerate(envs):
        assert env["RANK"] == str(2 + local) and env["LOCAL_RANK"] == str(local)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("4", "2")
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("pod-0.svc", "29511")
        # rank 0's init_process_group hosts the store: there is no agent store to join
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_RUN_ID"]
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["OMP_NUM_THREADS"] == "1"
        assert env["cuda_initialized"] is False


def test_ranks_follow_the_node_rank_of_an_indexed_job() -> None:
    ns = parse(["--nnodes=3", "--nproc-per-node=4", "--node-rank=2", "--master-addr=run-0.svc",
                "--master-port=29500", "-m", "mnnvl.runtime.verify"])  # fmt: skip
    env = worker_env(1, ns)
    assert env["RANK"] == "9" and env["WORLD_SIZE"] == "12"
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "2"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("run-0.svc", "29500")


def test_a_clique_groups_pod_gets_its_node_rank_from_the_group_base() -> None:
    argv = with_node_rank(["--nnodes=4", "-m", "x"], {"MNNVL_NODE_RANK_BASE": "2",
                                                      "JOB_COMPLETION_INDEX": "1"})  # fmt: skip
    assert worker_env(0, parse(argv))["RANK"] == "3"


def test_a_clique_groups_node_rank_is_kept_when_the_modules_own_arguments_look_alike() -> None:
    group = {"MNNVL_NODE_RANK_BASE": "2", "JOB_COMPLETION_INDEX": "1"}
    argv = with_node_rank(["--nnodes=4", "-m", "x", "--node-rank-file", "/tmp/r"], group)
    ns = parse(argv)
    assert ns.node_rank == 3 and ns.args == ["--node-rank-file", "/tmp/r"]
    given = with_node_rank(["--nnodes=4", "--node-rank", "0", "-m", "x"], group)
    assert parse(given).node_rank == 0  # the launcher's own option wins


def test_module_arguments_are_passed_through_untouched() -> None:
    ns = parse(["--nproc-per-node", "2", "-m", "mnnvl.runtime.verify", "--max-bytes", "1G", "-m"])
    assert ns.nproc_per_node == 2 and ns.module == "mnnvl.runtime.verify"
    assert ns.args == ["--max-bytes", "1G", "-m"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--nproc-per-node", "2"],  # no module
        ["--nnodes=2", "--node-rank=2", "-m", "x"],  # node rank out of range
        ["--rdzv-backend=c10d", "-m", "x"],  # elastic options are not taken
    ],
)
def test_bad_launcher_options_are_a_usage_error_before_any_worker_starts(argv) -> None:
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
