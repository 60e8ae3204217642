"""NVLink/NCCL verification inside a worker pod: ``python -m mnnvl.runtime.verify``.

One process per GPU (NCCL) or one CPU process per pod (gloo). Each rank checks its GPUs
through NVML, applies the NCCL profile (``MNNVL_NCCL_PROFILE``, default ``verify-strict``)
knowing whether the GPU sits on an MNNVL fabric, and joins the process group; rank 0 gathers
every rank's NVML summary, runs the all-reduce sweep with the others, judges
(:mod:`mnnvl.runtime.verdict`: PASS, FAIL or NOT_JUDGED, which is no PASS), prints
``RESULT {json}`` (with the transport NCCL used and ``timings_s``), then writes the report.

Exit code 0 on PASS (and on NOT_JUDGED with ``--allow-unjudged``), 4 on FAIL or on
NOT_JUDGED without it, 2 on bad input; the RESULT line is printed either way.

Every collective is bounded by ``--collective-timeout-s`` (the start-up rendezvous waits
``--fabric-wait-s`` longer, for peers still waiting for their fabric); a timed-out one exits
11 (retriable) naming the sweep size. Every sweep size and timed loop is reported to the
launcher's watchdog (``--stall-timeout-s``, :mod:`mnnvl.runtime.progress`), so a hung rank
ends its pod with exit 12. Test hook: ``MNNVL_TEST_SIGNAL_AT=<bytes>:<rank>:<SIGNAME>``
(:func:`mnnvl.runtime.progress.signal_at`).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

_STARTED = time.monotonic()  # before the heavy imports, so the breakdown counts them

import torch  # noqa: E402  (after the clock above on purpose)
import torch.distributed as dist  # noqa: E402

from mnnvl import report  # noqa: E402
from mnnvl.contract import env as contract_env  # noqa: E402
from mnnvl.contract import nccl  # noqa: E402
from mnnvl.contract.exit_codes import COLLECTIVE_TIMEOUT  # noqa: E402
from mnnvl.contract.result import FAIL, emit_result  # noqa: E402
from mnnvl.errors import SpecError, VerificationFailed, WorkloadFailed  # noqa: E402
from mnnvl.inputs import flags, surface  # noqa: E402
from mnnvl.inputs.spec import VerifyConfig  # noqa: E402
from mnnvl.runtime import (  # noqa: E402
    cliques,
    collectives,
    devices,
    fabric_health,
    groups,
    inplace,
    nccl_log,
    nvml,
    progress,
)
from mnnvl.runtime.local import free_port  # noqa: E402
from mnnvl.runtime.verdict import exit_code, judge  # noqa: E402

logger = logging.getLogger("mnnvl.runtime.verify")

DEFAULT_PROFILE = "verify-strict"
GPU_SIZES = (1 << 20, 4 << 30)
CPU_SIZES = (1 << 10, 1 << 20)
SIGNAL_AT_ENV = progress.SIGNAL_AT_ENV


def parse_config(argv: Sequence[str] | None) -> VerifyConfig:
    parser = argparse.ArgumentParser(prog="python -m mnnvl.runtime.verify", description=__doc__)
    flags.add_inputs(parser, surface.class_inputs(VerifyConfig))
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
    world = int(os.environ[contract_env.WORLD_SIZE])
    return int(os.environ["RANK"]), world, int(os.environ["LOCAL_RANK"])


def _sweep_plan(
    cfg: VerifyConfig, cuda: bool, sweep: progress.SweepProgress | None = None
) -> collectives.SweepPlan:
    lo, hi = GPU_SIZES if cuda else CPU_SIZES
    max_bytes = cfg.max_bytes or hi
    min_bytes = min(cfg.min_bytes or lo, max_bytes)
    sizes = collectives.sweep_sizes(min_bytes, max_bytes)
    if sweep is not None:
        sweep.sizes = sizes
    return collectives.SweepPlan(
        sizes=sizes,
        warmup_iters=cfg.warmup_iters,
        iters=cfg.iters,
        target_s=0.05 if cuda else 0.01,
        reps=5 if cuda else 3,
        cuda_graphs=cfg.cuda_graphs and cuda,
        # gloo figures are never judged against NVLink: a looser interval ends sizes sooner.
        rel_ci=0.01 if cuda else 0.05,
        progress=sweep,
    )


class Phases:
    """Seconds spent in each phase since process start (``timings_s`` in RESULT)."""

    def __init__(self, started: float) -> None:
        self.started = self.last = started
        self.seconds: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self.last, 3)
        self.last = now

    def total(self) -> float:
        return round(time.monotonic() - self.started, 3)


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def run(cfg: VerifyConfig, phases: Phases, sweep: progress.SweepProgress) -> dict[str, Any]:
    """Run on this rank; return the full RESULT dict (identical verdict on every rank)."""
    rank, world, local_rank = _dist_env()
    placed = groups.from_env(rank, world)  # a pod in the wrong group fails before NCCL starts
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    problem = devices.missing_gpus_problem(visible) or devices.missing_channel_problem()
    if problem:
        raise VerificationFailed(problem)
    cuda = visible > 0
    device = torch.device("cuda", local_rank % visible) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    phases.mark("cuda_setup")
    ids = devices.nvml_ids(device) if device is not None else []
    # A fabric still registering completes on its own: wait for it before judging it.
    summary = fabric_health.wait_for_fabric(lambda: nvml.check_gpus(ids), cfg.fabric_wait_s)
    summary.update(rank=rank, local_rank=local_rank, host=devices.pod_name())
    phases.mark("nvml")
    # The profile must see the fabric state before NCCL initialises: it sets
    # NCCL_MNNVL_ENABLE=1 only on fabric GPUs so a broken IMEX domain fails loudly.
    profile = os.environ.get(contract_env.NCCL_PROFILE, DEFAULT_PROFILE)
    nccl.apply_profile(profile, fabric_present=nvml.fabric_present(summary))
    ncclog = nccl_log.NcclLog().start() if cuda else None
    backend = "nccl" if cuda else "gloo"
    try:
        # Peers may still be waiting for their fabric: the rendezvous waits as long more;
        # then every collective is held to the collective timeout.
        rendezvous = datetime.timedelta(seconds=cfg.collective_timeout_s + cfg.fabric_wait_s)
        # The store as env:// makes it, and under launchers that restart workers in place
        # the attempt's own (mnnvl.runtime.inplace).
        joined = inplace.rendezvous(rank, world, rendezvous.total_seconds(), join_s=0.0)
        dist.init_process_group(backend, device_id=device, timeout=rendezvous, **joined)
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=cfg.collective_timeout_s))
        progress.report("process group ready", cfg.stall_s)
        try:
            result = _measure(cfg, phases, summary, device, ncclog, placed, sweep)
            if rank == 0:
                _publish(result, cfg.output_dir, phases)
            # Other ranks wait here so that a non-zero exit cannot get rank 0 killed by
            # torchrun before the RESULT line is out.
            dist.barrier()
        finally:
            dist.destroy_process_group()
    finally:
        if ncclog is not None and ncclog.active:
            ncclog.finish()  # NCCL's lines reach the pod log also when something broke
    return result


def _measure(
    cfg: VerifyConfig,
    phases: Phases,
    summary: dict[str, Any],
    device: torch.device | None,
    ncclog: nccl_log.NcclLog | None,
    placed: groups.Groups,
    sweep: progress.SweepProgress,
) -> dict[str, Any]:
    world = dist.get_world_size()
    summaries: list[Any] = [None] * world
    sweep.doing = "the all-gather of every rank's NVML summary"
    dist.all_gather_object(summaries, summary)  # the first collective: NCCL is set up here
    phases.mark("process_group")
    plan = _sweep_plan(cfg, device is not None, sweep)
    timings: dict[str, float] = {}
    backend = "nccl" if device is not None else "gloo"
    result: dict[str, Any] = {"kind": "verify"}
    dev = device or torch.device("cpu")
    if placed.count > 1:
        result.update(cliques.measure(cfg, plan, summaries, dev, placed, backend))
        sizes = result.pop("sizes")
    else:
        sizes = collectives.run_sweep(plan, dev, timings)
    phases.seconds.update({f"sweep_{k}": v for k, v in timings.items()})
    phases.mark("sweep")
    # Read after the sweep: NCCL connects each algorithm's channels on first use.
    result["nccl"] = _transport(ncclog, summary, world)
    if placed.count == 1:
        # A grouped run's transport is not judged: across cliques it rightly is the network.
        result.update(judge(cfg, summaries, sizes, world, backend, result["nccl"]))
    result.update(world_size=world, backend=backend, sizes=sizes, nodes=summaries)
    result["allow_unjudged"] = cfg.allow_unjudged
    phases.mark("judge")
    sweep.doing = "the all-gather of every rank's transport or the barrier after the verdict"
    progress.report("sweep judged", cfg.stall_s)
    return result


def _transport(
    ncclog: nccl_log.NcclLog | None, summary: dict[str, Any], world: int
) -> dict[str, Any]:
    """Every rank's transport, from its own NCCL log; gathered so rank 0 sees them all."""
    if ncclog is None:
        return {"version": None, "transport": "none (gloo, no NCCL)", "mnnvl": False}
    if not ncclog.active:
        mine: dict[str, Any] = {"transport": "unknown"}  # the user's NCCL_DEBUG_FILE
    else:
        nvlink = any(g["nvlink"]["active"] for g in summary.get("gpus", []))
        mine = nccl_log.classify(ncclog.lines(), nvlink_active=nvlink)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    return nccl_log.summarize(everyone, _nccl_version())


def _publish(result: dict[str, Any], output_dir: str, phases: Phases) -> None:
    """The verdict first (RESULT line), then the table and the report files with the plot."""
    result["timings_s"] = dict(phases.seconds)
    result["wall_s"] = phases.total()
    # Wall-clock time of the worker's start, so a launcher can tell its own start-up apart.
    result["started_unix"] = round(time.time() - result["wall_s"], 3)
    emit_result(result)
    logger.info("\n%s", report.verify_table(result))
    if output_dir:
        try:
            files = report.write_verify_report(result, output_dir)
            logger.info("report files: %s", files)
        except OSError as e:
            logger.error("could not write the report to %s: %s", output_dir, e)
    phases.mark("report")
    logger.info("after the verdict: report and plot took %.2f s", phases.seconds["report"])


def _timed_out(error: BaseException, cfg: VerifyConfig, doing: str) -> int:
    """Exit 11 (retriable) with one line naming the collective; rank 0 reports it too."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    reason = (
        f"{doing} timed out after --collective-timeout-s {cfg.collective_timeout_s:g} (a lost "
        f"or hung peer; the step may be retried): {first}"
    )
    rank = os.environ.get("RANK", "0")
    logger.error("rank %s: a collective in %s", rank, reason)
    if rank == "0":
        emit_result(_failed_result(reason))
    return COLLECTIVE_TIMEOUT


def _failed_result(reason: str, backend: str | None = None) -> dict[str, Any]:
    return {
        "kind": "verify",
        "verdict": FAIL,
        "reasons": [reason],
        "threshold_gbps": None,
        "threshold_source": "none",
        "judged_busbw_gbps": 0.0,
        "peak_busbw_gbps": 0.0,
        "world_size": int(os.environ.get(contract_env.WORLD_SIZE, "1")),
        "backend": backend or ("nccl" if torch.cuda.is_available() else "gloo"),
        "nccl": {"version": _nccl_version(), "transport": "unknown", "mnnvl": False},
        "sizes": [],
        "topology": None,
        "nodes": [],
        "wall_s": round(time.monotonic() - _STARTED, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    phases = Phases(_STARTED)
    logging.basicConfig(
        level=os.environ.get("MNNVL_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    phases.mark("imports")
    rank = os.environ.get("RANK", "0")
    sweep: progress.SweepProgress | None = None
    try:
        cfg = parse_config(argv)
        sweep = progress.SweepProgress(cfg.stall_s, int(rank), logger)
        result = run(cfg, phases, sweep)
    except SpecError as e:
        logger.error("%s", e)
        if rank == "0":
            emit_result(_failed_result(str(e)))
        return SpecError.exit_code
    except WorkloadFailed as e:
        # GPUs or the IMEX channel missing, or a pod placed in the wrong clique group: the
        # pod is named.
        logger.error("%s", e)
        if os.environ.get("LOCAL_RANK", "0") == "0":
            emit_result(_failed_result(str(e), backend="none"))
        return e.exit_code
    except (RuntimeError, OSError) as e:
        if sweep is not None and progress.is_collective_timeout(e):
            return _timed_out(e, cfg, sweep.doing)
        # NCCL init or a collective broke (e.g. NCCL_MNNVL_ENABLE=1 on a broken IMEX
        # domain): that is a verification failure, and the launcher still gets a RESULT.
        logger.exception("verification aborted")
        if rank == "0":
            emit_result(_failed_result(f"aborted: {e}"))
        return VerificationFailed.exit_code
    code = exit_code(result["verdict"], cfg.allow_unjudged)
    if result["verdict"] == FAIL:
        logger.error("verification FAILED: %s", "; ".join(result["reasons"]))
    elif code:
        logger.error(
            "verification NOT_JUDGED (no bandwidth threshold was applied) and "
            "--allow-unjudged was not given: %s",
            "; ".join(result["reasons"]),
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
