"""GPU fabric health and registration, from NVML's ``nvmlGpuFabricInfo`` (v2+: ``healthMask``).

``decode_health_mask`` reads the mask field by field as NVML defines it (``nvml.h``; the same
``NVML_GPU_FABRIC_HEALTH_MASK_*`` constants are in nvidia-ml-py's ``pynvml``). Degraded
bandwidth, an unhealthy route or an incorrect configuration is a FAIL; a route or access
timeout that NVML reports as recovered is a named WARN. ``wait_for_fabric`` re-checks a fabric
that is still registering (NOT_STARTED / IN_PROGRESS), which completes on its own.
Standard library only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

REGISTERING = ("NOT_STARTED", "IN_PROGRESS")

# healthMask fields as NVML defines them (nvml.h, ``NVML_GPU_FABRIC_HEALTH_MASK_*`` in
# nvidia-ml-py's pynvml): name -> (shift, width mask). Each 2-bit field reads 0 not supported,
# 1 TRUE, 2 FALSE; the incorrect-configuration field is a 4-bit code.
HEALTH_FIELDS = {
    "degraded_bw": (0, 0x3),
    "route_recovery": (2, 0x3),
    "route_unhealthy": (4, 0x3),
    "access_timeout_recovery": (6, 0x3),
    "incorrect_configuration": (8, 0xF),
    "partition_assigned": (12, 0x3),
    "gfm_state": (14, 0x3),
}
_TRI_STATE = {0: "NOT_SUPPORTED", 1: "TRUE", 2: "FALSE"}
_FIELD_VALUES = {
    "incorrect_configuration": {
        0: "NOT_SUPPORTED",
        1: "NONE",
        2: "INCORRECT_SYSGUID",
        3: "INCORRECT_CHASSIS_SN",
        4: "NO_PARTITION",
        5: "INSUFFICIENT_NVLINKS",
        6: "INCOMPATIBLE_GPU_FW",
        7: "INVALID_LOCATION",
        8: "GPU_STATE_INVALID",
    },
    "gfm_state": {0: "NOT_SUPPORTED", 1: "CONNECTED", 2: "DISCONNECTED"},
}
HEALTH_SUMMARIES = {0: "NOT_SUPPORTED", 1: "HEALTHY", 2: "UNHEALTHY", 3: "LIMITED_CAPACITY"}
# Judged: these make a GPU's fabric unfit for a run (FAIL) ...
HEALTH_FAILURES = {
    "degraded_bw": "the fabric reports degraded bandwidth",
    "route_unhealthy": "the fabric reports an unhealthy route",
}
# ... these say the fabric recovered by itself (WARN, named in the notes).
HEALTH_RECOVERED = {
    "route_recovery": "the fabric recovered a route",
    "access_timeout_recovery": "the fabric recovered from an access timeout",
}


def decode_health_mask(mask: int) -> dict[str, str]:
    """``healthMask`` as ``{field: value}``: ``{"degraded_bw": "TRUE", ...}``."""
    decoded = {}
    for name, (shift, width) in HEALTH_FIELDS.items():
        value = (mask >> shift) & width
        decoded[name] = _FIELD_VALUES.get(name, _TRI_STATE).get(value, f"UNKNOWN({value})")
    return decoded


def health_lines(where: str, fabric: dict[str, Any], *, failures: bool) -> list[str]:
    """The FAIL reasons (``failures``) or the recovered conditions of one GPU's fabric."""
    health = fabric.get("health") or {}
    judged, hint = (
        (HEALTH_FAILURES, "check nvidia-smi -q (Fabric) and the fabric manager")
        if failures
        else (HEALTH_RECOVERED, "it recovered; watch for repeats")
    )
    lines = [
        f"{where}: {text} (healthMask {fabric.get('health_mask', 0):#x}, "
        f"NVML_GPU_FABRIC_HEALTH_MASK_{name.upper()}_TRUE); {hint}"
        for name, text in judged.items()
        if health.get(name) == "TRUE"
    ]
    config = health.get("incorrect_configuration", "NOT_SUPPORTED")
    if failures and config not in ("NOT_SUPPORTED", "NONE"):
        lines.append(
            f"{where}: the fabric reports an incorrect configuration ({config}, healthMask "
            f"{fabric.get('health_mask', 0):#x}); {hint}"
        )
    return lines


def wait_for_fabric(
    check: Callable[[], dict[str, Any]],
    wait_s: float,
    *,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """``check()`` again until no GPU's fabric is still registering, for up to ``wait_s``.

    A fabric NOT_STARTED or IN_PROGRESS completes on its own (the fabric manager registers
    the GPU); NVML has no event for it, so this polls. The summary records how long it waited
    (``fabric_waited_s``) when it had to.
    """
    start = clock()
    summary = check()
    while _registering(summary) and (waited := clock() - start) < wait_s:
        logger.info("GPU fabric still registering; checking again (%.0f of %g s)", waited, wait_s)
        sleep(min(poll_s, wait_s - waited))
        summary = check()
    waited = clock() - start
    if waited > 0 or _registering(summary):
        summary["fabric_waited_s"] = round(waited, 1)
    return summary


def _registering(summary: dict[str, Any]) -> bool:
    return any(g["fabric"]["state"] in REGISTERING for g in summary.get("gpus", []))
