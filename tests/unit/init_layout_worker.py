"""Worker for test_init_layout: hash the initial weights under several shardings (gloo).

Run under torchrun with 2 processes; rank 0 prints one ``LAYOUT <name> <sha256>`` line per
layout: unsharded, FSDP over both ranks, and HSDP with 2 groups of 1 (built on meta, then
initialised sharded, as on GPUs).
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from mnnvl.runtime.model import ModelConfig, build_model
from mnnvl.runtime.parallel import apply_fsdp

CFG = ModelConfig(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=101, ffn_dim=64, seq_len=16
)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def sharded(shape: tuple[int, ...], names: tuple[str, ...] | None) -> str:
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = build_model(CFG, device="meta")
    apply_fsdp(model, mesh=mesh, param_dtype=torch.float32)
    model.to_empty(device="cpu")
    model.init_weights(seed=7)
    return digest(model)


def main() -> None:
    dist.init_process_group("gloo")
    plain = build_model(CFG, device="meta")
    plain.to_empty(device="cpu")
    plain.init_weights(seed=7)
    layouts = {
        "unsharded": digest(plain),
        "fsdp": sharded((2,), None),
        "hsdp": sharded((2, 1), ("replicate", "shard")),
    }
    everyone: list[dict[str, str] | None] = [None, None]
    dist.all_gather_object(everyone, layouts)
    if dist.get_rank() == 0:
        for rank, seen in enumerate(everyone):
            for name, value in (seen or {}).items():
                print(f"LAYOUT {name} rank{rank} {value}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
