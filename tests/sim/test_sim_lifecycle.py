"""Pod fault modes, process cleanup on stop, and ``serve``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import kubernetes
import pytest

from mnnvl.sim import SimCluster
from tests.sim.simkit import wait_for

NS = "default"


def _job(name: str, code: str, restart: str = "Never", backoff: int = 0) -> dict[str, Any]:
    container = {"name": "worker", "image": "sim", "command": ["python3", "-c", code]}
    return {
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": backoff,
            "template": {"spec": {"restartPolicy": restart, "containers": [container]}},
        },
    }


@pytest.fixture(scope="module")
def env() -> Any:
    with SimCluster(nodes=1, local_gpus=[]) as sim:
        api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        yield sim, kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api)


def _state(core: Any, job: str) -> Any:
    pods = core.list_namespaced_pod(NS, label_selector=f"job-name={job}").items
    return (
        pods[0].status.container_statuses[0] if pods and pods[0].status.container_statuses else None
    )


def test_image_pull_backoff_never_runs(env: Any) -> None:
    sim, core, batch = env
    sim.faults.fail_pod("pull", 0, mode="ImagePullBackOff")
    batch.create_namespaced_job(NS, _job("pull", "print('ran')"))
    cs = wait_for(
        lambda: (
            (s := _state(core, "pull"))
            and s.state.waiting
            and s.state.waiting.reason == "ImagePullBackOff"
            and s
        )
    )
    assert not cs.ready
    batch.delete_namespaced_job("pull", NS, propagation_policy="Background")


def test_crash_loop_restarts_with_exit_code(env: Any) -> None:
    sim, core, batch = env
    sim.faults.fail_pod("crash", 0, mode="CrashLoop", exit_code=9)
    # The restarts of an OnFailure pod count against backoffLimit: 6 leaves room for two.
    batch.create_namespaced_job(NS, _job("crash", "print('ran')", restart="OnFailure", backoff=6))
    cs = wait_for(lambda: (s := _state(core, "crash")) and s.restart_count >= 2 and s)
    assert cs.last_state.terminated.exit_code == 9
    batch.delete_namespaced_job("crash", NS, propagation_policy="Background")


def test_stop_kills_running_pod_processes() -> None:
    sim = SimCluster(nodes=1, local_gpus=[]).start()
    api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
    core, batch = kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api)
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    batch.create_namespaced_job(NS, _job("sleeper", code))
    pod = wait_for(
        lambda: [p for p in core.list_namespaced_pod(NS).items if p.status.phase == "Running"]
    )[0]
    pid = int(wait_for(lambda: core.read_namespaced_pod_log(pod.metadata.name, NS).strip()))
    sim.stop()
    sim.stop()  # idempotent
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_serve_prints_kubeconfig_and_json_then_stops_on_sigterm(tmp_path: Any) -> None:
    kc = tmp_path / "kubeconfig"
    code = (
        "from mnnvl.sim import serve; "
        f"serve(nodes=1, gpus_per_node=0, kubeconfig_path={str(kc)!r}, imex_delay_s=0.1)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(kc)
        info = json.loads(proc.stdout.readline())
        assert info["kubeconfig"] == str(kc) and info["nodes"] == 1
        api = kubernetes.config.new_client_from_config(config_file=f"{kc}.admin")
        nodes = kubernetes.client.CoreV1Api(api).list_node().items
        assert [n.metadata.name for n in nodes] == ["sim-node-0"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_pod_deleted_while_waiting_for_imex_releases_the_node(env: Any) -> None:
    sim, core, batch = env
    custom = kubernetes.client.CustomObjectsApi(core.api_client)
    sim.faults.imex_delay_s = 30.0
    body = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "slow"},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "slow-ch"}}},
    }
    custom.create_namespaced_custom_object(
        "resource.nvidia.com", "v1beta1", NS, "computedomains", body
    )
    job = _job("slow", "print('ran')")
    job["spec"]["template"]["spec"]["resourceClaims"] = [
        {"name": "ch", "resourceClaimTemplateName": "slow-ch"}
    ]
    wait_for(lambda: sim.store.find("resourceclaimtemplates", NS, "slow-ch"))
    batch.create_namespaced_job(NS, job)
    label = "resource.nvidia.com/computeDomain"
    wait_for(lambda: label in (core.read_node("sim-node-0").metadata.labels or {}))
    assert _state(core, "slow").state.waiting.reason == "ContainerCreating"
    batch.delete_namespaced_job("slow", NS, propagation_policy="Background")
    wait_for(lambda: label not in (core.read_node("sim-node-0").metadata.labels or {}))
    sim.faults.imex_delay_s = 0.2


def test_cli_sim_up_with_two_cliques_labels_half_the_nodes_each(tmp_path: Any) -> None:
    kc = tmp_path / "kubeconfig"
    cmd = [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "8", "--cliques", "2"]
    err = tmp_path / "sim.err"
    with err.open("w") as stderr:
        proc = subprocess.Popen([*cmd, "--kubeconfig", str(kc)], stderr=stderr)
    try:
        admin = tmp_path / "kubeconfig.admin"
        wait_for(lambda: admin.exists() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, err.read_text()[-2000:]
        api = kubernetes.config.new_client_from_config(config_file=str(admin))
        nodes = kubernetes.client.CoreV1Api(api).list_node().items
        cliques = [n.metadata.labels["nvidia.com/gpu.clique"] for n in nodes]
        assert len(nodes) == 8 and len(set(cliques)) == 2
        assert sorted(cliques.count(c) for c in set(cliques)) == [4, 4]
        assert {c.rsplit(".", 1)[1] for c in cliques} == {"0", "1"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
