"""A host copy's file: each tensor's bytes at an offset aligned to a page, then the header
(``torch.save`` of meta, extra and the state with each tensor as its ``Span``), then the
header's length (8 bytes). Read with ``pread`` into the destination (through pinned buffers to a
GPU), never mapped: mapping 7 GiB and registering it with CUDA took 2.9 s on one H200, the page
tables alone (docs/recovery.md)."""

from __future__ import annotations

import io
import itertools
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Span:
    """Where one tensor's bytes are in a host copy's file."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


_ALIGN = 4096
_TAIL = struct.Struct("<Q")
_CHUNK = 32 << 20  # bytes per pinned buffer


def write_file(path: Path, header: dict[str, Any], state: Any) -> None:
    """Write ``state`` (host tensors) and ``header`` to ``path`` in the host copy's format."""
    tensors = leaves(state)
    spans, end = [], 0
    for t in tensors:
        spans.append(Span(end, tuple(t.shape), t.dtype))
        end += -(-t.nbytes // _ALIGN) * _ALIGN
    it = iter(spans)
    head = io.BytesIO()
    torch.save({**header, "state": mapped(state, lambda _: next(it))}, head)
    with open(path, "wb", buffering=0) as f:
        for t, span in zip(tensors, spans, strict=True):
            _all(os.pwrite, f.fileno(), _bytes(t.detach().contiguous()), span.offset)
        _all(os.pwrite, f.fileno(), memoryview(head.getbuffer()), end)
        _all(os.pwrite, f.fileno(), _TAIL.pack(len(head.getbuffer())), end + len(head.getbuffer()))


def read_header(path: Path) -> dict[str, Any]:
    """A host copy's header: meta, extra and the state as ``Span`` leaves."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        (length,) = _TAIL.unpack(os.pread(f.fileno(), _TAIL.size, size - _TAIL.size))
        if length > size - _TAIL.size:
            raise ValueError(f"a header of {length} bytes in a file of {size}")
        head = os.pread(f.fileno(), length, size - _TAIL.size - length)
    found: dict[str, Any] = torch.load(io.BytesIO(head), weights_only=False)
    if any(s.offset + s.nbytes > size for s in leaves(found["state"], Span)):
        raise ValueError("the file ends before its tensors")
    return found


def read_tensors(path: Path, pairs: list[tuple[torch.Tensor, Span]]) -> None:
    """Read each ``Span``'s bytes from ``path`` into its tensor (on the CPU or a GPU)."""
    flats = [
        dest
        if dest.is_contiguous()
        else torch.empty_like(dest, memory_format=torch.contiguous_format)
        for dest, _ in pairs
    ]
    with open(path, "rb", buffering=0) as f:
        if not any(dest.is_cuda for dest, _ in pairs):
            for flat, (_, span) in zip(flats, pairs, strict=True):
                _all(os.preadv, f.fileno(), _bytes(flat), span.offset)
        else:
            # Pieces of at most a buffer, read by _READERS threads at once: one thread reads
            # a tmpfs file at about 2 GB/s (7 GiB in 3.7 s on one H200), the GPU takes 50.
            pieces = [
                (flat.reshape(-1).view(torch.uint8)[start : start + _CHUNK], span.offset + start)
                for flat, (_, span) in zip(flats, pairs, strict=True)
                for start in range(0, span.nbytes, _CHUNK)
            ]
            with ThreadPoolExecutor(_READERS, thread_name_prefix="host-copy-read") as readers:
                reads = [
                    readers.submit(_to_device, f.fileno(), pieces[i::_READERS])
                    for i in range(_READERS)
                ]
                for read in reads:
                    read.result()
    for flat, (dest, _) in zip(flats, pairs, strict=True):
        if flat is not dest:
            dest.copy_(flat)


_READERS = 4


def _to_device(fd: int, pieces: list[tuple[torch.Tensor, int]]) -> None:
    """Read each (device bytes, file offset) piece through two pinned buffers of this
    thread's, copied on a stream of its own while the next is read."""
    if not pieces:
        return
    torch.cuda.set_device(pieces[0][0].device)
    stream = torch.cuda.Stream()
    bufs = [torch.empty(_CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    done: list[torch.cuda.Event | None] = [None, None]
    for k, (into, offset) in zip(itertools.cycle((0, 1)), pieces):
        if (event := done[k]) is not None:
            event.synchronize()  # the buffer's last copy to the GPU is over
        buf = bufs[k][: into.numel()]
        _all(os.preadv, fd, _bytes(buf), offset)
        with torch.cuda.stream(stream):
            into.copy_(buf, non_blocking=True)
            done[k] = stream.record_event()
    stream.synchronize()


def _bytes(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes."""
    return t.reshape(-1).view(torch.uint8).numpy().data


def _all(call: Any, fd: int, data: Any, offset: int) -> None:
    """``os.pwrite``/``os.preadv`` until every byte of ``data`` is done (one call moves at
    most 2 GiB)."""
    view = memoryview(data).cast("B")
    while view:
        n = call(fd, view, offset) if call is os.pwrite else call(fd, [view], offset)
        if n <= 0:
            raise EOFError(f"{'wrote' if call is os.pwrite else 'read'} 0 bytes at {offset}")
        view, offset = view[n:], offset + n


def mapped(tree: Any, leaf: Any) -> Any:
    """``tree`` with each tensor replaced by ``leaf(tensor)``."""
    if isinstance(tree, dict):
        return {k: mapped(v, leaf) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(mapped(v, leaf) for v in tree)
    return leaf(tree) if isinstance(tree, torch.Tensor) else tree


def leaves(tree: Any, kind: type = torch.Tensor) -> list[Any]:
    """Every leaf of ``tree`` that is a ``kind``, in order."""
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in leaves(v, kind)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in leaves(v, kind)]
    return [tree] if isinstance(tree, kind) else []
