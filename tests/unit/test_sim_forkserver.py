"""A simulated pod that runs one of the product's runtime modules starts as a fork of a server
that has imported torch already, and is the same pod as one started by exec: its environment
and nothing else, its cwd, its log, its exit code, its thread count, its process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnnvl.ports import free_port
from mnnvl.sim.core import forkserver
from mnnvl.sim.core.procs import MARKER_ENV, Container, members
from tests.sim.simkit import wait_for

pytestmark = pytest.mark.slow  # the server imports torch (seconds)

# What the pod reports: whether torch was loaded before its module ran (the proof it was
# forked), then what it sees; then it does what its first argument says.
PROBE = """
import json, os, signal, sys, time
forked = "torch" in sys.modules
import torch
print("SEEN " + json.dumps({
    "forked": forked, "env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv,
    "threads": torch.get_num_threads(), "session": os.getsid(0), "pid": os.getpid(),
    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
}), flush=True)
what = sys.argv[1]
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "raise":
    raise RuntimeError("the probe failed on purpose")
if what == "hang":
    print("HANGING", flush=True)
    time.sleep(600)
print("atexit and buffered output reach the log")
"""


@pytest.fixture(autouse=True)
def fork_server_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server is on unless ``MNNVL_SIM_FORK_SERVER=0``: these tests make sure of it."""
    monkeypatch.setenv(forkserver.SWITCH_ENV, "1")


@pytest.fixture(scope="module")
def probe_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A package of one probe module on PYTHONPATH, forked as the runtime's modules are; the
    server held for the module's tests (as a kubelet holds it)."""
    root = tmp_path_factory.mktemp("probe")
    (root / "simprobe").mkdir()
    (root / "simprobe" / "__init__.py").write_text("")
    (root / "simprobe" / "pod.py").write_text(PROBE)
    packages = forkserver.PACKAGES
    forkserver.PACKAGES = (*packages, "simprobe")
    forkserver.acquire()
    yield root
    forkserver.release()
    forkserver.PACKAGES = packages


def start(root: Path, tmp: Path, *args: str, **env: str) -> tuple[Container, Path]:
    """The probe's pod running ``python -m simprobe.pod args`` (or ``args`` when they start
    with ``-m``)."""
    log = tmp / "pod.log"
    pod_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root), "POD_ONLY": "yes", **env}
    cmd = [sys.executable, *(args if args[0] == "-m" else ("-m", "simprobe.pod", *args))]
    return Container(cmd, pod_env, str(tmp), str(log), f"test/{tmp.name}"), log


def seen(log: Path) -> dict:
    return json.loads(next(x for x in log.read_text().splitlines() if x.startswith("SEEN "))[5:])


def test_a_forked_pod_sees_exactly_its_env_cwd_argv_and_writes_its_log(
    probe_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMULATOR_ONLY", "leak")
    pod, log = start(probe_path, tmp_path, "done", "x y", NCCL_NVLS_ENABLE="0")  # a pinned one
    assert pod.wait() == 0
    got = seen(log)
    assert got["forked"]
    marker = {MARKER_ENV: f"test/{tmp_path.name}", "NCCL_NVLS_ENABLE": "0"}
    want = {"PATH": os.environ["PATH"], "PYTHONPATH": str(probe_path), "POD_ONLY": "yes", **marker}
    assert got["env"] == want
    assert got["cwd"] == str(tmp_path)
    assert got["argv"] == [str(probe_path / "simprobe" / "pod.py"), "done", "x y"]
    assert got["session"] == got["pid"] and got["mask"] == [] and got["sigterm"]
    assert log.read_text().endswith("atexit and buffered output reach the log\n")


@pytest.mark.parametrize(
    ("args", "code"), [(("exit", "0"), 0), (("exit", "3"), 3), (("raise",), 1)]
)
def test_a_forked_pod_exits_with_its_own_code(
    probe_path: Path, tmp_path: Path, args: tuple[str, ...], code: int
) -> None:
    pod, log = start(probe_path, tmp_path, *args)
    assert pod.wait() == code
    assert seen(log)["forked"]
    if args == ("raise",):
        assert "RuntimeError: the probe failed on purpose" in log.read_text()


@pytest.mark.parametrize(("grace_s", "code"), [(None, 137), (30.0, 143)])
def test_a_forked_pod_stopped_by_a_signal_exits_128_plus_it(
    probe_path: Path, tmp_path: Path, grace_s: float | None, code: int
) -> None:
    pod, log = start(probe_path, tmp_path, "hang")
    codes: list[int] = []
    waiter = threading.Thread(target=lambda: codes.append(pod.wait()))
    waiter.start()
    while "HANGING" not in log.read_text():
        assert waiter.is_alive(), log.read_text()
        waiter.join(0.05)
    assert [pid for pid, _ in members(f"test/{tmp_path.name}", {})] == [pod.pid]
    pod.stop(grace_s)  # SIGTERM to its process group, or SIGKILL at once
    waiter.join(10)
    assert codes == [code] and seen(log)["forked"]
    assert members(f"test/{tmp_path.name}", {}) == []


def test_a_forked_pod_can_be_found_and_stopped_as_soon_as_it_has_a_pid(
    probe_path: Path, tmp_path: Path
) -> None:
    # A pod deleted right after its container started: its marker and session are there
    # already, so the stop finds it (it used to run on, left after its pod).
    pod, _ = start(probe_path, tmp_path, "hang")
    codes: list[int] = []
    waiter = threading.Thread(target=lambda: codes.append(pod.wait()))
    try:
        assert [pid for pid, _ in members(f"test/{tmp_path.name}", {})] == [pod.pid]
        assert os.getsid(pod.pid) == pod.pid
    finally:
        waiter.start()
        pod.stop(None)
        waiter.join(10)
    assert codes == [137] and members(f"test/{tmp_path.name}", {}) == []


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_forked_pod_runs_as_many_threads_as_its_omp_num_threads(
    probe_path: Path, tmp_path: Path, threads: str
) -> None:
    pod, log = start(probe_path, tmp_path, "done", OMP_NUM_THREADS=threads)
    assert pod.wait() == 0
    assert seen(log)["forked"] and seen(log)["threads"] == int(threads)


def test_a_forked_launchers_workers_run_one_thread_each_as_torchrun_sets_it(
    probe_path: Path, tmp_path: Path
) -> None:
    launch = ["-m", "mnnvl.runtime.launch", "--nnodes=1", "--nproc-per-node=2", "--node-rank=0"]
    where = ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    # The launcher's own package too, where it is not installed (a checkout on PYTHONPATH).
    path = os.pathsep.join([str(probe_path), str(Path(__file__).resolve().parents[2])])
    pod, log = start(
        probe_path, tmp_path, *launch, *where, "-m", "simprobe.pod", "done", PYTHONPATH=path
    )
    assert pod.wait() == 0, log.read_text()
    workers = [json.loads(x[5:]) for x in log.read_text().splitlines() if x.startswith("SEEN ")]
    assert [w["threads"] for w in workers] == [1, 1]
    assert [w["env"]["OMP_NUM_THREADS"] for w in workers] == ["1", "1"]


def test_the_switch_off_starts_the_pod_by_exec(
    probe_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(forkserver.SWITCH_ENV, "0")
    pod, log = start(probe_path, tmp_path, "exit", "3")
    assert pod.wait() == 3
    assert not seen(log)["forked"]


def test_a_pod_whose_interpreter_settings_differ_from_the_servers_is_execd(
    probe_path: Path, tmp_path: Path
) -> None:
    pod, log = start(probe_path, tmp_path, "done", PYTHONDONTWRITEBYTECODE="1")
    assert pod.wait() == 0
    assert not seen(log)["forked"] and seen(log)["env"]["PYTHONDONTWRITEBYTECODE"] == "1"


# A simulator of one forked pod, with the Guard a kubelet starts: it prints the pod's pid and
# the fork server's, then waits for the pod.
SIMULATOR = """
import os, sys
from mnnvl.sim.core import forkserver
from mnnvl.sim.core.procs import Container, Guard
forkserver.PACKAGES = ("simprobe",)
guard = Guard("killed/")
env = {"PATH": os.environ["PATH"], "PYTHONPATH": sys.argv[1]}
cmd = [sys.executable, "-m", "simprobe.pod", "hang"]
pod = Container(cmd, env, sys.argv[2], sys.argv[2] + "/pod.log", "killed/pod")
print(pod.pid, pod.server.proc.pid, flush=True)
pod.wait()
"""


def test_a_killed_simulator_leaves_neither_its_forked_pods_nor_the_server(
    probe_path: Path, tmp_path: Path
) -> None:
    cmd = [sys.executable, "-c", SIMULATOR, str(probe_path), str(tmp_path)]
    sim = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert sim.stdout is not None
        pod, server = map(int, sim.stdout.readline().split())
        wait_for(lambda: "HANGING" in (tmp_path / "pod.log").read_text(), 30, "the pod")
        sim.kill()  # runs no handler of the simulator's
        sim.wait(10)
        wait_for(lambda: not any(map(_alive, (pod, server))), 10, "the pod and server gone")
    finally:
        if sim.poll() is None:
            sim.kill()


def _alive(pid: int) -> bool:
    """Running (a zombie holds nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
