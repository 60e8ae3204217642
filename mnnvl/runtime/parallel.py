"""Process group setup and FSDP2 sharding of the decoder.

Order follows torchtitan: activation checkpointing, then ``torch.compile`` per block, then
``fully_shard`` per block, then the root. FSDP1 is not used.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from mnnvl.runtime import nccl
from mnnvl.runtime.model import ModelConfig, Transformer, build_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def fabric_present(local_rank: int) -> bool:
    """Cheap NVML probe: does this GPU report a completed NVLink fabric registration?

    Any failure (no pynvml, old driver, no fabric support) means False; the verify step
    does the full NVML checks and reports why.
    """
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(local_rank)
            info = pynvml.nvmlDeviceGetGpuFabricInfo(handle)
            uuid = bytes(info.clusterUuid)
            return bool(info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and any(uuid))
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # NVML raises many distinct types; all mean "no fabric"
        logger.info("NVLink fabric probe: %s; treating as no fabric", e)
        return False


def init_distributed() -> DistInfo:
    """Apply the NCCL profile, then join the process group torchrun describes in env."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available()
    profile = os.environ.get(nccl.PROFILE_ENV, "production")
    nccl.apply_profile(profile, fabric_present=use_cuda and fabric_present(local_rank))
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    logger.info("rank %s/%s on %s (NCCL profile %s)", rank, world, device, profile)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world, device=device)


def apply_activation_checkpointing(model: Transformer) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, block in list(model.layers.items()):
        model.layers.register_module(name, checkpoint_wrapper(block, preserve_rng_state=False))


def apply_compile(model: Transformer) -> None:
    for name, block in list(model.layers.items()):
        # torch.compile of a Module returns a Module (an OptimizedModule wrapping it).
        compiled = cast(nn.Module, torch.compile(block, fullgraph=True))
        model.layers.register_module(name, compiled)


def apply_fsdp(model: Transformer, *, mesh: DeviceMesh, param_dtype: torch.dtype) -> None:
    """Shard each block, then the root (embeddings, final norm, head)."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's weights are needed again first in backward: keep them gathered.
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    # The root holds the head, used last in forward and first in backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def build_sharded_model(
    cfg: ModelConfig,
    *,
    dist_info: DistInfo,
    param_dtype: torch.dtype,
    activation_checkpointing: bool = False,
    compile: bool = False,
) -> Transformer:
    """Build, wrap and shard the model; on CUDA it is built on meta and initialised sharded."""
    on_meta = dist_info.is_cuda
    model = build_model(cfg, device="meta" if on_meta else dist_info.device)
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    if compile:
        apply_compile(model)
    mesh = init_device_mesh(dist_info.device.type, (dist_info.world_size,))
    apply_fsdp(model, mesh=mesh, param_dtype=param_dtype)
    if on_meta:
        # to_empty swaps tensors in place, so a tied head stays tied to the embedding.
        model.to_empty(device=dist_info.device)
        model.init_weights()
    logger.info(
        "sharded %s parameters over %s ranks (param dtype %s, AC %s, compile %s)",
        f"{sum(p.numel() for p in model.parameters()):,}",
        dist_info.world_size,
        param_dtype,
        activation_checkpointing,
        compile,
    )
    return model
