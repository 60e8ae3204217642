"""Throughput, MFU and memory for the training step.

MFU = flops_per_token x tokens/s per GPU / device peak, with dense bf16 peaks as torchtitan
uses them (no 2:4 sparsity figures): H100 SXM and H200 989 TFLOP/s, B200 2.25 PFLOP/s,
GB200 2.5 PFLOP/s, A100 312 TFLOP/s. An unknown device gives MFU None, with a logged note.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from typing import Any

import torch

logger = logging.getLogger(__name__)

# Order matters: the first substring found in the device name wins ("GB200" before "B200").
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB300", 2.5e15),
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIE", 756e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
)


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device by its CUDA name, or None when unknown."""
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in device_name.upper()), None)


def worker_unit(device: torch.device) -> str:
    """What one rank is, for per-rank rates: a GPU, or on CPU (gloo) just a process."""
    return "gpu" if device.type == "cuda" else "rank"


def device_peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_bf16_flops(name)
    if peak is None:
        logger.warning("no bf16 peak known for %r; MFU will be reported as null", name)
    return peak


def mfu(flops_per_token: int, tokens_per_s_per_gpu: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction 0..1 (None without a known peak)."""
    if peak is None or tokens_per_s_per_gpu <= 0:
        return None
    return flops_per_token * tokens_per_s_per_gpu / peak


def peak_mem_gib(device: torch.device) -> float:
    """Peak allocated GPU memory; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


class Throughput:
    """Tokens/s between sync points, from its creation right before the first step; call
    ``mark`` only right after a device sync. The first window (compilation, allocator
    warm-up) is excluded from ``overall`` unless it is the only one.

    A checkpoint written in the background can slow the steps that run beside it (its copies
    share the GPU's copy engines and the host; its first save pins its host buffers) without
    holding any step up: ``checkpoint_lost_s`` counts that, as the time the windows that ran
    beside a save took past the median rate of the windows that did not.
    """

    def __init__(self) -> None:
        self.t_start = time.perf_counter()
        self.t_first = self.t_last = 0.0
        self.first_tokens = self.tokens_after_first = 0
        self.marks = 0
        self.paused_s = self.paused_total_s = 0.0
        self.windows: list[tuple[int, float, bool]] = []  # (tokens, seconds, beside a save)
        self._saving = False

    def exclude(self, seconds: float) -> None:
        """Leave time spent outside training steps (checkpoint saves) out of the rates."""
        self.paused_s += seconds

    def save_started(self) -> None:
        """A checkpoint save began: the window now running shares the machine with it."""
        self._saving = True

    def mark(self, tokens_since_last: int, saving: bool = False) -> float:
        """Record a sync point; return tokens/s since the previous one. ``saving``: a save is
        still being written, so the next window runs beside it too."""
        now = time.perf_counter()
        prev = self.t_last if self.marks else self.t_start
        elapsed = now - prev - self.paused_s
        if self.marks == 0:
            self.t_first, self.first_tokens = now, tokens_since_last
        else:
            self.tokens_after_first += tokens_since_last
            self.paused_total_s += self.paused_s
            self.windows.append((tokens_since_last, max(elapsed, 1e-9), self._saving))
        self._saving = saving
        self.paused_s = 0.0
        self.t_last = now
        self.marks += 1
        return tokens_since_last / max(elapsed, 1e-9)

    def checkpoint_lost_s(self) -> float:
        """Seconds the windows beside a background save took past the median clean rate."""
        clean = sorted(t / s for t, s, beside in self.windows if not beside and t)
        if not clean:
            return 0.0
        rate = clean[len(clean) // 2]
        return round(sum(max(0.0, s - t / rate) for t, s, beside in self.windows if beside), 3)

    def overall(self) -> float:
        if self.marks > 1:
            elapsed = self.t_last - self.t_first - self.paused_total_s
            return self.tokens_after_first / max(elapsed, 1e-9)
        if self.marks == 1:
            return self.first_tokens / max(self.t_first - self.t_start, 1e-9)
        return 0.0


class StepSplit:
    """Where a training step's time goes: forward, backward, optimizer (each with the
    communication the compute stream waited for), ``other`` the rest. CUDA events read by
    ``collect`` after the trainer's own sync (the host clock on CPU); the first ``skip_first``
    steps this process runs (compilation, warm-up; also after a resume) are left out."""

    PHASES = ("forward", "backward", "optimizer")

    def __init__(self, device: torch.device, skip_first: int = 2) -> None:
        self.cuda = device.type == "cuda"
        self.skip_first = skip_first
        self.begun = 0
        self.pending: list[dict[str, Any]] = []
        self.totals = dict.fromkeys(self.PHASES, 0.0)
        self.steps = 0
        self.current: dict[str, Any] = {}

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self) -> None:
        self.begun += 1
        measured = self.begun > self.skip_first
        self.current = {"begin": self._now() if measured else None}
        if measured:
            self.pending.append(self.current)

    def mark(self, phase: str) -> None:
        """The end of ``phase``; phases are marked in ``PHASES`` order, each once a step."""
        done = len(self.current) - 1  # phases marked since begin (-1: no step begun)
        expected = self.PHASES[done] if 0 <= done < len(self.PHASES) else None
        if phase != expected:
            raise ValueError(f"step phase {phase!r} marked where {expected!r} ends")
        self.current[phase] = self._now() if self.current["begin"] is not None else None

    def collect(self) -> None:
        for marks in self.pending:
            if len(marks) != len(self.PHASES) + 1:
                continue  # the step ended early (it raised): no split for it
            start = marks["begin"]
            for name in self.PHASES:
                end = marks[name]
                self.totals[name] += start.elapsed_time(end) if self.cuda else (end - start) * 1e3
                start = end
            self.steps += 1
        self.pending.clear()

    def summary(self, step_ms: float) -> dict[str, float] | None:
        """Mean ms per step by phase, with ``step`` (from the throughput) and ``other``."""
        if not self.steps:
            return None
        out = {name: round(total / self.steps, 2) for name, total in self.totals.items()}
        out["step"] = round(step_ms, 2)
        out["other"] = round(max(0.0, step_ms - sum(out[n] for n in self.PHASES)), 2)
        out["steps_measured"] = self.steps
        return out
