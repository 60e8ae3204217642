"""What a healthy system of a given kind measures: all-reduce bus bandwidth baselines, each row
with its source (a published figure and its citation, or our measurement with date and method).

Verification judges against a matching row x (1 - tolerance) when no ``--min-busbw-gbps`` is
given (docs/verification.md). A row matches on the GPU model (a word of NVML's name), GPUs per
node, the node count (a range), the transport (``transport_key``), the NCCL version range and
the platform (a provider's rows only when asked for). A multi-node NVLS row covers every
whole-node slice of one NVLink domain (2 to 18 nodes of an NVL72): NVLS bounds a GPU's busbw by
its own links (AICR: 841.17 GB/s on 2 GB300 nodes against 895.08 for the rack). Standard
library only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

TABLE_VERSION = "2026-12-02"
NVL72 = (2, 18)  # the whole-node slices of one NVL72 NVLink domain


@dataclass(frozen=True)
class Baseline:
    """One row: the large-message all-reduce busbw a healthy system of this kind reaches."""

    key: str
    models: tuple[str, ...]  # matched as words of NVML's GPU name
    gpus_per_node: int  # GPUs (ranks) per node of the communicator
    nodes: tuple[int, int]  # the node counts it judges, inclusive
    transport: str  # a transport_key value
    nccl_min: str  # inclusive, "2.28"
    busbw_gbps: float  # float32 sum, large messages (judged sizes)
    tolerance: float  # the verdict's floor is busbw x (1 - tolerance)
    source: str  # "published" or "measured"
    date: str  # when the figure was measured, else when its source published it
    citation: str
    platform: str = ""  # "": any cluster; a provider ("eks"): only when asked for
    nccl_max: str = ""  # exclusive, "" = open

    @property
    def floor_gbps(self) -> float:
        return round(self.busbw_gbps * (1.0 - self.tolerance), 1)


BASELINES: tuple[Baseline, ...] = (
    Baseline(
        key="h200x2-nv18-p2p",
        models=("H200",),
        gpus_per_node=2,
        nodes=(1, 1),
        transport="NVLink P2P",
        nccl_min="2.28",
        busbw_gbps=346.7,
        tolerance=0.10,
        source="measured",
        date="2026-11-30",
        citation=(
            "our measurement, 2026-11-30, 2 x H200 SXM NV18 on one host, NCCL 2.28.9, NVLS off: "
            "nccl-tests all_reduce_perf -b 1M -e 4G -f 2 -g 2 (float32 sum), 346.7 GB/s at "
            "4 GiB (343-347 over repeat runs), 328.7 at 1 GiB (bench/RESULTS.md)"
        ),
    ),
    Baseline(
        key="h100-h200x8-nvls",
        models=("H100", "H200"),
        gpus_per_node=8,
        nodes=(1, 1),
        transport="NVLS",
        nccl_min="2.17",
        busbw_gbps=480.0,
        tolerance=0.10,
        source="published",
        date="2024-05-06",
        citation=(
            "an NCCL maintainer's figures for 8 x H100 SXM with NVLS, ~480 GB/s all-reduce "
            "busbw at 4-8 GiB (github.com/NVIDIA/nccl/issues/1455); 8 x H200 ~475 GB/s "
            "(github.com/NVIDIA/nccl-tests/issues/272); the ~480 peak on 8 GPUs also in an NCCL "
            "maintainer's answer of 2024-05-06 (github.com/NVIDIA/nccl-tests/issues/212)"
        ),
    ),
    Baseline(
        key="gb200-nvl72-mnnvl-nvls",
        models=("GB200",),
        gpus_per_node=4,
        nodes=NVL72,
        transport="MNNVL NVLS",
        nccl_min="2.25",
        busbw_gbps=770.0,
        tolerance=0.2208,  # 770 x (1 - 0.2208) = 600: AICR's GB200 floor
        source="published",
        date="2026-09-16",
        citation=(
            "as reported by NVIDIA's AI Cluster Runtime: ~770 GB/s NVLS all-reduce busbw of "
            "production GB200 NVL72 from NVIDIA's Beacon baselines (release 26.08.00), floored "
            "at 600 for its gb200-eks/oke-training NCCL checks (github.com/NVIDIA/aicr/issues/"
            "2784, pull 2785, which calls ~770 reported, not confirmed); full-rack runs reach "
            "835-847 GB/s at 4-8 GiB (github.com/coreweave/nccl-tests/issues/43)"
        ),
    ),
    Baseline(
        key="gb300-nvl72-mnnvl-nvls",
        models=("GB300",),
        gpus_per_node=4,
        nodes=NVL72,
        transport="MNNVL NVLS",
        nccl_min="2.25",
        busbw_gbps=895.08,
        tolerance=0.0805,  # 895.08 x (1 - 0.0805) = 823: AICR's generic GB300 floor
        source="published",
        date="2026-09-16",
        citation=(
            "NVIDIA's AI Cluster Runtime: a validated bare-metal GB300 NVL72 baseline of "
            "895.08 GB/s NVLS all-reduce busbw at 16 GiB, 4 GPUs per node, floored at 823 "
            "(recipes/overlays/gb300-generic-ubuntu-training.yaml, github.com/NVIDIA/aicr/"
            "issues/2787)"
        ),
    ),
    Baseline(
        key="gb300-nvl72-mnnvl-nvls-eks",
        models=("GB300",),
        gpus_per_node=4,
        nodes=NVL72,
        transport="MNNVL NVLS",
        nccl_min="2.25",
        busbw_gbps=841.17,
        tolerance=0.1678,  # 841.17 x (1 - 0.1678) = 700: AICR's GB300 EKS floor
        source="published",
        date="2026-08-25",
        citation=(
            "NVIDIA's AI Cluster Runtime on EKS: 841.17 GB/s NVLS busbw measured on 2 x "
            "p6e-gb300r.36xlarge (8 GPUs, 16 GiB; github.com/NVIDIA/aicr/issues/1256), floor "
            "700 for gb300-eks-training (github.com/NVIDIA/aicr/issues/2640, 2787)"
        ),
        platform="eks",
    ),
)


def transport_key(nccl: dict[str, Any] | None) -> str:
    """The transport a baseline row names: NCCL's transport, with NVLS where it was set up."""
    nccl = nccl or {}
    transport = str(nccl.get("transport") or "unknown")
    if nccl.get("nvls") and transport in ("NVLink P2P", "MNNVL"):
        return "NVLS" if transport == "NVLink P2P" else "MNNVL NVLS"
    return transport


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".") if p.isdigit())


def _in_range(version: str | None, lo: str, hi: str) -> bool:
    if not version:
        return False  # an unknown NCCL matches no row: the figures depend on it
    v = _version(version)
    return v >= _version(lo) and (not hi or v < _version(hi))


def _rows(
    names: Sequence[str], nodes: int, gpus_per_node: int, platform: str
) -> Iterator[Baseline]:
    """The rows of this shape and platform whose models name every one of the GPUs."""
    # "H200" must not match "GH200": compare whole words of NVML's name.
    words = [name.replace("-", " ").split() for name in names]
    for row in BASELINES:
        low, high = row.nodes
        shape = row.gpus_per_node == gpus_per_node and low <= nodes <= high
        models = all(any(m in w for m in row.models) for w in words)
        if row.platform == platform and shape and models:
            yield row


def match(
    gpu_names: Sequence[str],
    gpus: int,
    nodes: int,
    nccl: dict[str, Any] | None,
    platform: str = "",
) -> Baseline | None:
    """The row for this system, or None. Every GPU's name must contain one of the models; the
    GPUs must spread evenly over the nodes."""
    names = [n for n in gpu_names if n]
    if not names or nodes < 1 or gpus % nodes:
        return None
    key, version = transport_key(nccl), (nccl or {}).get("version")
    rows = _rows(names, nodes, gpus // nodes, platform)
    return next(
        (r for r in rows if r.transport == key and _in_range(version, r.nccl_min, r.nccl_max)),
        None,
    )


def for_shape(system: str, nodes: int, gpus_per_node: int, platform: str = "") -> Baseline | None:
    """The row a run of this shape on this system would be judged against (any NCCL version
    the row covers)."""
    return next(_rows([f"NVIDIA {system.upper()}"], nodes, gpus_per_node, platform), None)


def as_dict(row: Baseline) -> dict[str, Any]:
    """A row for RESULT and the reports (with its floor)."""
    return {
        **asdict(row),
        "models": list(row.models),
        "nodes": list(row.nodes),
        "floor_gbps": row.floor_gbps,
    }


def rows() -> list[dict[str, Any]]:
    return [as_dict(row) for row in BASELINES]


def table_text() -> str:
    """The table as ``mnnvl baselines`` prints it."""
    header = ["key", "GPU", "GPUs/node", "nodes", "platform", "transport", "NCCL", "busbw GB/s"]
    header += ["tol", "floor"]
    rows = [
        [
            r.key,
            "/".join(r.models),
            str(r.gpus_per_node),
            "-".join(dict.fromkeys(map(str, r.nodes))),
            r.platform or "any",
            r.transport,
            f">={r.nccl_min}" + (f",<{r.nccl_max}" if r.nccl_max else ""),
            f"{r.busbw_gbps:.1f}",
            f"{r.tolerance:.1%}",
            f"{r.floor_gbps:.1f}",
        ]
        for r in BASELINES
    ]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", f"baseline table version {TABLE_VERSION}; sources:"]
    lines += [f"  {r.key} ({r.source}, {r.date}): {r.citation}" for r in BASELINES]
    return "\n".join(lines)


def shape_text(system: str, nodes: int, gpus_per_node: int, row: Baseline | None) -> str:
    """Which row a run of this shape gets, as ``mnnvl baselines --system ...`` prints it."""
    shape = f"{system} x {nodes} node(s) x {gpus_per_node} GPU(s)"
    if row is None:
        return (
            f"{shape}: no baseline row; verify derives its threshold (active links x link speed "
            "x --efficiency) unless --min-busbw-gbps is given"
        )
    low, high = row.nodes
    return (
        f"{shape}: row {row.key} ({row.transport}, NCCL >= {row.nccl_min}), floor "
        f"{row.floor_gbps:.1f} GB/s = {row.busbw_gbps:g} x (1 - {row.tolerance:.2%}); the row "
        f"judges {low}-{high} node(s) of {row.gpus_per_node} GPUs alike"
    )
