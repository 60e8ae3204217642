"""Llama-style decoder used by the training step: RMSNorm, RoPE, SwiGLU MLP, causal SDPA.

Presets are named after ``mnnvl.inputs.defaults.MODEL_PRESETS``. ``flops_per_token`` follows the
torchtitan/PaLM convention so MFU numbers are comparable with published ones.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from mnnvl.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int = 0
    """0 means n_heads (plain multi-head attention); fewer gives grouped-query attention."""
    vocab_size: int
    ffn_dim: int
    seq_len: int
    """Default training sequence length of the preset (TrainConfig.seq_len=0 picks it)."""
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads


PRESETS: dict[str, ModelConfig] = {
    # CPU-sized: fast enough for 2-process gloo tests on two cores.
    "tiny": ModelConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=192, seq_len=64
    ),
    "small": ModelConfig(dim=256, n_layers=4, n_heads=4, vocab_size=4096, ffn_dim=704, seq_len=256),
    # GPT-2-small sized, tied like GPT-2: ~124M parameters.
    "125m": ModelConfig(
        dim=768,
        n_layers=12,
        n_heads=12,
        vocab_size=50304,
        ffn_dim=2048,
        seq_len=1024,
        tie_embeddings=True,
    ),
    "350m": ModelConfig(
        dim=1024,
        n_layers=24,
        n_heads=16,
        vocab_size=50304,
        ffn_dim=2816,
        seq_len=1024,
        tie_embeddings=True,
    ),
    # head_dim 128 and wide FFN keep the GEMMs large enough for good MFU: ~1.2B parameters.
    "1b": ModelConfig(
        dim=2048, n_layers=16, n_heads=16, vocab_size=32000, ffn_dim=8192, seq_len=2048
    ),
    "3b": ModelConfig(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        vocab_size=50304,
        ffn_dim=8192,
        seq_len=4096,
        rope_theta=500000.0,
    ),
    # Llama-3-8B shape: ~8.0B parameters. Trained at sequence 2048 by default: the length its
    # preset batch (4) and checkpointing (every-2) were measured at on 2 x H200; a longer
    # --seq-len needs a smaller --batch-size.
    "8b": ModelConfig(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_dim=14336,
        seq_len=2048,
        rope_theta=500000.0,
    ),
}


def preset(name: str, *, seq_len: int = 0) -> ModelConfig:
    """The named preset, with ``seq_len`` overridden when non-zero."""
    try:
        cfg = PRESETS[name]
    except KeyError:
        raise SpecError("model", f"{name!r} is not one of {', '.join(PRESETS)}") from None
    return dataclasses.replace(cfg, seq_len=seq_len) if seq_len else cfg


def param_count(cfg: ModelConfig) -> int:
    """Parameters of ``Transformer(cfg)`` computed from the shape (tied weights counted once)."""
    d, kv = cfg.dim, cfg.kv_heads * cfg.head_dim
    attn = d * d * 2 + d * kv * 2
    block = attn + 3 * d * cfg.ffn_dim + 2 * d
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return cfg.vocab_size * d + cfg.n_layers * block + d + head


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token: ``6 * N + 12 * L * d * seq_len``.

    ``N`` = all parameters except the input embedding table, with the LM-head matmul
    (``vocab * dim``) always included even when tied, since it is a real GEMM. The factor 6
    is forward (2) plus backward (4) per multiply-accumulate. ``12 * L * d * seq_len`` is
    attention scores and values (QK^T and AV), also 6 x 2 matmuls, with ``d`` = heads x
    head_dim. Causal masking is not discounted (torchtitan/PaLM convention), so MFU here is
    directly comparable with torchtitan's published numbers.
    """
    n_matmul = param_count(cfg) - cfg.vocab_size * cfg.dim
    if cfg.tie_embeddings:
        n_matmul += cfg.vocab_size * cfg.dim
    return 6 * n_matmul + 12 * cfg.n_layers * cfg.dim * seq_len


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32: bf16 sums of squares lose too much precision.
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_table(head_dim: int, seq_len: int, theta: float, device: torch.device | None = None):
    """``[seq_len, head_dim]`` tensor: cos in the first half of the last dim, sin in the second."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, S, H, D]`` by position (half-split pairing)."""
    half = x.shape[-1] // 2
    cos = table[: x.shape[1], :half][None, :, None, :].to(x.dtype)
    sin = table[: x.shape[1], half:][None, :, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = apply_rope(self.wq(x).view(b, s, self.n_heads, self.head_dim), rope)
        k = apply_rope(self.wk(x).view(b, s, self.kv_heads, self.head_dim), rope)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim)
        if self.kv_heads != self.n_heads:
            # Expand K/V explicitly (not SDPA's enable_gqa) so every SDPA backend applies.
            rep = self.n_heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only LM. ``layers`` is a ModuleDict so per-block wrappers keep stable names."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Not persistent: recomputed by init_weights, never checkpointed.
        self.register_buffer("rope", rope_table(cfg.head_dim, cfg.seq_len, cfg.rope_theta), False)
        self.rope: torch.Tensor

    def init_weights(self, seed: int | None = None) -> None:
        """(Re)initialise everything; call after ``to_empty`` when the model was built on meta.

        Each weight draws from a generator of its own, seeded from ``seed`` (default: the
        seed given to ``torch.manual_seed``) and its position, so a seed gives the same model
        whatever the sharding: one group (FSDP), several clique groups (HSDP) or one process.
        """
        cfg = self.cfg
        base = torch.initial_seed() if seed is None else seed
        with torch.no_grad():
            self.rope.copy_(rope_table(cfg.head_dim, cfg.seq_len, cfg.rope_theta, self.rope.device))
        draws: list[tuple[torch.Tensor, float]] = [(self.tok_embeddings.weight, 0.02)]
        # Residual-branch outputs scaled down with depth (GPT-2) to keep early activations O(1).
        out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
        for block in self.layers.values():
            for name, mod in block.named_modules():
                if isinstance(mod, nn.Linear):
                    draws.append((mod.weight, out_std if name.endswith(("wo", "w2")) else 0.02))
                elif isinstance(mod, RMSNorm):
                    mod.reset_parameters()
        self.norm.reset_parameters()
        if not self.cfg.tie_embeddings:
            draws.append((self.output.weight, cfg.dim**-0.5))
        for index, (weight, std) in enumerate(draws):
            _normal_(weight, std, seed=(base * 1_000_003 + index) % 2**63)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h, self.rope)
        return self.output(self.norm(h))


def _normal_(weight: torch.Tensor, std: float, *, seed: int) -> None:
    """Fill ``weight`` with N(0, std²): the full tensor is drawn on every rank from the same
    generator and each rank keeps its own shard, so the values do not depend on the layout."""
    gen = torch.Generator(device=weight.device).manual_seed(seed)
    full = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    full.normal_(0.0, std, generator=gen)
    with torch.no_grad():
        if isinstance(weight, DTensor):
            mesh, placements = weight.device_mesh, weight.placements
            weight.copy_(distribute_tensor(full, mesh, placements, src_data_rank=None))
        else:
            weight.copy_(full)


def build_model(cfg: ModelConfig, *, device: torch.device | str = "cpu") -> Transformer:
    """Build the model on ``device``; on ``meta`` nothing is allocated or initialised."""
    with torch.device(device):
        model = Transformer(cfg)
    if str(device) != "meta":
        model.init_weights()
    return model
