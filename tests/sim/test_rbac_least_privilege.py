"""The shipped Role is exactly what the code sends: nothing missing, nothing extra.

A fresh simulated cluster records every (verb, API group, resource) a request asks for, as an
audit log would. Every step of the product runs against it, including the paths that only
failures and options take (fail-fast diagnostics, GPU claims, an owning launcher pod, a retried
step adopting its Job, a gang restart, reaping an orphan), and the recorded set must equal the
rules of ``manifests/base``'s Role.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mnnvl import steps
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, VerifyConfig, WorkloadSpec
from mnnvl.runtime.local import free_port
from mnnvl.sim import SimCluster

REPO = Path(__file__).resolve().parents[2]
NS = "default"


def role_rules(path: Path) -> set[tuple[str, str, str]]:
    """(verb, group, resource) for every rule of the one Role in ``path``."""
    (role,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Role"]
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
    steps.provision(domain, kubeconfig=kube, owner_pod=True)
    job = WorkloadSpec(run_id=run, purpose="job", nodes=2, gpus_per_node=1, gpu_mode="claim",
                       env=env, pods_running_timeout_s=60, job_timeout_s=60)  # fmt: skip
    assert steps.launch(job, "report", [], kubeconfig=kube).result == {"ok": True}
    # run again (a retried step): adopts the Service, the GPU template and the completed Job
    assert steps.launch(job, "report", [], kubeconfig=kube).result == {"ok": True}
    gang = WorkloadSpec(run_id=run, purpose="verify", nodes=2, gpus_per_node=0, env=env,
                        backoff_limit_per_index=1, job_timeout_s=60)  # fmt: skip
    sim.faults.fail_pod(RunNames.for_run(run).job("verify"), index=1, exit_code=1)
    restarted = steps.launch(gang, "slow_report", [], kubeconfig=kube)  # deletes rank 0's pod
    assert restarted.result == {"ok": True} and len(restarted.restarts) == 1
    with pytest.raises(WorkloadFailed):  # fail-fast reads the pod's events
        steps.launch(
            WorkloadSpec(run_id=run, purpose="verify-post", nodes=2, gpus_per_node=0, env=env,
                         pods_running_timeout_s=60, job_timeout_s=60),
            "crash", [], kubeconfig=kube,
        )  # fmt: skip
    cpu = {"nodes": 2, "gpus_per_node": 0, "pods_running_timeout_s": 120, "job_timeout_s": 300}
    cpu["rdzv_port"] = free_port()
    steps.train(
        WorkloadSpec(run_id=run, purpose="train", **cpu),
        TrainConfig(steps=2, warmup_steps=1, log_every=1),
        kubeconfig=kube,
    )
    steps.verify(
        WorkloadSpec(run_id=run, purpose="verify-pre", **cpu),
        VerifyConfig(max_bytes=64 << 10, min_busbw_gbps=1e-6),
        kubeconfig=kube,
    )
    assert steps.status(domain, kubeconfig=kube).domain is not None
    assert steps.teardown(domain, kubeconfig=kube).deleted
    orphan = DomainSpec(run_id="rbac-orphan", namespace=NS, delete_timeout_s=60)
    steps.provision(orphan, kubeconfig=kube)
    reaped = steps.reap(NS, live_run_ids={run}, older_than_s=0, kubeconfig=kube)
    assert "rbac-orphan" in reaped.runs


@pytest.mark.slow
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
    assert sorted(sent - granted) == [], "requests the Role would refuse (403)"
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
