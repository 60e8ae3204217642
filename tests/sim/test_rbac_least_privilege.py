"""The shipped Role is exactly what the code sends: nothing missing, nothing extra.

A fresh simulated cluster records every (verb, API group, resource) a request asks for, as an
audit log would. Every step of the product runs against it, including the paths that only
failures and options take (fail-fast diagnostics, GPU claims, an owning launcher pod, a retried
step adopting its Job, a gang restart, reaping an orphan), and the recorded set must equal the
rules of ``manifests/base``'s Role, but for the reads of the optional cluster reader
(``manifests/overlays/cluster-reader``) that ``--gpu-mode auto`` tries and does without.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mnnvl import steps
from mnnvl.contract.termination import Evidence
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, VerifyConfig, WorkloadSpec, from_inputs
from mnnvl.runtime.local import free_port
from mnnvl.sim import SimCluster

REPO = Path(__file__).resolve().parents[2]
NS = "default"


def role_rules(path: Path, kind: str = "Role") -> set[tuple[str, str, str]]:
    """(verb, group, resource) for every rule of the one Role (or ``kind``) in ``path``."""
    (role,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return {
        (verb, group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _launcher_pod(sim: SimCluster) -> None:
    """The pod a KFP/Argo step runs in (made in-process: not a request of the code under test)."""
    sim.store.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "launcher", "namespace": NS},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "command": [sys.executable, "-c", "import time; time.sleep(120)"],
                    }
                ]
            },
        },
    )


def _everything(sim: SimCluster, workers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kube = sim.kubeconfig_path
    env = {"PYTHONPATH": str(workers)}
    run = "rbac-run"
    domain = DomainSpec(run_id=run, namespace=NS, delete_timeout_s=60)
    monkeypatch.setenv("POD_NAME", "launcher")
    monkeypatch.setenv("POD_NAMESPACE", NS)
    # --gpu-mode auto tries the optional cluster reader's reads; refused, it runs with limits.
    auto = DomainSpec(run_id="rbac-auto", namespace=NS, delete_timeout_s=60)
    steps.provision(auto, kubeconfig=kube)
    gpus = from_inputs(
        WorkloadSpec, run_id="rbac-auto", purpose="job", nodes=2, gpus_per_node=1, env=env,
        pods_running_timeout_s=60, job_timeout_s=60)  # fmt: skip
    assert steps.launch(gpus, "report", [], kubeconfig=kube).result == {"ok": True}
    steps.teardown(auto, kubeconfig=kube)
    steps.provision(domain, kubeconfig=kube, owner_pod=True)
    job = from_inputs(
        WorkloadSpec, run_id=run, purpose="job", nodes=2, gpus_per_node=1, gpu_mode="claim",
        env=env, pods_running_timeout_s=60, job_timeout_s=60)  # fmt: skip
    assert steps.launch(job, "report", [], kubeconfig=kube).result == {"ok": True}
    # run again (a retried step): adopts the Service, the GPU template and the completed Job
    assert steps.launch(job, "report", [], kubeconfig=kube).result == {"ok": True}
    gang = from_inputs(
        WorkloadSpec, run_id=run, purpose="verify", nodes=2, gpus_per_node=0, env=env,
        max_restarts=1, job_timeout_s=60)  # fmt: skip
    sim.faults.fail_pod(RunNames.for_run(run).job("verify"), index=1, exit_code=1)
    restarted = steps.launch(gang, "slow_report", [], kubeconfig=kube)  # deletes rank 0's pod
    assert restarted.result == {"ok": True} and len(restarted.restarts) == 1
    with pytest.raises(WorkloadFailed):  # a gang restart, then fail-fast reads the pod's events
        steps.launch(
            from_inputs(
                WorkloadSpec, run_id=run, purpose="verify-post", nodes=2, gpus_per_node=0, env=env,
                pods_running_timeout_s=60, job_timeout_s=60, max_restarts=1),
            "crash", [], kubeconfig=kube,
        )  # fmt: skip
    # A node with NVLink errors is kept out of the next attempt (patch: suspend, affinity,
    # resume); with no spare node the step fails naming it.
    bad = DomainSpec(run_id="rbac-bad", namespace=NS, delete_timeout_s=60)
    steps.provision(bad, kubeconfig=kube)
    said = Evidence(exit_code=1, nvlink={"0": {"crc": 1}}).to_message()
    sim.faults.fail_node("sim-node-0", 1, said)
    with pytest.raises(WorkloadFailed, match="was excluded after failing"):
        steps.launch(
            from_inputs(WorkloadSpec, run_id="rbac-bad", purpose="job", nodes=2,
                        gpus_per_node=0, env=env, pods_running_timeout_s=60, job_timeout_s=60,
                        max_restarts=3),
            "slow_report", [], kubeconfig=kube,
        )  # fmt: skip
    sim.faults.heal_node("sim-node-0")
    steps.teardown(bad, kubeconfig=kube)
    cpu = {"nodes": 2, "gpus_per_node": 0, "pods_running_timeout_s": 120, "job_timeout_s": 300}
    cpu["rdzv_port"] = free_port()
    steps.train(
        from_inputs(WorkloadSpec, run_id=run, purpose="train", **cpu),
        TrainConfig(steps=2, warmup_steps=1, log_every=1),
        kubeconfig=kube,
    )
    steps.verify(
        from_inputs(WorkloadSpec, run_id=run, purpose="verify-pre", **cpu),
        VerifyConfig(max_bytes=64 << 10, min_busbw_gbps=1e-6),
        kubeconfig=kube,
    )
    assert steps.status(domain, kubeconfig=kube).domain is not None
    assert steps.teardown(domain, kubeconfig=kube).deleted
    orphan = DomainSpec(run_id="rbac-orphan", namespace=NS, delete_timeout_s=60)
    steps.provision(orphan, kubeconfig=kube)
    reaped = steps.reap(NS, live_run_ids={run}, older_than_s=0, kubeconfig=kube)
    assert "rbac-orphan" in reaped.runs


@pytest.mark.slow(55)
def test_role_grants_exactly_the_requests_every_step_sends(tmp_path, monkeypatch):
    (tmp_path / "report.py").write_text('print("RESULT {\\"ok\\": true}", flush=True)\n')
    (tmp_path / "crash.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "slow_report.py").write_text(
        'import time\ntime.sleep(3)\nprint("RESULT {\\"ok\\": true}", flush=True)\n'
    )
    with SimCluster(nodes=2, gpus_per_node=1) as sim:
        _launcher_pod(sim)
        _everything(sim, tmp_path, monkeypatch)
        sent = sim.rbac_requests
    granted = role_rules(REPO / "manifests" / "base" / "rbac.yaml")
    reader = REPO / "manifests" / "overlays" / "cluster-reader" / "cluster-reader-rbac.yaml"
    optional = {("get", "resource.k8s.io", "deviceclasses"), ("list", "", "nodes")}
    assert optional <= role_rules(reader, "ClusterRole") and optional <= sent
    assert sorted(sent - granted - optional) == [], "requests the Role would refuse (403)"
    assert sorted(granted - sent) == [], "granted but never used: drop them from the Role"


def test_base_binds_nothing_cluster_wide_and_argo_rules_live_in_the_argo_overlay():
    docs: list[dict[str, Any]] = []
    for path in (REPO / "manifests" / "base").glob("*.yaml"):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    assert not any(g == "argoproj.io" for _, g, _ in role_rules(REPO / "manifests/base/rbac.yaml"))
    argo = yaml.safe_load_all((REPO / "manifests/overlays/argo/workflow-rbac.yaml").read_text())
    argo_rules = {
        (v, g, r)
        for d in argo
        if d and d["kind"] == "Role"
        for rule in d["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert argo_rules == {
        ("create", "argoproj.io", "workflowtaskresults"),
        ("patch", "argoproj.io", "workflowtaskresults"),
    }


def _client(sim: SimCluster, path: str | None = None) -> Any:
    import kubernetes

    return kubernetes.config.new_client_from_config(config_file=path or sim.kubeconfig_path)


def test_the_runner_is_refused_what_its_role_lacks_with_the_real_403() -> None:
    from kubernetes import client
    from kubernetes.client import ApiException

    with SimCluster(nodes=1, namespaces=("default", "team-a")) as sim:
        core = client.CoreV1Api(_client(sim))
        assert core.list_namespaced_pod("team-a").items == []  # granted in every namespace
        with pytest.raises(ApiException) as denied:
            core.list_node()
        assert denied.value.status == 403
        body = yaml.safe_load(denied.value.body)
        assert body["reason"] == "Forbidden" and body["message"] == (
            'nodes is forbidden: User "system:serviceaccount:default:mnnvl-runner" cannot list '
            'resource "nodes" in API group "" at the cluster scope'
        )
        with pytest.raises(ApiException) as denied:
            core.delete_namespaced_config_map("settings", "default")
        assert yaml.safe_load(denied.value.body)["message"] == (
            'configmaps "settings" is forbidden: User "system:serviceaccount:default:mnnvl-runner"'
            ' cannot delete resource "configmaps" in API group "" in the namespace "default"'
        )
        # A namespace the platform team made later, without manifests/base: nothing granted.
        admin = client.CoreV1Api(_client(sim, sim.admin_kubeconfig_path))
        admin.create_namespace({"metadata": {"name": "team-b"}})
        with pytest.raises(ApiException) as denied:
            client.BatchV1Api(_client(sim)).list_namespaced_job("team-b")
        assert (
            'cannot list resource "jobs" in API group "batch" in the namespace "team-b"'
            in (yaml.safe_load(denied.value.body)["message"])
        )


def test_rules_match_subresources_resource_names_and_groups_as_rbac_does() -> None:
    from mnnvl.sim.api.rbac import Request, allowed, service_account_user

    user = service_account_user("ns", "sa")
    with SimCluster(nodes=1, namespaces=("ns",)) as sim:
        rules = [
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
             "resourceNames": ["mine"]},
            {"apiGroups": ["batch"], "resources": ["*/status"], "verbs": ["*"]},
        ]  # fmt: skip
        sim.store.create("roles", {"metadata": {"name": "r", "namespace": "ns"}, "rules": rules})
        binding = {
            "metadata": {"name": "b", "namespace": "ns"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa"}],
        }
        sim.store.create("rolebindings", binding)

        def may(verb: str, group: str, resource: str, sub: str = "", name: str = "x") -> bool:
            return allowed(sim.store, user, Request(verb, group, resource, sub, "ns", name))

        assert may("get", "", "pods", "log") and not may("get", "", "pods")
        assert may("get", "", "configmaps", name="mine") and not may("get", "", "configmaps")
        assert not may("list", "", "configmaps", name="")
        assert may("patch", "batch", "jobs", "status") and not may("patch", "batch", "jobs")
        assert not may("get", "apps", "deployments", "status")
        assert not allowed(
            sim.store,
            service_account_user("other", "sa"),
            Request("get", "", "pods", "log", "ns", "x"),
        )


def test_an_unknown_token_is_401_and_no_token_is_anonymous() -> None:
    import urllib.error
    import urllib.request

    with SimCluster(nodes=1) as sim:
        url = f"{sim.url}/api/v1/namespaces/default/pods"
        codes = []
        for headers in ({"Authorization": "Bearer forged"}, {}):
            try:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
            except urllib.error.HTTPError as e:
                codes.append((e.code, yaml.safe_load(e.read())["message"][:60]))
        assert codes == [
            (401, "Unauthorized"),
            (403, 'pods is forbidden: User "system:anonymous" cannot list resou'),
        ]


def test_a_role_missing_one_verb_fails_the_step_with_exit_5_naming_the_verb_and_the_role(
    tmp_path,
) -> None:
    import subprocess

    with SimCluster(nodes=2) as sim:
        role = sim.store.get("roles", NS, "mnnvl-runner")
        for rule in role["rules"]:
            if rule["resources"] == ["jobs"]:
                rule["verbs"].remove("create")
        sim.store.update("roles", NS, "mnnvl-runner", role)
        kube = ["--kubeconfig", sim.kubeconfig_path, "--run-id", "rbac-short", "--namespace", NS]
        cli = [sys.executable, "-m", "mnnvl"]
        subprocess.run([*cli, "provision", *kube], check=True, capture_output=True)
        step = subprocess.run(
            [*cli, "train", *kube, "--nodes", "2", "--gpus-per-node", "0", "--steps", "2"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert step.returncode == 5, step.stderr
        assert 'cannot create resource "jobs" in API group "batch"' in step.stderr
        assert "has the mnnvl-runner Role of manifests/base/rbac.yaml there" in step.stderr
        subprocess.run([*cli, "teardown", *kube], check=True, capture_output=True)
        assert sim.objects() == []
