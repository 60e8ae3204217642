"""Process group setup and FSDP2 sharding of the decoder.

Order follows torchtitan: activation checkpointing, then ``torch.compile`` per block, then
``fully_shard`` per block, then the root. ``MNNVL_TRAIN_TUNING`` (comma-separated
``key=value``) holds benchmark-only levers measured in ``bench/bench_train.py`` and not worth
an input: ``prefetch=N`` (explicit all-gather prefetch of N blocks), ``optim=foreach`` and
``ckpt=sync`` / ``ckpt=async-fresh`` (:mod:`mnnvl.runtime.checkpoint`) and ``hostcopy=off``
(no host copy of the checkpoint to resume from: :mod:`mnnvl.runtime.hostcopy`).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from mnnvl.contract import env as contract_env
from mnnvl.contract import nccl
from mnnvl.errors import SpecError, WorkloadFailed
from mnnvl.runtime import devices, groups, inplace, nvml
from mnnvl.runtime.model import ModelConfig, Transformer, build_model

logger = logging.getLogger(__name__)
JOIN_TIMEOUT_S = 600.0  # how long ranks wait for each other at start (torchrun's join_timeout)
TUNING_ENV = "MNNVL_TRAIN_TUNING"
TUNING_DEFAULTS = {"prefetch": "0", "optim": "fused", "ckpt": "async", "hostcopy": "on"}
TUNING_CHOICES = {
    "optim": ("fused", "foreach"),
    "ckpt": ("async", "async-fresh", "sync"),
    "hostcopy": ("on", "off"),
}
# Former keys of MNNVL_TRAIN_TUNING, now training inputs.
TUNING_MOVED = {"ac": "--activation-checkpointing", "reshard": "--reshard-after-forward"}


def tuning() -> dict[str, str]:
    """The levers of ``MNNVL_TRAIN_TUNING`` over their defaults; unknown keys are bad input."""
    text = os.environ.get(TUNING_ENV, "")
    found = dict(TUNING_DEFAULTS)
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key in TUNING_MOVED:
            raise SpecError(TUNING_ENV, f"{item!r}: set it with {TUNING_MOVED[key]} instead")
        if key not in TUNING_DEFAULTS or not value:
            raise SpecError(TUNING_ENV, f"{item!r}: use {', '.join(TUNING_DEFAULTS)} as key=value")
        if value not in TUNING_CHOICES.get(key, (value,)):
            raise SpecError(
                TUNING_ENV, f"{item!r}: {key} is one of {', '.join(TUNING_CHOICES[key])}"
            )
        found[key] = value
    return found


@dataclass(frozen=True, kw_only=True)
class DistInfo:
    rank: int
    world_size: int
    device: torch.device
    groups: groups.Groups | None = None  # None: one group (FSDP over all ranks)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def fabric_identity(device: torch.device, *, nvml_module: Any = None) -> str | None:
    """This GPU's ``<clusterUuid>/<cliqueId>`` on a completed NVLink fabric, else None (also
    when NVML is missing: the verify step reports why). The GPU is looked up by UUID:
    ``CUDA_VISIBLE_DEVICES`` renumbers CUDA indexes, NVML's do not follow."""
    if device.type != "cuda":
        return None
    return nvml.fabric_identity(nvml.check_gpus(devices.nvml_ids(device), nvml=nvml_module))


def init_distributed(timeout_s: float) -> DistInfo:
    """Apply the NCCL profile, then join the process group torchrun describes in env;
    ``timeout_s`` bounds every collective."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get(contract_env.WORLD_SIZE, "1"))
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    problem = devices.missing_gpus_problem(visible)
    if problem:
        raise WorkloadFailed(problem)
    use_cuda = visible > 0
    timeout = datetime.timedelta(seconds=timeout_s)
    profile = os.environ.get(contract_env.NCCL_PROFILE, "production")
    placed = groups.from_env(rank, world)  # a pod in the wrong group fails before NCCL starts
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    fabric = fabric_identity(device)
    nccl.apply_profile(profile, fabric_present=fabric is not None)
    joined = inplace.rendezvous(rank, world, timeout_s, join_s=JOIN_TIMEOUT_S)
    if use_cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timeout, **joined)
    else:
        dist.init_process_group("gloo", timeout=timeout, **joined)
    logger.info("rank %s/%s on %s (NCCL profile %s)", rank, world, device, profile)
    groups.check_fabric(placed, rank, fabric)
    return DistInfo(rank=rank, world_size=world, device=device, groups=placed)


def device_mesh(dist_info: DistInfo) -> DeviceMesh:
    """1-D mesh over all ranks (FSDP), or (groups x ranks per group) for HSDP: shard inside
    an NVLink clique, replicate across cliques."""
    placed = dist_info.groups
    if placed is None or placed.count == 1:
        return init_device_mesh(dist_info.device.type, (dist_info.world_size,))
    return init_device_mesh(
        dist_info.device.type, placed.mesh_shape, mesh_dim_names=placed.mesh_dims
    )


def ac_words(every: int) -> str:
    """Activation checkpointing as a person reads it in the log."""
    if every <= 0:
        return "activation checkpointing off"
    if every == 1:
        return "activation checkpointing on every block"
    return f"activation checkpointing on 1 block in {every}"


def apply_activation_checkpointing(model: Transformer, every: int) -> None:
    """Recompute the activations of every ``every``-th block (1 = all blocks, 0 = none):
    blocks 0, N, 2N, ... are wrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, (name, block) in enumerate(list(model.layers.items())):
        if every and i % every == 0:
            model.layers.register_module(name, checkpoint_wrapper(block, preserve_rng_state=False))


def apply_compile(model: Transformer) -> None:
    for name, block in list(model.layers.items()):
        # torch.compile of a Module returns a Module (an OptimizedModule wrapping it).
        compiled = cast(nn.Module, torch.compile(block, fullgraph=True))
        model.layers.register_module(name, compiled)


def apply_fsdp(
    model: Transformer,
    *,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reshard: bool = True,
    prefetch: int = 0,
) -> None:
    """Shard each block, then the root (embeddings, final norm, head)."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's weights are needed again first in backward: keep them gathered.
        last = i == len(blocks) - 1
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard and not last)
    # The root holds the head, used last in forward and first in backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    if prefetch > 0:
        for i, block in enumerate(blocks):
            ahead = blocks[i + 1 : i + 1 + prefetch]
            behind = blocks[max(0, i - prefetch) : i][::-1]
            if ahead:
                block.set_modules_to_forward_prefetch(ahead)  # type: ignore[operator]
            if behind:
                block.set_modules_to_backward_prefetch(behind)  # type: ignore[operator]


def build_sharded_model(
    cfg: ModelConfig,
    *,
    dist_info: DistInfo,
    param_dtype: torch.dtype,
    ac_every: int = 0,
    reshard: bool = True,
    compile: bool = False,
) -> Transformer:
    """Build, wrap and shard the model; on CUDA it is built on meta and initialised sharded."""
    on_meta = dist_info.is_cuda
    levers = tuning()
    model = build_model(cfg, device="meta" if on_meta else dist_info.device)
    apply_activation_checkpointing(model, every=ac_every)
    if compile:
        apply_compile(model)
    mesh = device_mesh(dist_info)
    apply_fsdp(
        model,
        mesh=mesh,
        param_dtype=param_dtype,
        reshard=reshard,
        prefetch=int(levers["prefetch"]),
    )
    if on_meta:
        # to_empty swaps tensors in place, so a tied head stays tied to the embedding.
        model.to_empty(device=dist_info.device)
        model.init_weights()
    logger.info(
        "sharded %s parameters over mesh %s (param dtype %s, %s, reshard %s, "
        "compile %s, tuning %s)",
        f"{sum(p.numel() for p in model.parameters()):,}",
        tuple(mesh.shape),
        param_dtype,
        ac_words(ac_every),
        reshard,
        compile,
        levers,
    )
    return model
