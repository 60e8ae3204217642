"""The ComputeDomain side of the driver, over real HTTP against the simulated cluster."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.driver import Api
from mnnvl.driver.api import COMPUTE_DOMAIN, RESOURCE_CLAIM_TEMPLATE
from mnnvl.errors import CrdMissing, NotAdoptable, TeardownIncomplete, WaitTimeout
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec
from mnnvl.sim import SimCluster

DOMAIN_LABEL = "resource.nvidia.com/computeDomain"


SIM = dict(nodes=2, namespaces=("default", "quiet"))

# The kubernetes client's own code paths: make test-client-newest runs them with its newest.
pytestmark = pytest.mark.client


def new_spec(**kw) -> DomainSpec:
    return DomainSpec(run_id=f"t-{uuid.uuid4().hex[:10]}", **kw)


def kinds_of_run(sim: SimCluster, spec: DomainSpec) -> list[str]:
    return sorted(kind for kind, _, _ in sim.objects(RunNames.for_run(spec.run_id).selector))


def test_provision_creates_domain_and_waits_for_its_channel_template(sim):
    spec = new_spec()
    result = steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    names = RunNames.for_run(spec.run_id)
    assert (result.domain, result.channel_template) == (names.domain, names.channel_template)
    assert result.adopted is False and result.uid
    with Api.connect(sim.kubeconfig_path) as api:
        rct = api.get(RESOURCE_CLAIM_TEMPLATE, "default", names.channel_template)
    assert rct["metadata"]["labels"][DOMAIN_LABEL] == result.uid
    assert json.loads(json.dumps(result.to_dict())) == result.to_dict()
    steps.teardown(spec, kubeconfig=sim.kubeconfig_path)


def test_provision_twice_adopts_the_same_domain(sim):
    spec = new_spec()
    first = steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    second = steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    assert second.adopted is True and second.uid == first.uid
    assert kinds_of_run(sim, spec) == ["ComputeDomain"]
    steps.teardown(spec, kubeconfig=sim.kubeconfig_path)


def test_provision_never_reads_the_domain_so_it_cannot_wait_for_ready():
    # Every read of a ComputeDomain in this namespace (GET, LIST, WATCH) is refused. A
    # provision that polled or watched status.status for Ready would fail with exit 5; the
    # correct gate (the generated RCT) needs only the create.
    with SimCluster(nodes=2, namespaces=("gate",)) as cluster:
        cluster.faults.fail_requests("GET", "/namespaces/gate/computedomains", 403, count=1000)
        spec = new_spec(namespace="gate", rct_timeout_s=10)
        before = cluster.request_count
        result = steps.provision(spec, kubeconfig=cluster.kubeconfig_path)
        assert result.elapsed_s < 5
        assert cluster.request_count - before <= 3  # create, list RCT, (watch RCT)
        assert cluster.request_counts[("GET", "fault")] == 0


def test_foreign_domain_with_our_name_is_a_conflict(sim, capsys):
    spec = new_spec()
    names = RunNames.for_run(spec.run_id)
    body = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": names.domain, "namespace": "default", "labels": {"team": "x"}},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "someone-else"}}},
    }
    with Api.connect(sim.kubeconfig_path) as api:
        api.create(COMPUTE_DOMAIN, "default", body)
        with pytest.raises(NotAdoptable, match=names.domain):
            steps.provision(spec, kubeconfig=sim.kubeconfig_path)
        code = cli.main(["provision", "--run-id", spec.run_id, "--kubeconfig", sim.kubeconfig_path])
        result = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert code == 2 and result["exit_code"] == 2
        assert "not part of run" in result["error"]
        api.delete(COMPUTE_DOMAIN, "default", names.domain)


def test_missing_crd_exits_5_with_install_hint(capsys):
    with SimCluster(nodes=1, crd_installed=False) as cluster:
        spec = new_spec()
        with pytest.raises(CrdMissing):
            steps.provision(spec, kubeconfig=cluster.kubeconfig_path)
        code = cli.main(
            ["provision", "--run-id", spec.run_id, "--kubeconfig", cluster.kubeconfig_path]
        )
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 5 and result == {
        "ok": False,
        "command": "provision",
        "error": result["error"],
        "exit_code": 5,
    }
    assert "nvidia-dra-driver-gpu" in result["error"]
    assert "computedomains.resource.nvidia.com" in result["error"]


def test_rct_that_never_appears_times_out_naming_it(sim):
    spec = new_spec(rct_timeout_s=1.0)
    names = RunNames.for_run(spec.run_id)
    sim.faults.no_rct(names.domain)
    start = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    assert 0.9 < time.monotonic() - start < 20  # the 1 s timeout, not a longer wait
    assert names.channel_template in str(info.value)
    assert "controller" in str(info.value)
    steps.teardown(spec, kubeconfig=sim.kubeconfig_path)


def test_rct_of_another_domain_is_a_conflict(sim):
    spec = new_spec()
    names = RunNames.for_run(spec.run_id)
    squatter = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": names.channel_template,
            "namespace": "default",
            "labels": {DOMAIN_LABEL: "some-other-uid"},
        },
        "spec": {"spec": {"devices": {"requests": []}}},
    }
    with Api.connect(sim.kubeconfig_path) as api:
        api.create(RESOURCE_CLAIM_TEMPLATE, "default", squatter)
        with pytest.raises(NotAdoptable, match="already exists; the DRA controller cannot"):
            steps.provision(spec, kubeconfig=sim.kubeconfig_path)
        api.delete(RESOURCE_CLAIM_TEMPLATE, "default", names.channel_template)
    steps.teardown(spec, kubeconfig=sim.kubeconfig_path)


def test_wait_survives_watch_expiry(sim, eventually):
    # The controller is held back, so provision must watch; the first two watches get 410
    # Gone; the template appears later (made here, as the controller would) and is seen.
    spec = new_spec(rct_timeout_s=20)
    names = RunNames.for_run(spec.run_id)
    sim.faults.no_rct(names.domain)
    sim.faults.expire_watches(2)

    def controller() -> None:
        eventually(lambda: sim.faults._watch_expiries == 0, what="both watches to expire")
        with Api.connect(sim.kubeconfig_path) as api:
            lst = api.list(
                COMPUTE_DOMAIN, "default", field_selector=f"metadata.name={names.domain}"
            )
            uid = lst["items"][0]["metadata"]["uid"]
            meta = {"name": names.channel_template, "namespace": "default"}
            meta["labels"] = {DOMAIN_LABEL: uid}
            body = {"metadata": meta, "spec": {"spec": {"devices": {"requests": []}}}}
            api.create(RESOURCE_CLAIM_TEMPLATE, "default", body)

    helper = threading.Thread(target=controller)
    helper.start()
    result = steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    helper.join()
    assert result.elapsed_s < 10
    assert sim.faults.take_watch_expiry() is False  # both expiries were hit and survived
    with Api.connect(sim.kubeconfig_path) as api:
        api.delete(RESOURCE_CLAIM_TEMPLATE, "default", names.channel_template)
    steps.teardown(spec, kubeconfig=sim.kubeconfig_path)


def test_transient_503_on_create_is_retried(sim):
    spec = new_spec()
    sim.faults.fail_requests("POST", "/computedomains", 503, count=2)
    before = sim.request_count
    result = steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    assert result.adopted is False
    assert sim.request_count - before >= 4  # two refused creates, the create, the RCT list
    assert kinds_of_run(sim, spec) == ["ComputeDomain"]
    steps.teardown(spec, kubeconfig=sim.kubeconfig_path)


def test_teardown_is_idempotent(sim):
    spec = new_spec()
    steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    first = steps.teardown(spec, kubeconfig=sim.kubeconfig_path)
    second = steps.teardown(spec, kubeconfig=sim.kubeconfig_path)
    assert first.already_gone is False
    assert f"ComputeDomain default/{RunNames.for_run(spec.run_id).domain}" in first.deleted
    assert second.already_gone is True and second.deleted == []
    assert kinds_of_run(sim, spec) == []


def test_stuck_finalizer_times_out_naming_the_finalizer(sim):
    spec = new_spec(delete_timeout_s=1.0)
    names = RunNames.for_run(spec.run_id)
    steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    sim.faults.stick_finalizer("ComputeDomain", names.domain)
    with pytest.raises(TeardownIncomplete) as info:
        steps.teardown(spec, kubeconfig=sim.kubeconfig_path)
    assert info.value.exit_code == 3  # a deadline passed; what may be left is listed
    assert any(names.domain in left for left in info.value.leftovers)
    message = str(info.value)
    assert names.domain in message
    assert "finalizer resource.nvidia.com/computeDomain still present" in message
    assert "-l nvidia-dra-driver-gpu-component=controller" in message
    assert "-l dra-driver-nvidia-gpu-component=controller" in message  # the v0.4+ chart's
    sim.faults.unstick_finalizer("ComputeDomain", names.domain)


def test_reap_deletes_dead_runs_and_keeps_live_ones(sim):
    live, dead = new_spec(namespace="quiet"), new_spec(namespace="quiet")
    for spec in (live, dead):
        steps.provision(spec, kubeconfig=sim.kubeconfig_path)
    result = steps.reap(
        "quiet", live_run_ids={live.run_id}, older_than_s=0, kubeconfig=sim.kubeconfig_path
    )
    assert result.runs == [dead.run_id]
    assert kinds_of_run(sim, dead) == []
    assert kinds_of_run(sim, live) == ["ComputeDomain"]
    steps.teardown(live, kubeconfig=sim.kubeconfig_path)


def test_forbidden_create_exits_5_naming_verb_resource_and_rbac(sim, capsys):
    spec = new_spec()
    sim.faults.fail_requests("POST", "/computedomains", 403)
    code = cli.main(["provision", "--run-id", spec.run_id, "--kubeconfig", sim.kubeconfig_path])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 5 and result["exit_code"] == 5
    assert "create computedomains default/" in result["error"]
    assert "manifests/base/rbac.yaml" in result["error"]
    assert kinds_of_run(sim, spec) == []
