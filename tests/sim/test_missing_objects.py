"""Objects a pod refers to that do not exist: the simulator answers as a v1.36 cluster does
(ServiceAccount admission refuses the pod, the scheduler leaves it Unschedulable on a missing
claim, the kubelet holds it in CreateContainerConfigError on a missing Secret or ConfigMap),
and the steps fail at once with exit 4, naming the missing object and the fix."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client, config

from mnnvl.cli import main as cli
from mnnvl.driver import Api
from mnnvl.driver.lifecycle import wait_for_job
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.sim import SimCluster
from tests.sim.simkit import wait_for

RUN = ["--gpus-per-node", "0", "--skip-verify", "--steps", "2", "--warmup-steps", "1"]


SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)


@pytest.fixture
def core(sim: SimCluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=sim.admin_kubeconfig_path))


def pod(name: str, spec: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    body = {"name": "worker", "image": "busybox", "command": ["sleep", "30"], **container}
    return {"metadata": {"name": name}, "spec": {"containers": [body], **(spec or {})}}


def wait_pod(core: client.CoreV1Api, name: str, done: Any, timeout_s: float = 10) -> Any:
    def there() -> Any:
        found = core.read_namespaced_pod(name, "default")
        return found if done(found) else None

    return wait_for(there, timeout=timeout_s, what=f"pod {name} to get there")


def run(sim: SimCluster, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = cli.main(["run", "--nodes", "2", *RUN, *argv, "--kubeconfig", sim.kubeconfig_path])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    result["code"] = code
    return result


# ---- the simulator ------------------------------------------------------------------------


def test_every_namespace_has_a_default_service_account_and_pods_get_it(sim, core):
    core.create_namespace({"metadata": {"name": "fresh"}})
    assert core.read_namespaced_service_account("default", "fresh").metadata.name == "default"
    created = core.create_namespaced_pod("fresh", pod("plain"))
    assert created.spec.service_account_name == "default"
    core.delete_namespaced_pod("plain", "fresh", grace_period_seconds=0)


def test_a_pod_naming_a_missing_service_account_is_refused_by_admission(sim, core):
    with pytest.raises(client.ApiException) as info:
        core.create_namespaced_pod("default", pod("sa", {"serviceAccountName": "trainer"}))
    assert info.value.status == 403
    assert json.loads(info.value.body)["message"] == (
        'pods "sa" is forbidden: error looking up service account default/trainer: '
        'serviceaccount "trainer" not found'
    )
    core.create_namespaced_service_account("default", {"metadata": {"name": "trainer"}})
    core.create_namespaced_pod("default", pod("sa", {"serviceAccountName": "trainer"}))
    core.delete_namespaced_pod("sa", "default", grace_period_seconds=0)


def test_a_pod_on_a_missing_claim_is_unschedulable_until_the_claim_exists(sim, core):
    volume = {"name": "d", "persistentVolumeClaim": {"claimName": "later"}}
    core.create_namespaced_pod("default", pod("pvc", {"volumes": [volume]}))

    def unschedulable(p: Any) -> bool:
        return any(c.reason == "Unschedulable" for c in p.status.conditions or [])

    found = wait_pod(core, "pvc", unschedulable)
    message = next(c.message for c in found.status.conditions if c.reason == "Unschedulable")
    assert message.startswith('0/2 nodes are available: persistentvolumeclaim "later" not found.')
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    core.create_namespaced_persistent_volume_claim(
        "default", {"metadata": {"name": "later"}, "spec": spec}
    )
    wait_pod(core, "pvc", lambda p: p.spec.node_name)
    core.delete_namespaced_pod("pvc", "default", grace_period_seconds=0)


def test_a_missing_secret_in_the_env_holds_the_container_until_it_is_created(sim, core):
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "t"}}}]
    core.create_namespaced_pod("default", pod("env", env=env))

    def config_error(p: Any) -> bool:
        statuses = p.status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return bool(waiting and waiting.reason == "CreateContainerConfigError")

    found = wait_pod(core, "env", config_error)
    assert found.status.container_statuses[0].state.waiting.message == 'secret "creds" not found'
    core.create_namespaced_secret("default", {"metadata": {"name": "creds"}, "data": {}})
    wait_pod(core, "env", lambda p: p.status.phase == "Running")
    core.delete_namespaced_pod("env", "default", grace_period_seconds=0)


# ---- the steps fail at once, naming the object and the fix ------------------------------------


def test_a_missing_service_account_fails_the_run_at_once_naming_it(sim, capsys):
    started = time.monotonic()
    result = run(sim, capsys, "--run-id", "no-sa", "--worker-service-account", "ghost")
    assert result["code"] == 4, result
    assert time.monotonic() - started < 45  # not the unschedulable grace nor a timeout
    assert 'serviceaccount "ghost" not found' in result["error"]
    assert "create that service account in namespace default" in result["error"]
    assert sim.objects(RunNames.for_run("no-sa").selector) == []


def test_a_missing_claim_fails_the_run_at_once_naming_it(sim, capsys):
    started = time.monotonic()
    result = run(sim, capsys, "--run-id", "no-pvc", "--pvc", "ghost-data:/data")
    assert result["code"] == 4, result
    assert time.monotonic() - started < 45
    assert 'persistentvolumeclaim "ghost-data" not found' in result["error"]
    assert "create that PersistentVolumeClaim in namespace default" in result["error"]
    assert sim.objects(RunNames.for_run("no-pvc").selector) == []


def test_a_missing_config_map_fails_the_wait_at_once_naming_it(sim):
    batch = client.BatchV1Api(config.new_client_from_config(config_file=sim.admin_kubeconfig_path))
    env = [{"name": "C", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "c"}}}]
    template = pod("x", env=env)
    template["spec"]["restartPolicy"] = "Never"
    job = {
        "metadata": {"name": "cm-job"},
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "completionMode": "Indexed",
            "template": {"spec": template["spec"]},
        },
    }
    batch.create_namespaced_job("default", job)
    workload = WorkloadSpec(run_id="cm", nodes=1, gpus_per_node=0)
    started = time.monotonic()
    try:
        with Api.connect(sim.kubeconfig_path) as api, pytest.raises(WorkloadFailed) as info:
            wait_for_job(api, workload, "cm-job")
    finally:
        batch.delete_namespaced_job("cm-job", "default", propagation_policy="Background")
    assert time.monotonic() - started < 30
    assert info.value.exit_code == 4
    assert 'configmap "settings" not found' in str(info.value)
    assert "create the Secret or ConfigMap the message names in namespace default" in str(
        info.value
    )
