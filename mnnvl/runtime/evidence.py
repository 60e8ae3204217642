"""What failed in a worker pod, as its launcher tells it: the pod's termination message
(:mod:`mnnvl.contract.termination`), read by the driver from pod status.

What the launcher knows: the worker it saw fail first (rank, exit code, its last progress and
its last words, see :func:`mnnvl.runtime.progress.write_words`), whether the module to run
exists at all, a stalled worker's process state, the verdict of the exit-code table, and on
GPUs what NVML says changed since the attempt started: NVLink error counters (CRC, replay,
recovery) per GPU, a fabric that is no longer healthy, uncorrectable ECC errors, critical Xid
events (where NVML's event sets are offered). NVML is not CUDA: reading it creates no CUDA
context, so the launcher, which forks its workers, may (after the fork: never in a worker).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from mnnvl.contract import exit_codes
from mnnvl.contract.env import GPUS_PER_NODE
from mnnvl.contract.termination import (
    RETRY,
    STOP,
    TERMINATION_PATH,
    TERMINATION_PATH_ENV,
    Evidence,
    parse,
)
from mnnvl.runtime import fabric_health, nvml

logger = logging.getLogger(__name__)
MAX_XIDS = 20  # Xid events kept: the termination message holds 4096 bytes


def missing_module(module: str) -> str | None:
    """Why ``module`` cannot be found, None when it can. Only the module and the packages above
    it count: an import inside them that fails (a dependency, a shared file system that did
    not answer) is the module's own failure, a crash that a restart may clear."""
    import importlib.util

    try:
        if importlib.util.find_spec(module) is not None:
            return None
    except ModuleNotFoundError as e:
        if e.name is None or not (module == e.name or module.startswith(f"{e.name}.")):
            raise
        return str(e)
    return f"No module named {module!r}"


class LastErrors(logging.Handler):
    """The worker's last ERROR log lines: its own words when it exits non-zero by itself."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines = [*self.lines[-4:], record.getMessage()]


def process_state(pid: int) -> str:
    """A stalled worker's process state, in words: a stopped one is the hang itself, a running
    or sleeping one may be waiting for a peer that hangs."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return {
        "T": "stopped (SIGSTOP)",
        "t": "stopped by a debugger",
        "D": "in uninterruptible I/O",
        "Z": "exited",
    }.get(state, "alive (it may be waiting for a peer)")


def verdict(code: int) -> str:
    """``stop`` for an exit code no restart can change, else ``retry``."""
    return STOP if code in exit_codes.NON_RETRIABLE_EXIT_CODES else RETRY


def of_code(code: int, error: str = "") -> Evidence:
    """The evidence of exit code ``code``: its verdict and reason from the exit-code table."""
    reason = exit_codes.reason(code)
    return Evidence(verdict=verdict(code), reason=reason, exit_code=code, error=error)


def merged(own: Evidence | None, seen: Evidence) -> Evidence:
    """What a worker wrote itself, completed with what the launcher saw."""
    if own is None:
        return seen
    empty = Evidence()
    return dataclasses.replace(
        seen,
        **{
            k: v
            for k, v in dataclasses.asdict(own).items()
            if v != getattr(empty, k) and k != "verdict"
        },
    )


def take_own(environ: Mapping[str, str] = os.environ) -> Evidence | None:
    """What a worker wrote itself where the termination message goes (None: nothing of ours),
    removed from there: the launcher decides on it (NVLink errors a worker saw recreate the
    pods, so that the driver can keep the node out), and a restart in place must not leave
    one attempt's evidence to the next attempt's failure."""
    path = environ.get(TERMINATION_PATH_ENV) or TERMINATION_PATH
    try:
        with open(path, "r+", encoding="utf-8") as f:
            own = parse(f.read())
            f.seek(0)
            f.truncate()
    except OSError:
        return None  # no file: outside a pod, or nothing written
    return own


def write(evidence: Evidence, environ: Mapping[str, str] = os.environ) -> None:
    """Write ``evidence`` where the kubelet reads the termination message (the path the Job
    names, else Kubernetes' default where the kubelet mounted it; outside a pod, nowhere). A
    failure to write is logged, never raised: the exit code still reaches the pod's status."""
    path = environ.get(TERMINATION_PATH_ENV) or TERMINATION_PATH
    if path == TERMINATION_PATH and not os.path.exists(path):
        return  # not in a container with a termination message file: nothing reads it
    try:
        with open(path, "a+", encoding="utf-8") as f:
            f.seek(0)
            # A worker that wrote its own evidence there knows its failure best: its fields win.
            own = parse(f.read())
            f.seek(0)
            f.truncate()
            f.write(merged(own, evidence).to_message())
    except OSError as e:
        logger.warning(
            "could not write the failure's evidence to %s (%s): the driver sees the exit code "
            "only; check the pod's terminationMessagePath and that the path is writable",
            path,
            e,
        )


def _ecc(lib: Any, handle: Any) -> int | None:
    """Uncorrectable ECC errors since the driver loaded (None: not readable here)."""
    try:
        return int(
            lib.nvmlDeviceGetTotalEccErrors(
                handle, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC
            )
        )
    except (AttributeError, lib.NVMLError):  # no such call, constant or feature here
        return None


class GpuWatch:
    """The pod's GPUs as NVML sees them at the attempt's start, and what changed by a failure.

    ``devices``: NVML indices (the GPUs the container was given); none on a CPU pod."""

    def __init__(self, devices: list[int], lib: Any = None) -> None:
        self.devices = devices
        self.lib = nvml.load_nvml() if lib is None and devices else lib
        self.start = self.read()
        self.xid_sets = self._watch_xids()

    @classmethod
    def of_pod(cls, environ: Mapping[str, str] = os.environ) -> GpuWatch:
        """The GPUs the Job gave this pod (``MNNVL_GPUS_PER_NODE``)."""
        try:
            count = int(environ.get(GPUS_PER_NODE, "0") or 0)
        except ValueError:
            count = 0
        return cls(list(range(count)))

    def read(self) -> dict[str, dict[str, Any]]:
        """Per GPU (its index as text): NVLink error totals, fabric, uncorrectable ECC."""
        if not self.devices or self.lib is None:
            return {}
        summary = nvml.check_gpus(self.devices, nvml=self.lib)
        gpus = {str(g["device"]): g for g in summary["gpus"]}
        if not gpus:  # NVML unavailable: check_gpus has logged why
            return {}
        self.lib.nvmlInit()
        try:
            for index, gpu in gpus.items():
                gpu["ecc"] = _ecc(self.lib, self.lib.nvmlDeviceGetHandleByIndex(int(index)))
        except self.lib.NVMLError as e:  # the counters read above are still worth reporting
            logger.warning("NVML: could not read ECC errors: %s", e)
        finally:
            self.lib.nvmlShutdown()
        return gpus

    def _watch_xids(self) -> dict[str, Any]:
        """One NVML event set per GPU for its critical Xid events (NVML reports only events
        that happen while a set is registered, so NVML stays initialised until the end)."""
        if not self.start or self.lib is None:
            return {}
        lib, sets = self.lib, {}
        try:
            lib.nvmlInit()
            for gpu in self.start:
                events = lib.nvmlEventSetCreate()
                handle = lib.nvmlDeviceGetHandleByIndex(int(gpu))
                lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, events)
                sets[gpu] = events
        except (AttributeError, lib.NVMLError) as e:  # not offered here: no Xid evidence
            logger.info("NVML: Xid events are not readable here (%s)", e)
        return sets

    def xids(self) -> list[list[Any]]:
        """``[gpu, xid]`` of each critical Xid event since the start (at most MAX_XIDS)."""
        found: list[list[Any]] = []
        lib: Any = self.lib  # set whenever an event set is
        for gpu, events in self.xid_sets.items():
            while len(found) < MAX_XIDS:
                try:
                    data = lib.nvmlEventSetWait_v2(events, 0)
                except lib.NVMLError:  # NVML_ERROR_TIMEOUT: no more events
                    break
                found.append([gpu, int(data.eventData)])
        return found

    def findings(self, evidence: Evidence) -> None:
        """Add to ``evidence`` what NVML says changed since the start."""
        evidence.xid = self.xids()
        for gpu, now in self.read().items():
            before = self.start.get(gpu, {})
            links = _link_deltas(before.get("nvlink", {}), now.get("nvlink", {}))
            if links:
                evidence.nvlink[gpu] = links
            fabric = _fabric_problem(gpu, now.get("fabric") or {})
            if fabric:
                evidence.fabric[gpu] = fabric
            ecc, ecc_before = now.get("ecc"), before.get("ecc")
            if ecc is not None and ecc_before is not None and ecc > ecc_before:
                evidence.ecc[gpu] = ecc - ecc_before


def _link_deltas(before: dict[str, Any], now: dict[str, Any]) -> dict[str, int]:
    """NVLink error counter deltas of one GPU (summed over its links): crc, replay, recovery."""
    was, new = before.get("errors") or {}, now.get("errors") or {}

    def delta(*keys: str) -> int:
        return sum(max((new.get(k) or 0) - (was.get(k) or 0), 0) for k in keys)

    found = {
        "crc": delta("crc_flit", "crc_data"),
        "replay": delta("replay"),
        "recovery": delta("recovery"),
    }
    return {k: v for k, v in found.items() if v}


def _fabric_problem(gpu: str, fabric: dict[str, Any]) -> str:
    """Why a GPU's fabric is not healthy now ("" when it is, or has none)."""
    lines = fabric_health.health_lines(f"GPU {gpu}", fabric, failures=True)
    if fabric.get("health_summary") == "UNHEALTHY":
        lines.append(f"GPU {gpu}: fabric health summary UNHEALTHY")
    return "; ".join(lines)


def first_failure(codes: list[tuple[float, int, int]]) -> tuple[int, int] | None:
    """``(rank, exit code as a shell reports it)`` of the worker the launcher saw fail first
    (the others it stopped come later); None when every worker exited 0."""
    failed = sorted((t, rank, code) for t, rank, code in codes if code)
    return (failed[0][1], exit_codes.shell_code(failed[0][2])) if failed else None
