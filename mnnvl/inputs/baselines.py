"""What a healthy system of a given kind measures: all-reduce bus bandwidth baselines.

A threshold derived from link count x link speed x efficiency says what the links could
carry, not what a healthy system of that kind reaches. This table holds what such systems
were measured at, each row with its source: a published figure with its citation, or our
own measurement with its date and method. The verification judges against a matching row
x (1 - tolerance) when the user gave no ``--min-busbw-gbps`` (docs/verification.md).

A row matches on the GPU model (NVML's name contains it), the GPUs in the measured
communicator, the nodes they sit on, the transport NCCL used (``transport_key``) and the
NCCL version range. ``mnnvl baselines`` prints the table. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

TABLE_VERSION = "2026-12-01"


@dataclass(frozen=True)
class Baseline:
    """One row: the large-message all-reduce busbw a healthy system of this kind reaches."""

    key: str
    models: tuple[str, ...]  # matched as substrings of NVML's GPU name
    gpus: int  # GPUs (ranks) in the measured communicator
    nodes: int
    transport: str  # a transport_key value
    nccl_min: str  # inclusive, "2.28"
    nccl_max: str  # exclusive, "" = open
    busbw_gbps: float  # float32 sum, large messages (judged sizes)
    tolerance: float  # the verdict's floor is busbw x (1 - tolerance)
    source: str  # "published" or "measured"
    citation: str

    @property
    def floor_gbps(self) -> float:
        return round(self.busbw_gbps * (1.0 - self.tolerance), 1)


BASELINES: tuple[Baseline, ...] = (
    Baseline(
        key="h200x2-nv18-p2p",
        models=("H200",),
        gpus=2,
        nodes=1,
        transport="NVLink P2P",
        nccl_min="2.28",
        nccl_max="",
        busbw_gbps=346.7,
        tolerance=0.10,
        source="measured",
        citation=(
            "our measurement, 2026-11-30, 2 x H200 SXM NV18 on one host, NCCL 2.28.9, NVLS off: "
            "nccl-tests all_reduce_perf -b 1M -e 4G -f 2 -g 2 (float32 sum), 346.7 GB/s at "
            "4 GiB (343-347 over repeat runs), 328.7 at 1 GiB (bench/RESULTS.md)"
        ),
    ),
    Baseline(
        key="h100-h200x8-nvls",
        models=("H100", "H200"),
        gpus=8,
        nodes=1,
        transport="NVLS",
        nccl_min="2.17",
        nccl_max="",
        busbw_gbps=480.0,
        tolerance=0.10,
        source="published",
        citation=(
            "an NCCL maintainer's figures for 8 x H100 SXM with NVLS, ~480 GB/s all-reduce "
            "busbw at 4-8 GiB (github.com/NVIDIA/nccl/issues/1455); 8 x H200 ~475 GB/s "
            "(github.com/NVIDIA/nccl-tests/issues/272)"
        ),
    ),
    Baseline(
        key="gb200-nvl72-mnnvl-nvls",
        models=("GB200",),
        gpus=72,
        nodes=18,
        transport="MNNVL NVLS",
        nccl_min="2.25",
        nccl_max="",
        busbw_gbps=770.0,
        tolerance=0.2208,  # 770 x (1 - 0.2208) = 600: the validation floor
        source="published",
        citation=(
            "NVIDIA's production baseline for GB200 NVL72 NVLS all-reduce, ~770 GB/s busbw, as "
            "cited by its AI Cluster Runtime validation, whose GB200 floor is 600 GB/s "
            "(github.com/NVIDIA/aicr); full-rack runs reach 835-847 GB/s at 4-8 GiB "
            "(github.com/coreweave/nccl-tests/issues/43)"
        ),
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


def match(
    gpu_names: Sequence[str], gpus: int, nodes: int, nccl: dict[str, Any] | None
) -> Baseline | None:
    """The row for this system, or None. Every GPU's name must contain one of the models."""
    names = [n for n in gpu_names if n]
    if not names:
        return None
    key = transport_key(nccl)
    version = (nccl or {}).get("version")
    for row in BASELINES:
        if (
            row.gpus == gpus
            and row.nodes == nodes
            and row.transport == key
            and _in_range(version, row.nccl_min, row.nccl_max)
            and all(any(_model_in(m, n) for m in row.models) for n in names)
        ):
            return row
    return None


def _model_in(model: str, name: str) -> bool:
    # "H200" must not match "GH200": compare whole words of NVML's name.
    return model in name.replace("-", " ").split()


def as_dict(row: Baseline) -> dict[str, Any]:
    """A row for RESULT and the reports (with its floor)."""
    return {**asdict(row), "models": list(row.models), "floor_gbps": row.floor_gbps}


def rows() -> list[dict[str, Any]]:
    return [as_dict(row) for row in BASELINES]


def table_text() -> str:
    """The table as ``mnnvl baselines`` prints it."""
    header = ["key", "GPU", "GPUs", "nodes", "transport", "NCCL", "busbw GB/s", "tol", "floor"]
    rows = [
        [
            r.key,
            "/".join(r.models),
            str(r.gpus),
            str(r.nodes),
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
    lines += [f"  {r.key} ({r.source}): {r.citation}" for r in BASELINES]
    return "\n".join(lines)
