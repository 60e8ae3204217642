"""Helpers the simulator tests share: calls by path through the official client (``Raw``),
pod and ComputeDomain bodies, a PersistentVolumeClaim for the runs to mount, a polling wait,
the check that nothing of a run is left."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes import client, config
from kubernetes.client import ApiException
from kubernetes.dynamic import DynamicClient

from mnnvl.sim import SimCluster

NS = "default"
CD_PATH = "/apis/resource.nvidia.com/v1beta1/namespaces/{ns}/computedomains"
# A worker that works until the file named by $GATE exists, then reports: a training stand-in
# that a test can interrupt and let finish at will (a pod that stays up waits on this, not on
# a sleep).
GATED = (
    "import json, os, time\n"
    "while not os.path.exists(os.environ['GATE']):\n    time.sleep(0.1)\n"
    "print('RESULT ' + json.dumps({'ok': True}), flush=True)\n"
)
# A pod that holds until all $PODS pods of its run are running (each marks itself by its
# hostname in the directory $BARRIER), then reports: as a rendezvous holds them, so none frees
# its node for another pod early.
ALL_RUNNING = (
    "import os, pathlib, time\n"
    "here = pathlib.Path(os.environ['BARRIER'])\n"
    "(here / os.environ['HOSTNAME']).touch()\n"
    "while len(list(here.iterdir())) < int(os.environ['PODS']):\n    time.sleep(0.05)\n"
    "print('RESULT {}', flush=True)\n"
)


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def assert_nothing_left(sim: SimCluster, selector: str | None = None) -> None:
    """Nothing of the runs matching ``selector`` (None: of any run) is left in the cluster: no
    object, and no process that a container of one of their pods started."""
    assert sim.objects(selector) == [], "objects of the run remain after teardown"
    assert sim.processes(selector) == [], "processes of the run's pods remain after teardown"


class _NoDiscovery:
    """A ``DynamicClient`` discoverer that discovers nothing: these tests name their paths."""

    def __init__(self, client: Any, cache_file: Any = None) -> None:
        del client, cache_file


class Raw:
    """Dict-in, dict-out calls by path through the official client (its typed models drop fields).

    ``DynamicClient.request`` is the client's public generic call on every release from 30 to
    the newest (``ApiClient.call_api`` changed its signature in 36 and 37). A non-2xx answer
    raises an ``ApiException`` with the status and the ``Status`` body.
    """

    def __init__(self, sim: SimCluster, kubeconfig: str = "") -> None:
        """As the cluster's admin, or as the user of ``kubeconfig``."""
        config = kubeconfig or sim.admin_kubeconfig_path
        self.api = kubernetes.config.new_client_from_config(config_file=config)
        self.dynamic = DynamicClient(self.api, discoverer=_NoDiscovery)

    def open(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        """The response with its body not yet read (a watch can be read as it streams)."""
        return self.dynamic.request(
            method,
            path,
            body=body,
            query_params=list(query.items()),
            header_params={"Accept": "application/json"},
            content_type="application/json",
            serialize=False,
        )

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        resp = self.open(method, path, body, **query)
        try:
            return json.loads(resp.data or b"null")
        finally:
            resp.release_conn()

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def gone(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiException as e:
            return e.status == 404
        return False

    def pod(self, name: str, ns: str = NS) -> Any:
        return self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def create_pod(self, body: dict[str, Any], ns: str = NS) -> Any:
        return self.call("POST", f"/api/v1/namespaces/{ns}/pods", body)

    def create_cd(self, name: str, ns: str = NS) -> Any:
        body = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": name},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-ch"}}},
        }
        cd = self.call("POST", CD_PATH.format(ns=ns), body)
        wait_for(
            lambda: (
                not self.gone(
                    f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/{name}-ch"
                )
            ),
            what="channel template",
        )
        return cd


def pod_body(
    name: str,
    code: str = "import time; time.sleep(60)",
    gpus: int = 0,
    claim_template: str | None = None,
    node: str | None = None,
    grace_s: int | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "sim", "command": ["python3", "-c", code]}
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if claim_template:
        spec["resourceClaims"] = [{"name": "imex", "resourceClaimTemplateName": claim_template}]
        container.setdefault("resources", {})["claims"] = [{"name": "imex"}]
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create_claim(cluster: SimCluster, name: str) -> None:
    """The PersistentVolumeClaim the runs mount (a pod naming a missing one is unschedulable)."""
    core = client.CoreV1Api(
        config.new_client_from_config(config_file=cluster.admin_kubeconfig_path)
    )
    spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
    body = {"metadata": {"name": name}, "spec": spec}
    core.create_namespaced_persistent_volume_claim("default", body)


def foreign_domain(name: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "x"}},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-theirs"}}},
    }
