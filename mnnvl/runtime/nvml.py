"""Per-GPU NVLink and fabric checks through NVML (the ``pynvml`` module of nvidia-ml-py).

Every function returns plain dicts (JSON-able) so rank summaries travel through
``all_gather_object`` and land unchanged in the RESULT line and the report.

The ``pynvml`` module is a parameter everywhere (``nvml=``), so tests pass a fake one;
``None`` means "import the real one". NVML missing or failing never raises: the summary
says ``"nvml": "unavailable: ..."`` and the verdict reports that the link checks were skipped.

Per-link speed comes, in order of preference, from the NVML field
``NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON`` (the speed every active link runs at; NVML only has
per-link speed fields for links 0..11, fewer than Hopper's 18, so the common field is used)
and otherwise from the NVLink version with the figures ``nvidia-smi nvlink -s`` prints:
NVLink3 25 GB/s, NVLink4 26.562 GB/s, NVLink5 53.125 GB/s. ``speed_source`` records which.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from typing import Any

from mnnvl.contract.env import IMEX_CHANNEL_DIR
from mnnvl.runtime import fabric_health

logger = logging.getLogger(__name__)

IMEX_CHANNEL_PATH = f"{IMEX_CHANNEL_DIR}/channel0"
LINK_SPEED_BY_VERSION_GBPS = {3: 25.0, 4: 26.562, 5: 53.125}
# nvmlNvlinkVersion_t values of newer drivers (…_3_0 = 4, …_4_0 = 6, …_5_0 = 7); older drivers
# return the plain major number (4 on Hopper). Values 1..5 are read as majors: the only clash
# (enum 4 = NVLink 3.0) changes the fallback speed by 6 %, and the field value wins anyway.
_VERSION_ENUM_TO_MAJOR = {6: 4, 7: 5, 8: 6}
FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
ERROR_COUNTERS = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}
_VALUE_ATTRS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_ZERO_UUID = "0" * 32


def load_nvml() -> Any | None:
    """The real ``pynvml`` module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _absent_errors(nvml: Any) -> tuple[type[BaseException], ...]:
    """NVML errors that mean "this link/feature does not exist here" rather than a fault."""
    names = ("NVMLError_NotSupported", "NVMLError_InvalidArgument", "NVMLError_FunctionNotFound")
    return tuple(getattr(nvml, n) for n in names if hasattr(nvml, n))


def check_gpus(
    devices: Sequence[str | int],
    *,
    nvml: Any = None,
    imex_path: str = IMEX_CHANNEL_PATH,
) -> dict[str, Any]:
    """Check the given GPUs (NVML index, or UUID string ``GPU-…``).

    Returns ``{"nvml": "ok" | "unavailable: …" | "not checked: no GPU", "gpus": [...]}``.
    """
    if not devices:
        return {"nvml": "not checked: no GPU", "gpus": []}
    nvml = load_nvml() if nvml is None else nvml
    if nvml is None:
        return {"nvml": "unavailable: pynvml (nvidia-ml-py) is not installed", "gpus": []}
    try:
        nvml.nvmlInit()
    except Exception as e:  # a missing driver library raises a non-NVML error too
        logger.warning("NVML init failed: %s", e)
        return {"nvml": f"unavailable: {e}", "gpus": []}
    try:
        gpus = [_check_gpu(nvml, dev, imex_path) for dev in devices]
    except nvml.NVMLError as e:
        logger.warning("NVML query failed: %s", e)
        return {"nvml": f"unavailable: {e}", "gpus": []}
    finally:
        nvml.nvmlShutdown()
    return {"nvml": "ok", "gpus": gpus}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_gpu(nvml: Any, dev: str | int, imex_path: str) -> dict[str, Any]:
    if isinstance(dev, str):
        handle = nvml.nvmlDeviceGetHandleByUUID(dev)
    else:
        handle = nvml.nvmlDeviceGetHandleByIndex(dev)
    return {
        "device": dev,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "nvlink": nvlink_info(nvml, handle),
        "fabric": fabric_info(nvml, handle),
        "imex_channel": os.path.exists(imex_path),
    }


def nvlink_info(nvml: Any, handle: Any) -> dict[str, Any]:
    """Link states, version, per-link speed and summed DL error counters of one GPU."""
    absent = _absent_errors(nvml)
    active: list[int] = []
    inactive: list[int] = []
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except absent:
            continue
        (active if state == nvml.NVML_FEATURE_ENABLED else inactive).append(link)
    version_raw = _first_version(nvml, handle, active, absent)
    version = _VERSION_ENUM_TO_MAJOR.get(version_raw, version_raw) if version_raw else None
    speed, source = _speed_from_field(nvml, handle) if active else (None, "none")
    if speed is None and version in LINK_SPEED_BY_VERSION_GBPS:
        speed, source = LINK_SPEED_BY_VERSION_GBPS[version], "version"
    return {
        "links": len(active) + len(inactive),
        "active": len(active),
        "inactive_links": inactive,
        "version": version,
        "version_raw": version_raw,
        "speed_gbps": speed,
        "speed_source": source,
        "errors": _error_counters(nvml, handle, active, absent),
    }


def _first_version(
    nvml: Any, handle: Any, links: list[int], absent: tuple[type[BaseException], ...]
) -> int | None:
    for link in links:
        try:
            return int(nvml.nvmlDeviceGetNvLinkVersion(handle, link))
        except absent:
            continue
    return None


def _speed_from_field(nvml: Any, handle: Any) -> tuple[float | None, str]:
    field_id = getattr(nvml, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", None)
    if field_id is None:
        return None, "none"
    try:
        (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    except nvml.NVMLError as e:
        logger.info("NVLink speed field unavailable (%s); using the NVLink version", e)
        return None, "none"
    if value.nvmlReturn != nvml.NVML_SUCCESS:
        return None, "none"
    mbps = getattr(value.value, _VALUE_ATTRS.get(int(value.valueType), "uiVal"))
    # NVML reports MB/s (26562 on NVLink4); 0 means the driver does not fill it in.
    return (round(mbps / 1000.0, 3), "nvml-field") if mbps else (None, "none")


def _error_counters(
    nvml: Any, handle: Any, links: list[int], absent: tuple[type[BaseException], ...]
) -> dict[str, int | None]:
    totals: dict[str, int | None] = {}
    for key, const in ERROR_COUNTERS.items():
        counter = getattr(nvml, const, None)
        total: int | None = None
        for link in links if counter is not None else []:
            try:
                total = (total or 0) + int(
                    nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)
                )
            except absent:
                continue
        totals[key] = total
    return totals


def fabric_info(nvml: Any, handle: Any) -> dict[str, Any]:
    """NVML GPU fabric (IMEX / MNNVL) state; NOT_SUPPORTED on hosts without a fabric manager.

    Asks for ``nvmlGpuFabricInfo_v3`` (adds ``healthSummary``), then v2, then the legacy call;
    ``health`` is ``healthMask`` decoded (``decode_health_mask``).
    """
    info = _fabric_struct(nvml, handle)
    if info is None:
        return {"state": "NOT_SUPPORTED", "cluster_uuid": _ZERO_UUID, "clique_id": 0, "status": 0}
    mask = int(getattr(info, "healthMask", 0))
    summary = getattr(info, "healthSummary", None)
    return {
        "state": FABRIC_STATES.get(int(info.state), f"UNKNOWN({int(info.state)})"),
        "cluster_uuid": bytes(info.clusterUuid).hex(),
        "clique_id": int(info.cliqueId),
        "status": int(info.status),
        "health_mask": mask,
        "health": fabric_health.decode_health_mask(mask),
        "health_summary": fabric_health.HEALTH_SUMMARIES.get(int(summary), str(summary))
        if summary is not None
        else None,
    }


def _fabric_struct(nvml: Any, handle: Any) -> Any | None:
    absent = _absent_errors(nvml)
    mismatch = getattr(nvml, "NVMLError_ArgumentVersionMismatch", ())
    if hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV"):
        # Newest structure first: a driver older than the structure says "version mismatch".
        for struct, version in (
            ("c_nvmlGpuFabricInfo_v3_t", "nvmlGpuFabricInfo_v3"),
            ("c_nvmlGpuFabricInfoV_t", "nvmlGpuFabricInfo_v2"),
        ):
            if not hasattr(nvml, struct):
                continue
            info = getattr(nvml, struct)()
            info.version = getattr(nvml, version, info.version)
            try:
                nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
                return info
            except mismatch:
                continue
            except absent:
                break
    if hasattr(nvml, "nvmlDeviceGetGpuFabricInfo"):
        info = nvml.c_nvmlGpuFabricInfo_t()
        try:
            nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
            return info
        except absent:
            return None
    return None


# ---- judgements on summaries (pure; used by verify.py and the tests) ---------------------


def is_mnnvl_fabric(fabric: dict[str, Any] | None) -> bool:
    """NCCL's rule: a GPU is on an MNNVL fabric when COMPLETED with a non-zero clusterUuid."""
    if not fabric:
        return False
    return fabric["state"] == "COMPLETED" and fabric["cluster_uuid"] != _ZERO_UUID


def fabric_present(summary: dict[str, Any]) -> bool:
    return fabric_identity(summary) is not None


def fabric_identity(summary: dict[str, Any]) -> str | None:
    """``<clusterUuid>/<cliqueId>`` of the first MNNVL fabric GPU of a summary, else None."""
    for gpu in summary.get("gpus", []):
        if is_mnnvl_fabric(gpu["fabric"]):
            return f"{gpu['fabric']['cluster_uuid']}/{gpu['fabric']['clique_id']}"
    return None


def _where(summary: dict[str, Any], rank: int, gpu: dict[str, Any]) -> str:
    host = summary.get("host")
    return f"rank {rank}{f' on {host}' if host else ''} {gpu['name']} ({gpu['uuid']})"


# The checks a verdict reports one by one (and the CTRF report lists as tests).
LINKS, FABRIC, HEALTH = "NVML links", "fabric state", "fabric health"


def local_checks(summary: dict[str, Any], rank: int) -> dict[str, list[str]]:
    """One rank's FAIL reasons per check (``LINKS``, ``FABRIC``, ``HEALTH``)."""
    checks: dict[str, list[str]] = {LINKS: [], FABRIC: [], HEALTH: []}
    for gpu in summary.get("gpus", []):
        where = _where(summary, rank, gpu)
        link = gpu["nvlink"]
        if link["links"] and link["inactive_links"]:
            checks[LINKS].append(
                f"{where}: {len(link['inactive_links'])} of {link['links']} NVLink links "
                f"inactive (links {link['inactive_links']}); check nvidia-smi nvlink -s"
            )
        fabric = gpu["fabric"]
        if fabric["state"] in fabric_health.REGISTERING:
            waited = summary.get("fabric_waited_s")
            checks[FABRIC].append(
                f"{where}: GPU fabric registration is {fabric['state']}"
                + (f" after waiting {waited:g} s (--fabric-wait-s)" if waited is not None else "")
                + "; check the fabric manager / IMEX daemon on this node"
            )
        if fabric["state"] == "COMPLETED" and fabric["status"] != 0:
            checks[FABRIC].append(
                f"{where}: GPU fabric COMPLETED with error status {fabric['status']}"
            )
        if is_mnnvl_fabric(fabric) and not gpu["imex_channel"]:
            checks[FABRIC].append(
                f"{where}: fabric COMPLETED but no IMEX channel ({IMEX_CHANNEL_PATH}); the pod "
                "lacks its ComputeDomain channel claim"
            )
        if is_mnnvl_fabric(fabric):
            checks[HEALTH] += fabric_health.health_lines(where, fabric, failures=True)
    return checks


def health_warnings(summary: dict[str, Any], rank: int) -> list[str]:
    """WARN lines: fabric conditions NVML reports as recovered, and any health condition of
    a GPU outside a multi-node NVLink fabric (not judged as FAIL)."""
    lines: list[str] = []
    for gpu in summary.get("gpus", []):
        where = _where(summary, rank, gpu)
        lines += fabric_health.health_lines(where, gpu["fabric"], failures=False)
        if not is_mnnvl_fabric(gpu["fabric"]):
            # Judged only on a multi-node NVLink fabric: a single host's fabric manager
            # (clusterUuid zero) may report fields that say nothing about this run.
            lines += fabric_health.health_lines(where, gpu["fabric"], failures=True)
    return [f"WARN: {line}" for line in lines]


def fabric_problems(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """FAIL reasons across ranks: every GPU must agree on clusterUuid and cliqueId.

    A mix of fabric and non-fabric GPUs fails too: NCCL would then not use MNNVL for the
    job (it needs every rank COMPLETED with the same clusterUuid).
    """
    seen: dict[tuple[str, int], list[int]] = {}
    for rank, summary in enumerate(summaries):
        for gpu in summary.get("gpus", []):
            fab = gpu["fabric"]
            if fab["state"] == "NOT_SUPPORTED":
                key = ("none", 0)
            elif is_mnnvl_fabric(fab):
                key = (fab["cluster_uuid"], fab["clique_id"])
            else:
                continue  # not ready yet: already a local problem
            seen.setdefault(key, []).append(rank)
    if len(seen) <= 1 or not any(k[0] != "none" for k in seen):
        return []
    groups = "; ".join(
        f"ranks {ranks}: " + ("no fabric" if uuid == "none" else f"clusterUuid {uuid} clique {cq}")
        for (uuid, cq), ranks in sorted(seen.items(), key=lambda kv: kv[1][0])
    )
    return [
        "GPU fabric mismatch across ranks (the pods are not in one NVLink clique/IMEX domain): "
        + groups
    ]


def topology(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The RESULT ``topology``: the weakest GPU's NVLink figures and rank 0's fabric."""
    gpus = [g for s in summaries for g in s.get("gpus", [])]
    linked = [g["nvlink"] for g in gpus if g["nvlink"]["links"]]
    active = min((n["active"] for n in linked), default=0)
    speeds = [n["speed_gbps"] for n in linked if n["speed_gbps"]]
    speed = min(speeds) if speeds else None
    versions = [n["version"] for n in linked if n["version"]]
    first = gpus[0]["fabric"] if gpus else None
    fabric = None
    if first and first["state"] != "NOT_SUPPORTED":
        fabric = {k: first[k] for k in ("state", "cluster_uuid", "clique_id")}
    return {
        "gpus_per_rank": max((len(s.get("gpus", [])) for s in summaries), default=0),
        "active_links": active,
        "link_speed_gbps": speed,
        "link_limit_gbps": round(active * speed, 3) if speed and active else None,
        "nvlink_version": min(versions) if versions else None,
        "fabric": fabric,
    }
