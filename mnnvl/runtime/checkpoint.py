"""Sharded checkpoints with torch.distributed.checkpoint (DCP), written without stopping
training, and automatic resume (docs/training.md).

Layout under the checkpoint directory (which every rank must see, e.g. a shared volume)::

    step-<N>/            DCP files of {"model", "optim"} + rank-<r>.pt (step, RNG, LR state)
    latest               text "step-<N>"; written by rank 0, atomically, only after every
                         rank finished its part of step-<N>

At most one save is in flight. Model and optimizer state are staged into pinned host memory
by a background thread and written by ``dcp.async_save`` over a gloo group of the
checkpoint's own; ``wait_staged`` holds the next optimizer step until the copy is done, so the
checkpoint is the state of step N exactly. Until rank 0 writes ``latest`` (after DCP's
coordinator gathered every rank's write results) it names the previous checkpoint, so a crash
during a save leaves that one valid.

The host buffers are kept from one save to the next (as torchtitan's pinned-memory mode
does). ``DefaultStager`` cannot do that: torch 2.11 closes its state-dict stager after every
stage, which empties its buffer cache and its copy table (reusing it raised ``KeyError:
<class 'type'>`` deep-copying the optimizer state). ``mode``: ``async`` (reused buffers),
``async-fresh`` (a new ``DefaultStager`` per save) or ``sync`` (``dcp.save`` in the training
thread); the last two are benchmark levers. The newest ``KEEP`` complete checkpoints are kept.

In the ``async`` mode each rank also keeps its part of the newest complete checkpoint in the
pod's memory (:mod:`mnnvl.runtime.hostcopy`), written from the staged buffers beside the disk
write and named once the save is complete; ``resume`` prefers it when every rank has one of
the same step, not older than ``latest``.

Test hook: ``MNNVL_TEST_CHECKPOINT_DELAY=<step>:<rank>:<seconds>`` makes that rank's write of
that step's checkpoint start late, in the background, to hold a save in flight.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from mnnvl.contract import exit_codes
from mnnvl.errors import MnnvlError
from mnnvl.runtime import hostcopy

logger = logging.getLogger(__name__)

LATEST = "latest"
KEEP = 2  # complete checkpoints kept
DELAY_ENV = "MNNVL_TEST_CHECKPOINT_DELAY"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer with its files made durable by a short-lived process of their own.

    A worker cannot end while one of its threads waits in ``fsync``: the kernel finishes the
    flush first, seconds for a checkpoint's gigabytes, so a killed or stopped worker whose save
    was being synced was reaped that much later and every restart waited for it. The files are
    still synced before the write counts as done (before ``latest`` names the checkpoint)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, thread_count=WRITER_THREADS, sync_files=False)

    def write_data(self, plan: Any, planner: Any) -> Any:
        written = super().write_data(plan, planner)  # done when it returns
        _durable(sorted({Path(self.path, r.storage_data.relative_path) for r in written.wait()}))
        return written

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        _durable([Path(self.path, ".metadata"), Path(self.path)])


_FSYNC = """
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
"""


def _durable(paths: list[Path]) -> None:
    """``fsync`` each of ``paths`` in a process of its own (``_Writer``)."""
    if not paths:
        return
    done = subprocess.run(
        [sys.executable, "-S", "-c", _FSYNC, *map(str, paths)], capture_output=True, text=True
    )
    if done.returncode:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise OSError(f"could not sync {paths[0].parent} to its storage: {last}")


class _DelayedWriter(_Writer):
    """The test hook's writer: starts this rank's write ``delay_s`` late."""

    delay_s = 0.0

    def write_data(self, plan: Any, planner: Any) -> Any:
        time.sleep(self.delay_s)
        return super().write_data(plan, planner)


class Resumed(NamedTuple):
    """What a run resumed from: this rank's extra state (step, LR, ...), ``source`` (``host``
    or ``disk``), the seconds the load took and the file or checkpoint loaded."""

    extra: dict[str, Any]
    source: str
    load_s: float
    path: Path


class Checkpointer:
    def __init__(
        self,
        root: str,
        *,
        rank: int,
        mode: str = "async",
        timeout_s: float | None = None,
        host_copy: hostcopy.HostCopy | None = None,
    ) -> None:
        self.root = Path(root)
        self.rank = rank
        self.asynchronous = mode != "sync"
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        # Collective: every rank builds its Checkpointer in the same order.
        self.group = dist.new_group(backend="gloo", timeout=timeout) if self.asynchronous else None
        self._reused = hostcopy.ReusedStager() if mode == "async" else None
        self.stalls: list[float] = []  # seconds each save held training up
        self.final_wait_s = 0.0  # waiting at the end for the last save's write
        self._staging: Callable[[], Any] | None = None  # returns once the copy is done
        self._pending: Future[Path] | None = None
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        # Written from the reused staging buffers: the other modes keep none between saves.
        self.host_copy = host_copy if self._reused is not None else None
        self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="host-copy")

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
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any],
        *,
        host_copy: bool = True,
    ) -> Path:
        """Start a collective save (every rank calls it); returns once the state is being staged.
        Once it is complete, this rank's part is also kept as its host copy unless
        ``host_copy`` is False (the final save: nothing resumes after it)."""
        started = time.perf_counter()
        self.wait()  # the previous save: at most one in flight
        path = self.root / f"step-{step}"
        if self.rank == 0:
            # A leftover from an interrupted save of the same step must not mix with this one.
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        path.mkdir(parents=True, exist_ok=True)
        own = {**extra, "step": step, "rng": _rng_state()}
        torch.save(own, path / f"rank-{self.rank}.pt")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        writer = _writer(path, step, self.rank)
        if not self.asynchronous:
            dcp.save(state, storage_writer=writer)
            self._pending = Future()
            self._pending.set_result(self._commit(path, started))
        else:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the state of step N is final before it is copied
            stager = self._reused or hostcopy.fresh_stager()
            response: Any = dcp.async_save(
                state, storage_writer=writer, process_group=self.group, async_stager=stager
            )
            # torch returns (staging, upload) futures with a background stager, else the upload.
            upload: Future[Any] = getattr(response, "upload_completion", response)
            staged = getattr(response, "staging_completion", None)
            self._staging = staged.result if staged is not None else stager.synchronize_staging
            copy = None
            if host_copy and self.host_copy is not None and self._reused is not None:
                # Beside the disk write, from the same buffers once they are filled.
                keep, staging = self.host_copy, self._reused.staging()
                copy = self._copier.submit(lambda: keep.write(step, staging.result(), own))
            self._pending = self._committer.submit(
                self._finish, path, upload, stager, started, copy
            )
        self.stalls.append(time.perf_counter() - started)
        logger.info(
            "checkpoint %s: training held %.3f s; %s",
            path,
            self.stalls[-1],
            "writing in the background" if self.asynchronous else "written",
        )
        return path

    def busy(self) -> bool:
        """Whether a save is still being staged or written."""
        return self._pending is not None and not self._pending.done()

    def wait_staged(self) -> float:
        """Wait until the save in flight has copied the state (before it changes again);
        return the seconds waited, which count to that save's stall."""
        if self._staging is None:
            return 0.0
        started = time.perf_counter()
        self._staging()
        self._staging = None
        waited = time.perf_counter() - started
        self.stalls[-1] += waited
        return waited

    def wait(self) -> Path | None:
        """Wait for the save in flight to be complete (``latest`` written on rank 0); return
        its path (None when none was in flight). A failed write raises here."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        self._staging = None  # the write waits for its staging copy
        return pending.result()

    def finish(self) -> Path | None:
        """The end of training: wait for the last save, then stop the background thread."""
        started = time.perf_counter()
        try:
            return self.wait()
        finally:
            self.final_wait_s = time.perf_counter() - started
            self._committer.shutdown(wait=True)
            self._copier.shutdown(wait=True)
            if self._reused is not None:
                self._reused.release()

    def stall_summary(self) -> dict[str, Any] | None:
        """``last`` and ``max`` seconds a save held training up, and how many saves ran."""
        if not self.stalls:
            return None
        return {
            "last": round(self.stalls[-1], 3),
            "max": round(max(self.stalls), 3),
            "saves": len(self.stalls),
        }

    def resume(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, run: str = ""
    ) -> Resumed | None:
        """Load the newest state to resume from (collective): the host copies when every rank
        has one of the same step, not older than the newest complete checkpoint on disk; else
        that checkpoint; None when there is neither."""
        started = time.perf_counter()
        disk = self.latest()
        newest = None if disk is None else _step(disk)
        host = hostcopy.load(self.host_copy, newest, model, optimizer, self.group)
        if host is not None:
            (extra, path), source = host, "host"
            _set_rng_state(extra.pop("rng"))
        elif disk is not None:
            extra, path, source = self.load(disk, model, optimizer, run), disk, "disk"
        else:
            return None
        took = time.perf_counter() - started
        where = "the host copy" if source == "host" else "the checkpoint directory"
        step = extra["step"]
        logger.info("resumed from %s (step %s): %s, loaded in %.2f s", path, step, where, took)
        return Resumed(extra, source, took, path)

    def discard_host_copy(self) -> None:
        """Training ended: the run's host copies are no longer needed."""
        if self.host_copy is not None:
            self.host_copy.remove_run()

    def load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, run: str = ""
    ) -> dict[str, Any]:
        """Load model + optimizer in place; return this rank's extra state (step, LR, ...).
        ``run`` names the model this run trains (``the tiny preset``); a checkpoint of another
        model or shape raises :class:`CheckpointMismatch` before anything is loaded."""
        model_sd, optim_sd = get_state_dict(model, optimizer)
        _check_fits(path, model_sd, run)
        # dcp.load fills these dicts in place.
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        own = path / f"rank-{self.rank}.pt"
        # A run resumed with a different world size has no file of its own: use rank 0's.
        extra_path = own if own.exists() else path / "rank-0.pt"
        extra: dict[str, Any] = torch.load(extra_path, weights_only=False)
        _set_rng_state(extra.pop("rng"))
        return extra

    def _finish(
        self,
        path: Path,
        upload: Future[Any],
        stager: AsyncStager,
        t0: float,
        copy: Future[Path | None] | None,
    ) -> Path:
        """The background end of a save: wait for this rank's writes (the disk's and the host
        copy's: the next save refills the buffers only after both), commit, then give the
        host copy its name."""
        try:
            upload.result()
        except dcp.CheckpointException as e:  # a BaseException: made an error the step reports
            raise RuntimeError(f"the write of checkpoint {path} failed: {_why(e)}") from e
        finally:
            if stager is not self._reused:
                stager.close()  # a fresh one's pinned buffers go with it
            written = copy.result() if copy is not None else None
        done = self._commit(path, t0)
        if written is not None and self.host_copy is not None:
            self.host_copy.publish(written)
        return done

    def _commit(self, path: Path, t0: float) -> Path:
        """Rank 0: point ``latest`` at ``path`` (every rank's part is written) and prune."""
        if self.rank == 0:
            tmp = self.root / f".{LATEST}.tmp"
            tmp.write_text(path.name + "\n")
            os.replace(tmp, self.root / LATEST)
            self._prune(_step(path))
            logger.info(
                "saved checkpoint %s (%.2f s after it began)", path, time.perf_counter() - t0
            )
        return path

    def _prune(self, newest: int) -> None:
        """Delete the step directories below ``newest`` but the ``KEEP - 1`` newest complete
        ones (a partial one below it is an interrupted save: deleted too)."""
        older = sorted(
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if p.is_dir() and (m := _STEP_DIR.match(p.name)) and int(m.group(1)) < newest
        )
        complete = [p for _, p in older if (p / ".metadata").is_file()]
        kept = set(complete[len(complete) - (KEEP - 1) :])
        for _step, old in older:
            if old not in kept:
                shutil.rmtree(old, ignore_errors=True)
                logger.info("removed old checkpoint %s", old)


class CheckpointMismatch(MnnvlError):
    """The checkpoint directory holds a checkpoint of another model or shape: no restart can
    load it (exit 14, not retried)."""

    exit_code = exit_codes.CHECKPOINT_MISMATCH


def _check_fits(path: Path, model_sd: dict[str, Any], run: str) -> None:
    """Raise :class:`CheckpointMismatch` when the model's tensors in the checkpoint at ``path``
    (DCP's metadata: names and global shapes) are not this model's."""
    meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    theirs = {
        k: tuple(m.size) for k, m in meta.items() if k.startswith("model.") and hasattr(m, "size")
    }
    mine = {f"model.{k}": tuple(v.shape) for k, v in model_sd.items() if hasattr(v, "shape")}
    differ = sorted(k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k])
    if mine.keys() == theirs.keys() and not differ:
        return
    if differ:
        first = f"{differ[0]} is {list(theirs[differ[0]])} there, {list(mine[differ[0]])} here"
    else:
        only = sorted(mine.keys() ^ theirs.keys())[0]
        first = f"{only} is only {'here' if only in mine else 'there'}"
    try:  # what the run that wrote it trained (checkpoints of earlier versions do not say)
        model = torch.load(path / "rank-0.pt", weights_only=False).get("model")
    except (OSError, RuntimeError, AttributeError):
        model = None
    written = f"the {model} preset" if model else "another model"
    params = sum(math.prod(size) for size in theirs.values())
    here = sum(math.prod(size) for size in mine.values())
    raise CheckpointMismatch(
        f"cannot resume from {path}: it was written for {written} ({params:,} parameters), "
        f"and this run is {run or 'another model'} ({here:,} parameters; {first}); a restart "
        f"cannot change that: give another --checkpoint-dir (an empty one starts at step 0), "
        f"or train the model it was written for"
    )


# Files each rank writes at once: one thread writes a 1b checkpoint at a third of what the
# disk takes (measured on one H200: 44 s for 14.5 GB against 1.5 GB/s); more overlap the
# serialisation of one file with the write of another.
WRITER_THREADS = 4


def _writer(path: Path, step: int, rank: int) -> dcp.FileSystemWriter:
    at = os.environ.get(DELAY_ENV, "")
    if at:
        at_step, at_rank, seconds = at.split(":")
        if (int(at_step), int(at_rank)) == (step, rank):
            writer = _DelayedWriter(str(path))
            writer.delay_s = float(seconds)
            logger.warning("test hook: rank %d writes %s %s s late", rank, path, seconds)
            return writer
    return _Writer(str(path))


def _step(path: Path) -> int:
    return int(path.name.split("-")[1])


def _why(error: dcp.CheckpointException) -> str:
    """Each failed rank's error in one line (DCP's own text carries their tracebacks)."""
    failures = sorted(getattr(error, "failures", {}).items())
    words = [f"rank {rank}: {type(exc).__name__}: {exc}" for rank, (exc, _) in failures]
    return "; ".join(words) or str(error).splitlines()[0]


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
