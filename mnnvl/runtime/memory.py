"""GPU memory: refuse a configuration whose model and optimizer state cannot fit before the
model is built, and turn a CUDA out-of-memory in training into one actionable line.

The estimate counts what FSDP2 with mixed precision keeps per GPU for the whole step and
leaves activations out (they depend on batch, sequence and checkpointing, and are what the
levers trade):

* sharded over the world size: fp32 master weights (4 B), fp32 gradients (4 B) and AdamW's
  two moments (8 B): 16 B per parameter / world size;
* unsharded compute copies (2 B in bf16, 4 B in fp32): every block's with
  ``reshard_after_forward`` false (kept from forward to backward), else about two blocks'
  (the one computing and the one prefetched).

A configuration is refused when that exceeds ``STATE_FRACTION`` of the GPU's memory: the
rest is for activations and the allocator. The 8b preset on one H200 (139.8 GiB) needs
~134.6 GiB of state (it OOMs at 134 GiB allocated) and is refused; on two it needs ~74.8 GiB
and trains.
"""

from __future__ import annotations

from mnnvl.errors import SpecError
from mnnvl.runtime.model import ModelConfig, param_count

GIB = 2**30
SHARDED_BYTES_PER_PARAM = 16  # fp32 master + fp32 grad + AdamW exp_avg + exp_avg_sq
STATE_FRACTION = 0.9
LEVERS = (
    "--batch-size, --activation-checkpointing full, --reshard-after-forward true, "
    "or more GPUs (--nodes / --gpus-per-node)"
)


def state_gib(cfg: ModelConfig, *, world_size: int, compute_bytes: int, reshard: bool) -> float:
    """Per-GPU memory of weights, gradients and optimizer state, GiB (no activations)."""
    params = param_count(cfg)
    sharded = params * SHARDED_BYTES_PER_PARAM / world_size
    block = (params - cfg.vocab_size * cfg.dim) / max(1, cfg.n_layers)
    gathered = (2 * block if reshard else params) * compute_bytes
    return (sharded + gathered) / GIB


def check_fits(
    name: str,
    cfg: ModelConfig,
    *,
    world_size: int,
    compute_bytes: int,
    reshard: bool,
    device_gib: float,
) -> float:
    """The estimate in GiB; ``SpecError`` (exit 2) when it exceeds ``STATE_FRACTION`` of a
    GPU's ``device_gib``."""
    need = state_gib(cfg, world_size=world_size, compute_bytes=compute_bytes, reshard=reshard)
    if need > STATE_FRACTION * device_gib:
        raise SpecError(
            "model",
            f"{name} ({param_count(cfg) / 1e9:.2f} B parameters) on {world_size} GPU(s) needs "
            f"~{need:.1f} GiB per GPU for weights, gradients and optimizer state before any "
            f"activation, more than {STATE_FRACTION:.0%} of the {device_gib:.1f} GiB of one "
            f"GPU; use more GPUs (--nodes / --gpus-per-node), --reshard-after-forward true "
            "or a smaller --model",
        )
    return need


def oom_message(
    name: str,
    *,
    batch_size: int,
    seq_len: int,
    world_size: int,
    peak_gib: float,
    device_gib: float,
) -> str:
    """The one line a CUDA out-of-memory in training becomes."""
    return (
        f"CUDA out of memory: model {name}, batch size {batch_size}, sequence length "
        f"{seq_len}, world size {world_size}, peak {peak_gib:.1f} GiB allocated of "
        f"{device_gib:.1f} GiB; a retry would fail the same way: lower {LEVERS}"
    )
