"""``--gpu-mode auto``: how this cluster gives pods GPUs, from what the runner may read.

The namespaced Role (``manifests/base``) reads nothing cluster-scoped; the optional cluster
reader (``manifests/overlays/cluster-reader``) lets a step read the GPU DeviceClass, the nodes
and the ResourceSlices. ``auto`` becomes, in this order:

- ``limits`` when the DeviceClass (``gpu_device_class``) does not exist: no DRA GPUs;
- ``limits`` when a node has allocatable ``nvidia.com/gpu``: the device plugin serves GPUs;
- ``limits`` when the DeviceClass maps ``nvidia.com/gpu`` (``spec.extendedResourceName``,
  KEP-5004, beta in Kubernetes 1.36; the DRA driver's own chart sets it on ``resource.k8s.io/v1``):
  the scheduler allocates the class's devices for such limits;
- ``claim`` when the DeviceClass maps nothing, or no node has ``nvidia.com/gpu``: GPUs come only
  from the DRA driver (GPU Operator v26.7.0's ``GPUCluster`` renders ``gpu.nvidia.com`` without
  ``extendedResourceName``, ``manifests/state-dra-driver/0400_deviceclass-gpu.yaml``);
- ``limits`` when neither can be read; a pod then Unschedulable with ``Insufficient
  nvidia.com/gpu`` names ``--gpus-per-node 0`` and ``--gpu-mode claim`` (:func:`shortage_hint`).

Where nodes and ResourceSlices are readable and show no GPU at all, ``auto`` refuses the step
before any object is created, naming ``--gpus-per-node 0``. The scheduler's message alone cannot
say so: ``Insufficient nvidia.com/gpu`` reads the same for GPUs in use and for none at all.

The decision is part of the Job's identity (its pod template asks for GPUs one way or the
other), so it is recorded on the Job (``GPU_MODE_ANNOTATION``) and a step that meets its own
Job (a retry after its pod was lost, a rerun) takes it from there instead of deciding again:
the cluster reader bound or unbound meanwhile, or a device-plugin pool scaled, never turns
the step's own Job into "a different spec". The pure builders render ``auto`` as ``limits``
(``mnnvl render`` needs no cluster).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from mnnvl.driver.api import DEVICE_CLASS, JOB, NODE, RESOURCE_SLICE, Api
from mnnvl.driver.ownership import FAILURE_ANNOTATION, owned_by_run
from mnnvl.errors import MnnvlError, NotFound, SpecError
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import rank0_job

logger = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_DRIVER = "gpu.nvidia.com"
CLUSTER_READER = "manifests/overlays/cluster-reader"
NO_GPUS = (
    f"no node of this cluster has a GPU (none offers {GPU_RESOURCE} and the DRA driver "
    "publishes no GPU device); for CPU workers pass --gpus-per-node 0"
)
# On each Job of a step: the GPU mode its pods ask for (limits or claim).
GPU_MODE_ANNOTATION = "mnnvl.io/gpu-mode"
GPU_MODES = ("limits", "claim")


def resolve_gpu_mode(api: Api, workload: WorkloadSpec) -> WorkloadSpec:
    """The workload with ``gpu_mode`` ``auto`` decided (logged once, with why): as recorded
    on the step's Job when it exists, else from what the cluster shows now."""
    place = workload.placement
    if place.gpu_mode != "auto" or workload.gpus_per_node == 0:
        return workload
    mode, why = recorded_gpu_mode(api, workload) or choose_gpu_mode(api, place.gpu_device_class)
    logger.info("--gpu-mode auto: %s (%s)", mode, why)
    return dataclasses.replace(workload, placement=dataclasses.replace(place, gpu_mode=mode))


def recorded_gpu_mode(api: Api, workload: WorkloadSpec) -> tuple[str, str] | None:
    """The mode the step's rank-0 Job was created with, when that Job exists, is the run's
    and is not the record of a failed step (other input may replace that)."""
    ns, name = workload.namespace, rank0_job(workload)
    try:
        job = api.get(JOB, ns, name)
    except NotFound:
        return None
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    mode = annotations.get(GPU_MODE_ANNOTATION)
    if mode not in GPU_MODES or FAILURE_ANNOTATION in annotations:
        return None
    if not owned_by_run(job, workload.run_id):
        return None
    return str(mode), f"as decided when Job {ns}/{name} of this step was created"


def with_gpu_mode(job: dict[str, Any], workload: WorkloadSpec) -> dict[str, Any]:
    """``job`` annotated with the GPU mode its pods ask for (see ``GPU_MODE_ANNOTATION``)."""
    if workload.gpus_per_node == 0:
        return job
    meta = job["metadata"]
    mode = workload.placement.gpu_mode
    annotations = {**(meta.get("annotations") or {}), GPU_MODE_ANNOTATION: mode}
    return {**job, "metadata": {**meta, "annotations": annotations}}


def choose_gpu_mode(api: Api, device_class: str) -> tuple[str, str]:
    """(mode, why) for ``auto``. Raises ``SpecError`` where the cluster shows it has no GPU of
    any kind (nodes and ResourceSlices readable): no pod asking for GPUs could ever start."""
    plugin_nodes = device_plugin_nodes(api)
    if plugin_nodes == 0 and dra_gpu_devices(api) == 0:
        raise SpecError("gpus_per_node", NO_GPUS)
    try:
        spec = api.get(DEVICE_CLASS, "", device_class).get("spec") or {}
        mapped: str | None = str(spec.get("extendedResourceName") or "")
    except NotFound:
        return "limits", f"no DeviceClass {device_class}: GPUs come from the device plugin"
    except MnnvlError:
        mapped = None  # not readable without the cluster reader
    if plugin_nodes:
        return "limits", f"{plugin_nodes} node(s) offer {GPU_RESOURCE} (the device plugin)"
    if mapped == GPU_RESOURCE:
        return "limits", f"DeviceClass {device_class} maps {GPU_RESOURCE} (extendedResourceName)"
    if mapped is not None or plugin_nodes == 0:
        return "claim", (
            f"no node offers {GPU_RESOURCE} and DeviceClass {device_class} maps no extended "
            "resource: GPUs come only from the DRA driver"
            if mapped is not None
            else f"no node offers {GPU_RESOURCE}: GPUs come only from the DRA driver"
        )
    return "limits", (
        f"neither DeviceClass {device_class} nor the nodes are readable ({CLUSTER_READER} "
        "grants that); a pod that finds no GPUs says so"
    )


def device_plugin_nodes(api: Api) -> int | None:
    """How many nodes have allocatable ``nvidia.com/gpu``; None when nodes are not readable."""
    try:
        nodes = api.list(NODE, "")["items"]
    except MnnvlError:
        return None
    return sum(
        1
        for n in nodes
        if str(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")) != "0"
    )


def dra_gpu_devices(api: Api) -> int | None:
    """How many GPU devices the DRA driver publishes; None when ResourceSlices are not readable."""
    try:
        slices = api.list(RESOURCE_SLICE, "")["items"]
    except MnnvlError:
        return None
    return sum(
        len((s.get("spec") or {}).get("devices") or [])
        for s in slices
        if (s.get("spec") or {}).get("driver") == GPU_DRIVER
    )


def shortage_hint(api: Api, unschedulable: str) -> str:
    """For a pod the scheduler finds no free ``nvidia.com/gpu`` for: where the cluster's GPUs
    come only from the DRA driver, say so and name ``--gpu-mode claim`` ("" otherwise)."""
    if f"Insufficient {GPU_RESOURCE}" not in unschedulable:
        return ""
    devices = dra_gpu_devices(api)
    if devices is None:
        return (
            f"no node has a free {GPU_RESOURCE}: on a cluster without GPUs pass --gpus-per-node "
            "0 (CPU workers); where GPUs come only from the DRA driver (no device plugin: GPU "
            "Operator GPUCluster, EKS Auto Mode) run with --gpu-mode claim (with "
            f"{CLUSTER_READER} granted, --gpu-mode auto finds out either itself)"
        )
    if not devices:
        return ""
    return (
        f"no node has a free {GPU_RESOURCE}, but the DRA driver publishes {devices} GPU "
        f"device(s) (ResourceSlices of driver {GPU_DRIVER}): this cluster's GPUs come from "
        "DRA; run with --gpu-mode claim"
    )
