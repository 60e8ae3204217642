"""The decoder, its presets and FLOP count, the data sources, LR schedule and MFU inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mnnvl.errors import SpecError
from mnnvl.inputs import defaults, spec
from mnnvl.runtime import metrics
from mnnvl.runtime.data import SyntheticBatches, TokenFileBatches, build_batches, write_token_file
from mnnvl.runtime.model import PRESETS, build_model, flops_per_token, param_count, preset
from mnnvl.runtime.train import lr_factor

torch.set_num_threads(1)


def test_every_spec_preset_has_a_model() -> None:
    assert set(PRESETS) == set(defaults.MODEL_PRESETS)


def test_forward_gives_logits_per_position_and_backward_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    model = build_model(preset("tiny"))
    tokens = torch.randint(512, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 512)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = build_model(preset("tiny")).eval()
    a = torch.randint(512, (1, 12))
    b = a.clone()
    b[0, 8:] = (b[0, 8:] + 1) % 512
    with torch.no_grad():
        assert torch.allclose(model(a)[0, :8], model(b)[0, :8], atol=1e-5)
        assert not torch.allclose(model(a)[0, 8:], model(b)[0, 8:], atol=1e-5)


@pytest.mark.parametrize("tie", [False, True])
def test_param_count_matches_the_built_module(tie: bool) -> None:
    cfg = dataclasses.replace(preset("tiny"), tie_embeddings=tie)
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)
    assert (model.output.weight is model.tok_embeddings.weight) is tie


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("125m", 110e6, 140e6),
        ("350m", 300e6, 420e6),
        ("1b", 1.1e9, 1.3e9),
        ("3b", 2.8e9, 3.4e9),
        ("8b", 7.9e9, 8.1e9),
    ],
)
def test_preset_sizes_are_in_their_named_range(name: str, low: float, high: float) -> None:
    assert low <= param_count(preset(name)) <= high


def test_flops_per_token_matches_a_hand_count_for_tiny() -> None:
    # tiny: d=64, 2 layers, 4 heads of 16, 2 KV heads (K/V width 32), ffn 192, vocab 512.
    attn = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64
    block = attn + 3 * 64 * 192 + 2 * 64
    n_matmul = 2 * block + 64 + 512 * 64  # blocks, final norm, LM head; no input embedding
    assert flops_per_token(preset("tiny"), 64) == 6 * n_matmul + 12 * 2 * 64 * 64 == 886656


def test_tied_head_still_counts_its_matmul_flops() -> None:
    untied = preset("tiny")
    tied = dataclasses.replace(untied, tie_embeddings=True)
    assert flops_per_token(tied, 64) == flops_per_token(untied, 64)


def test_seq_len_override_and_bad_preset() -> None:
    assert preset("tiny", seq_len=32).seq_len == 32
    with pytest.raises(SpecError, match="model"):
        preset("huge")


def test_synthetic_batches_are_deterministic_per_rank_and_step() -> None:
    a = SyntheticBatches(vocab_size=512, seq_len=32, batch_size=2, seed=1, rank=0)
    b = SyntheticBatches(vocab_size=512, seq_len=32, batch_size=2, seed=1, rank=1)
    x, y = a.batch(3)
    assert x.shape == y.shape == (2, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(a.batch(3)[0], x)
    assert not torch.equal(b.batch(3)[0], x)
    assert not torch.equal(a.batch(4)[0], x)


def test_synthetic_batches_mostly_follow_one_successor_table() -> None:
    data = SyntheticBatches(vocab_size=512, seq_len=256, batch_size=4, seed=0, rank=0)
    succ = torch.empty(512, dtype=torch.int64)
    succ[data.order] = data.order.roll(-1)
    x, y = data.batch(0)
    assert (succ[x] == y).float().mean() > 0.85


@pytest.mark.parametrize("width", [2, 4])
def test_token_file_windows_are_strided_by_rank(tmp_path, width: int) -> None:
    path = str(tmp_path / "tokens.bin")
    tokens = list(range(40000, 40000 + 1000)) if width == 2 else list(range(70000, 71000))
    write_token_file(path, tokens, width=width)
    vocab = 80000
    r0 = TokenFileBatches(path, vocab_size=vocab, seq_len=10, batch_size=2, rank=0, world=2)
    r1 = TokenFileBatches(path, vocab_size=vocab, seq_len=10, batch_size=2, rank=1, world=2)
    x0, y0 = r0.batch(0)
    x1, _ = r1.batch(0)
    assert x0[0, 0].item() == tokens[0] and x0[1, 0].item() == tokens[10]
    assert x1[0, 0].item() == tokens[20]
    assert torch.equal(y0[:, :-1], x0[:, 1:])
    assert r0.batch(1)[0][0, 0].item() == tokens[40]


def test_headerless_uint16_file_and_out_of_vocab_ids(tmp_path) -> None:
    path = tmp_path / "plain.bin"
    path.write_bytes(bytes(range(0, 200)))  # 100 little-endian uint16 tokens
    data = build_batches(
        str(path), vocab_size=70000, seq_len=8, batch_size=1, seed=0, rank=0, world=1
    )
    assert data.batch(0)[0][0, 0].item() == 0 + 1 * 256
    small = build_batches(
        str(path), vocab_size=16, seq_len=8, batch_size=1, seed=0, rank=0, world=1
    )
    with pytest.raises(SpecError, match="vocab"):
        small.batch(0)


def test_lr_warms_up_linearly_then_decays_to_min_ratio() -> None:
    cfg = spec.TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(cfg, 0) == pytest.approx(0.1)
    assert lr_factor(cfg, 9) == pytest.approx(1.0)
    assert lr_factor(cfg, 55) == pytest.approx(0.55)
    assert lr_factor(cfg, 100) == pytest.approx(0.1)
    values = [lr_factor(cfg, k) for k in range(10, 101)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA GB200", 2.5e15),
        ("NVIDIA B200", 2.25e15),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_flops_by_device_name(name: str, peak: float | None) -> None:
    assert metrics.peak_bf16_flops(name) == peak


def test_mfu_is_a_fraction_or_none() -> None:
    assert metrics.mfu(6 * 10**9, 50_000, 989e12) == pytest.approx(0.3033, abs=1e-4)
    assert metrics.mfu(6 * 10**9, 50_000, None) is None
    assert math.isclose(metrics.mfu(1, 0.5, 1.0) or 0.0, 0.5)
