"""Pods the API refuses to create: the simulator refuses them as a real kube-apiserver does
(PodSecurity, a validating webhook, ResourceQuota), the Job controller records a FailedCreate
Event and retries, and the steps report the API's own reason (exit 4) instead of waiting.
Our own pods pass the restricted Pod Security Standard by default."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from kubernetes import client, config

from mnnvl.cli import main as cli
from mnnvl.driver import wait
from mnnvl.inputs.names import RunNames
from mnnvl.sim import SimCluster
from tests.sim.simkit import wait_for

RESTRICTED, BASELINE, QUOTA = "strict", "base", "quota"
ENFORCE = "pod-security.kubernetes.io/enforce"
RUN = ["--gpus-per-node", "0", "--skip-verify", "--steps", "2", "--warmup-steps", "1"]


SIM = dict(nodes=2, local_gpus=[], namespaces=("default", RESTRICTED, BASELINE))


@pytest.fixture(scope="module")
def sim(sim: SimCluster) -> SimCluster:
    """The module's cluster (conftest) with its namespaces' Pod Security levels."""
    config.load_kube_config(sim.admin_kubeconfig_path)
    core = client.CoreV1Api()
    for ns, level in ((RESTRICTED, "restricted"), (BASELINE, "baseline")):
        core.patch_namespace(ns, {"metadata": {"labels": {ENFORCE: level}}})
    return sim


@pytest.fixture
def core(sim: SimCluster) -> client.CoreV1Api:
    config.load_kube_config(sim.admin_kubeconfig_path)
    return client.CoreV1Api()


def refusal(core: client.CoreV1Api, ns: str, pod: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as info:
        core.create_namespaced_pod(ns, pod)
    return info.value.status, json.loads(info.value.body)["message"]


def pod(name: str, spec: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    body = {"name": "worker", "image": "busybox", "command": ["true"], **container}
    return {"metadata": {"name": name}, "spec": {"containers": [body], **(spec or {})}}


def run(
    sim: SimCluster, capsys: pytest.CaptureFixture[str], run_id: str, ns: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    """``mnnvl run`` (train, then teardown) and its JSON result."""
    argv = ["run", "--run-id", run_id, "--namespace", ns, "--nodes", "2", *RUN, *extra]
    code = cli.main([*argv, "--kubeconfig", sim.kubeconfig_path])
    return code, json.loads(capsys.readouterr().out.splitlines()[-1])


# ---- the simulator refuses as kube-apiserver does ---------------------------------------------


def test_restricted_namespace_refuses_a_root_pod_with_pod_security_admissions_message(core):
    code, message = refusal(
        core,
        RESTRICTED,
        pod(
            "root",
            {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
            securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        ),
    )
    assert code == 403
    assert message == (
        'pods "root" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true '
        '(pod or container "worker" must set securityContext.runAsNonRoot=true)'
    )


def test_baseline_namespace_refuses_host_access_but_admits_root(core):
    code, message = refusal(
        core,
        BASELINE,
        pod(
            "host",
            {"hostNetwork": True, "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]},
            securityContext={"privileged": True},
        ),
    )
    assert code == 403
    assert message == (
        'pods "host" is forbidden: violates PodSecurity "baseline:latest": host namespaces '
        '(hostNetwork=true), hostPath volumes (volume "dev"), privileged (container "worker" '
        "must not set securityContext.privileged=true)"
    )
    core.create_namespaced_pod(BASELINE, pod("root-ok"))
    core.delete_namespaced_pod("root-ok", BASELINE)


def test_webhook_denial_answers_a_client_with_the_webhooks_message(sim, core):
    sim.admission.deny("policy.example.com", "pods need a team label")
    try:
        code, message = refusal(core, "default", pod("denied"))
    finally:
        sim.admission.clear_denials()
    assert code == 403
    assert message == (
        'admission webhook "policy.example.com" denied the request: pods need a team label'
    )


def test_quota_refusal_is_a_failed_create_event_and_the_job_controller_retries(
    sim, core, eventually
):
    ns = "default"
    core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "q1"}, "spec": {"hard": {"pods": "1"}}}
    )
    batch = client.BatchV1Api()
    template = {"spec": {"restartPolicy": "Never", "containers": pod("x")["spec"]["containers"]}}
    template["spec"]["containers"][0]["command"] = ["sleep", "2"]
    job = {
        "metadata": {"name": "two"},
        "spec": {"completions": 2, "parallelism": 2, "template": template},
    }
    try:
        batch.create_namespaced_job(ns, job)
        refused = _wait_for_event(core, ns, "two", "FailedCreate")
        assert refused.type == "Warning"
        assert refused.message.startswith('Error creating: pods "two-')
        assert refused.message.endswith(
            '" is forbidden: exceeded quota: q1, requested: pods=1, used: pods=1, limited: pods=1'
        )
        # The first pod ends, its quota frees, and a retry creates the second one.
        created = lambda: [  # noqa: E731
            e
            for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=two").items
            if e.reason == "SuccessfulCreate"
        ]
        eventually(lambda: len(created()) >= 2, what="the second pod created")
        assert len(created()) == 2
    finally:
        batch.delete_namespaced_job("two", ns, propagation_policy="Background")
        core.delete_namespaced_resource_quota("q1", ns)


def _wait_for_event(core: client.CoreV1Api, ns: str, job: str, reason: str) -> Any:
    selector = f"involvedObject.kind=Job,involvedObject.name={job},reason={reason}"
    events = wait_for(
        lambda: core.list_namespaced_event(ns, field_selector=selector).items,
        timeout=20,
        what=f"a {reason} event on Job {job}",
    )
    return events[0]


# ---- the steps report the API's reason ----------------------------------------------------------


def test_run_in_a_restricted_namespace_completes_and_leaves_nothing(sim, capsys):
    code, result = run(sim, capsys, "psa-ok", RESTRICTED)
    assert code == 0, result
    assert sim.objects(RunNames.for_run("psa-ok").selector) == []


def test_pod_security_refusal_fails_the_run_at_once_with_the_apis_message(sim, capsys):
    started = time.monotonic()
    code, result = run(sim, capsys, "psa-root", RESTRICTED, "--pod-security", "baseline")
    assert code == 4, result
    assert time.monotonic() - started < 45  # not the 900 s pods-running timeout nor the grace
    failure = result["error"]
    assert "the API refused to create the pods of Job" in failure
    assert 'violates PodSecurity "restricted:latest": runAsNonRoot != true' in failure
    assert f"namespace {RESTRICTED} enforces Pod Security level restricted" in failure
    assert "--pod-security restricted" in failure
    assert sim.objects(RunNames.for_run("psa-root").selector) == []


def test_quota_refusal_shows_in_progress_and_fails_after_the_grace_naming_the_quota(
    sim, core, caplog, capsys, monkeypatch
):
    monkeypatch.setattr(wait, "PROGRESS_EVERY_S", 0.5)
    caplog.set_level(logging.INFO, logger="mnnvl")
    core.create_namespaced_resource_quota(
        BASELINE, {"metadata": {"name": "q1"}, "spec": {"hard": {"pods": "1"}}}
    )
    try:
        code, result = run(sim, capsys, "quota-1", BASELINE, "--unschedulable-grace-s", "3")
    finally:
        core.delete_namespaced_resource_quota("q1", BASELINE)
    assert code == 4, result
    progress = [m for m in caplog.messages if "pods Running" in m and "refused" in m]
    assert progress, caplog.messages
    assert "exceeded quota: q1, requested: pods=1, used: pods=1, limited: pods=1" in progress[-1]
    failure = result["error"]
    assert "still refused after 3 s (--unschedulable-grace-s)" in failure
    assert f"ResourceQuota q1 in namespace {BASELINE} is used up" in failure
    assert sim.objects(RunNames.for_run("quota-1").selector) == []


def test_webhook_denial_of_one_clique_groups_pods_fails_the_run_at_once_naming_it(capsys):
    run_id = "deny-g1"
    group1 = RunNames.for_run(run_id).job("train", 1)
    with SimCluster(nodes=4, cliques=2, local_gpus=[]) as cluster:
        cluster.admission.deny("gpu-policy.example.com", "clique 1 is reserved", job=group1)
        argv = ["run", "--run-id", run_id, "--nodes", "4", "--nodes-per-clique", "2", *RUN]
        code = cli.main([*argv, "--kubeconfig", cluster.kubeconfig_path])
        result = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert code == 4, result
        assert f"Job default/{group1}" in result["error"]
        assert (
            'admission webhook "gpu-policy.example.com" denied the request: clique 1 is reserved'
            in result["error"]
        )
        assert cluster.objects(RunNames.for_run(run_id).selector) == []
