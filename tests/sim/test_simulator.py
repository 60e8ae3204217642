"""The simulated cluster, driven by the unmodified ``kubernetes`` client over real HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
from kubernetes import watch
from kubernetes.client import ApiException

from mnnvl.sim import SimCluster
from tests.sim.simkit import wait_for

G, V, CDS = "resource.nvidia.com", "v1beta1", "computedomains"
NS = "default"
LABEL_CD = "resource.nvidia.com/computeDomain"


class Clients:
    def __init__(self, sim: SimCluster) -> None:
        self.api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.batch = kubernetes.client.BatchV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.apiext = kubernetes.client.ApiextensionsV1Api(self.api)

    def resource(self, method: str, path: str, body: Any = None) -> Any:
        """A resource.k8s.io/v1 call by path (the oldest supported client has no typed API)."""
        _, namespace, plural, *name = path.strip("/").split("/")  # namespaces/NS/PLURAL[/NAME]
        coords = ("resource.k8s.io", "v1", namespace, plural)
        if method == "POST":
            return self.custom.create_namespaced_custom_object(*coords, body)
        return self.custom.get_namespaced_custom_object(*coords, name[0])

    def cd(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(G, V, NS, CDS, name)

    def create_cd(self, name: str, num_nodes: int | None = 0, **extra: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}}
        if num_nodes is not None:
            spec["numNodes"] = num_nodes
        body = {
            "apiVersion": f"{G}/{V}",
            "kind": "ComputeDomain",
            "metadata": {"name": name},
            "spec": spec,
            **extra,
        }
        return self.custom.create_namespaced_custom_object(G, V, NS, CDS, body)


def missing(fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except ApiException as e:
        return e.status == 404
    return False


SIM = dict(nodes=2, gpus_per_node=2, imex_delay_s=0.3, local_gpus=[])


@pytest.fixture(scope="module")
def k(sim: SimCluster) -> Clients:
    return Clients(sim)


def test_crud_conflict_not_found_and_label_selectors(k: Clients) -> None:
    for name, tier in (("svc-a", "web"), ("svc-b", "db"), ("svc-c", None)):
        labels = {"app": "demo", **({"tier": tier} if tier else {})}
        k.core.create_namespaced_service(
            NS, {"metadata": {"name": name, "labels": labels}, "spec": {"clusterIP": "None"}}
        )
    with pytest.raises(ApiException) as conflict:
        k.core.create_namespaced_service(NS, {"metadata": {"name": "svc-a"}, "spec": {}})
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as gone:
        k.core.read_namespaced_service("nope", NS)
    assert gone.value.status == 404

    def names(selector: str) -> list[str]:
        items = k.core.list_namespaced_service(NS, label_selector=selector).items
        return sorted(s.metadata.name for s in items)

    assert names("tier=web") == ["svc-a"]
    assert names("tier==web") == ["svc-a"]
    assert names("app=demo,tier!=web") == ["svc-b", "svc-c"]
    assert names("tier in (web,db)") == ["svc-a", "svc-b"]
    assert names("tier notin (web),app") == ["svc-b", "svc-c"]
    assert names("!tier,app=demo") == ["svc-c"]
    fields = k.core.list_namespaced_service(NS, field_selector="metadata.name=svc-b").items
    assert [s.metadata.name for s in fields] == ["svc-b"]

    patched = k.core.patch_namespaced_service("svc-a", NS, {"metadata": {"labels": {"x": "1"}}})
    assert patched.metadata.labels == {"app": "demo", "tier": "web", "x": "1"}
    # A list body is an RFC 6902 JSON patch (`kubectl patch --type json`); "~1" is "/".
    ops = [
        {"op": "test", "path": "/metadata/labels/x", "value": "1"},
        {"op": "add", "path": "/metadata/labels/y~1z", "value": "2"},
    ]
    assert k.core.patch_namespaced_service("svc-a", NS, ops).metadata.labels["y/z"] == "2"
    with pytest.raises(ApiException) as failed:
        bad = [{"op": "test", "path": "/metadata/labels/x", "value": "9"}]
        k.core.patch_namespaced_service("svc-a", NS, bad)
    assert failed.value.status == 422
    assert k.core.read_namespaced_service("svc-a", NS).metadata.labels["x"] == "1"
    k.core.delete_namespaced_service("svc-a", NS)
    assert missing(lambda: k.core.read_namespaced_service("svc-a", NS))


def test_watch_resumes_from_resource_version_and_delivers_410(sim: SimCluster, k: Clients) -> None:
    start = k.core.list_namespaced_service(NS).metadata.resource_version
    k.core.create_namespaced_service(NS, {"metadata": {"name": "w1"}, "spec": {}})
    k.core.delete_namespaced_service("w1", NS)
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            k.core.list_namespaced_service, NS, resource_version=start, timeout_seconds=1
        )
    ]
    assert seen == [("ADDED", "w1"), ("DELETED", "w1")]

    sim.faults.expire_watches(1)
    with pytest.raises(ApiException) as expired:
        list(
            watch.Watch().stream(
                k.core.list_namespaced_service, NS, resource_version=start, timeout_seconds=1
            )
        )
    assert expired.value.status == 410

    sim.store.compact()  # history dropped: the old resourceVersion is now too old
    with pytest.raises(ApiException) as too_old:
        list(
            watch.Watch().stream(
                k.core.list_namespaced_service, NS, resource_version=start, timeout_seconds=1
            )
        )
    assert too_old.value.status == 410


def test_computedomain_gets_finalizer_template_and_ready_with_zero_nodes(k: Clients) -> None:
    cd = k.create_cd("cd-zero", num_nodes=0, status={"status": "Ready", "nodes": []})
    assert "status" not in cd  # status is only written through /status
    assert cd["spec"]["numNodes"] == 0 and cd["spec"]["channel"]["allocationMode"] == "Single"
    rct = wait_for(
        lambda: (
            not missing(
                lambda: k.resource(
                    "GET", "/namespaces/default/resourceclaimtemplates/cd-zero-channel"
                )
            )
            and k.resource("GET", "/namespaces/default/resourceclaimtemplates/cd-zero-channel")
        )
    )
    uid = cd["metadata"]["uid"]
    assert rct["metadata"]["labels"] == {
        LABEL_CD: uid,
        "resource.nvidia.com/computeDomainTarget": "Workload",
    }
    assert rct["metadata"]["finalizers"] == ["resource.nvidia.com/computeDomain"]
    devices = rct["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {
            "name": "channel",
            "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"},
        }
    ]
    assert devices["config"][0]["opaque"] == {
        "driver": "compute-domain.nvidia.com",
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainChannelConfig",
            "domainID": uid,
            "allocationMode": "Single",
        },
    }
    status = wait_for(lambda: k.cd("cd-zero").get("status"))
    assert status == {"status": "Ready", "nodes": []}
    assert k.cd("cd-zero")["metadata"]["finalizers"] == ["resource.nvidia.com/computeDomain"]


def test_computedomain_spec_is_immutable_and_validated(k: Clients) -> None:
    k.create_cd("cd-immutable")
    with pytest.raises(ApiException) as immut:
        k.custom.patch_namespaced_custom_object(
            G, V, NS, CDS, "cd-immutable", {"spec": {"numNodes": 3}}
        )
    assert immut.value.status == 422
    assert "A computeDomain.spec is immutable" in json.loads(immut.value.body)["message"]
    bad = {
        "apiVersion": f"{G}/{V}",
        "kind": "ComputeDomain",
        "metadata": {"name": "cd-bad"},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "x"}, "allocationMode": "Some"}},
    }
    with pytest.raises(ApiException) as enum:
        k.custom.create_namespaced_custom_object(G, V, NS, CDS, bad)
    assert enum.value.status == 422
    # metadata changes are fine
    k.custom.patch_namespaced_custom_object(
        G, V, NS, CDS, "cd-immutable", {"metadata": {"labels": {"a": "b"}}}
    )


def test_deleting_computedomain_clears_finalizer_unless_stuck(sim: SimCluster, k: Clients) -> None:
    k.create_cd("cd-del")
    wait_for(lambda: k.cd("cd-del").get("status"))
    k.custom.delete_namespaced_custom_object(G, V, NS, CDS, "cd-del")
    wait_for(lambda: missing(lambda: k.cd("cd-del")), what="CD gone")
    assert missing(
        lambda: k.resource("GET", "/namespaces/default/resourceclaimtemplates/cd-del-channel")
    )

    sim.faults.stick_finalizer("ComputeDomain", "cd-stuck")
    k.create_cd("cd-stuck")
    wait_for(lambda: k.cd("cd-stuck").get("status"))
    k.custom.delete_namespaced_custom_object(G, V, NS, CDS, "cd-stuck")
    stuck = wait_for(
        lambda: k.cd("cd-stuck")["metadata"].get("deletionTimestamp") and k.cd("cd-stuck")
    )
    time.sleep(0.2)
    assert k.cd("cd-stuck")["metadata"]["finalizers"] == ["resource.nvidia.com/computeDomain"]
    assert stuck["metadata"]["deletionTimestamp"]
    sim.faults.unstick_finalizer("ComputeDomain", "cd-stuck")


def test_template_name_taken_leaves_domain_stuck_with_event(sim: SimCluster, k: Clients) -> None:
    k.resource(
        "POST",
        "/namespaces/default/resourceclaimtemplates",
        {"metadata": {"name": "cd-taken-channel"}, "spec": {"spec": {"devices": {}}}},
    )
    k.create_cd("cd-taken")
    wait_for(lambda: any(e["reason"] == "FailedCreateResourceClaimTemplate" for e in sim.events))
    assert "status" not in k.cd("cd-taken")


def worker_job(name: str, template: str, code: str, gpus: int = 1) -> dict[str, Any]:
    env = [
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}.default.svc.cluster.local"},
        {"name": "MASTER_PORT", "value": "29500"},
    ]
    container = {
        "name": "worker",
        "image": "sim",
        "command": ["python3", "-c", code],
        "env": env,
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "claims": [{"name": "imex"}]},
    }
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"job-name": name}},
                    "topologyKey": "nvidia.com/gpu.clique",
                }
            ]
        }
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "subdomain": name,
                    "affinity": affinity,
                    "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": template}],
                    "containers": [container],
                },
            },
        },
    }


CHECK_ENV = (
    "import os, sys, time\n"
    "idx = os.environ['JOB_COMPLETION_INDEX']\n"
    "assert os.environ['MASTER_ADDR'] == '127.0.0.1', os.environ['MASTER_ADDR']\n"
    "assert os.environ['MASTER_PORT'] != '29500'\n"
    "time.sleep(0.6)\n"
    "print('RESULT {\"index\": ' + idx + '}')\n"
    "sys.exit(0 if idx in ('0', '1') else 3)\n"
)


def test_indexed_job_runs_through_imex_gate_and_domain_follows_workload(
    sim: SimCluster, k: Clients
) -> None:
    cd = k.create_cd("cd-two", num_nodes=2)
    uid = cd["metadata"]["uid"]
    wait_for(lambda: k.cd("cd-two").get("status"))
    assert k.cd("cd-two")["status"]["status"] == "NotReady"  # numNodes 2: needs workload pods
    k.core.create_namespaced_service(
        NS,
        {
            "metadata": {"name": "train"},
            "spec": {"clusterIP": "None", "selector": {"job-name": "train"}},
        },
    )
    k.batch.create_namespaced_job(NS, worker_job("train", "cd-two-channel", CHECK_ENV))
    states: dict[str, list[str]] = {}
    for ev in watch.Watch().stream(
        k.core.list_namespaced_pod, NS, label_selector="job-name=train", timeout_seconds=20
    ):
        pod = ev["object"]
        cs = (pod.status.container_statuses or [None])[0]
        state = (
            "none"
            if cs is None
            else (
                cs.state.waiting.reason
                if cs.state.waiting
                else "Running"
                if cs.state.running
                else f"exit{cs.state.terminated.exit_code}"
            )
        )
        seq = states.setdefault(pod.metadata.name, [])
        if not seq or seq[-1] != state:
            seq.append(state)
        if state == "Running":
            node = k.core.read_node(pod.spec.node_name)
            assert node.metadata.labels[LABEL_CD] == uid
        if len(states) == 2 and all(s[-1].startswith("exit") for s in states.values()):
            break
    assert len(states) == 2
    for seq in states.values():
        assert "ContainerCreating" in seq and "Running" in seq and seq[-1] == "exit0", seq
    pods = k.core.list_namespaced_pod(NS, label_selector="job-name=train").items
    assert sorted(p.spec.hostname for p in pods) == ["train-0", "train-1"]
    assert {p.spec.node_name for p in pods} == {"sim-node-0", "sim-node-1"}
    for p in pods:
        idx = p.metadata.labels["batch.kubernetes.io/job-completion-index"]
        assert p.metadata.name.startswith(f"train-{idx}-")
        log = k.core.read_namespaced_pod_log(p.metadata.name, NS, container="worker")
        assert log.strip() == f'RESULT {{"index": {idx}}}'
        assert k.core.read_namespaced_pod_log(p.metadata.name, NS, tail_lines=1).startswith(
            "RESULT"
        )
    job = wait_for(
        lambda: (
            k.batch.read_namespaced_job("train", NS).status.completion_time
            and k.batch.read_namespaced_job("train", NS)
        )
    )
    assert job.status.succeeded == 2 and job.status.completed_indexes == "0-1"
    assert [c.type for c in job.status.conditions][-1] == "Complete"
    # the domain follows the workload: labels and status.nodes empty again
    wait_for(
        lambda: not any(LABEL_CD in (n.metadata.labels or {}) for n in k.core.list_node().items),
        what="node labels removed",
    )
    wait_for(lambda: k.cd("cd-two")["status"]["nodes"] == [], what="status.nodes emptied")
    k.batch.delete_namespaced_job("train", NS, propagation_policy="Background")
    wait_for(lambda: not k.core.list_namespaced_pod(NS, label_selector="job-name=train").items)


def test_domain_turns_ready_once_workload_nodes_join(sim: SimCluster, k: Clients) -> None:
    k.create_cd("cd-ready", num_nodes=2)
    code = "import time; time.sleep(30)"
    k.batch.create_namespaced_job(NS, worker_job("hold", "cd-ready-channel", code))
    status = wait_for(
        lambda: (
            (k.cd("cd-ready").get("status") or {}).get("status") == "Ready"
            and k.cd("cd-ready")["status"]
        ),
        timeout=10,
    )
    assert sorted(n["name"] for n in status["nodes"]) == ["sim-node-0", "sim-node-1"]
    assert all(
        n["status"] == "Ready" and n["cliqueID"].startswith(sim.cluster_uuid)
        for n in status["nodes"]
    )
    k.batch.delete_namespaced_job("hold", NS, propagation_policy="Foreground")
    wait_for(lambda: not k.core.list_namespaced_pod(NS, label_selector="job-name=hold").items)
    wait_for(lambda: k.cd("cd-ready")["status"]["status"] == "NotReady")


def test_pod_asking_for_too_many_gpus_is_unschedulable(sim: SimCluster, k: Clients) -> None:
    k.core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": "greedy"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "sim",
                        "command": ["true"],
                        "resources": {"limits": {"nvidia.com/gpu": "3"}},
                    }
                ]
            },
        },
    )
    cond = wait_for(
        lambda: next(
            (
                c
                for c in k.core.read_namespaced_pod("greedy", NS).status.conditions or []
                if c.type == "PodScheduled"
            ),
            None,
        )
    )
    assert cond.status == "False" and cond.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond.message
    events = k.core.list_namespaced_event(NS, field_selector="involvedObject.name=greedy").items
    assert any(e.reason == "FailedScheduling" for e in events)
    assert k.core.read_namespaced_pod("greedy", NS).status.phase == "Pending"
    k.core.delete_namespaced_pod("greedy", NS)


def test_owner_reference_garbage_collection(k: Clients) -> None:
    owner = k.core.create_namespaced_service(NS, {"metadata": {"name": "owner"}, "spec": {}})
    ref = {"apiVersion": "v1", "kind": "Service", "name": "owner", "uid": owner.metadata.uid}
    k.core.create_namespaced_service(
        NS, {"metadata": {"name": "dependent", "ownerReferences": [ref]}, "spec": {}}
    )
    k.core.delete_namespaced_service("owner", NS)
    assert wait_for(lambda: missing(lambda: k.core.read_namespaced_service("dependent", NS)))


def test_injected_request_fault_returns_status(sim: SimCluster, k: Clients) -> None:
    sim.faults.fail_requests("GET", "/services/flaky", 503)
    k.core.create_namespaced_service(NS, {"metadata": {"name": "flaky"}, "spec": {}})
    with pytest.raises(ApiException) as err:
        k.core.read_namespaced_service("flaky", NS)
    assert err.value.status == 503
    assert json.loads(err.value.body)["reason"] == "ServiceUnavailable"
    assert k.core.read_namespaced_service("flaky", NS).metadata.name == "flaky"


def test_failed_pod_fault_fails_job_with_backoff_limit(sim: SimCluster, k: Clients) -> None:
    k.create_cd("cd-fail")
    wait_for(lambda: k.cd("cd-fail").get("status"))
    sim.faults.fail_pod("boom", index=1, mode="Failed", exit_code=7)
    k.batch.create_namespaced_job(NS, worker_job("boom", "cd-fail-channel", "print('ok')"))
    job = wait_for(
        lambda: (
            any(
                c.type == "Failed"
                for c in k.batch.read_namespaced_job("boom", NS).status.conditions or []
            )
            and k.batch.read_namespaced_job("boom", NS)
        )
    )
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    pods = k.core.list_namespaced_pod(
        NS, label_selector="job-name=boom,batch.kubernetes.io/job-completion-index=1"
    ).items
    term = pods[0].status.container_statuses[0].state.terminated
    assert pods[0].status.phase == "Failed" and term.exit_code == 7
    k.batch.delete_namespaced_job("boom", NS, propagation_policy="Background")


def test_crd_not_installed_gives_404_everywhere() -> None:
    with SimCluster(nodes=1, crd_installed=False, local_gpus=[]) as sim:
        k = Clients(sim)
        assert missing(
            lambda: k.apiext.read_custom_resource_definition("computedomains.resource.nvidia.com")
        )
        assert missing(lambda: k.custom.list_namespaced_custom_object(G, V, NS, CDS))
        assert missing(lambda: k.create_cd("x"))
        assert k.core.list_namespaced_pod(NS).items == []


def test_log_of_an_unscheduled_pod_is_empty_like_the_real_apiserver(k: Clients) -> None:
    # kube-apiserver has no kubelet to ask before the pod is bound: an empty 200, no error.
    pod = {
        "metadata": {"name": "nowhere"},
        "spec": {
            "nodeSelector": {"no-such": "label"},
            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
        },
    }
    k.core.create_namespaced_pod(NS, pod)
    wait_for(
        lambda: k.core.read_namespaced_pod("nowhere", NS).status.conditions,
        what="the scheduler's verdict",
    )
    assert k.core.read_namespaced_pod_log("nowhere", NS, container="main") == ""
    k.core.delete_namespaced_pod("nowhere", NS)
