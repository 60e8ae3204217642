"""Sharded training step: ``python -m mnnvl.runtime.train [TrainConfig flags]`` under torchrun.

FSDP2 over all ranks, bf16 compute with fp32 master weights and reductions on GPU (fp32 on
CPU/gloo), blocks compiled where ``TrainConfig.compiles`` says, fused AdamW, linear warm-up
then cosine decay to ``min_lr_ratio``, gradient clipping, sharded checkpoints written in the
background (:mod:`mnnvl.runtime.checkpoint`; the run succeeds only once its final one is
complete) with automatic resume of the step, optimizer, LR schedule and RNG (the data order
is a function of the step, so a restarted run continues the same loss curve). Rank 0 logs
metrics to stderr and ends with one ``RESULT {json}`` line on stdout.

Non-finite loss or gradient norm: a device-side flag is accumulated every step without a host
sync and all-reduced at every log step and before every checkpoint, so a NaN fails the run
(exit 4) within ``log_every`` steps and never reaches a checkpoint. Every collective is bounded
by ``--collective-timeout-s`` (exit 11, retriable, naming the collective, the step and the
ranks that did not arrive); progress goes to the launcher's watchdog (``--stall-timeout-s``).
CUDA out of memory is one line with the levers and exit 10; weights and optimizer state that
cannot fit are refused (exit 2) before the model is built (:mod:`mnnvl.runtime.memory`).

Test hooks: ``MNNVL_TEST_INJECT_NAN_STEP=<n>`` multiplies step ``n``'s loss by NaN on every
rank; ``MNNVL_TEST_SIGNAL_AT=<step>:<rank>:<SIGNAME>`` signals that rank after that step,
once per checkpoint directory (:func:`mnnvl.runtime.progress.signal_at`).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mnnvl.contract.exit_codes import COLLECTIVE_TIMEOUT, OUT_OF_MEMORY
from mnnvl.contract.result import emit_result
from mnnvl.errors import MnnvlError, WorkloadFailed
from mnnvl.inputs import flags, spec, surface
from mnnvl.runtime import memory, metrics, progress
from mnnvl.runtime.checkpoint import Checkpointer
from mnnvl.runtime.data import build_batches
from mnnvl.runtime.groups import Groups
from mnnvl.runtime.hostcopy import HostCopy
from mnnvl.runtime.model import Transformer, flops_per_token, preset
from mnnvl.runtime.parallel import DistInfo, build_sharded_model, init_distributed, tuning
from mnnvl.units import human_duration

logger = logging.getLogger("mnnvl.runtime.train")
INJECT_NAN_ENV = "MNNVL_TEST_INJECT_NAN_STEP"
SIGNAL_AT_ENV = progress.SIGNAL_AT_ENV


def lr_factor(cfg: spec.TrainConfig, k: int) -> float:
    """LR multiplier for optimiser step ``k`` (0-based): linear warm-up, then cosine."""
    if k < cfg.warmup_steps:
        return (k + 1) / cfg.warmup_steps
    progress = min(1.0, (k - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: Transformer, cfg: spec.TrainConfig, info: DistInfo):
    # No weight decay on norms (1-D); fused kernel on CUDA saves a launch per parameter.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    fused = info.is_cuda and tuning()["optim"] != "foreach"
    opt = torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused, foreach=None if fused else True
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(cfg, k))
    return opt, sched


class Trainer:
    def __init__(self, cfg: spec.TrainConfig, info: DistInfo) -> None:
        self.cfg, self.info = cfg, info
        self.mcfg = preset(cfg.model, seq_len=cfg.seq_len)
        bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and info.is_cuda)
        torch.manual_seed(cfg.seed)  # same on every rank: identical (sharded) initial weights
        self.compiled = cfg.compiles(info.is_cuda)
        on = "GPU" if info.is_cuda else "CPU"
        logger.info(
            "compile %s (--compile %s: %s preset on %s)", self.compiled, cfg.compile, cfg.model, on
        )
        self.model = build_sharded_model(
            self.mcfg,
            dist_info=info,
            param_dtype=torch.bfloat16 if bf16 else torch.float32,
            ac_every=cfg.ac_every,
            reshard=cfg.reshard,
            compile=self.compiled,
        )
        self.opt, self.sched = build_optimizer(self.model, cfg, info)
        self.data = build_batches(
            cfg.data,
            vocab_size=self.mcfg.vocab_size,
            seq_len=self.mcfg.seq_len,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            rank=info.rank,
            world=info.world_size,
        )
        self.ckpt = None
        if cfg.checkpoint_dir:
            levers = tuning()
            self.ckpt = Checkpointer(
                cfg.checkpoint_dir,
                rank=info.rank,
                mode=levers["ckpt"],
                timeout_s=cfg.collective_timeout_s,
                host_copy=self.host_copy() if levers["hostcopy"] == "on" else None,
            )
        self.held_s = 0.0  # training held for a save's staging copy since the last step
        self.finite = torch.ones((), dtype=torch.bool, device=info.device)
        self.losses: list[list[float]] = []
        self.last_loss, self.checkpoint, self.start_step = float("nan"), "", 0
        self.resumed_from = ""  # the checkpoint this run continued from
        self.resume_source: str | None = None  # "host" (the pod's memory) or "disk"
        self.resume_load_s: float | None = None
        self.checkpoint_lost_s = 0.0  # steps slowed beside background saves (metrics.Throughput)
        self.first_step_s: float | None = None  # incl. compiling the blocks and warm-up
        self.inject_nan = int(os.environ.get(INJECT_NAN_ENV, "0"))
        self.phase = "start-up"  # where a collective timeout happened, for its message
        self.arrivals = progress.Arrivals(info.rank, info.world_size)
        self.tokens_per_step = cfg.batch_size * self.mcfg.seq_len * info.world_size
        self.flops = flops_per_token(self.mcfg, self.mcfg.seq_len)
        self.peak = metrics.device_peak_flops(info.device)
        # The first two steps this process runs (also after a resume) compile and warm the
        # allocator: left out of the split.
        self.split = metrics.StepSplit(info.device, skip_first=2)

    def host_copy(self) -> HostCopy | None:
        """Where this rank keeps its host copy, written for this run, rank and model."""
        identity = {
            "checkpoint_dir": self.cfg.checkpoint_dir,
            "rank": self.info.rank,
            "world_size": self.info.world_size,
            "model": self.cfg.model,
            "seq_len": self.mcfg.seq_len,
        }
        return HostCopy.for_pod(identity)

    def resume(self) -> None:
        run = f"the {self.cfg.model} preset"
        resumed = self.ckpt.resume(self.model, self.opt, run=run) if self.ckpt else None
        if resumed is None:
            return
        extra, path = resumed.extra, str(resumed.path)
        self.sched.load_state_dict(extra["scheduler"])
        self.start_step, self.last_loss, self.checkpoint = extra["step"], extra["loss"], path
        self.resumed_from = path
        self.resume_source, self.resume_load_s = resumed.source, round(resumed.load_s, 3)

    def close(self) -> None:
        """Stop the heartbeat the trainer runs beside training; call it before the process
        group is destroyed (the heartbeat writes to its store)."""
        self.arrivals.stop()

    def step(self, step: int) -> torch.Tensor:
        split = self.split
        split.begin()
        inputs, targets = (t.to(self.info.device, non_blocking=True) for t in self.data.batch(step))
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
        if step == self.inject_nan:
            loss = loss * float("nan")
        split.mark("forward")
        loss.backward()
        split.mark("backward")
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.grad_clip or math.inf
        )
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.finite &= torch.isfinite(loss.detach()) & torch.isfinite(norm)
        if self.ckpt is not None:  # a background save copies the state this step changes
            self.held_s += self.ckpt.wait_staged()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        split.mark("optimizer")
        return loss.detach()

    def sync(self, step: int, loss: torch.Tensor) -> float:
        """All-reduce loss and the finite flag (a host sync); raise on all ranks if non-finite."""
        stats = torch.stack([loss.float(), (~self.finite).float()])
        dist.all_reduce(stats)
        mean_loss, bad = (stats / self.info.world_size).tolist()
        if bad > 0 or not math.isfinite(mean_loss):
            raise WorkloadFailed(
                f"non-finite loss or gradient norm by step {step} (checked every "
                f"{self.cfg.log_every} steps and before checkpoints); lower --lr, check --data "
                "or try --dtype fp32"
            )
        self.last_loss = mean_loss
        return mean_loss

    def run(self) -> float:
        cfg, first = self.cfg, self.start_step + 1
        thr, marked = metrics.Throughput(), self.start_step
        for step in range(first, cfg.steps + 1):
            self.phase = f"step {step} (FSDP all-gather / reduce-scatter)"
            self.arrivals.step = step
            loss = self.step(step)
            thr.exclude(self.held_s)
            self.held_s = 0.0
            progress.report(f"step {step}", cfg.stall_s, step=not cfg.stall_timeout_s)
            progress.signal_at(step, self.info.rank, "step", cfg.checkpoint_dir or ".")
            is_log = step in (first, cfg.steps) or step % cfg.log_every == 0
            save = self.ckpt is not None and (
                step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
            )
            if is_log or save:
                self.phase = f"the loss all-reduce after step {step}"
                mean_loss = self.sync(step, loss)
                self.split.collect()  # events are complete after the sync
            if is_log:
                saving = self.ckpt is not None and self.ckpt.busy()
                rate = thr.mark(self.tokens_per_step * (step - marked), saving)
                if step == first:
                    self.first_step_s = round(thr.t_first - thr.t_start, 3)
                marked = step
                self.losses.append([step, mean_loss])
                per_gpu = rate / self.info.world_size
                mfu = metrics.mfu(self.flops, per_gpu, self.peak)
                logger.info(
                    "step %d loss %.4f lr %.3g tok/s %.0f (%.0f/%s) mfu %s mem %.2f GiB; %s",
                    step,
                    mean_loss,
                    self.sched.get_last_lr()[0],
                    rate,
                    per_gpu,
                    metrics.worker_unit(self.info.device),
                    "n/a" if mfu is None else f"{mfu:.1%}",
                    metrics.peak_mem_gib(self.info.device),
                    self.steps_left(step, first, rate),
                )
            if save and self.ckpt is not None:
                extra = {
                    "scheduler": self.sched.state_dict(),
                    "loss": mean_loss,
                    "model": cfg.model,  # what it was written for, named if another run loads it
                }
                t_save = time.perf_counter()
                self.phase = f"the checkpoint save of step {step} (barrier)"
                progress.report(f"checkpoint step {step} saving", cfg.stall_s, hold=True)
                self.ckpt.save(step, self.model, self.opt, extra, host_copy=step < cfg.steps)
                thr.save_started()
                progress.report(f"checkpoint step {step} started", cfg.stall_s)
                thr.exclude(time.perf_counter() - t_save)
        if self.ckpt is not None:
            # Success needs the final checkpoint complete: wait for its background write.
            self.phase = "the last checkpoint's write"
            progress.report("waiting for the last checkpoint's write", cfg.stall_s, hold=True)
            done = self.ckpt.finish()
            if done is not None:
                self.checkpoint = str(done)
                progress.report(f"checkpoint {done.name} complete", cfg.stall_s)
        self.checkpoint_lost_s = thr.checkpoint_lost_s()
        return thr.overall()

    def steps_left(self, step: int, first: int, rate: float) -> str:
        """``10 of 20 steps, ETA 3 s`` (the launcher's progress line reads it). The first
        step's rate includes compiling and warm-up, so it gives no ETA."""
        done = f"{step} of {self.cfg.steps} steps"
        if step == first or rate <= 0:
            return done
        eta = (self.cfg.steps - step) * self.tokens_per_step / rate
        return f"{done}, ETA {human_duration(eta)}"

    def mesh(self) -> dict[str, Any]:
        """The device mesh: ``shape``, ``dims``, ``groups`` (NVLink cliques) and ``sharding``."""
        placed = self.info.groups or Groups(count=1, size=self.info.world_size, index=0)
        return {
            "shape": list(placed.mesh_shape),
            "dims": list(placed.mesh_dims),
            "groups": placed.count,
            "sharding": "HSDP" if placed.count > 1 else "FSDP",
        }

    def result(self, tokens_per_s: float, wall_s: float) -> dict[str, Any]:
        per_gpu = tokens_per_s / self.info.world_size
        return {
            "kind": "train",
            "final_loss": self.last_loss if math.isfinite(self.last_loss) else None,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_gpu": per_gpu,
            "mfu": metrics.mfu(self.flops, per_gpu, self.peak),
            "steps": self.cfg.steps,
            "start_step": self.start_step,
            "resumed_from": self.resumed_from,
            "resume_source": self.resume_source,
            "resume_load_s": self.resume_load_s,
            "checkpoint": self.checkpoint,
            "checkpoint_stall_s": self.ckpt.stall_summary() if self.ckpt else None,
            "checkpoint_final_wait_s": round(self.ckpt.final_wait_s, 3) if self.ckpt else None,
            # Steps slowed beside a background save (no figure above holds it: see Throughput).
            "checkpoint_lost_s": self.checkpoint_lost_s if self.ckpt else None,
            "peak_mem_gib": metrics.peak_mem_gib(self.info.device),
            "world_size": self.info.world_size,
            "mesh": self.mesh(),
            "params": sum(p.numel() for p in self.model.parameters()),
            "model": self.cfg.model,
            "device": self.info.device.type,
            "wall_s": wall_s,
            "step_split_ms": self.split.summary(
                1e3 * self.tokens_per_step / tokens_per_s if tokens_per_s > 0 else 0.0
            ),
            "batch_size": self.cfg.batch_size,
            "seq_len": self.mcfg.seq_len,
            "activation_checkpointing": self.cfg.activation_checkpointing,
            "reshard_after_forward": self.cfg.reshard,
            "compile": self.compiled,
            "compile_input": self.cfg.compile,
            "first_step_s": self.first_step_s,
            "tuning": tuning(),
            "losses": self.losses,
        }


def parse_config(argv: list[str] | None) -> spec.TrainConfig:
    parser = argparse.ArgumentParser(prog="python -m mnnvl.runtime.train", description=__doc__)
    flags.add_inputs(parser, surface.class_inputs(spec.TrainConfig))
    return flags.from_namespace(spec.TrainConfig, parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s",
    )
    t0 = time.perf_counter()
    try:
        cfg = parse_config(argv)
        tuning()  # bad levers are bad input, found before the process group exists
        info = init_distributed(cfg.collective_timeout_s)
        progress.report("process group ready", cfg.stall_s, hold=True)  # then load, compile
        check_memory(cfg, info)
    except MnnvlError as e:  # e.g. GPUs requested but none visible: fail naming the pod
        logger.error("%s", e)
        return e.exit_code
    if not cfg.checkpoint_dir:
        logger.warning("no --checkpoint-dir: a restart (a lost or hung worker) starts at step 0")
    trainer: Trainer | None = None
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        trainer = Trainer(cfg, info)
        trainer.resume()
        tokens_per_s = trainer.run()
        if info.rank == 0:
            emit_result(trainer.result(tokens_per_s, time.perf_counter() - t0))
        if trainer.ckpt is not None:
            trainer.ckpt.discard_host_copy()  # ended normally: nothing resumes from it
        return 0
    except MnnvlError as e:
        logger.error("training failed: %s", e)
        return e.exit_code
    except RuntimeError as e:  # torch.OutOfMemoryError is one
        return failure_code(e, cfg, info, trainer)
    finally:
        if trainer is not None:
            trainer.close()  # no thread of ours may still be inside torch when the process exits
        dist.destroy_process_group()


def check_memory(cfg: spec.TrainConfig, info: DistInfo) -> None:
    """Refuse (exit 2) a model whose weights and optimizer state cannot fit one GPU."""
    if not info.is_cuda:
        return
    mcfg = preset(cfg.model, seq_len=cfg.seq_len)
    bf16 = cfg.dtype in ("bf16", "auto")
    memory.check_fits(
        cfg.model,
        mcfg,
        world_size=info.world_size,
        compute_bytes=2 if bf16 else 4,
        reshard=cfg.reshard,
        device_gib=torch.cuda.get_device_properties(info.device).total_memory / memory.GIB,
    )


def failure_code(
    error: RuntimeError, cfg: spec.TrainConfig, info: DistInfo, trainer: Trainer | None
) -> int:
    """Exit 10 for CUDA out of memory and 11 for a collective timeout, each with one line;
    anything else is re-raised (a crash, exit 1)."""
    if isinstance(error, torch.OutOfMemoryError):
        device_gib = torch.cuda.get_device_properties(info.device).total_memory / memory.GIB
        seq_len = preset(cfg.model, seq_len=cfg.seq_len).seq_len
        logger.error(
            "%s",
            memory.oom_message(
                cfg.model,
                batch_size=cfg.batch_size,
                seq_len=seq_len,
                world_size=info.world_size,
                peak_gib=metrics.peak_mem_gib(info.device),
                device_gib=device_gib,
            ),
        )
        return OUT_OF_MEMORY
    if progress.is_collective_timeout(error):
        where = trainer.phase if trainer is not None else "start-up"
        missing = trainer.arrivals.behind() if trainer is not None else "unknown"
        logger.error(
            "rank %d: a collective in %s timed out after --collective-timeout-s %g; ranks that "
            "did not arrive: %s (lost or hung; the run restarts from its last checkpoint): %s",
            info.rank,
            where,
            cfg.collective_timeout_s,
            missing,
            str(error).splitlines()[0] if str(error) else type(error).__name__,
        )
        return COLLECTIVE_TIMEOUT
    raise error


if __name__ == "__main__":
    sys.exit(main())
