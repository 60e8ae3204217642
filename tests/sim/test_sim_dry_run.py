"""Server-side dry run (``dryRun=All``) as a real kube-apiserver answers it: the write is
admitted and validated, the answer is what would be stored, and nothing is stored, so no
watch and no controller ever sees it (``kubectl apply --dry-run=server`` relies on this).

Each test uses the official client's ``dry_run="All"`` with dict bodies, and proves that no
controller reacted by waiting for the reaction to a real write made afterwards (a barrier).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException

from mnnvl.sim import SimCluster
from tests.sim.simkit import wait_for
from tests.sim.test_simulator import CDS, NS, Clients, G, V, missing


@pytest.fixture(scope="module")
def k() -> Iterator[Clients]:
    with SimCluster(nodes=2, gpus_per_node=0, imex_delay_s=0.1, local_gpus=[]) as sim:
        yield Clients(sim)


def _rct_exists(k: Clients, name: str) -> bool:
    return not missing(lambda: k.resource("GET", f"namespaces/{NS}/resourceclaimtemplates/{name}"))


def _job(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox", "command": ["true"]}],
                }
            }
        },
    }


def test_dry_run_create_stores_nothing_and_the_driver_never_reacts(k: Clients) -> None:
    answer = k.custom.create_namespaced_custom_object(G, V, NS, CDS, _cd("dry-cd"), dry_run="All")
    assert answer["metadata"]["name"] == "dry-cd" and answer["metadata"]["uid"]
    assert answer["spec"]["channel"]["allocationMode"] == "Single"  # defaulted, as stored
    assert not answer["metadata"].get("resourceVersion")  # never written
    assert missing(lambda: k.cd("dry-cd"))
    k.create_cd("real-cd")  # barrier: once its template exists, the controller saw both
    wait_for(lambda: _rct_exists(k, "real-cd-channel"), what="the real domain's RCT")
    assert not _rct_exists(k, "dry-cd-channel")
    assert missing(lambda: k.cd("dry-cd"))


def test_dry_run_job_runs_no_pods(k: Clients) -> None:
    answer = k.batch.create_namespaced_job(NS, _job("dry-job"), dry_run="All")
    assert answer.metadata.name == "dry-job"
    assert missing(lambda: k.batch.read_namespaced_job("dry-job", NS))
    k.batch.create_namespaced_job(NS, _job("real-job"))
    wait_for(
        lambda: k.core.list_namespaced_pod(NS, label_selector="job-name=real-job").items,
        what="the real Job's pod",
    )
    assert not k.core.list_namespaced_pod(NS, label_selector="job-name=dry-job").items


def test_dry_run_patch_and_replace_answer_the_change_and_keep_the_object(k: Clients) -> None:
    svc = k.core.create_namespaced_service(
        NS, {"metadata": {"name": "dry-svc", "labels": {"a": "1"}}, "spec": {"clusterIP": "None"}}
    )
    rv = svc.metadata.resource_version
    patched = k.core.patch_namespaced_service(
        "dry-svc", NS, {"metadata": {"labels": {"a": "2"}}}, dry_run="All"
    )
    assert patched.metadata.labels == {"a": "2"} and patched.metadata.resource_version == rv
    body = k.api.sanitize_for_serialization(k.core.read_namespaced_service("dry-svc", NS))
    body["metadata"]["labels"] = {"b": "3"}
    replaced = k.core.replace_namespaced_service("dry-svc", NS, body, dry_run="All")
    assert replaced.metadata.labels == {"b": "3"}
    now = k.core.read_namespaced_service("dry-svc", NS)
    assert now.metadata.labels == {"a": "1"} and now.metadata.resource_version == rv


def test_dry_run_delete_answers_the_terminating_object_and_deletes_nothing(k: Clients) -> None:
    k.create_cd("keep-cd")
    wait_for(lambda: k.cd("keep-cd")["metadata"].get("finalizers"), what="the finalizer")
    answer = k.custom.delete_namespaced_custom_object(G, V, NS, CDS, "keep-cd", dry_run="All")
    assert answer["metadata"]["deletionTimestamp"]  # the finalizer would hold it Terminating
    assert "deletionTimestamp" not in k.cd("keep-cd")["metadata"]
    k.core.create_namespaced_service(NS, {"metadata": {"name": "keep-svc"}, "spec": {}})
    k.core.delete_namespaced_service("keep-svc", NS, dry_run="All")
    assert k.core.read_namespaced_service("keep-svc", NS).metadata.name == "keep-svc"
    k.core.delete_collection_namespaced_service(NS, dry_run="All")
    assert k.core.read_namespaced_service("keep-svc", NS).metadata.name == "keep-svc"


def test_dry_run_still_validates_and_refuses_unknown_values(k: Clients) -> None:
    bad = _cd("bad-cd")
    bad["spec"]["channel"]["allocationMode"] = "Some"
    with pytest.raises(ApiException) as invalid:
        k.custom.create_namespaced_custom_object(G, V, NS, CDS, bad, dry_run="All")
    assert invalid.value.status == 422
    with pytest.raises(ApiException) as unknown:
        k.core.create_namespaced_service(NS, {"metadata": {"name": "x"}, "spec": {}}, dry_run="Yes")
    assert unknown.value.status == 422 and "supported values" in unknown.value.body
    assert missing(lambda: k.core.read_namespaced_service("x", NS))


def _cd(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "ComputeDomain",
        "metadata": {"name": name},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
    }
