"""A simulated pod's /dev/shm is its own: a file a pod writes under /dev/shm lands in a
directory no other pod sees, sized by the memory emptyDir mounted there, and it goes when
the pod is deleted, as a cluster removes a pod's emptyDir."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from mnnvl.contract import env as contract_env
from mnnvl.sim import SimCluster
from tests.sim.simkit import NS, wait_for

# Writes /dev/shm/probe (the path as the pod names it) and prints what its /dev/shm is.
WRITES = (
    "import json, os, sys\n"
    "open(sys.argv[1], 'w').write(os.environ['JOB_COMPLETION_INDEX'])\n"
    f"print(json.dumps([os.environ['{contract_env.SHM_DIR}'], "
    f"os.environ['{contract_env.SHM_SIZE}']]))\n"
)


@pytest.mark.slow
def test_two_pods_write_dev_shm_each_in_its_own_which_goes_with_the_pod(sim: SimCluster) -> None:
    api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
    core = kubernetes.client.CoreV1Api(api)
    container = {
        "name": "main",
        "image": "sim",
        "command": ["python3", "-c", WRITES, "/dev/shm/probe"],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}
    pod_spec = {"restartPolicy": "Never", "containers": [container], "volumes": [shm]}
    job = {
        "metadata": {"name": "shm-probe"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {"spec": pod_spec},
        },
    }
    kubernetes.client.BatchV1Api(api).create_namespaced_job(NS, job)

    def done() -> Any:
        pods = core.list_namespaced_pod(NS, label_selector="job-name=shm-probe").items
        ended = [p for p in pods if p.status.phase in ("Succeeded", "Failed")]
        return pods if len(ended) == 2 else None

    pods = wait_for(done, timeout=60, what="shm-probe's two pods")
    seen = {}
    for pod in pods:
        log = core.read_namespaced_pod_log(pod.metadata.name, NS, _preload_content=False).data
        seen[pod.metadata.name] = json.loads(log.decode().splitlines()[-1])
    (a, a_size), (b, b_size) = seen.values()
    assert a != b and a_size == b_size == str(8 * 2**20)
    wrote = sorted((Path(d) / "probe").read_text() for d in (a, b))
    assert wrote == ["0", "1"]  # each pod's file in its own /dev/shm, none overwritten
    for pod in pods:
        core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
    wait_for(
        lambda: not os.path.exists(a) and not os.path.exists(b), what="the pods' /dev/shm gone"
    )
