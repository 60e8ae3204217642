"""What the simulated API server refuses, as a real one does: schema admission (Kubernetes
1.34 strict for built-in kinds, the driver's CRD for ComputeDomains, per driver line), field
selectors per resource, and watches (bookmarks, 410 Gone after compaction)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from mnnvl.inputs.spec import DomainSpec
from mnnvl.manifests import compute_domain
from mnnvl.sim import SimCluster
from mnnvl.sim.api.schemas import SchemaAdmission
from tests.sim.simkit import CD_PATH, Raw, pod_body

JOBS = "/apis/batch/v1/namespaces/default/jobs"
PODS = "/api/v1/namespaces/default/pods"
SERVICES = "/api/v1/namespaces/default/services"
RCTS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates"
CDS = CD_PATH.format(ns="default")


def rejected(raw: Raw, method: str, path: str, body: Any = None, **query: Any) -> Any:
    with pytest.raises(ApiException) as info:
        raw.call(method, path, body, **query)
    return info.value.status, json.loads(info.value.body)["message"]


@pytest.fixture(scope="module")
def sim(schema_dir: Path) -> Iterator[SimCluster]:
    with SimCluster(nodes=1, local_gpus=[], schema_dir=str(schema_dir), watch_history=20) as c:
        yield c


# ---- admission ------------------------------------------------------------------------------


def test_job_with_an_unknown_field_is_rejected_422(raw: Raw) -> None:
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "typo"},
        "spec": {"completion": 2, "template": {"spec": pod_body("x")["spec"]}},
    }
    code, message = rejected(raw, "POST", JOBS, body)
    assert code == 422
    assert message == 'Job.batch "typo" is invalid: spec.completion: unknown field "completion"'


def test_pod_service_and_claim_template_with_bad_types_are_rejected_422(raw: Raw) -> None:
    pod = pod_body("badport")
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": "http"}]
    code, message = rejected(raw, "POST", PODS, pod)
    assert code == 422 and "spec.containers[0].ports[0].containerPort" in message
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": {}}}
    assert rejected(raw, "POST", SERVICES, svc)[0] == 422
    rct = {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [{"nam": "x"}]}}}}
    code, message = rejected(raw, "POST", RCTS, rct)
    assert code == 422 and "spec.spec.devices.requests[0]" in message


def test_valid_objects_from_the_builders_are_accepted(raw: Raw) -> None:
    cd = compute_domain(DomainSpec(run_id="admitted"))
    created = raw.call("POST", CDS, cd)
    assert created["spec"]["numNodes"] == 0
    raw.call("DELETE", f"{CDS}/{cd['metadata']['name']}")


def test_v25_12_requires_num_nodes_and_v0_4_defaults_it(schema_dir: Path) -> None:
    spec = {"channel": {"resourceClaimTemplate": {"name": "ch"}}}
    body = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain", "spec": spec}
    with SimCluster(nodes=1, local_gpus=[], driver_version="v25.12.0") as new:
        code, message = rejected(Raw(new), "POST", CDS, {**body, "metadata": {"name": "a"}})
        assert code == 422
        assert message == (
            'ComputeDomain.resource.nvidia.com "a" is invalid: spec.numNodes: Required value'
        )
    with SimCluster(nodes=1, local_gpus=[], driver_version="v0.4.0") as old:
        raw = Raw(old)
        created = raw.call("POST", CDS, {**body, "metadata": {"name": "b"}})
        assert created["spec"]["numNodes"] == 0
        negative = {**body, "metadata": {"name": "c"}, "spec": {**spec, "numNodes": -1}}
        assert rejected(raw, "POST", CDS, negative)[0] == 422


def test_computedomain_checked_against_the_crd_schema_from_configuration(
    raw: Raw, schema_dir: Path, tmp_path: Path
) -> None:
    bad = compute_domain(DomainSpec(run_id="typed"))
    bad["spec"]["channel"]["resourceClaimTemplate"]["name"] = 7
    code, message = rejected(raw, "POST", CDS, bad)
    assert code == 422 and "spec.channel.resourceClaimTemplate.name" in message
    assert SchemaAdmission(str(schema_dir), "v25.12.0").crd_path is not None
    with pytest.raises(FileNotFoundError, match="MNNVL_SCHEMA_DIR"):
        SchemaAdmission(str(tmp_path), "v25.12.0")


# ---- field selectors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "selector"),
    [
        (PODS, "spec.nodeName=sim-node-0"),
        (PODS, "status.phase!=Running,metadata.name=x"),
        ("/api/v1/namespaces/default/events", "involvedObject.name=x,reason=Scheduled"),
        (CDS, "metadata.name=x"),
        ("/api/v1/nodes", "spec.unschedulable=false"),
        (JOBS, "status.successful=1"),
    ],
)
def test_field_selectors_the_real_api_server_supports_are_accepted(
    raw: Raw, path: str, selector: str
) -> None:
    assert "items" in raw.call("GET", path, fieldSelector=selector)


@pytest.mark.parametrize(
    ("path", "selector"),
    [
        (PODS, "spec.containers=x"),
        (CDS, "spec.numNodes=0"),
        (JOBS, "status.active=1"),
        ("/api/v1/namespaces/default/events", "message=x"),
    ],
)
def test_other_field_selectors_are_a_400(raw: Raw, path: str, selector: str) -> None:
    code, message = rejected(raw, "GET", path, fieldSelector=selector)
    assert (code, message) == (400, f"field label not supported: {selector.split('=')[0]}")


# ---- watch ----------------------------------------------------------------------------------


def watch_lines(raw: Raw, path: str, **query: Any) -> list[dict[str, Any]]:
    resp = raw.open("GET", path, watch="true", **query)
    try:
        lines = resp.data.decode().splitlines()
    finally:
        resp.release_conn()
    return [json.loads(line) for line in lines if line.strip()]


def test_watch_sends_bookmarks_only_when_asked(raw: Raw, sim: SimCluster) -> None:
    rv = raw.call("GET", PODS)["metadata"]["resourceVersion"]
    quiet = watch_lines(raw, PODS, resourceVersion=rv, timeoutSeconds=3)
    assert quiet == []
    marked = watch_lines(
        raw, PODS, resourceVersion=rv, timeoutSeconds=3, allowWatchBookmarks="true"
    )
    assert marked and all(e["type"] == "BOOKMARK" for e in marked)
    assert marked[0]["object"]["kind"] == "Pod"
    assert int(marked[0]["object"]["metadata"]["resourceVersion"]) >= int(rv)


def test_watch_from_a_compacted_resource_version_gets_410(raw: Raw) -> None:
    old = raw.call("GET", "/api/v1/namespaces")["metadata"]["resourceVersion"]
    for i in range(25):  # more changes than the 20 the fixture's history keeps
        raw.call("POST", "/api/v1/namespaces/default/services", _svc(f"churn-{i}"))
    events = watch_lines(raw, SERVICES, resourceVersion=old, timeoutSeconds=1)
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"


def _svc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
    }
