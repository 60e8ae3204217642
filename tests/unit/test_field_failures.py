"""Failures users report on GB200/GB300 clusters, fed to the diagnosis in their own words: the
scheduler's FailedScheduling text, the kubelet's FailedPrepareDynamicResources event, a worker's
CUDA/NCCL error line. Each is recognised as its own kind, with its fix, and only the transient
one is waited out."""

from __future__ import annotations

from typing import Any

import pytest

from mnnvl.contract.termination import Evidence
from mnnvl.driver.attempts import job_failure
from mnnvl.driver.diagnose import Grace, pod_problem, pods_progress, raise_on_stuck_pod
from mnnvl.driver.kueue import describe, evicted
from mnnvl.errors import MnnvlError, ProblemKind
from mnnvl.inputs.spec import WorkloadSpec, from_inputs

RUN = "field-a"
# kube-scheduler's FailedScheduling text (the DynamicResources and NodeAffinity filters' words).
NO_LABEL = (
    "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. preemption: "
    "0/4 nodes are available: 4 Preemption is not helpful for scheduling."
)
ONE_LABELLED = (
    "0/4 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 3 node(s) didn't "
    "match Pod's node affinity/selector. preemption: 0/4 nodes are available: 1 No preemption "
    "victims found for incoming pod, 3 Preemption is not helpful for scheduling."
)
TAINTED = (
    "0/2 nodes are available: 1 cannot allocate all claims, 1 node(s) didn't match pod "
    "anti-affinity rules. still not schedulable, preemption: 0/2 nodes are available: 2 "
    "Preemption is not helpful for scheduling."
)
# The kubelet's event around the compute-domain kubelet plugin's error while the node's IMEX
# daemon is not Ready in the domain (the plugin's words as logged in
# kubernetes-sigs/dra-driver-nvidia-gpu#1162; what #1486's pods showed until they ran).
NOT_READY = (
    "Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim "
    "default/w-0-imex-channel-8gwxw: error preparing devices for claim "
    "'default/w-0-imex-channel-8gwxw:4914da61-1a20-42b3-bf26-981025df4289': prepare devices "
    "failed: error applying config: error asserting ComputeDomain Ready: current node not ready "
    "in ComputeDomain"
)


class Api:
    """Pods, logs and a domain as the diagnosis reads them (no events)."""

    def __init__(self, pods: list[dict[str, Any]] | None = None, log: str = "") -> None:
        self.pods, self.log = pods or [], log

    def list(self, kind: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"items": self.pods if kind.plural == "pods" else []}

    def get(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise MnnvlError("not found")

    def pod_log(self, *args: Any, **kwargs: Any) -> str:
        return self.log


def _pending(unschedulable: str = "", selector: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if unschedulable:
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        status["conditions"] = [cond | {"message": unschedulable}]
    spec = {"nodeSelector": selector} if selector else {}
    return {"metadata": {"name": "w-1", "uid": "u1", "labels": {}}, "spec": spec, "status": status}


def _stuck(workload: WorkloadSpec, pod: dict[str, Any], grace_s: float) -> MnnvlError | None:
    try:
        raise_on_stuck_pod(Api(), workload, {"w-1": pod}, {}, Grace(grace_s))  # type: ignore[arg-type]
    except MnnvlError as err:
        return err
    return None


def _workload(**fields: Any) -> WorkloadSpec:
    return from_inputs(WorkloadSpec, run_id=RUN, namespace="default", nodes=2, **fields)


def test_no_node_with_the_clique_label_is_said_by_name_with_the_counts() -> None:
    assert _stuck(_workload(), _pending(NO_LABEL), 60) is None  # a label may come back
    err = _stuck(_workload(), _pending(NO_LABEL), 0)
    assert err is not None and err.exit_code == 4
    assert err.problem is ProblemKind.NO_CLIQUE_LABEL
    message = str(err)
    assert (
        "at most 0 of 4 nodes carry the clique label nvidia.com/gpu.clique and a clique group "
        "needs 2 nodes" in message
    )
    assert "gpuCliqueLabelEnabled" in message and "--clique-label" in message


def test_too_few_labelled_nodes_for_a_group_under_a_providers_key() -> None:
    workload = _workload(clique_label="cloud.example.com/nvlink-domain")
    err = _stuck(workload, _pending(ONE_LABELLED), 0)
    assert err is not None and err.problem is ProblemKind.NO_CLIQUE_LABEL
    assert "at most 1 of 4 nodes carry the clique label cloud.example.com/nvlink-domain" in str(err)


def test_a_node_selector_pod_is_not_blamed_on_the_label() -> None:
    # Kueue's topology assignment (or the user's selector) also fails the node affinity filter.
    err = _stuck(_workload(), _pending(NO_LABEL, {"kubernetes.io/hostname": "n3"}), 0)
    assert err is not None and err.problem is ProblemKind.UNSCHEDULABLE
    # Without clique affinity the label is asked for by nothing.
    err = _stuck(_workload(clique_affinity=False), _pending(NO_LABEL), 0)
    assert err is not None and err.problem is ProblemKind.UNSCHEDULABLE


def test_a_claim_refused_by_a_device_taint_names_the_taint_and_the_health_check() -> None:
    assert _stuck(_workload(gpu_mode="claim"), _pending(TAINTED), 60) is None
    err = _stuck(_workload(gpu_mode="claim"), _pending(TAINTED), 0)
    assert err is not None and err.exit_code == 4
    assert err.problem is ProblemKind.CLAIM_UNALLOCATABLE
    message = str(err)
    assert "no node could allocate the pod's device claims" in message
    assert "DRADeviceTaints" in message and "gpu.nvidia.com/xid" in message
    assert "NVML health check" in message


def test_prepare_waiting_for_the_imex_daemon_is_transient_and_says_so() -> None:
    creating = _pending()
    creating["status"]["containerStatuses"] = [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}
    ]
    creating["spec"]["nodeName"] = "n1"
    event = {
        "reason": "FailedPrepareDynamicResources",
        "message": NOT_READY,
        "involvedObject": {"name": "w-1"},
        "metadata": {"resourceVersion": "7"},
    }
    # Never permanent, however long it lasts: the pods-running deadline bounds it.
    assert pod_problem(creating, event, retries=False, grace=Grace(0)) is None
    line = pods_progress(Api(), _workload(), {"w-1": creating}, 0, "", {"e": event})  # type: ignore[arg-type]
    assert "FailedPrepareDynamicResources, transient: the kubelet retries" in line
    assert "current node not ready in ComputeDomain" in line


@pytest.mark.parametrize(
    "said",
    [
        # kubernetes-sigs/dra-driver-nvidia-gpu#1417, in CUDA's words (GB200 and GB300).
        "RuntimeError: CUDA error in cuMemImportFromShareableHandle: invalid resource handle",
        # NCCL's CUCHECK on the same call (CUDA_ERROR_INVALID_HANDLE is 400).
        "w-1:123:456 [0] transport/nvls.cc:215 NCCL WARN Cuda failure 400 'invalid resource "
        "handle'",
    ],
    ids=["cuda", "nccl"],
)
def test_an_imex_import_refused_in_the_workers_log_names_the_daemon_fix(said: str) -> None:
    failed = {
        "metadata": {
            "name": "w-1",
            "uid": "u1",
            "annotations": {"batch.kubernetes.io/job-completion-index": "1"},
        },
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
        },
    }
    log = f"step 3 loss 2.1\n{said}\nTraceback (most recent call last): ..."
    condition = {"reason": "FailedIndexes", "message": "Job has failed indexes"}
    found = job_failure(Api([failed], log), _workload(max_restarts=0), "w", condition, "1")  # type: ignore[arg-type]
    assert found.kind is ProblemKind.IMEX_IMPORT and found.exit_code == 1
    assert said.strip() in found.message
    assert "although the domain's IMEX daemons look healthy" in found.message
    assert "#1417" in found.message and "nvidia-imex-ctl -N" in found.message


def test_the_job_failing_for_good_names_the_rank_node_gpu_and_evidence_that_ended_it() -> None:
    said = Evidence(
        reason="crashed",
        rank=3,
        gpu="1",
        exit_code=1,
        step="40",
        error="RuntimeError: NCCL error: unhandled system error",
        nvlink={"1": {"crc": 7}},
    )
    failed = {
        "metadata": {
            "name": "w-1",
            "uid": "u1",
            "annotations": {"batch.kubernetes.io/job-completion-index": "1"},
        },
        "spec": {"nodeName": "gb-node-7"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": 1, "message": said.to_message()}}}
            ],
        },
    }
    condition = {"reason": "BackoffLimitExceeded", "message": "Job has reached the limit"}
    found = job_failure(Api([failed]), _workload(max_restarts=0), "w", condition, "1")  # type: ignore[arg-type]
    assert found.exit_code == 1 and found.pod == "w-1"
    # Worded as each failed attempt's warning is (attempts.Attempt.names and the evidence).
    assert "pod w-1 (rank 3, GPU 1) on node gb-node-7 (index 1)" in found.message
    assert "NVLink errors on GPU 1: crc +7" in found.message
    assert "at step 40" in found.message
    assert "last line: RuntimeError: NCCL error: unhandled system error" in found.message


def test_kueues_eviction_words_name_the_reason_and_the_requeue_count() -> None:
    # As Kueue v0.19 leaves a preempted Workload (pkg/scheduler/preemption/preemption.go) and
    # one evicted for its PodsReady timeout (pkg/controller/core/workload_controller.go).
    preempted_by = (
        "Preempted to accommodate a workload (UID: 5f1c, JobUID: 9a2e) due to prioritization in "
        "the ClusterQueue; preemptor path: /mnnvl; preemptee path: /mnnvl"
    )
    preempted = {
        "status": {
            "conditions": [
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": "Preempted",
                    "message": preempted_by,
                },
                {
                    "type": "Preempted",
                    "status": "True",
                    "reason": "InClusterQueue",
                    "message": preempted_by,
                },
                {
                    "type": "Requeued",
                    "status": "True",
                    "reason": "Preempted",
                    "message": preempted_by,
                },
                {"type": "QuotaReserved", "status": "False", "reason": "Pending"},
            ]
        }
    }
    timed_out = {
        "status": {
            "requeueState": {"count": 3, "requeueAt": "2026-12-01T10:04:00Z"},
            "conditions": [
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": "PodsReadyTimeout",
                    "message": "Exceeded the PodsReady timeout team-a/job-x-1a2b3",
                },
                {"type": "Requeued", "status": "False", "reason": "PodsReadyTimeout"},
            ],
        }
    }
    said = describe({"job-p": preempted})
    assert said.startswith("Workload job-p Evicted (Preempted: Preempted to accommodate a workload")
    assert "InClusterQueue: Preempted to accommodate" in said
    said = describe({"job-x": timed_out})
    assert said == (
        "Workload job-x Evicted (PodsReadyTimeout: Exceeded the PodsReady timeout "
        "team-a/job-x-1a2b3); requeued 3 time(s) (status.requeueState.count), back-off until "
        "2026-12-01T10:04:00Z"
    )
    assert evicted({"job-x": timed_out}) == said
    readmitted = {
        "status": {**timed_out["status"], "conditions": [{"type": "Admitted", "status": "True"}]}
    }
    assert describe({"job-x": readmitted}).startswith("Workload job-x Admitted; requeued 3 time(s)")
    assert evicted({"job-x": readmitted}) == ""
