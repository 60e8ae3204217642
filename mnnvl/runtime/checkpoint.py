"""Sharded checkpoints with torch.distributed.checkpoint (DCP) and automatic resume.

Layout under the checkpoint directory (which every rank must see, e.g. a shared volume)::

    step-<N>/            DCP files of {"model", "optim"} + rank-<r>.pt (step, RNG, LR state)
    latest               text "step-<N>"; written by rank 0, atomically, only after every
                         rank finished step-<N>

A ``step-<N>`` without a ``latest`` pointing at it is an interrupted save and is ignored.
The newest ``keep`` complete checkpoints are kept; older ones are deleted by rank 0.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from mnnvl.errors import MnnvlError

logger = logging.getLogger(__name__)

LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class Checkpointer:
    def __init__(self, root: str, *, rank: int, keep: int = 2) -> None:
        self.root = Path(root)
        self.rank = rank
        self.keep = max(1, keep)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        marker = self.root / LATEST
        try:
            name = marker.read_text().strip()
        except FileNotFoundError:
            return None
        path = self.root / name
        if not _STEP_DIR.match(name) or not (path / ".metadata").is_file():
            raise MnnvlError(f"{marker} points at {name!r}, which is not a complete checkpoint")
        return path

    def save(
        self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any]
    ) -> Path:
        """Save collectively (every rank must call); return the checkpoint path."""
        path = self.root / f"step-{step}"
        if self.rank == 0:
            # A leftover from an interrupted save of the same step must not mix with this one.
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        path.mkdir(parents=True, exist_ok=True)
        torch.save({**extra, "step": step, "rng": _rng_state()}, path / f"rank-{self.rank}.pt")
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        dist.barrier()
        if self.rank == 0:
            tmp = self.root / f".{LATEST}.tmp"
            tmp.write_text(path.name + "\n")
            os.replace(tmp, self.root / LATEST)
            self._prune()
        dist.barrier()
        logger.info("saved checkpoint %s", path)
        return path

    def load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Load model + optimizer in place; return this rank's extra state (step, LR, ...)."""
        model_sd, optim_sd = get_state_dict(model, optimizer)
        # dcp.load fills these dicts in place.
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        own = path / f"rank-{self.rank}.pt"
        # A run resumed with a different world size has no file of its own: use rank 0's.
        extra_path = own if own.exists() else path / "rank-0.pt"
        extra: dict[str, Any] = torch.load(extra_path, weights_only=False)
        _set_rng_state(extra.pop("rng"))
        logger.info("resumed from %s (step %s)", path, extra["step"])
        return extra

    def _prune(self) -> None:
        steps = sorted(
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if p.is_dir() and (m := _STEP_DIR.match(p.name))
        )
        for _step, old in steps[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
            logger.info("removed old checkpoint %s", old)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
