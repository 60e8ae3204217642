"""The simulator behaves like the real components where order and timing matter: the
scheduler, graceful deletion, IMEX loss, namespaces, cliques and DRA prepare errors.

Each test drives the unmodified ``kubernetes`` client over HTTP and asserts what a real
cluster would show at that moment (see the fidelity table in ``mnnvl/sim/README.md``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from mnnvl.sim import SimCluster
from tests.sim.simkit import CD_PATH, Raw, pod_body, wait_for

NS = "default"


def phase(raw: Raw, name: str, ns: str = NS) -> str:
    return str(raw.pod(name, ns).get("status", {}).get("phase"))


SIM = dict(
    nodes=2, gpus_per_node=2, local_gpus=[], imex_delay_s=0.1, namespaces=("default", "other")
)


# ---- API server ------------------------------------------------------------------------------


def test_a_caller_without_permission_is_forbidden_even_where_no_api_serves_the_resource(
    sim: SimCluster, raw: Raw
) -> None:
    # kube-apiserver authorizes before it routes (DefaultBuildHandlerChain wraps the API in
    # WithAuthorization): the runner's Role grants nothing in this group, so 403, not 404.
    path = "/apis/widgets.example.com/v1/namespaces/default/widgets"
    with pytest.raises(ApiException) as refused:
        Raw(sim, sim.kubeconfig_path).call("GET", path)
    assert refused.value.status == 403
    said = json.loads(refused.value.body)["message"]
    assert 'cannot list resource "widgets" in API group "widgets.example.com"' in said
    with pytest.raises(ApiException) as missing:  # a caller allowed everything: not served
        raw.call("GET", path)
    assert missing.value.status == 404


def test_a_job_created_without_completions_or_parallelism_gets_upstreams_defaults(
    raw: Raw,
) -> None:
    template = {
        "metadata": {"labels": {"app": "once"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
    }
    created = raw.call(
        "POST",
        "/apis/batch/v1/namespaces/default/jobs",
        {"metadata": {"name": "defaults"}, "spec": {"template": template}},
    )
    spec = created["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert (spec["completionMode"], spec["suspend"]) == ("NonIndexed", False)
    assert spec["podReplacementPolicy"] == "TerminatingOrFailed"
    assert created["metadata"]["labels"] == {"app": "once"}
    queue = raw.call(
        "POST",
        "/apis/batch/v1/namespaces/default/jobs",
        {"metadata": {"name": "queue"}, "spec": {"completions": 3, "template": template}},
    )
    assert (queue["spec"]["completions"], queue["spec"]["parallelism"]) == (3, 1)
    for name in ("defaults", "queue"):
        raw.call(
            "DELETE",
            f"/apis/batch/v1/namespaces/default/jobs/{name}",
            {"propagationPolicy": "Background"},
        )


# ---- scheduler ------------------------------------------------------------------------------


def test_new_pod_is_pending_without_conditions_and_bound_a_moment_later(raw: Raw) -> None:
    created = raw.create_pod(pod_body("sched-later"))
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    assert "nodeName" not in created["spec"]
    assert not raw.pod("sched-later")["status"].get("conditions")  # not at once
    pod = wait_for(
        lambda: raw.pod("sched-later")["spec"].get("nodeName") and raw.pod("sched-later")
    )
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["status"] == "True"
    raw.call("DELETE", "/api/v1/namespaces/default/pods/sched-later", gracePeriodSeconds=0)


def test_unschedulable_is_marked_asynchronously_with_the_schedulers_message(raw: Raw) -> None:
    raw.create_pod(pod_body("too-big", gpus=3))
    assert not raw.pod("too-big")["status"].get("conditions")
    cond = wait_for(
        lambda: next(iter(raw.pod("too-big")["status"].get("conditions") or []), None),
        what="PodScheduled condition",
    )
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "PodScheduled",
        "False",
        "Unschedulable",
    )
    assert cond["message"] == (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
        "available: 2 No preemption victims found for incoming pod."
    )
    raw.call("DELETE", "/api/v1/namespaces/default/pods/too-big")
    assert raw.gone("/api/v1/namespaces/default/pods/too-big")  # never bound: deleted at once


def test_unschedulable_pod_is_bound_once_capacity_frees(raw: Raw) -> None:
    for name in ("fill-0", "fill-1", "waiter"):
        raw.create_pod(pod_body(name, gpus=2))
    wait_for(
        lambda: any(
            c.get("reason") == "Unschedulable"
            for c in raw.pod("waiter")["status"].get("conditions") or []
        ),
        what="waiter Unschedulable",
    )
    raw.call("DELETE", "/api/v1/namespaces/default/pods/fill-0", gracePeriodSeconds=0)
    wait_for(lambda: raw.pod("waiter")["spec"].get("nodeName"), what="waiter bound")
    for name in ("fill-1", "waiter"):
        raw.call("DELETE", f"/api/v1/namespaces/default/pods/{name}", gracePeriodSeconds=0)


def test_gated_pod_is_never_scheduled_until_its_last_gate_is_removed(raw: Raw) -> None:
    body = pod_body("gated")
    body["spec"]["schedulingGates"] = [{"name": "example.com/a"}, {"name": "example.com/b"}]
    created = raw.create_pod(body)
    # kube-apiserver marks a gated pod on create; the scheduler never tries it.
    assert created["status"]["conditions"] == [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates",
            "lastProbeTime": None,
            "lastTransitionTime": created["status"]["conditions"][0]["lastTransitionTime"],
        }
    ]
    path = "/api/v1/namespaces/default/pods/gated"
    raw.call("PATCH", path, {"spec": {"schedulingGates": [{"name": "example.com/b"}]}})
    raw.create_pod(pod_body("probe"))  # seen after the patch: an ungated pod is bound no later
    wait_for(lambda: raw.pod("probe")["spec"].get("nodeName"), what="probe bound")
    pod = raw.pod("gated")
    assert "nodeName" not in pod["spec"]
    assert [c["reason"] for c in pod["status"]["conditions"]] == ["SchedulingGated"]
    raw.call("PATCH", path, {"spec": {"schedulingGates": None}})
    wait_for(lambda: raw.pod("gated")["spec"].get("nodeName"), what="gated pod bound")
    raw.call("DELETE", path, gracePeriodSeconds=0)
    raw.call("DELETE", "/api/v1/namespaces/default/pods/probe", gracePeriodSeconds=0)


# ---- deletion -------------------------------------------------------------------------------

TRAP_TERM = (
    "import os, signal, sys, time\n"
    "out = sys.argv[1]\n"
    "def term(*_):\n"
    "    open(out, 'a').write('TERM\\n')\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "open(out, 'a').write(f'PID {os.getpid()}\\n')\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)


def trap_pod(name: str, out: Path, grace_s: int) -> dict[str, Any]:
    body = pod_body(name, TRAP_TERM, grace_s=grace_s)
    body["spec"]["containers"][0]["command"] += [str(out)]
    return body


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as dead)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


def test_deleted_pod_is_terminating_for_its_grace_period_then_sigkilled_and_404(
    raw: Raw, tmp_path: Path
) -> None:
    out = tmp_path / "signals"
    raw.create_pod(trap_pod("graceful", out, grace_s=1))
    wait_for(lambda: phase(raw, "graceful") == "Running" and out.exists(), what="Running")
    pid = int(out.read_text().split()[1])
    start = time.monotonic()
    raw.call("DELETE", "/api/v1/namespaces/default/pods/graceful")
    terminating = raw.pod("graceful")
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 1
    wait_for(lambda: "TERM" in out.read_text(), what="SIGTERM")
    assert not raw.gone("/api/v1/namespaces/default/pods/graceful")  # still Terminating
    wait_for(lambda: raw.gone("/api/v1/namespaces/default/pods/graceful"), what="404")
    assert time.monotonic() - start >= 0.9  # the whole grace period
    assert not alive(pid)  # ignored SIGTERM, so SIGKILL


def test_foreground_job_deletion_keeps_the_job_until_its_pods_are_gone(
    raw: Raw, tmp_path: Path
) -> None:
    out = tmp_path / "signals"
    tmpl = trap_pod("ignored", out, grace_s=1)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "fg"},
        "spec": {"backoffLimit": 0, "template": {"spec": tmpl["spec"]}},
    }
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    raw.call("POST", jobs, job)
    pods = "/api/v1/namespaces/default/pods"
    wait_for(
        lambda: (
            [p for p in raw.call("GET", pods, labelSelector="job-name=fg")["items"]]
            and out.exists()
        ),
        what="pod started",
    )
    raw.call("DELETE", f"{jobs}/fg", {"propagationPolicy": "Foreground"})
    held = raw.get(f"{jobs}/fg")
    assert held["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in held["metadata"]["finalizers"]
    wait_for(lambda: raw.gone(f"{jobs}/fg"), what="Job gone")
    assert raw.call("GET", pods, labelSelector="job-name=fg")["items"] == []
    assert "TERM" in out.read_text()


def test_namespace_deletion_waits_for_a_stuck_domain_finalizer(sim: SimCluster) -> None:
    raw = Raw(sim)
    raw.call("POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    raw.create_cd("stuck", ns="doomed")
    sim.faults.stick_finalizer("ComputeDomain", "stuck")
    raw.call("DELETE", "/api/v1/namespaces/doomed")
    ns = raw.get("/api/v1/namespaces/doomed")
    assert ns["status"]["phase"] == "Terminating"
    time.sleep(0.5)
    assert not raw.gone("/api/v1/namespaces/doomed")
    with pytest.raises(ApiException) as forbidden:
        raw.create_pod(pod_body("late"), ns="doomed")
    assert forbidden.value.status == 403
    assert "being terminated" in json.loads(forbidden.value.body)["message"]
    sim.faults.unstick_finalizer("ComputeDomain", "stuck")
    raw.call(  # any change wakes the controller, which now drops its finalizer
        "PATCH",
        CD_PATH.format(ns="doomed") + "/stuck",
        {"metadata": {"labels": {"poke": "1"}}},
    )
    wait_for(lambda: raw.gone("/api/v1/namespaces/doomed"), what="namespace gone")


# ---- IMEX loss ------------------------------------------------------------------------------


def test_deleting_a_domain_under_running_pods_kills_them_and_fails_them_naming_it(
    raw: Raw, sim: SimCluster
) -> None:
    raw.create_cd("early")
    raw.create_pod(pod_body("imex-user", claim_template="early-ch"))
    wait_for(lambda: phase(raw, "imex-user") == "Running", what="Running")
    raw.call("DELETE", CD_PATH.format(ns=NS) + "/early")
    pod = wait_for(
        lambda: phase(raw, "imex-user") == "Failed" and raw.pod("imex-user"), what="Failed"
    )
    assert pod["status"]["reason"] == "IMEXDomainLost"
    assert "ComputeDomain default/early" in pod["status"]["message"]
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 137 and "IMEX domain" in term["message"]
    reasons = [e["reason"] for e in sim.events if e["involvedObject"]["name"] == "imex-user"]
    assert "IMEXDomainLost" in reasons
    raw.call("DELETE", "/api/v1/namespaces/default/pods/imex-user")
    wait_for(lambda: raw.gone(CD_PATH.format(ns=NS) + "/early"), what="domain gone")


def test_lost_node_pod_is_evicted_after_its_toleration_and_pod_gc_fails_it_once_node_gone() -> None:
    # As the real control plane: nothing fails the pod while its kubelet is unreachable;
    # the taint-eviction controller deletes it after the default toleration (it stays
    # Terminating), and pod GC marks it Failed and force-deletes it once the node is gone.
    with SimCluster(
        nodes=2, local_gpus=[], imex_delay_s=0.1, default_toleration_s=1, pod_gc_quarantine_s=0.5
    ) as sim:
        raw = Raw(sim)
        raw.create_cd("rack")
        body = pod_body("on-lost", claim_template="rack-ch", node="sim-node-1")
        body["metadata"]["finalizers"] = ["example.com/keep"]  # to read its last status
        raw.create_pod(body)
        wait_for(lambda: phase(raw, "on-lost") == "Running", what="Running")
        tolerations = raw.pod("on-lost")["spec"]["tolerations"]
        assert {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 1,
        } in tolerations
        sim.lose_node("sim-node-1")
        pod = wait_for(
            lambda: raw.pod("on-lost")["metadata"].get("deletionTimestamp") and raw.pod("on-lost")
        )
        assert pod["status"]["phase"] == "Running"  # no kubelet moves it on
        target = [c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert target and target[0]["reason"] == "DeletionByTaintManager"
        events = [e for e in sim.events if e["involvedObject"]["name"] == "on-lost"]
        assert any(
            e["reason"] == "TaintManagerEviction"
            and e["message"] == "Marking for deletion Pod default/on-lost"
            for e in events
        )
        assert not any(e["reason"] == "IMEXDomainLost" for e in events)
        time.sleep(1.5)
        assert raw.pod("on-lost")["status"]["phase"] == "Running"  # Terminating for good
        raw.call("DELETE", "/api/v1/nodes/sim-node-1")
        pod = wait_for(lambda: phase(raw, "on-lost") == "Failed" and raw.pod("on-lost"))
        target = [c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert target[0]["reason"] == "DeletionByPodGC"
        assert target[0]["message"] == "PodGC: node no longer exists"
        assert pod["metadata"]["deletionGracePeriodSeconds"] == 0
        raw.create_pod(pod_body("after"))
        wait_for(lambda: raw.pod("after")["spec"].get("nodeName") == "sim-node-0")


def test_out_of_service_taint_lets_pod_gc_force_delete_a_pod_stuck_terminating() -> None:
    with SimCluster(nodes=2, local_gpus=[], imex_delay_s=0.1, default_toleration_s=30) as sim:
        raw = Raw(sim)
        raw.create_pod(pod_body("stuck", node="sim-node-1"))
        wait_for(lambda: phase(raw, "stuck") == "Running", what="Running")
        sim.lose_node("sim-node-1")
        taint = {
            "key": "node.kubernetes.io/out-of-service",
            "value": "nodeshutdown",
            "effect": "NoExecute",
        }
        node = raw.call("GET", "/api/v1/nodes/sim-node-1")
        raw.call(
            "PATCH",
            "/api/v1/nodes/sim-node-1",
            {"spec": {"taints": [*node["spec"]["taints"], taint]}},
        )
        wait_for(lambda: raw.gone("/api/v1/namespaces/default/pods/stuck"), what="pod gone")


# ---- cliques and DRA prepare errors ---------------------------------------------------------


def test_cliques_label_nodes_and_report_per_node_clique_ids() -> None:
    with SimCluster(nodes=4, cliques=2, local_gpus=[], imex_delay_s=0.1) as sim:
        raw = Raw(sim)
        nodes = raw.get("/api/v1/nodes")["items"]
        cliques = [n["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in nodes]
        assert len(set(cliques)) == 2 and cliques.count(cliques[0]) == 2
        cd = raw.create_cd("wide")
        for i, node in ((0, "sim-node-0"), (2, "sim-node-2")):
            raw.create_pod(pod_body(f"w{i}", claim_template="wide-ch", node=node))
        path = CD_PATH.format(ns=NS) + "/wide"
        status = wait_for(
            lambda: (
                len((raw.get(path).get("status") or {}).get("nodes") or []) == 2
                and raw.get(path)["status"]
            )
        )
        by_node = {e["name"]: e for e in status["nodes"]}
        assert by_node["sim-node-0"]["cliqueID"] == f"{sim.cluster_uuid}.0"
        assert by_node["sim-node-2"]["cliqueID"] == f"{sim.cluster_uuid}.1"
        assert by_node["sim-node-0"]["index"] == by_node["sim-node-2"]["index"] == 0
        assert cd["metadata"]["uid"]


def prepare_events(sim: SimCluster, pod: str) -> list[str]:
    return [
        e["message"]
        for e in sim.events
        if e["involvedObject"]["name"] == pod and e["reason"] == "FailedPrepareDynamicResources"
    ]


def test_claim_in_another_namespace_than_its_domain_fails_prepare_as_the_driver_words_it(
    raw: Raw, sim: SimCluster
) -> None:
    raw.create_cd("home")
    rct = raw.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates/home-ch")
    copy = {"metadata": {"name": "borrowed"}, "spec": rct["spec"]}
    raw.call("POST", "/apis/resource.k8s.io/v1/namespaces/other/resourceclaimtemplates", copy)
    raw.create_pod(pod_body("stranger", claim_template="borrowed"), ns="other")
    message = wait_for(lambda: prepare_events(sim, "stranger"), what="event")[0]
    assert message.startswith("Failed to prepare dynamic resources: prepare dynamic resources: ")
    assert message.endswith(
        "error applying config: error asserting ComputeDomain's namespace: "
        "the ResourceClaim's namespace is different than the ComputeDomain's namespace"
    )
    assert phase(raw, "stranger", "other") == "Pending"
    raw.call("DELETE", "/api/v1/namespaces/other/pods/stranger", gracePeriodSeconds=0)


def test_node_labelled_for_another_domain_fails_prepare_with_the_drivers_words(
    raw: Raw, sim: SimCluster
) -> None:
    raw.create_cd("second")
    raw.call(
        "PATCH",
        "/api/v1/nodes/sim-node-1",
        {"metadata": {"labels": {"resource.nvidia.com/computeDomain": "another-uid"}}},
    )
    raw.create_pod(pod_body("blocked", claim_template="second-ch", node="sim-node-1"))
    message = wait_for(lambda: prepare_events(sim, "blocked"), what="event")[0]
    assert message.endswith(
        "error adding Node label for ComputeDomain: "
        "label already exists for a different ComputeDomain"
    )
    raw.call("DELETE", "/api/v1/namespaces/default/pods/blocked", gracePeriodSeconds=0)
    raw.call(
        "PATCH",
        "/api/v1/nodes/sim-node-1",
        {"metadata": {"labels": {"resource.nvidia.com/computeDomain": None}}},
    )


def test_teardown_of_a_running_workload_deletes_it_before_the_domain(tmp_path: Path) -> None:
    """The driver's teardown order, judged by the stricter simulator: deleting the domain
    first would fail the running pods with IMEXDomainLost (previous test)."""
    from mnnvl import steps
    from mnnvl.driver.api import Api
    from mnnvl.driver.workload import create_workload
    from mnnvl.inputs.spec import DomainSpec, WorkloadSpec

    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    with SimCluster(nodes=2, local_gpus=[], imex_delay_s=0.1) as sim:
        domain = DomainSpec(run_id="order", delete_timeout_s=30)
        workload = WorkloadSpec(
            run_id="order", purpose="job", nodes=2, gpus_per_node=0,
            env={"PYTHONPATH": str(tmp_path)},
        )  # fmt: skip
        steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        api = Api.connect(sim.kubeconfig_path)
        try:
            (job,), _ = create_workload(api, workload, "sleeper", [])
            running = f"batch.kubernetes.io/job-name={job}"
            # a pod's processes: its launcher and the worker it forks
            pods = lambda: {pod for _, pod, _ in sim.processes(running)}  # noqa: E731
            wait_for(lambda: len(pods()) == 2, timeout=60, what="2 pods running")
        finally:
            api.close()
        result = steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
        assert result.deleted and not sim.objects()
        assert not [e for e in sim.events if e["reason"] == "IMEXDomainLost"]


def test_invalid_image_reference_holds_the_pod_in_invalid_image_name(
    raw: Raw, sim: SimCluster
) -> None:
    body = pod_body("bad-image")
    body["spec"]["containers"][0]["image"] = "Registry Host/My Image"
    raw.create_pod(body)
    waiting = wait_for(
        lambda: (
            (raw.pod("bad-image")["status"].get("containerStatuses") or [{}])[0]
            .get("state", {})
            .get("waiting", {})
            .get("reason")
            == "InvalidImageName"
            and raw.pod("bad-image")["status"]["containerStatuses"][0]["state"]["waiting"]
        ),
        what="InvalidImageName",
    )
    assert "invalid reference format" in waiting["message"]
    assert phase(raw, "bad-image") == "Pending"
    raw.call("DELETE", "/api/v1/namespaces/default/pods/bad-image")
    wait_for(lambda: raw.gone("/api/v1/namespaces/default/pods/bad-image"), what="404")
