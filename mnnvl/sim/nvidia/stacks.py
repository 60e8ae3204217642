"""The NVIDIA stack a simulated cluster plays: where GPUs come from, who runs IMEX.

GPU stacks (``SimCluster(gpu_stack=…)``): ``device-plugin``, where the NVIDIA device plugin gives
every node ``nvidia.com/gpu`` allocatable and the DRA driver's ``gpu.nvidia.com`` DeviceClass
maps that extended resource (``extendedResourceName``, as ``templates/deviceclass-gpu.yaml`` of
kubernetes-sigs/dra-driver-nvidia-gpu renders it on ``resource.k8s.io/v1``), so ``nvidia.com/gpu``
limits and ``gpu.nvidia.com`` claims draw on one count per node; or ``dra``, with no device
plugin (GPU Operator v26.7.0's ``GPUCluster``, EKS Auto Mode): the DeviceClass maps nothing
(``manifests/state-dra-driver/0400_deviceclass-gpu.yaml`` of NVIDIA/gpu-operator v26.7.0) and
each node's GPUs are devices ``gpu-0`` … in a ResourceSlice of driver ``gpu.nvidia.com``, a
claim allocated device by device.

IMEX modes (``SimCluster(imex_mode=…)``, the driver's ``resources.computeDomains.imex.mode``):
``daemons`` (driverManaged: an IMEX daemon per node and domain) or ``hostManaged`` (the
host's ``nvidia-imex`` service; the driver publishes channel devices but no daemon devices:
``computeDomainPublishedDevices`` in ``cmd/compute-domain-kubelet-plugin/driver.go``).
"""

from __future__ import annotations

from mnnvl.sim.api.model import Obj
from mnnvl.sim.api.store import Store
from mnnvl.sim.nvidia.dra import CHANNEL_CLASS
from mnnvl.sim.nvidia.dra import DRIVER as CD_DRIVER

GPU = "nvidia.com/gpu"
GPU_CLASS = "gpu.nvidia.com"
GPU_DRIVER = "gpu.nvidia.com"  # the DRA driver's GPU side; its DeviceClass has the same name
GPU_STACKS = ("device-plugin", "dra")
IMEX_MODES = ("daemons", "hostManaged")
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"


def check_stack(gpu_stack: str, imex_mode: str) -> None:
    if gpu_stack not in GPU_STACKS:
        raise ValueError(f"gpu_stack {gpu_stack!r} is not one of {', '.join(GPU_STACKS)}")
    if imex_mode not in IMEX_MODES:
        raise ValueError(f"imex_mode {imex_mode!r} is not one of {', '.join(IMEX_MODES)}")


def node_gpus(gpu_stack: str, gpus: int) -> dict[str, str]:
    """The node's ``nvidia.com/gpu`` capacity: the device plugin's, none without it."""
    return {GPU: str(gpus)} if gpu_stack == "device-plugin" else {}


def _device_class(name: str, selector: str, extended: str = "") -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": selector}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"metadata": {"name": name}, "spec": spec}


def _slice(node: str, driver: str, devices: list[Obj]) -> Obj:
    return {
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _device(name: str, kind: str, index: int) -> Obj:
    """A device as the driver publishes it; unqualified attributes are in its own domain."""
    return {"name": name, "attributes": {"type": {"string": kind}, "id": {"int": index}}}


def seed(store: Store, gpu_stack: str, imex_mode: str, nodes: list[str], gpus: int) -> None:
    """The DeviceClasses the driver's chart installs and each node's ResourceSlices."""
    gpu_selector = (
        f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'gpu'"
    )
    cd = f"device.driver == '{CD_DRIVER}' && device.attributes['{CD_DRIVER}'].type"
    classes = [
        _device_class(GPU_CLASS, gpu_selector, GPU if gpu_stack == "device-plugin" else ""),
        _device_class(
            CHANNEL_CLASS, f"{cd} == 'channel' && device.attributes['{CD_DRIVER}'].id == 0"
        ),
        _device_class(DAEMON_CLASS, f"{cd} == 'daemon'"),
    ]
    for obj in classes:
        store.create("deviceclasses", obj)
    for node in nodes:
        channel = [_device("channel-0", "channel", 0)]
        daemon = [_device("daemon-0", "daemon", 0)] if imex_mode == "daemons" else []
        store.create("resourceslices", _slice(node, CD_DRIVER, channel + daemon))
        if gpu_stack == "dra" and gpus > 0:
            devices = [_device(f"gpu-{i}", "gpu", i) for i in range(gpus)]
            store.create("resourceslices", _slice(node, GPU_DRIVER, devices))
