"""Request economy of the simulated cluster with watch-based clients: outcomes and request
counts only (how fast it goes is measured by bench/bench_load.py, not asserted here)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes import watch

from mnnvl.sim import SimCluster
from tests.sim.simkit import ALL_RUNNING

G, V, CDS, NS = "resource.nvidia.com", "v1beta1", "computedomains", "default"


def _wait_event(list_fn: Any, *args: Any, want: str, name: str, **kw: Any) -> None:
    """One watch request that ends when ``name`` shows up with event type ``want``."""
    w = watch.Watch()
    for ev in w.stream(
        list_fn, *args, field_selector=f"metadata.name={name}", timeout_seconds=10, **kw
    ):
        if ev["type"] == want:
            w.stop()
            return
    raise AssertionError(f"{name}: no {want} event")


def _one_run(sim: SimCluster, i: int, errors: list[str]) -> None:
    try:
        api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        custom = kubernetes.client.CustomObjectsApi(api)
        name = f"run-{i}"
        body = {
            "apiVersion": f"{G}/{V}",
            "kind": "ComputeDomain",
            "metadata": {"name": name},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": name}}},
        }
        cd = custom.create_namespaced_custom_object(G, V, NS, CDS, body)

        def list_rcts(namespace: str, **kw: Any) -> Any:
            return custom.list_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaimtemplates", **kw
            )

        _wait_event(list_rcts, NS, want="ADDED", name=name)
        custom.delete_namespaced_custom_object(G, V, NS, CDS, name)
        _wait_event(
            custom.list_namespaced_custom_object,
            G,
            V,
            NS,
            CDS,
            want="DELETED",
            name=name,
            resource_version=cd["metadata"]["resourceVersion"],
        )
    except Exception as e:  # collected and asserted by the test thread
        errors.append(f"run {i}: {e!r}")


def test_hundred_concurrent_domain_runs_leave_nothing_and_never_poll() -> None:
    with SimCluster(nodes=2, local_gpus=[]) as sim:
        errors: list[str] = []
        threads = [threading.Thread(target=_one_run, args=(sim, i, errors)) for i in range(100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert sim.objects() == []
        assert sim.request_count == 400  # create, watch, delete, watch per run: nothing polls


def test_eighteen_node_run_needs_few_requests_with_watches(tmp_path: Path) -> None:
    with SimCluster(nodes=18, gpus_per_node=1, imex_delay_s=0.1, local_gpus=[]) as sim:
        api = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        core, batch = kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api)
        custom = kubernetes.client.CustomObjectsApi(api)
        body = {
            "apiVersion": f"{G}/{V}",
            "kind": "ComputeDomain",
            "metadata": {"name": "big"},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "big"}}},
        }
        cd = custom.create_namespaced_custom_object(G, V, NS, CDS, body)

        def list_rcts(namespace: str, **kw: Any) -> Any:
            return custom.list_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaimtemplates", **kw
            )

        _wait_event(list_rcts, NS, want="ADDED", name="big")
        core.create_namespaced_service(
            NS, {"metadata": {"name": "big"}, "spec": {"clusterIP": "None"}}
        )
        container = {
            "name": "worker",
            "image": "sim",
            # All 18 run at once: a node freed early could take a second pod.
            "command": ["python3", "-c", ALL_RUNNING],
            "env": [{"name": "BARRIER", "value": str(tmp_path)}, {"name": "PODS", "value": "18"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "claims": [{"name": "ch"}]},
        }
        batch.create_namespaced_job(
            NS,
            {
                "metadata": {"name": "big"},
                "spec": {
                    "completionMode": "Indexed",
                    "completions": 18,
                    "parallelism": 18,
                    "backoffLimit": 0,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "subdomain": "big",
                            "resourceClaims": [{"name": "ch", "resourceClaimTemplateName": "big"}],
                            "containers": [container],
                        }
                    },
                },
            },
        )
        w = watch.Watch()
        complete = False
        for ev in w.stream(
            batch.list_namespaced_job, NS, field_selector="metadata.name=big", timeout_seconds=300
        ):
            status = ev["object"].status  # None until the controller first writes it
            if any(c.type == "Complete" for c in (status and status.conditions) or []):
                complete = True
                w.stop()
        assert complete, "the 18-pod Job did not complete"
        pods = core.list_namespaced_pod(NS, label_selector="job-name=big").items
        assert len({p.spec.node_name for p in pods}) == 18
        pod0 = next(p for p in pods if p.spec.hostname == "big-0")
        assert core.read_namespaced_pod_log(pod0.metadata.name, NS).startswith("RESULT")
        batch.delete_namespaced_job("big", NS, propagation_policy="Foreground")
        core.delete_namespaced_service("big", NS)
        custom.delete_namespaced_custom_object(G, V, NS, CDS, "big")
        _wait_event(
            custom.list_namespaced_custom_object,
            G,
            V,
            NS,
            CDS,
            want="DELETED",
            name="big",
            resource_version=cd["metadata"]["resourceVersion"],
        )
        assert sim.request_count <= 40, sim.request_counts
        assert sim.objects() == []
