"""What a pod's process sees of the world: its spec's environment and the image's (with the
host's NCCL settings, its pinned ones winning), nothing else of the simulator's, and cluster DNS
names only for the Services that exist."""

from __future__ import annotations

import json
from typing import Any

import kubernetes
import pytest

from mnnvl.sim import SimCluster
from tests.sim.simkit import NS, wait_for

# Prints what the pod sees: two variables, the NCCL-side ones and how its MASTER_ADDR resolves.
SEES = (
    "import json, os, socket\n"
    "try:\n"
    "    socket.getaddrinfo(os.environ['MASTER_ADDR'], 29500)\n"
    "    resolved = 'ok'\n"
    "except socket.gaierror as e:\n"
    "    resolved = 'gaierror: ' + str(e)\n"
    "print(json.dumps({'probe': os.environ.get('MNNVL_LEAK_PROBE'),\n"
    "    'spec': os.environ.get('FROM_SPEC'), 'master': os.environ['MASTER_ADDR'],\n"
    "    'resolved': resolved, 'nccl': {k: v for k, v in os.environ.items()\n"
    "        if k.startswith(('NCCL_', 'NVSHMEM_', 'TORCH_SYMM_MEM_'))}}))\n"
)


@pytest.fixture(scope="module")
def core(sim: SimCluster) -> Any:
    api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
    return kubernetes.client.CoreV1Api(api)


def run_job(
    sim: SimCluster, core: Any, name: str, spec_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a one-pod Job whose MASTER_ADDR names its pod 0 under Service ``name`` (plus
    ``spec_env``); what it saw."""
    env = [
        {"name": "FROM_SPEC", "value": "from-the-spec"},
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}.{NS}.svc"},
        *({"name": k, "value": v} for k, v in (spec_env or {}).items()),
    ]
    container = {"name": "main", "image": "sim", "command": ["python3", "-c", SEES], "env": env}
    job = {
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }
    api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
    kubernetes.client.BatchV1Api(api).create_namespaced_job(NS, job)

    def done() -> Any:
        pods = core.list_namespaced_pod(NS, label_selector=f"job-name={name}").items
        return pods if pods and pods[0].status.phase in ("Succeeded", "Failed") else None

    pod = wait_for(done, timeout=30, what=f"{name}'s pod")[0]
    log = core.read_namespaced_pod_log(pod.metadata.name, NS, _preload_content=False).data
    return dict(json.loads(log.decode().splitlines()[-1]))


def test_a_pod_sees_its_spec_env_and_nothing_of_the_simulators(
    sim: SimCluster, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNNVL_LEAK_PROBE", "leaked")
    seen = run_job(sim, core, "env-probe")
    assert seen["probe"] is None
    assert seen["spec"] == "from-the-spec"


def test_a_gpu_hosts_pinned_nccl_settings_reach_the_pod_and_no_spec_overrides_them(
    sim: SimCluster, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    host = {**pinned, "NVSHMEM_DISABLE_NVLS": "1", "NCCL_SOCKET_IFNAME": "lo"}
    for name, value in host.items():
        monkeypatch.setenv(name, value)
    spec = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}
    spec.update(NCCL_SOCKET_IFNAME="eth0", NCCL_DEBUG="INFO")
    seen = run_job(sim, core, "nccl-probe", spec)
    # the host's pinned values win; the spec wins for the others, as over an image's ENV
    assert seen["nccl"] == {**host, **pinned, "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}


def test_the_master_address_resolves_only_once_its_service_exists(
    sim: SimCluster, core: Any
) -> None:
    missing = run_job(sim, core, "no-service")
    assert missing["master"] == f"no-service-0.no-service.{NS}.svc"
    assert missing["resolved"].startswith("gaierror")
    headless = {"clusterIP": "None", "selector": {"job-name": "with-service"}}
    core.create_namespaced_service(NS, {"metadata": {"name": "with-service"}, "spec": headless})
    present = run_job(sim, core, "with-service")
    assert present == {**present, "master": "127.0.0.1", "resolved": "ok"}
