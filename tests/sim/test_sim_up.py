"""`mnnvl sim up` as a person uses it: it says how to use it and looks like a real apiserver."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from mnnvl.sim import SimCluster
from mnnvl.sim.cluster import _usage
from mnnvl.sim.core.procs import descendants
from tests.sim.simkit import wait_for


def test_sim_up_prints_how_to_use_it_answers_version_and_stops_on_sigterm(tmp_path: Path):
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "1", "--kubeconfig", str(kc)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        told = []
        for line in proc.stderr:
            told.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(told)
        assert f"export KUBECONFIG={kc}" in text and "Ctrl-C" in text
        api = kubernetes.config.new_client_from_config(config_file=str(kc))
        version = kubernetes.client.VersionApi(api).get_code()  # the typed model needs every field
        assert version.git_version.startswith("v1.") and version.major == "1"
        assert version.go_version and version.platform and version.build_date
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        result = json.loads(out.splitlines()[-1])
        assert result["ok"] is True and result["command"] == "sim up"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sim_up_plays_the_dra_only_gpu_stack_with_host_managed_imex(tmp_path: Path):
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "1", "--gpus-per-node", "4",
         "--gpu-stack", "dra", "--imex-mode", "hostManaged", "--cluster-reader",
         "--kubeconfig", str(kc)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the simulator announces itself there
            if line.startswith("{"):
                served = json.loads(line)
                break
        assert (served["gpu_stack"], served["imex_mode"]) == ("dra", "hostManaged")
        api = kubernetes.config.new_client_from_config(config_file=str(kc))  # the runner
        (node,) = kubernetes.client.CoreV1Api(api).list_node().items  # the cluster reader
        assert "nvidia.com/gpu" not in node.status.allocatable
        raw = kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices"
        )
        devices = {
            s["spec"]["driver"]: [d["name"] for d in s["spec"]["devices"]] for s in raw["items"]
        }
        assert devices == {
            "gpu.nvidia.com": ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
            "compute-domain.nvidia.com": ["channel-0"],  # no daemon device: host-managed
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie no longer does: it holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    return bool(wait_for(lambda: not any(map(_alive, pids)), seconds, "the pods' processes end"))


def _sim_up_with_a_running_pod(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """``mnnvl sim up`` serving, and the pid of a pod process that would sleep for minutes."""
    kc = tmp_path / "kubeconfig"
    cmd = [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "1", "--gpus-per-node", "0"]
    err = tmp_path / "sim.err"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [*cmd, "--kubeconfig", str(kc)], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    admin = tmp_path / "kubeconfig.admin"
    wait_for(lambda: admin.exists() or proc.poll() is not None, timeout=60)
    assert proc.poll() is None, err.read_text()[-2000:]
    api = kubernetes.config.new_client_from_config(config_file=str(admin))
    core, batch = kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api)
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    container = {"name": "main", "image": "sim", "command": ["python3", "-c", code]}
    job = {"metadata": {"name": "sleeper"}, "spec": {"backoffLimit": 0, "template": {"spec": {
        "restartPolicy": "Never", "containers": [container]}}}}  # fmt: skip
    batch.create_namespaced_job("default", job)
    pod = wait_for(lambda: core.list_namespaced_pod("default").items, timeout=30)[0]
    log = wait_for(lambda: _log(core, pod.metadata.name), timeout=30)
    return proc, int(log)


def _log(core: Any, name: str) -> str:
    try:
        return str(core.read_namespaced_pod_log(name, "default")).strip()
    except kubernetes.client.ApiException:
        return ""


def test_sigterm_ends_sim_up_within_seconds_and_its_pods_processes_with_it(tmp_path: Path):
    proc, pid = _sim_up_with_a_running_pod(tmp_path)
    try:
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - start < 10
        assert _gone_within([pid], 2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_simulator_leaves_no_pod_process(tmp_path: Path):
    """SIGKILL runs no handler of the simulator's; its pods' processes go with it all the same,
    as a node's containers go with the node."""
    proc, pid = _sim_up_with_a_running_pod(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=10)
        assert _gone_within([pid], 10)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_ends_mnnvl_run_sim_within_seconds_leaving_no_process(tmp_path: Path):
    cmd = [sys.executable, "-m", "mnnvl", "run", "--sim", "--run-id", "term", "--nodes", "2"]
    cmd += ["--gpus-per-node", "0", "--min-busbw-gbps", "0.001", "--steps", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # training is under way (the step's progress line)
            if "train: step " in line:
                break
        pods = wait_for(lambda: [p for p in descendants(proc.pid) if _alive(p)], timeout=30)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM
        assert time.monotonic() - start < 20
        assert _gone_within(pods, 5)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_simulated_cluster_larger_than_the_machine_is_refused_at_once_naming_the_limit():
    cmd = [sys.executable, "-m", "mnnvl", "run", "--sim", "--nodes", "100000"]
    start = time.monotonic()
    done = subprocess.run(
        [*cmd, "--nodes-per-clique", "10", "--gpus-per-node", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and time.monotonic() - start < 15
    error = json.loads(done.stdout.splitlines()[-1])["error"]
    assert error.startswith("nodes (--nodes): 100000 simulated nodes do not fit this machine")
    assert "MiB available now hold at most" in error


@pytest.mark.parametrize(
    ("gpus_per_node", "local_gpus", "suggested"),
    [(1, ["0", "1"], 1), (2, ["0"], 0), (0, ["0"], 0)],
)
def test_sim_up_suggests_a_run_that_fits_the_gpus_it_was_started_with(
    gpus_per_node: int, local_gpus: list[str], suggested: int
) -> None:
    with SimCluster(nodes=2, gpus_per_node=gpus_per_node, local_gpus=local_gpus) as sim:
        run = next(line for line in _usage(sim).splitlines() if "mnnvl run" in line)
    assert f"--nodes 2 --gpus-per-node {suggested} " in run
    if gpus_per_node == 2:  # nodes that advertise GPUs this machine lacks run CPU workers
        assert "this machine has 1 of the nodes' 4 GPUs" in run


def test_sim_up_with_trainer_serves_trainjobs_and_the_torch_runtime_to_the_runner(tmp_path: Path):
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "1", "--trainer",
         "--kubeconfig", str(kc)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the simulator announces itself there
            if line.startswith("{"):
                break
        api = kubernetes.client.CustomObjectsApi(
            kubernetes.config.new_client_from_config(config_file=str(kc))  # the runner
        )
        runtime = api.get_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "torch-distributed"
        )
        assert runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] == "node"
        found = api.list_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs"
        )
        assert found["items"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
