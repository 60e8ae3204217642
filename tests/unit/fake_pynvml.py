"""A stand-in for the ``pynvml`` module: just the calls ``mnnvl.runtime.nvml`` makes, each with
nvidia-ml-py's signature (``test_fake_nvml_has_the_real_signatures`` holds it to that).

``FakeNvml(gpus)`` behaves like the module for a host whose GPUs are ``FakeGpu`` records;
builders below reproduce the machines the tests need.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVLINK4_SPEED_MBPS = 26562


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class FabricInfo(ctypes.Structure):
    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
    ]


class NVMLError_ArgumentVersionMismatch(NVMLError):
    pass


class FabricInfoV(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint),
    ]


class FabricInfoV3(ctypes.Structure):
    """``nvmlGpuFabricInfo_v3_t``: v2 plus ``healthSummary`` (as nvidia-ml-py declares it)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint),
        ("healthSummary", ctypes.c_ubyte),
    ]


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    links: int = 18
    down: tuple[int, ...] = ()
    version_raw: int = 6  # nvmlNvlinkVersion_t NVLINK_VERSION_4_0, as 580 drivers return
    speed_mbps: int | None = None  # None: the speed field is not filled in (as seen on H200)
    errors: dict[int, int] = field(default_factory=dict)  # counter id -> count per link
    fabric_state: int | None = 0  # None: the fabric call itself is not supported
    cluster_uuid: bytes = bytes(16)
    clique_id: int = 0
    health_mask: int = 0
    health_summary: int = 0  # NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
    fabric_versions: tuple[int, ...] = (2, 3)  # nvmlGpuFabricInfo versions the driver knows
    xids: list[int] = field(default_factory=list)  # critical Xid events still to be reported


class _Value:
    def __init__(self, ui: int) -> None:
        self.uiVal = ui


class _Field:
    def __init__(self, ret: int, value: int) -> None:
        self.nvmlReturn = ret
        self.valueType = 1
        self.value = _Value(value)


class FakeNvml:
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_ArgumentVersionMismatch = NVMLError_ArgumentVersionMismatch
    NVML_SUCCESS = 0
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_NVLINK_ERROR_DL_REPLAY = 0
    NVML_NVLINK_ERROR_DL_RECOVERY = 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
    NVML_NVLINK_ERROR_DL_CRC_DATA = 3
    NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90
    nvmlEventTypeXidCriticalError = 8
    NVMLError_Timeout = NVMLError_Timeout
    nvmlGpuFabricInfo_v2 = 0x2000024
    nvmlGpuFabricInfo_v3 = 0x3000028
    c_nvmlGpuFabricInfoV_t = FabricInfoV
    c_nvmlGpuFabricInfo_t = FabricInfo
    c_nvmlGpuFabricInfo_v3_t = FabricInfoV3

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialised = 0

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError(f"no GPU {uuid}")

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetNvLinkState(self, device: FakeGpu, link: int) -> int:
        if link >= device.links:
            raise NVMLError_NotSupported()
        return 0 if link in device.down else 1

    def nvmlDeviceGetNvLinkVersion(self, device: FakeGpu, link: int) -> int:
        if link >= device.links:
            raise NVMLError_NotSupported()
        return device.version_raw

    def nvmlDeviceGetNvLinkErrorCounter(self, device: FakeGpu, link: int, counter: int) -> int:
        return device.errors.get(counter, 0)

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, fieldIds: list[int]) -> list[_Field]:
        if handle.speed_mbps is None:
            return [_Field(3, 0) for _ in fieldIds]  # NVML_ERROR_NOT_SUPPORTED per field
        return [_Field(0, handle.speed_mbps) for _ in fieldIds]

    def nvmlDeviceGetGpuFabricInfoV(self, device: FakeGpu, gpuFabricInfo: Any) -> int:
        if device.fabric_state is None:
            raise NVMLError_NotSupported()
        info = getattr(gpuFabricInfo, "_obj", gpuFabricInfo)
        if info.version >> 24 not in device.fabric_versions:
            raise NVMLError_ArgumentVersionMismatch()  # as a driver older than the struct
        info.healthMask = device.health_mask
        if hasattr(info, "healthSummary"):
            info.healthSummary = device.health_summary
        return self._fill_fabric(device, info)

    def nvmlDeviceGetGpuFabricInfo(self, device: FakeGpu, gpuFabricInfo: Any) -> int:
        if device.fabric_state is None:
            raise NVMLError_NotSupported()
        return self._fill_fabric(device, getattr(gpuFabricInfo, "_obj", gpuFabricInfo))

    def nvmlEventSetCreate(self) -> list[FakeGpu]:
        return []  # the GPUs registered with it

    def nvmlDeviceRegisterEvents(
        self, handle: FakeGpu, eventTypes: int, eventSet: list[FakeGpu]
    ) -> None:
        eventSet.append(handle)

    def nvmlEventSetWait_v2(self, eventSet: list[FakeGpu], timeoutms: int) -> Any:
        for gpu in eventSet:
            if gpu.xids:
                return SimpleNamespace(device=gpu, eventData=gpu.xids.pop(0))
        raise NVMLError_Timeout()

    @staticmethod
    def _fill_fabric(device: FakeGpu, info: Any) -> int:
        info.state = device.fabric_state
        info.cliqueId = device.clique_id
        info.status = 0
        for i, b in enumerate(device.cluster_uuid):
            info.clusterUuid[i] = b
        return 0


def h200(uuid: str = "GPU-h200-0", **kw: Any) -> FakeGpu:
    """A healthy H200 SXM: 18 NVLink4 links up; fabric NOT_SUPPORTED."""
    return FakeGpu(uuid=uuid, **kw)


def degraded_h200(uuid: str = "GPU-h200-bad") -> FakeGpu:
    return FakeGpu(uuid=uuid, down=(3, 7), errors={0: 12, 1: 2, 3: 40})


CLUSTER_A = bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0")
CLUSTER_B = bytes.fromhex("aa" * 16)


def gb200(uuid: str, cluster: bytes = CLUSTER_A, clique: int = 32766) -> FakeGpu:
    """A GB200 NVL72 GPU: 18 NVLink5 links, fabric COMPLETED in ``cluster``/``clique``."""
    return FakeGpu(
        name="NVIDIA GB200",
        uuid=uuid,
        version_raw=7,
        speed_mbps=53125,
        fabric_state=3,
        cluster_uuid=cluster,
        clique_id=clique,
    )
