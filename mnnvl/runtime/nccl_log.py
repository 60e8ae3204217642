"""Which transport NCCL used, read from its own ``NCCL_DEBUG=INFO`` log lines.

NCCL prints one ``Channel … via P2P/…`` (or ``via SHM/…``, ``via NET/…``) line per connection
it sets up, and ``MNNVL 1 cliqueId …`` when a communicator runs over the multi-node NVLink
fabric. The formats, as NCCL 2.28 writes them (``src/transport/p2p.cc``, ``shm.cc``, ``net.cc``,
``src/mnnvl.cc``, ``src/transport/nvls.cc``):

- ``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`` (``P2P/MNNVL/read`` on an MNNVL
  communicator, ``P2P/IPC`` with cuMem off, ``P2P/direct pointer`` inside one process);
- ``Channel 00 : 0[0] -> 1[1] via SHM/direct/direct``;
- ``Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA`` (``NET/Socket/0`` over TCP);
- ``MNNVL 1 cliqueId 7ffe cliqueSize 8 cliqueRank 0`` (only when MNNVL is on);
- ``NVLS comm 0x… headRank 0 nHeads 8 …`` when NVLink SHARP (NVLS) buffers are set up.

The verification sends NCCL's log of its own process to a file
(``NCCL_DEBUG_FILE``, set before NCCL initialises), reads it back after the sweep, copies it
to stderr (so the pod log still holds NCCL's lines) and records the transport in RESULT.

Standard library only; the NCCL version comes from the caller (torch knows it).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, MutableMapping
from typing import Any

from mnnvl.runtime.groups import clique_label

_VIA = re.compile(r"\bvia (P2P|SHM|NET|COLLNET)(/[^\s]*)?")
_MNNVL = re.compile(r"\bMNNVL (\d+) cliqueId")
_NVLS = re.compile(r"\bNVLS comm ")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
# Worst first: a communicator is as fast as its slowest connection.
_ORDER = ("network", "SHM", "P2P", "MNNVL")


def classify(lines: Iterable[str], *, nvlink_active: bool) -> dict[str, Any]:
    """``{"transport", "connections", "mnnvl", "nvls", "log_version"}`` from NCCL INFO lines.

    ``transport`` is the slowest kind seen: ``network (NET/IB)``, ``SHM``, ``NVLink P2P``
    (P2P between GPUs with active NVLink links), ``PCIe P2P``, ``MNNVL`` (P2P on a
    communicator with MNNVL on), or ``none`` when NCCL set up no connection (one rank).
    """
    kinds: Counter[str] = Counter()
    detail: dict[str, str] = {}
    mnnvl = nvls = False
    version = None
    for line in lines:
        if (m := _MNNVL.search(line)) and m.group(1) != "0":
            mnnvl = True
        nvls = nvls or bool(_NVLS.search(line))
        if m := _VERSION.search(line):
            version = version or m.group(1)
        if m := _VIA.search(line):
            kind = {"NET": "network", "COLLNET": "network"}.get(m.group(1), m.group(1))
            mnnvl = mnnvl or (m.group(2) or "").startswith("/MNNVL")
            kinds[kind] += 1
            detail.setdefault(kind, m.group(1) + (m.group(2) or ""))
    if mnnvl and kinds["P2P"]:
        kinds["MNNVL"] = kinds.pop("P2P")
        detail["MNNVL"] = detail.pop("P2P")
    worst = next((k for k in _ORDER if kinds[k]), None)
    if worst is None:
        transport = "none"
    elif worst == "network":
        kind, _, rest = detail["network"].partition("/")  # NET/IB/0/GDRDMA
        transport = f"network ({kind}/{rest.split('/')[0] or '?'})"
    elif worst == "P2P":
        transport = "NVLink P2P" if nvlink_active else "PCIe P2P"
    else:
        transport = worst
    return {
        "transport": transport,
        "connections": {detail[k]: n for k, n in kinds.items() if n},
        "mnnvl": mnnvl,
        "nvls": nvls,
        "log_version": version,
    }


class NcclLog:
    """Route this process's NCCL log to a private file for the time of the verification.

    Does nothing when the user already set ``NCCL_DEBUG_FILE`` (their file, their format)
    or on CPU runs. Otherwise sets ``NCCL_DEBUG=INFO`` with the ``INIT`` subsystem when
    unset, so the transport is known under every NCCL profile; ``echo_all`` (the profile
    asked for INFO) copies every line to stderr afterwards, else only warnings.
    """

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.path: str | None = None
        self.echo_all = True

    def start(self) -> NcclLog:
        env = self.environ
        if env.get("NCCL_DEBUG_FILE"):
            return self
        self.echo_all = env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE")
        if not self.echo_all:
            env["NCCL_DEBUG"] = "INFO"
            env.setdefault("NCCL_DEBUG_SUBSYS", "INIT")
        fd, self.path = tempfile.mkstemp(prefix="mnnvl-nccl-", suffix=".log")
        os.close(fd)
        env["NCCL_DEBUG_FILE"] = self.path
        return self

    def lines(self) -> list[str]:
        if self.path is None:
            return []
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                return f.read().splitlines()
        except OSError:
            return []

    def finish(self) -> list[str]:
        """The lines logged so far; they are copied to stderr and the file removed."""
        lines = self.lines()
        shown = lines if self.echo_all else [ln for ln in lines if " WARN " in ln]
        if shown:
            sys.stderr.write("\n".join(shown) + "\n")
            sys.stderr.flush()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None
        return lines

    @property
    def active(self) -> bool:
        return self.path is not None


def summarize(per_rank: list[dict[str, Any]], version: str | None) -> dict[str, Any]:
    """The RESULT ``nccl`` entry: the slowest transport over all ranks, and the version."""
    seen = [r for r in per_rank if r.get("transport") not in (None, "unknown")]
    order = ("network", "SHM", "PCIe P2P", "NVLink P2P", "MNNVL", "none")

    def rank_of(t: str) -> int:
        return next((i for i, k in enumerate(order) if t.startswith(k)), len(order))

    transport = min((r["transport"] for r in seen), key=rank_of, default="unknown")
    return {
        "version": version,
        "transport": transport,
        "mnnvl": any(r.get("mnnvl") for r in seen),
        "nvls": bool(seen) and all(r.get("nvls") for r in seen),
        "per_rank": [r.get("transport", "unknown") for r in per_rank],
    }


MNNVL_CAUSES = (
    "the IMEX channel is not mounted in the pod (/dev/nvidia-caps-imex-channels/channel0 comes "
    "with the ComputeDomain's channel claim)",
    "NCCL_CUMEM_ENABLE=0 (MNNVL needs cuMem)",
    "NCCL_MNNVL_ENABLE=0",
    "the pods sit in different NVLink cliques (node label {clique})",
)
P2P_CAUSES = (
    "NCCL_P2P_DISABLE=1",
    "NCCL_P2P_LEVEL set below NVL",
    "peer access between the GPUs refused inside the container (check nvidia-smi topo -p2p r)",
)
NVLINK_TRANSPORTS = ("NVLink P2P", "MNNVL")


def expected_transport(*, nodes: int, mnnvl_fabric: bool, nvlink: bool) -> str | None:
    """The transport the GPUs offer a communicator: MNNVL across nodes whose GPUs all sit on
    a COMPLETED fabric, NVLink P2P between the NVLink-connected GPUs of one host."""
    if nodes > 1 and mnnvl_fabric:
        return "MNNVL"
    if nodes == 1 and nvlink:
        return "NVLink P2P"
    return None


def transport_problems(
    nccl: dict[str, Any], *, nodes: int, mnnvl_fabric: bool, nvlink: bool
) -> list[str]:
    """FAIL reasons when NCCL built the measured communicator over a slower transport than
    the GPUs offer (``expected_transport``; MNNVL also counts as NVLink on one host). An
    unknown transport (the user's own ``NCCL_DEBUG_FILE``) or none (one rank, gloo) is not
    judged here."""
    found = str(nccl.get("transport") or "unknown")
    expected = expected_transport(nodes=nodes, mnnvl_fabric=mnnvl_fabric, nvlink=nvlink)
    if expected is None or found.startswith(("unknown", "none")):
        return []
    if expected == "MNNVL" and found != "MNNVL":
        return [
            f"transport: NCCL built the {nodes}-node communicator over {found}, expected MNNVL "
            "(every GPU reports a COMPLETED NVLink fabric); usual causes: "
            + "; ".join(MNNVL_CAUSES).format(clique=clique_label())
        ]
    if expected == "NVLink P2P" and found not in NVLINK_TRANSPORTS:
        return [
            f"transport: NCCL used {found} between GPUs of one host that have NVLink P2P "
            "available, expected NVLink P2P; usual causes: " + "; ".join(P2P_CAUSES)
        ]
    return []
