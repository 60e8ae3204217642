"""NVLink/NCCL verification inside a worker pod: ``python -m mnnvl.runtime.verify``.

Launched by torchrun, one process per GPU (NCCL), or one CPU process per pod (gloo).
Each rank checks its GPU through NVML, applies the NCCL profile (``MNNVL_NCCL_PROFILE``,
default ``verify-strict``) knowing whether the GPU sits on an MNNVL fabric, then joins the
process group; rank 0 collects every rank's NVML summary, runs the all-reduce sweep with
the others, judges, writes the report files and prints ``RESULT {json}``.

Verdict: FAIL on an inactive NVLink link of a GPU that has NVLink, a fabric that is not
ready or differs across ranks, a COMPLETED fabric without an IMEX channel, a wrong
all-reduce sum, or bus bandwidth under the threshold. NVLink error counters are reported
but never fail the run: NVML counts them since the driver loaded, replays and recoveries
are corrected by the link layer, and a link that degrades enough to matter shows up as an
inactive link or low bandwidth, which are judged.

Exit code 0 on PASS, 4 on FAIL, 2 on bad input; the RESULT line is printed either way.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from mnnvl import flags, report
from mnnvl.errors import SpecError, VerificationFailed
from mnnvl.runtime import collectives, nccl, nvml
from mnnvl.runtime.result import emit_result, free_port
from mnnvl.spec import VerifyConfig

logger = logging.getLogger("mnnvl.runtime.verify")

DEFAULT_PROFILE = "verify-strict"
GPU_SIZES = (1 << 20, 4 << 30)
CPU_SIZES = (1 << 10, 1 << 20)


def judge(
    cfg: VerifyConfig,
    summaries: Sequence[dict[str, Any]],
    sizes: Sequence[dict[str, Any]],
    world_size: int,
) -> dict[str, Any]:
    """The verdict part of RESULT: verdict, reasons, threshold and judged bandwidth."""
    reasons: list[str] = []
    for rank, summary in enumerate(summaries):
        reasons += nvml.local_problems(summary, rank)
    reasons += nvml.fabric_problems(summaries)
    reasons += [
        f"all_reduce of {row['bytes']} bytes returned a wrong sum"
        for row in sizes
        if not row["correct"]
    ]
    failed = bool(reasons)
    topo = nvml.topology(summaries)
    threshold, source = threshold_gbps(cfg, topo)
    judged = judged_busbw(sizes, cfg.judge_min_bytes)
    notes = _notes(summaries)
    if world_size < 2:
        threshold, source = None, "none"
        notes.append("one rank: bus bandwidth is 0 by definition, so bandwidth was not judged")
    elif threshold is None:
        notes.append("no NVLink detected and no --min-busbw-gbps given: bandwidth not judged")
    elif judged < threshold:
        failed = True
        reasons.append(
            f"busbw {judged:.1f} GB/s is below the {source} threshold {threshold:.1f} GB/s"
            + (f" (link limit {topo['link_limit_gbps']} GB/s)" if topo["link_limit_gbps"] else "")
        )
    return {
        "verdict": "FAIL" if failed else "PASS",
        "reasons": reasons + notes,
        "threshold_gbps": threshold,
        "threshold_source": source,
        "judged_busbw_gbps": judged,
        "peak_busbw_gbps": max((row["busbw_gbps"] for row in sizes), default=0.0),
        "topology": topo,
    }


def threshold_gbps(cfg: VerifyConfig, topo: dict[str, Any]) -> tuple[float | None, str]:
    """User threshold if given, else active links x link speed x efficiency, else none."""
    if cfg.min_busbw_gbps > 0:
        return cfg.min_busbw_gbps, "user"
    if topo["active_links"] and topo["link_speed_gbps"]:
        derived = topo["active_links"] * topo["link_speed_gbps"] * cfg.efficiency
        return round(derived, 3), "derived"
    return None, "none"


def judged_busbw(sizes: Sequence[dict[str, Any]], judge_min_bytes: int) -> float:
    """Best busbw at sizes >= judge_min_bytes; the largest size if the sweep stops below."""
    if not sizes:
        return 0.0
    big = [row["busbw_gbps"] for row in sizes if row["bytes"] >= judge_min_bytes]
    return max(big) if big else max(sizes, key=lambda row: row["bytes"])["busbw_gbps"]


def _notes(summaries: Sequence[dict[str, Any]]) -> list[str]:
    notes = []
    for rank, summary in enumerate(summaries):
        if summary["nvml"].startswith("unavailable"):
            notes.append(f"note: rank {rank} NVML {summary['nvml']}; NVLink checks skipped")
        for gpu in summary.get("gpus", []):
            errors = {k: v for k, v in gpu["nvlink"]["errors"].items() if v}
            if errors:
                notes.append(
                    f"note: rank {rank} NVLink error counters since driver load {errors} "
                    "(reported, not judged)"
                )
    return notes


# ---- process side ------------------------------------------------------------------------


def parse_config(argv: Sequence[str] | None) -> VerifyConfig:
    parser = argparse.ArgumentParser(prog="python -m mnnvl.runtime.verify", description=__doc__)
    flags.add_arguments(parser, VerifyConfig)
    return flags.from_namespace(VerifyConfig, parser.parse_args(argv))


def _dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank); a bare ``python -m`` run is a one-rank job."""
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        )
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


def _nvml_id(device: torch.device) -> list[str | int]:
    """The NVML identity of the CUDA device (UUID, since CUDA_VISIBLE_DEVICES renumbers)."""
    if device.type != "cuda":
        return []
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return [text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"]
    return [device.index or 0]


def _sweep_plan(cfg: VerifyConfig, cuda: bool) -> collectives.SweepPlan:
    lo, hi = GPU_SIZES if cuda else CPU_SIZES
    max_bytes = cfg.max_bytes or hi
    min_bytes = min(cfg.min_bytes or lo, max_bytes)
    return collectives.SweepPlan(
        sizes=collectives.sweep_sizes(min_bytes, max_bytes),
        warmup_iters=cfg.warmup_iters,
        iters=cfg.iters,
        target_s=0.08 if cuda else 0.01,
        reps=5 if cuda else 3,
        cuda_graphs=cfg.cuda_graphs and cuda,
    )


def run(cfg: VerifyConfig, started: float) -> dict[str, Any]:
    """Run on this rank; return the full RESULT dict (identical verdict on every rank)."""
    rank, world, local_rank = _dist_env()
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    summary = nvml.check_gpus(_nvml_id(device) if device is not None else [])
    summary.update(rank=rank, local_rank=local_rank, host=socket.gethostname())
    # The profile must see the fabric state before NCCL initialises: it sets
    # NCCL_MNNVL_ENABLE=1 only on fabric GPUs so a broken IMEX domain fails loudly.
    profile = os.environ.get(nccl.PROFILE_ENV, DEFAULT_PROFILE)
    nccl.apply_profile(profile, fabric_present=nvml.fabric_present(summary))
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, device_id=device, timeout=datetime.timedelta(seconds=300))
    try:
        summaries: list[Any] = [None] * world
        dist.all_gather_object(summaries, summary)
        plan = _sweep_plan(cfg, cuda)
        sizes = collectives.run_sweep(plan, device or torch.device("cpu"))
        result: dict[str, Any] = {"kind": "verify"}
        result.update(judge(cfg, summaries, sizes, world))
        result.update(world_size=world, backend=backend, sizes=sizes, nodes=summaries)
        result["wall_s"] = round(time.monotonic() - started, 3)
        if rank == 0:
            _publish(result, cfg.output_dir)
        # Other ranks wait here so that a non-zero exit cannot get rank 0 killed by
        # torchrun before the RESULT line is out.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return result


def _publish(result: dict[str, Any], output_dir: str) -> None:
    if output_dir:
        try:
            files = report.write_verify_report(result, output_dir)
            logger.info("report files: %s", files)
        except OSError as e:
            logger.error("could not write the report to %s: %s", output_dir, e)
    logger.info("\n%s", report.verify_table(result))
    emit_result(result)


def _failed_result(reason: str, started: float) -> dict[str, Any]:
    return {
        "kind": "verify",
        "verdict": "FAIL",
        "reasons": [reason],
        "threshold_gbps": None,
        "threshold_source": "none",
        "judged_busbw_gbps": 0.0,
        "peak_busbw_gbps": 0.0,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "backend": "nccl" if torch.cuda.is_available() else "gloo",
        "sizes": [],
        "topology": None,
        "nodes": [],
        "wall_s": round(time.monotonic() - started, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    logging.basicConfig(
        level=os.environ.get("MNNVL_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = parse_config(argv)
        result = run(cfg, started)
    except SpecError as e:
        logger.error("%s", e)
        if os.environ.get("RANK", "0") == "0":
            emit_result(_failed_result(str(e), started))
        return SpecError.exit_code
    except (RuntimeError, OSError) as e:
        # NCCL init or a collective broke (e.g. NCCL_MNNVL_ENABLE=1 on a broken IMEX
        # domain): that is a verification failure, and the launcher still gets a RESULT.
        logger.exception("verification aborted")
        if os.environ.get("RANK", "0") == "0":
            emit_result(_failed_result(f"aborted: {e}", started))
        return VerificationFailed.exit_code
    if result["verdict"] != "PASS":
        logger.error("verification FAILED: %s", "; ".join(result["reasons"]))
        return VerificationFailed.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
