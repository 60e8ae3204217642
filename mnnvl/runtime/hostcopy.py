"""The host side of a checkpoint: the host buffers a background save stages the state into
(:class:`ReusedStager`, kept from save to save) and, written from them beside the disk write,
a copy of each rank's newest complete checkpoint in the pod's memory, so that workers
restarted in place resume from memory instead of the shared disk
(docs/recovery.md#the-host-copy).

Layout, in the pod's memory-backed ``/dev/shm`` (an emptyDir: it outlives the worker
processes, not the pod)::

    mnnvl-hostcopy/<run id>/<pod name>/step-<N>.rank-<r>.pt   (contract.env.HOST_COPY_DIR)

On the simulator, whose pods are processes of one machine, the pod's ``/dev/shm`` is a directory
of its own and its size the emptyDir's sizeLimit (``contract.env.SHM_DIR``, ``SHM_SIZE``).

One file per rank, the newest complete one (and the next while it is written, where both fit):
its local shards of model and optimizer state as the background save staged them, this rank's
extra state (step, LR schedule, RNG) and what it was written for (run id, checkpoint directory,
rank, world size, model), in the format of ``write_file``. It is written under a temporary name
and renamed once its checkpoint is complete (on disk), so a file with the final name is a
complete checkpoint's. The pod name keys it to one pod: a recreated pod has another name and an
empty ``/dev/shm``. The run's directory is removed when training ends normally.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from mnnvl.contract import env as contract_env
from mnnvl.runtime import devices
from mnnvl.runtime.copyfile import Span, leaves, mapped, read_header, read_tensors, write_file
from mnnvl.units import human_bytes

logger = logging.getLogger(__name__)

ROOT = Path(contract_env.HOST_COPY_DIR)
_FILE = re.compile(r"^step-(\d+)\.rank-(\d+)\.pt$")


class HostCopy:
    """This rank's host copy in ``pod_dir``; ``identity`` is what a copy must have been written
    for to be loaded (run id, checkpoint directory, rank, world size, model)."""

    def __init__(self, pod_dir: Path, identity: dict[str, Any]) -> None:
        self.dir = pod_dir
        self.identity = identity
        self.rank = int(identity["rank"])

    @classmethod
    def for_pod(cls, identity: dict[str, Any]) -> HostCopy | None:
        """The copy of this pod's rank, or None outside a pod of a run (no run id: no pod
        whose memory outlives the workers) or without ``/dev/shm``."""
        shm = os.environ.get(contract_env.SHM_DIR)
        root = Path(shm) / ROOT.name if shm else ROOT
        run_id = os.environ.get(contract_env.RUN_ID, "")
        if not run_id or not root.parent.is_dir():
            return None
        pod = os.environ.get(contract_env.POD_NAME) or devices.pod_name()
        return cls(root / run_id / pod, {"run_id": run_id, **identity})

    def write(self, step: int, state: Any, extra: dict[str, Any]) -> Path | None:
        """Write ``state`` (the staged host tensors of ``step``) and ``extra`` under a temporary
        name; return the file for :meth:`publish` once the checkpoint is complete. This rank's
        older copy stays until then where the memory has room for both (a failure during the
        save still resumes from memory), else it goes first. Skipped (None) with one log line
        when the memory has no room or the write fails: the disk checkpoint remains."""
        for stale in self.dir.glob(f".*.rank-{self.rank}.pt.tmp"):
            stale.unlink(missing_ok=True)
        local = _local(state)
        need = sum(t.nbytes for t in leaves(local)) * 1.05  # and the header, the alignment
        tmp = self.dir / f".step-{step}.rank-{self.rank}.pt.tmp"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            room = free_bytes(self.dir)
            if room < need:
                for old in self._files():
                    room += old.stat().st_size
                    old.unlink()
            if room < need:
                logger.warning(
                    "no host copy of checkpoint step %d: it needs %s, %s has %s free; raise "
                    "--shm-size to resume from memory (restarts load from disk)",
                    step,
                    human_bytes(int(need)),
                    self.dir,
                    human_bytes(room),
                )
                return None
            meta = {**self.identity, "step": step}
            write_file(tmp, {"meta": meta, "extra": extra}, local)
        except (OSError, RuntimeError) as e:  # a full /dev/shm: OSError from the writes
            # Ranks of one pod share its /dev/shm: each saw room, together they may not fit.
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            logger.warning(
                "no host copy of checkpoint step %d: %s (restarts load from disk)", step, e
            )
            return None
        return tmp

    def publish(self, tmp: Path) -> Path:
        """The copy written to ``tmp`` under its own name (its checkpoint is complete), and
        the only one of this rank."""
        path = tmp.with_name(tmp.name.removeprefix(".").removesuffix(".tmp"))
        os.replace(tmp, path)
        for old in self._files():
            if old != path:
                old.unlink(missing_ok=True)
        logger.info("host copy of the checkpoint: %s", path)
        return path

    def find(self, target: Any) -> tuple[int, Path, dict[str, Any]] | None:
        """This rank's copy as (step, path, header) when it was written for this run, rank,
        world size and model and its tensors have ``target``'s shapes, else None (with why).
        Only the header is read: the load reads the tensors."""
        path = self.newest()
        if path is None:
            return None
        try:
            found = read_header(path)
            meta = found["meta"]
        except (OSError, RuntimeError, EOFError, TypeError, KeyError, ValueError) as e:
            logger.warning("host copy %s unreadable (%r): loading from disk", path, e)
            return None
        differ = sorted(k for k, v in self.identity.items() if meta.get(k) != v)
        if differ:
            theirs = ", ".join(f"{k} {meta.get(k)!r}" for k in differ)
            logger.warning("host copy %s was written for %s: loading from disk", path, theirs)
            return None
        if _shapes(found["state"]) != _shapes(_local(target)):
            logger.warning(
                "host copy %s holds other tensors than this model: loading from disk", path
            )
            return None
        return int(meta["step"]), path, found

    def remove_run(self) -> None:
        """Remove the run's copies (every pod's, on the simulator): training ended."""
        shutil.rmtree(self.dir.parent, ignore_errors=True)
        with contextlib.suppress(OSError):  # other runs' copies are there
            self.dir.parent.parent.rmdir()

    def newest(self) -> Path | None:
        """This rank's copy, if there is one."""
        files = self._files()
        return files[-1] if files else None

    def _files(self) -> list[Path]:
        """This rank's copies, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.dir.iterdir()
            if (m := _FILE.match(p.name)) and int(m.group(2)) == self.rank
        ]
        return [p for _, p in sorted(found)]


def fill(target: Any, saved: Any, path: Path) -> Any:
    """``target`` (a state dict of this rank's model or optimizer) with the values of the
    copy at ``path`` (``saved``: its header's state): tensors read in place (a DTensor's local
    shard), other values replaced."""
    pairs: list[tuple[torch.Tensor, Span]] = []

    def walk(mine: Any, theirs: Any) -> Any:
        if isinstance(mine, dict):
            return {k: walk(v, theirs[k]) for k, v in mine.items()}
        if isinstance(mine, (list, tuple)):
            return type(mine)(walk(v, s) for v, s in zip(mine, theirs, strict=True))
        if isinstance(mine, torch.Tensor):
            pairs.append((mine.to_local() if isinstance(mine, DTensor) else mine, theirs))
            return mine
        return theirs

    state = walk(target, saved)
    read_tensors(path, pairs)
    return state


def free_bytes(path: Path) -> int:
    """The room left in the pod's ``/dev/shm`` at ``path``. On a cluster node a memory emptyDir
    is a tmpfs of its sizeLimit (kubernetes pkg/volume/emptydir/empty_dir.go, setupTmpfs), so
    the filesystem's free room says it; where the pod's ``/dev/shm`` is a plain directory with
    a size (``SHM_DIR``, ``SHM_SIZE``: the simulator), that size less what is in it counts."""
    fs = os.statvfs(path)
    free = fs.f_bavail * fs.f_frsize
    shm, size = os.environ.get(contract_env.SHM_DIR), os.environ.get(contract_env.SHM_SIZE)
    if not shm or not size:
        return free
    used = 0
    for f in Path(shm).rglob("*"):
        with contextlib.suppress(OSError):  # another rank's file, replaced meanwhile
            used += f.lstat().st_size if f.is_file() else 0
    return max(0, min(free, int(size) - used))


def _local(tree: Any) -> Any:
    """``tree`` with each DTensor as its local shard (what this rank holds)."""
    return mapped(tree, lambda t: t.to_local() if isinstance(t, DTensor) else t)


def _shapes(tree: Any, at: str = "") -> dict[str, Any]:
    """Every leaf's path -> (shape, dtype) for a tensor, its type's name otherwise."""
    if isinstance(tree, dict):
        return {k: v for key, val in tree.items() for k, v in _shapes(val, f"{at}/{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, val in enumerate(tree) for k, v in _shapes(val, f"{at}/{i}").items()}
    if isinstance(tree, (torch.Tensor, Span)):
        return {at: (tuple(tree.shape), tree.dtype)}
    return {at: type(tree).__name__}


def load(
    copy: HostCopy | None,
    disk_step: int | None,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    group: Any,
) -> tuple[dict[str, Any], Path] | None:
    """Collective over ``group`` (every rank calls it): load this rank's copy into ``model``
    and ``optimizer`` when every rank has one of the same step, not older than ``disk_step``
    (the newest complete checkpoint on disk); return (its extra state, the file), else None
    and nothing is loaded."""
    if copy is None or disk_step is None:  # the same on every rank (one shared disk)
        return None  # and with no checkpoint on disk, a copy is of another life of the run
    found, target, took = None, None, Took()
    if copy.newest() is not None:
        # Fills in the optimizer state (a step of zeros): only where a load follows.
        model_sd, optim_sd = get_state_dict(model, optimizer)
        target = {"model": model_sd, "optim": optim_sd}
        took("state layout")
        found = copy.find(target)
        took("header")
    # A copy older than the disk's newest checkpoint is of an earlier life of the run.
    step = found[0] if found is not None and found[0] >= disk_step else -1
    if not agreed(step, group):
        if step >= 0:
            logger.info("not every rank has a host copy of step %d: loading from disk", step)
        return None
    assert found is not None and target is not None
    _, path, saved = found
    took("agreed")
    state = fill(target, saved["state"], path)
    took("read")
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    took("set")
    logger.info("host copy loaded: %s", took)
    return saved["extra"], path


class Took:
    """Seconds each named part of a load took, in order (``'header 0.02 s, ...'``)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._last = time.perf_counter()

    def __call__(self, part: str) -> None:
        now = time.perf_counter()
        self.parts.append(f"{part} {now - self._last:.2f} s")
        self._last = now

    def __str__(self) -> str:
        return ", ".join(self.parts)


def agreed(step: int, group: Any) -> bool:
    """Collective over ``group``: whether every rank offers a host copy of ``step`` (-1:
    none)."""
    both = torch.tensor([step, -step], dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MIN, group=group)
    return step >= 0 and int(both[0]) == step and -int(both[1]) == step


class ReusedStager(AsyncStager):
    """Stages into host buffers kept across saves (found by the device storage they copy),
    in a thread of its own: pinned memory and non-blocking copies on a stream of its own
    where CUDA is. Not in shared memory: DCP's write runs in a thread, not a process.
    A save refills the buffers only after the one before it was written."""

    _synchronize_after_execute = False  # the caller waits for the copy (``wait_staged``)

    def __init__(self) -> None:
        cuda = torch.cuda.is_available()
        self._copier = StateDictStager(pin_memory=cuda, share_memory=False)
        self._stream = torch.cuda.Stream() if cuda else None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-staging")
        self._staged: Future[Any] | None = None

    def stage(self, state_dict: Any) -> Future[Any]:
        self._staged = self._thread.submit(self._copy, state_dict)
        return self._staged

    def staging(self) -> Future[Any]:
        """The last save's copy into the host buffers (its result: the staged state)."""
        assert self._staged is not None
        return self._staged

    def _copy(self, state_dict: Any) -> Any:
        if self._stream is None:
            return self._copier.stage(state_dict)
        torch.cuda.set_device(self._stream.device)
        with torch.cuda.stream(self._stream):
            staged = self._copier.stage(state_dict, non_blocking=True)
        self._stream.synchronize()
        return staged

    def synchronize_staging(self) -> None:
        """Wait for the copy in progress (where torch returns no staging future)."""
        if self._staged is not None:
            self._staged.result()

    def close(self) -> None:
        """Kept open between saves (``async_save`` may close a stager it was given)."""

    def release(self) -> None:
        self._thread.shutdown(wait=True)
        self._copier.close()


def fresh_stager() -> DefaultStager:
    """A single-use ``DefaultStager`` staged like ``ReusedStager``."""
    cuda = torch.cuda.is_available()
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,
            use_async_staging=True,
            use_non_blocking_copy=cuda,
        )
    )
