"""What kubectl needs from the simulated API server, checked on the wire: HTTPS (kubectl sends a
kubeconfig's token only over TLS), the protobuf body of ``kubectl create namespace``, the
OpenAPI v3 documents that tell ``kubectl apply`` the server validates fields, the short
names kubectl resolves through discovery, and the Tables ``kubectl get`` prints. kubectl itself
runs these against ``mnnvl sim up`` in ``tests/sim/test_examples.py`` (the README's kubectl
lines).
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.error
import urllib.request
from typing import Any

import kubernetes
import pytest
import yaml

from mnnvl.sim import SimCluster
from tests.sim.simkit import foreign_domain, wait_for

SIM = {"tls": True, "namespaces": ("default", "team-a")}
# The body kubectl v1.32.4 sends for `kubectl create namespace foo` (its -v=9 dump).
CREATE_NAMESPACE_FOO = bytes.fromhex(
    "6b387300 0a0f0a027631 12094e616d657370616365"  # k8s\0, typeMeta {v1, Namespace}
    "121b 0a13 0a03666f6f 1200 1a00 2200 2a00 3200 3800 4200"  # raw: metadata {name: foo, ...}
    "1200 1a020a00"  # spec {}, status {phase: ""}
    "1a00 2200"  # contentEncoding, contentType
)
PROTOBUF = "application/vnd.kubernetes.protobuf"
# What kubectl v1.32 sends with every `kubectl get` (its -v=8 dump).
KUBECTL_GET = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def _kubeconfig(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        config: dict[str, Any] = yaml.safe_load(f)
    return config


def _request(
    sim: SimCluster,
    method: str,
    path: str,
    body: bytes | None = None,
    ctype: str = "",
    accept: str = "",
) -> tuple[int, Any]:
    """(status, JSON body) of a request as the admin, over the kubeconfig's TLS (a watch's
    body: the list of its events)."""
    config = _kubeconfig(sim.admin_kubeconfig_path)
    cluster = config["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    headers = {"Authorization": f"Bearer {config['users'][0]['user']['token']}"}
    if ctype:
        headers["Content-Type"] = ctype
    if accept:
        headers["Accept"] = accept
    req = urllib.request.Request(cluster["server"] + path, body, headers, method=method)
    context = ssl.create_default_context(cadata=ca)
    try:
        with urllib.request.urlopen(req, context=context, timeout=10) as resp:
            if "watch=true" in path:
                return resp.status, [json.loads(line) for line in resp.read().splitlines()]
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_sim_up_serves_https_with_a_certificate_its_kubeconfig_trusts(sim: SimCluster) -> None:
    cluster = _kubeconfig(sim.kubeconfig_path)["clusters"][0]["cluster"]
    assert cluster["server"].startswith("https://127.0.0.1:")
    api = kubernetes.config.new_client_from_config(config_file=sim.kubeconfig_path)
    pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod("default")  # the runner's token
    assert pods.items == []
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(cluster["server"] + "/version", timeout=10)  # no CA: refused
    plain = cluster["server"].replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(plain + "/version", timeout=10)


def test_kubectl_create_namespace_sends_protobuf_and_the_namespace_is_created(
    sim: SimCluster,
) -> None:
    status, created = _request(sim, "POST", "/api/v1/namespaces", CREATE_NAMESPACE_FOO, PROTOBUF)
    assert (status, created["kind"], created["metadata"]["name"]) == (201, "Namespace", "foo")
    status, account = _request(sim, "GET", "/api/v1/namespaces/foo/serviceaccounts/default")
    assert status == 200, account


def test_protobuf_the_simulator_cannot_read_is_a_415_that_says_to_send_json(
    sim: SimCluster,
) -> None:
    # kubectl create configmap x --from-literal=a=b: a ConfigMap, whose data the decoder skips.
    configmap = CREATE_NAMESPACE_FOO.replace(b"\x12\x09Namespace", b"\x12\x09ConfigMap")
    # a Namespace with a label a=b (ObjectMeta field 11), which the decoder would drop
    labelled = bytearray(CREATE_NAMESPACE_FOO)
    labelled[labelled.index(b"\x0a\x13") + 1] += 8
    labelled[labelled.index(b"\x12\x1b") + 1] += 8
    at = labelled.index(b"\x42\x00") + 2
    labelled[at:at] = b"\x5a\x06\x0a\x01a\x12\x01b"
    for body in (configmap, b"not protobuf"):
        status, answer = _request(sim, "POST", "/api/v1/namespaces", body, PROTOBUF)
        assert (status, answer["reason"]) == (415, "UnsupportedMediaType"), answer
        assert "accepted media types include: application/json" in answer["message"]
        assert "kubectl create -f and apply -f send JSON" in answer["message"]
    status, answer = _request(sim, "POST", "/api/v1/namespaces", bytes(labelled), PROTOBUF)
    assert (status, answer["reason"]) == (415, "UnsupportedMediaType"), answer
    assert "metadata field 11 is set" in answer["message"]


def test_openapi_v3_tells_kubectl_that_every_kind_validates_fields_on_the_server(
    sim: SimCluster,
) -> None:
    """What kubectl's QueryParamVerifierV3 reads: the root's group-version URLs, and in each
    document a PATCH operation for the kind with the ``fieldValidation`` query parameter."""
    status, root = _request(sim, "GET", "/openapi/v3")
    assert status == 200
    kinds = {
        ("api/v1", "Namespace"),
        ("api/v1", "Service"),
        ("apis/batch/v1", "Job"),
        ("apis/resource.k8s.io/v1", "ResourceClaimTemplate"),
        ("apis/resource.nvidia.com/v1beta1", "ComputeDomain"),
    }
    for gv_path, kind in kinds:
        status, doc = _request(sim, "GET", root["paths"][gv_path]["serverRelativeURL"])
        assert status == 200, doc
        patches = [
            op["patch"]
            for op in doc["paths"].values()
            if op["patch"]["x-kubernetes-group-version-kind"]["kind"] == kind
        ]
        assert len(patches) == 1, (gv_path, kind)
        query = {p["name"] for p in patches[0]["parameters"] if p["in"] == "query"}
        assert {"fieldValidation", "dryRun"} <= query
    assert _request(sim, "GET", "/openapi/v3/apis/apps/v1")[0] == 404


def test_discovery_names_the_short_names_kubectl_resolves(sim: SimCluster) -> None:
    status, core = _request(sim, "GET", "/api/v1")
    short = {r["name"]: r.get("shortNames", []) for r in core["resources"]}
    assert status == 200
    assert (short["namespaces"], short["pods"], short["services"]) == (["ns"], ["po"], ["svc"])
    all_category = {r["name"] for r in core["resources"] if "all" in r.get("categories", [])}
    assert all_category == {"pods", "services"}


def test_kubectl_get_is_answered_with_tables_of_pod_state_and_job_and_domain_columns(
    sim: SimCluster,
) -> None:
    command = ["python3", "-c", "print('done')"]
    container = {"name": "main", "image": "sim", "command": command}
    template = {"restartPolicy": "Never", "containers": [container]}
    job = {"metadata": {"name": "table-probe"}, "spec": {"template": {"spec": template}}}
    jobs, pods = "/apis/batch/v1/namespaces/default/jobs", "/api/v1/namespaces/default/pods"
    assert _request(sim, "POST", jobs, json.dumps(job).encode(), "application/json")[0] == 201
    cd = json.dumps(foreign_domain("table-cd")).encode()
    cds = "/apis/resource.nvidia.com/v1beta1/namespaces/default/computedomains"
    assert _request(sim, "POST", cds, cd, "application/json")[0] == 201

    def table(path: str) -> Any:
        status, answer = _request(sim, "GET", path, accept=KUBECTL_GET)
        assert (status, answer["kind"], answer["apiVersion"]) == (200, "Table", "meta.k8s.io/v1")
        return answer

    done = wait_for(
        lambda: (t := table(f"{jobs}/table-probe"))["rows"][0]["cells"][1] == "Complete" and t,
        what="the Job's table to say Complete",
    )
    assert [c["name"] for c in done["columnDefinitions"]][:4] == [
        *("Name", "Status", "Completions", "Duration")
    ]
    assert done["rows"][0]["cells"][2] == "1/1"
    listed = table(f"{pods}?labelSelector=job-name%3Dtable-probe")
    columns = [(c["name"], c["priority"]) for c in listed["columnDefinitions"]]
    wide = [("IP", 1), ("Node", 1)]  # what -o wide adds
    assert columns == [(n, 0) for n in ("Name", "Ready", "Status", "Restarts", "Age")] + wide
    (row,) = listed["rows"]
    name, ready, status, restarts, age, ip, node = row["cells"]
    assert (ready, status, restarts, ip) == ("0/1", "Completed", "0", "127.0.0.1")
    assert re.fullmatch(r"\d+s", age) and node.startswith("sim-node-"), row["cells"]
    # kubectl reads the namespace and labels (-A, --show-labels) from the row's metadata
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == name
    domain = table(f"{cds}/table-cd")
    assert [c["name"] for c in domain["columnDefinitions"]] == ["Name", "Age"]
    assert domain["rows"][0]["cells"][0] == "table-cd"
    status, plain = _request(sim, "GET", pods, accept="application/json")
    assert (status, plain["kind"]) == (200, "PodList")
    # kubectl get -w: each event's object a Table of its row, the columns with the first only
    watched = f"{pods}?watch=true&timeoutSeconds=1&labelSelector=job-name%3Dtable-probe"
    status, events = _request(sim, "GET", watched, accept=KUBECTL_GET)
    assert status == 200 and [e["object"]["kind"] for e in events] == ["Table"]
    assert events[0]["object"]["rows"][0]["cells"][:3] == [name, "0/1", "Completed"]
    assert events[0]["object"]["columnDefinitions"] == listed["columnDefinitions"]
    watched = "/api/v1/namespaces?watch=true&timeoutSeconds=1"  # default and team-a at least
    status, events = _request(sim, "GET", watched, accept=KUBECTL_GET)
    columns = [len(e["object"]["columnDefinitions"]) for e in events]
    assert status == 200 and len(columns) >= 2 and columns[0] == 2 and set(columns[1:]) == {0}
