"""Training batches: deterministic synthetic tokens, or windows of a memory-mapped token file.

Both sources are pure functions of ``(seed, rank, step)``, so a resumed run sees exactly
the batches it would have seen without the interruption, and no iterator state needs
checkpointing.
"""

from __future__ import annotations

import array
import logging
import mmap
import os
import struct

import torch

from mnnvl.errors import SpecError

logger = logging.getLogger(__name__)

# Optional header: magic, version (u32), bytes per token (u32), token count (u64).
HEADER_MAGIC = b"MNNVLTOK"
HEADER = struct.Struct("<8sIIQ")
_NOISE = 0.05


def _generator(seed: int, rank: int, step: int) -> torch.Generator:
    # Mix with distinct odd multipliers so neighbouring (rank, step) pairs never collide.
    mixed = (seed * 1_000_003 + rank * 7_919 + step * 104_729) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


class SyntheticBatches:
    """A fixed random cyclic token order ("next token = successor of this one"), lightly noised.

    The successor table depends only on ``seed``, so every rank and step shares it and
    the model can learn it: the loss falls from ln(vocab) within a few steps, which makes
    the data a useful smoke test of the whole optimiser path.
    """

    def __init__(self, *, vocab_size: int, seq_len: int, batch_size: int, seed: int, rank: int):
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.seed, self.rank = seed, rank
        self.order = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = _generator(self.seed, self.rank, step)
        starts = torch.randint(self.vocab_size, (self.batch_size, 1), generator=gen)
        idx = (starts + torch.arange(self.seq_len + 1)) % self.vocab_size
        tokens = self.order[idx]
        noise = torch.rand(tokens.shape, generator=gen) < _NOISE
        random_tokens = torch.randint(self.vocab_size, tokens.shape, generator=gen)
        tokens = torch.where(noise, random_tokens, tokens)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _file_layout(path: str, size: int, head: bytes) -> tuple[int, int]:
    """``(header_bytes, bytes_per_token)`` from the header if present, else from the suffix."""
    if head[: len(HEADER_MAGIC)] == HEADER_MAGIC:
        _magic, version, width, _count = HEADER.unpack(head[: HEADER.size])
        if version != 1 or width not in (2, 4):
            raise SpecError(
                "data", f"{path}: unsupported header (version {version}, width {width})"
            )
        return HEADER.size, width
    name = os.path.basename(path).lower()
    width = 4 if name.endswith((".u32.bin", ".uint32.bin")) else 2
    if size % width:
        raise SpecError(
            "data", f"{path}: {size} bytes is not a whole number of {width}-byte tokens"
        )
    return 0, width


class TokenFileBatches:
    """Strided windows over a flat binary token file, memory-mapped once per process.

    Format: ``*.bin`` of little-endian uint16 tokens (uint32 for ``*.u32.bin`` /
    ``*.uint32.bin``), or any name with the ``MNNVLTOK`` header that states the width.
    Window ``w`` of step ``s`` on rank ``r`` is global index ``(s * world + r) * batch + w``,
    so ranks never read the same window in a step and the file is walked in order.
    """

    def __init__(
        self, path: str, *, vocab_size: int, seq_len: int, batch_size: int, rank: int, world: int
    ):
        self.path, self.vocab_size, self.seq_len = path, vocab_size, seq_len
        self.batch_size, self.rank, self.world = batch_size, rank, world
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                offset, self.width = _file_layout(path, size, fh.read(HEADER.size))
                # Copy-on-write mapping: writable for torch.frombuffer, never written back.
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as e:
            raise SpecError("data", f"cannot read token file {path}: {e}") from e
        dtype = torch.int16 if self.width == 2 else torch.int32
        self.n_tokens = (size - offset) // self.width
        if self.n_tokens < seq_len + 2:
            raise SpecError("data", f"{path} holds {self.n_tokens} tokens; need > {seq_len + 1}")
        self.tokens = torch.frombuffer(self._map, dtype=dtype, count=self.n_tokens, offset=offset)
        logger.info("token file %s: %s tokens of %s bytes", path, self.n_tokens, self.width)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        span = self.seq_len + 1
        n_windows = (self.n_tokens - 1) // self.seq_len
        first = (step * self.world + self.rank) * self.batch_size
        rows = []
        for w in range(first, first + self.batch_size):
            start = (w % n_windows) * self.seq_len
            start = min(start, self.n_tokens - span)
            rows.append(self.tokens[start : start + span].to(torch.int64))
        # Stored signed: undo the sign so uint16/uint32 ids above the signed range survive.
        tokens = torch.stack(rows) & (0xFFFF if self.width == 2 else 0xFFFFFFFF)
        top = int(tokens.max())
        if top >= self.vocab_size:
            raise SpecError(
                "data", f"{self.path} holds token id {top}; the model's vocab is {self.vocab_size}"
            )
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def write_token_file(path: str, tokens: list[int] | torch.Tensor, *, width: int = 2) -> None:
    """Write a token file with the ``MNNVLTOK`` header (used by tests and data preparation)."""
    t = torch.as_tensor(tokens, dtype=torch.int64)
    if width not in (2, 4):
        raise SpecError("width", f"{width} must be 2 or 4 bytes per token")
    # Unsigned on disk; array's "H"/"I" are native-endian, so this assumes little-endian hosts.
    body = array.array("H" if width == 2 else "I", t.tolist())
    if body.itemsize != width:
        raise SpecError("width", f"this platform's array item is {body.itemsize} bytes")
    with open(path, "wb") as fh:
        fh.write(HEADER.pack(HEADER_MAGIC, 1, width, t.numel()))
        fh.write(body.tobytes())


def build_batches(
    data: str, *, vocab_size: int, seq_len: int, batch_size: int, seed: int, rank: int, world: int
) -> SyntheticBatches | TokenFileBatches:
    """``batch(step)`` of either: ``(inputs, targets)``, int64 ``[batch, seq_len]`` on the CPU."""
    if data == "synthetic":
        return SyntheticBatches(
            vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size, seed=seed, rank=rank
        )
    return TokenFileBatches(
        data, vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size, rank=rank, world=world
    )
