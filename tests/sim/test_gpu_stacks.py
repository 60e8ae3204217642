"""Runs with the default ``--gpu-mode auto`` on both GPU stacks the simulator plays.

``dra``: GPUs come only from the DRA driver (GPU Operator GPUCluster, EKS Auto Mode): no node
has ``nvidia.com/gpu``, the ``gpu.nvidia.com`` DeviceClass maps no extended resource, and each
node's GPUs are ResourceSlice devices. ``device-plugin``: ``nvidia.com/gpu`` allocatable and a
DeviceClass that maps it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.contract.rbac import CLUSTER_READER
from mnnvl.driver.gpus import GPU_MODE_ANNOTATION
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw, assert_nothing_left

SIM = dict(nodes=2, gpus_per_node=4, gpu_stack="dra")
DONE = ["python3", "-c", "import time; time.sleep(0.5); print('RESULT {\"ok\": true}')"]


@contextmanager
def _run(sim: SimCluster, **workload: Any) -> Iterator[WorkloadSpec]:
    run_id = f"gs-{uuid.uuid4().hex[:10]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    spec = from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="job",
        nodes=2,
        gpus_per_node=4,
        pods_running_timeout_s=60,
        job_timeout_s=60,
        **workload,
    )
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    try:
        yield spec
    finally:
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
        assert_nothing_left(sim, RunNames.for_run(run_id).selector)


def _launch_seeing_gpus(sim: SimCluster, workload: WorkloadSpec) -> dict[str, list[str]]:
    """Launch ``DONE``; return node -> the GPU devices its claims held while the pods ran
    (released when they end)."""
    seen: dict[str, list[str]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            for claim in sim.store.list("resourceclaims")[0]:
                alloc = (claim.get("status") or {}).get("allocation") or {}
                results = alloc.get("devices", {}).get("results") or []
                gpus = sorted(r["device"] for r in results if r["driver"] == "gpu.nvidia.com")
                if gpus:
                    seen[results[0]["pool"]] = gpus

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        launched = steps.launch(workload, "", DONE, kubeconfig=sim.kubeconfig_path)
    finally:
        done.set()
        watcher.join()
    assert launched.result == {"ok": True}
    return seen


def test_default_gpu_mode_on_dra_only_gpus_fails_in_the_grace_naming_gpu_mode_claim(sim):
    # Only the namespaced Role: nothing says where the GPUs come from, so auto asks for limits.
    with _run(sim, unschedulable_grace_s=1) as workload:
        started = time.monotonic()
        with pytest.raises(WorkloadFailed) as info:
            steps.launch(workload, "", DONE, kubeconfig=sim.kubeconfig_path)
        took = time.monotonic() - started
    message = str(info.value)
    assert "\n" not in message
    # The scheduler's reason first, then what it means here.
    assert message.index("Insufficient nvidia.com/gpu") < message.index("no node has a free")
    assert (
        "no node has a free nvidia.com/gpu: on a cluster without GPUs pass --gpus-per-node 0"
        in (message)
    )
    assert "run with --gpu-mode claim" in message and "Insufficient nvidia.com/gpu" in message
    assert took < 15, f"failed after {took:.1f} s, not within the grace"


def test_gpu_mode_claim_on_dra_only_gpus_gets_devices_per_node(sim):
    with _run(sim, gpu_mode="claim") as workload:
        assert _launch_seeing_gpus(sim, workload) == {
            f"sim-node-{i}": ["gpu-0", "gpu-1", "gpu-2", "gpu-3"] for i in range(2)
        }


@pytest.mark.slow
def test_default_gpu_mode_with_the_cluster_reader_chooses_claim_on_dra_only_gpus(caplog):
    caplog.set_level("INFO", logger="mnnvl")
    cluster = SimCluster(nodes=2, gpus_per_node=4, gpu_stack="dra", cluster_reader=True)
    with cluster, _run(cluster) as workload:
        assert sorted(_launch_seeing_gpus(cluster, workload)) == ["sim-node-0", "sim-node-1"]
        pod = cluster.store.list("pods")[0][0]
        assert "limits" not in pod["spec"]["containers"][0]["resources"]
    assert any(
        m.startswith("--gpu-mode auto: claim (no node offers nvidia.com/gpu and DeviceClass")
        for m in caplog.messages
    )


@pytest.mark.slow
def test_default_gpu_mode_with_the_cluster_reader_keeps_limits_beside_the_device_plugin():
    cluster = SimCluster(nodes=2, gpus_per_node=4, cluster_reader=True)
    with cluster, _run(cluster) as workload:
        assert _launch_seeing_gpus(cluster, workload) == {}
        pod = cluster.store.list("pods")[0][0]
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
        template = RunNames.for_run(workload.run_id).gpu_template
        assert cluster.store.find("resourceclaimtemplates", "default", template) is None


@pytest.mark.slow
def test_default_gpu_mode_decided_once_a_rerun_adopts_its_job_after_the_reader_was_unbound():
    """``auto`` chose claim with the cluster reader; unbound, it would choose limits. The
    rerun takes the decision recorded on its Job and adopts it (not "a different spec")."""
    cluster = SimCluster(nodes=2, gpus_per_node=4, gpu_stack="dra", cluster_reader=True)
    with cluster, _run(cluster) as workload:
        first = steps.launch(workload, "", DONE, kubeconfig=cluster.kubeconfig_path)
        job = RunNames.for_run(workload.run_id).job("job")
        created = cluster.store.find("jobs", "default", job)
        assert created is not None
        assert created["metadata"]["annotations"][GPU_MODE_ANNOTATION] == "claim"
        path = f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{CLUSTER_READER}"
        Raw(cluster).call("DELETE", path)

        again = steps.launch(workload, "", DONE, kubeconfig=cluster.kubeconfig_path)
        assert again.result == first.result == {"ok": True}
        assert again.adopted.startswith("complete since")
        assert (
            cluster.store.find("jobs", "default", job)["metadata"]["uid"]
            == created["metadata"]["uid"]
        )
