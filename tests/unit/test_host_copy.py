"""The host copy of the newest checkpoint (one gloo rank): written once a save is complete,
preferred by a resume, and never used when it is missing, older than the disk's, partial, or
written for another run, world size, model or shape: those resume from disk, loss for loss."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mnnvl.inputs.spec import TrainConfig
from mnnvl.ports import free_port
from mnnvl.runtime import checkpoint, copyfile, hostcopy
from mnnvl.runtime.checkpoint import Checkpointer
from mnnvl.runtime.hostcopy import HostCopy
from mnnvl.runtime.parallel import DistInfo
from mnnvl.runtime.train import Trainer

torch.set_num_threads(1)
INFO = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
IDENTITY = {"run_id": "r1", "checkpoint_dir": "/ckpt/r1", "rank": 0, "world_size": 1}


def trainer() -> Trainer:
    return Trainer(TrainConfig(model="tiny", steps=8, warmup_steps=1), INFO)


def checkpointer(tmp: Path, **identity: Any) -> Checkpointer:
    copy = HostCopy(tmp / "shm" / "r1" / "pod-a", {**IDENTITY, "model": "tiny", **identity})
    return Checkpointer(str(tmp / "ckpt"), rank=0, host_copy=copy)


def save(t: Trainer, ck: Checkpointer, step: int, *, host_copy: bool = True) -> None:
    t.step(step)
    extra = {"loss": 0.0, "scheduler": t.sched.state_dict(), "model": "tiny"}
    ck.save(step, t.model, t.opt, extra, host_copy=host_copy)
    ck.wait()


def copies(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "shm" / "r1" / "pod-a").iterdir())


def trained_to_2(tmp: Path) -> float:
    """Train and save steps 1 and 2; return the loss of step 3 (what a resume must repeat)."""
    t, ck = trainer(), checkpointer(tmp)
    save(t, ck, 1)
    save(t, ck, 2)
    loss = t.step(3).item()
    ck.finish()
    return loss


def resumed(tmp: Path, **identity: Any) -> tuple[str | None, float]:
    """A new run resumed: (source, the loss of the step after the one it resumed from)."""
    t = trainer()
    t.ckpt = checkpointer(tmp, **identity)
    t.resume()
    assert t.start_step == 2
    loss = t.step(3).item()
    t.ckpt.finish()
    return t.resume_source, loss


def test_a_completed_save_leaves_one_host_copy_of_its_own_step(
    gloo_one_rank: None, tmp_path: Path
) -> None:
    t, ck = trainer(), checkpointer(tmp_path)
    save(t, ck, 1)
    assert copies(tmp_path) == ["step-1.rank-0.pt"]
    save(t, ck, 2)
    assert copies(tmp_path) == ["step-2.rank-0.pt"]  # the newest only, no temporary left
    save(t, ck, 3, host_copy=False)  # the final save: nothing resumes after it
    assert copies(tmp_path) == ["step-2.rank-0.pt"]
    ck.finish()
    ck.discard_host_copy()  # the run ended normally
    assert not (tmp_path / "shm" / "r1").exists()


def test_resume_prefers_the_host_copy_and_continues_loss_for_loss(
    gloo_one_rank: None, tmp_path: Path
) -> None:
    loss = trained_to_2(tmp_path)
    source, again = resumed(tmp_path)
    assert (source, again) == ("host", loss)


def _copy_file(tmp: Path) -> Path:
    return tmp / "shm" / "r1" / "pod-a" / "step-2.rank-0.pt"


def _rewritten(path: Path, change: Any, to: Path | None = None) -> None:
    """The copy at ``path`` with ``change`` applied to its header and tensors, at ``to``."""
    header = copyfile.read_header(path)
    spans = copyfile.leaves(header["state"], copyfile.Span)
    tensors = [torch.empty(s.shape, dtype=s.dtype) for s in spans]
    copyfile.read_tensors(path, list(zip(tensors, spans, strict=True)))
    it = iter(tensors)
    state = copyfile.mapped(header.pop("state"), lambda _: next(it))
    change(header, state)
    copyfile.write_file(to or path, header, state)
    if to is not None:
        path.unlink()


def _older(tmp: Path) -> None:
    """The copy says step 1, the disk's newest is step 2."""

    def step_1(header: dict[str, Any], state: Any) -> None:
        header["meta"]["step"] = header["extra"]["step"] = 1

    path = _copy_file(tmp)
    _rewritten(path, step_1, path.with_name("step-1.rank-0.pt"))


def _truncated(tmp: Path) -> None:
    path = _copy_file(tmp)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _another_shape(tmp: Path) -> None:
    def smaller(header: dict[str, Any], state: Any) -> None:
        state["model"]["tok_embeddings.weight"] = torch.zeros(3, 3)

    _rewritten(_copy_file(tmp), smaller)


def _no_copy_on_one_side(tmp: Path) -> None:
    _copy_file(tmp).unlink()
    (tmp / "shm" / "r1" / "pod-a" / ".step-2.rank-0.pt.tmp").write_bytes(b"partial")


CASES = {
    "missing": (_no_copy_on_one_side, {}),
    "older than the disk's": (_older, {}),
    "partial": (_truncated, {}),
    "of another shape": (_another_shape, {}),
    "of another run": (None, {"run_id": "r2"}),
    "of another model": (None, {"model": "small"}),
    "of another world size": (None, {"world_size": 2}),
    "of another checkpoint directory": (None, {"checkpoint_dir": "/ckpt/other"}),
}


@pytest.mark.parametrize("case", CASES)
def test_a_host_copy_that_does_not_fit_resumes_from_disk_loss_for_loss(
    gloo_one_rank: None, tmp_path: Path, case: str
) -> None:
    loss = trained_to_2(tmp_path)
    spoil, identity = CASES[case]
    if spoil is not None:
        spoil(tmp_path)
    source, again = resumed(tmp_path, **identity)
    assert (source, again) == ("disk", loss)


def test_a_host_copy_without_its_checkpoint_on_disk_is_not_used(
    gloo_one_rank: None, tmp_path: Path
) -> None:
    trained_to_2(tmp_path)
    (tmp_path / "ckpt" / "latest").unlink()  # the checkpoint directory was emptied
    t, plain = trainer(), trainer()
    t.ckpt = checkpointer(tmp_path)
    t.resume()
    t.ckpt.finish()
    assert (t.resume_source, t.start_step) == (None, 0)
    # It starts at step 0 exactly as a run that never had a copy (optimizer state untouched).
    assert [t.step(s).item() for s in (1, 2, 3)] == [plain.step(s).item() for s in (1, 2, 3)]


def _saved_without_a_copy(tmp: Path, caplog: pytest.LogCaptureFixture) -> str:
    """Save step 1 where the host copy cannot be written; no copy is left, and the one line
    the host copy logged about it is returned."""
    t, ck = trainer(), checkpointer(tmp)
    with caplog.at_level(logging.WARNING, logger=hostcopy.__name__):
        save(t, ck, 1)
    ck.finish()
    assert copies(tmp) == []
    (line,) = [r.getMessage() for r in caplog.records if r.name == hostcopy.__name__]
    return line


def test_no_room_in_memory_skips_the_copy_with_one_line(
    gloo_one_rank: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    full = os.statvfs_result((4096, 4096, 1000, 0, 0, 1000, 0, 0, 0, 255))
    monkeypatch.setattr(hostcopy.os, "statvfs", lambda path: full)
    line = _saved_without_a_copy(tmp_path, caplog)
    assert line.startswith("no host copy of checkpoint step 1: it needs ")
    assert "raise --shm-size" in line
    assert (tmp_path / "ckpt" / "step-1" / ".metadata").is_file()  # the disk's is complete


def test_a_failed_disk_write_leaves_no_host_copy_of_its_step(
    gloo_one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, ck = trainer(), checkpointer(tmp_path)
    save(t, ck, 1)

    class BrokenWriter(checkpoint._DelayedWriter):
        def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
            raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "_writer", lambda path, step, rank: BrokenWriter(str(path)))
    t.step(2)
    ck.save(2, t.model, t.opt, {"loss": 0.0, "scheduler": t.sched.state_dict(), "model": "tiny"})
    with pytest.raises(RuntimeError, match=r"the write of checkpoint .*step-2 failed"):
        ck.finish()
    assert "step-2.rank-0.pt" not in copies(tmp_path)
    again = trainer()
    again.ckpt = checkpointer(tmp_path)
    again.resume()
    again.ckpt.finish()
    assert again.start_step == 1  # the newest complete checkpoint


def test_a_host_copy_that_does_not_fit_while_written_leaves_no_partial_file(
    gloo_one_rank: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def full(path: Path, header: dict[str, Any], state: Any) -> None:
        Path(path).write_bytes(b"half a copy")  # other ranks of the pod filled /dev/shm
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hostcopy, "write_file", full)
    line = _saved_without_a_copy(tmp_path, caplog)
    assert line.startswith("no host copy of checkpoint step 1: [Errno 28] No space left")


def _two_ranks(rank: int, port: int, tmp: str, drop: int) -> None:
    """One of two gloo ranks (pods of their own): train and save steps 1 and 2, drop rank
    ``drop``'s copy (-1: none), then resume in a new trainer; writes (source, whether its step
    3 repeats the loss) to ``rank-<r>.json``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    info = DistInfo(rank=rank, world_size=2, device=torch.device("cpu"))
    cfg = TrainConfig(model="tiny", steps=8, warmup_steps=1)
    pod = Path(tmp) / "shm" / "r1" / f"pod-{rank}"
    identity = {**IDENTITY, "rank": rank, "world_size": 2, "model": "tiny"}

    def ckpt() -> Checkpointer:
        return Checkpointer(str(Path(tmp) / "ckpt"), rank=rank, host_copy=HostCopy(pod, identity))

    first = Trainer(cfg, info)
    first.ckpt = ckpt()
    for step in (1, 2):
        save(first, first.ckpt, step)
    first.ckpt.finish()
    loss = first.step(3).item()
    first.close()
    if rank == drop:
        (pod / f"step-2.rank-{rank}.pt").unlink()
    dist.barrier()
    again = Trainer(cfg, info)
    again.ckpt = ckpt()
    again.resume()
    same = again.step(3).item() == loss
    again.ckpt.finish()
    again.close()  # as the worker ends: its heartbeat stops before the process group goes
    Path(tmp, f"rank-{rank}.json").write_text(json.dumps([again.resume_source, same]))
    dist.destroy_process_group()


@pytest.mark.parametrize(("drop", "source"), [(-1, "host"), (1, "disk")])
def test_two_ranks_resume_from_their_copies_only_when_both_have_one(
    tmp_path: Path, drop: int, source: str
) -> None:
    mp.spawn(_two_ranks, args=(free_port(), str(tmp_path), drop), nprocs=2)
    said = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert said == [[source, True], [source, True]]  # both ranks, loss for loss


def _in_flight(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Checkpointer, list[str]]:
    """Save step 1, then start a save of step 2 whose disk write starts 2 s late; return the
    checkpointer and the copies once step 2's host copy is written, its save still in flight."""
    t, ck = trainer(), checkpointer(tmp)
    save(t, ck, 1)

    def late(path: Path, step: int, rank: int) -> checkpoint._DelayedWriter:
        writer = checkpoint._DelayedWriter(str(path))
        writer.delay_s = 2.0
        return writer

    monkeypatch.setattr(checkpoint, "_writer", late)
    t.step(2)
    ck.save(2, t.model, t.opt, {"loss": 0.0, "scheduler": t.sched.state_dict(), "model": "tiny"})
    written = tmp / "shm" / "r1" / "pod-a" / ".step-2.rank-0.pt.tmp"
    deadline = time.monotonic() + 60
    while not written.exists() and ck.busy() and time.monotonic() < deadline:
        time.sleep(0.01)  # waits for the copy's write, not for a fixed time
    assert ck.busy(), "the save ended before its host copy was seen"
    return ck, copies(tmp)


def test_the_older_copy_stays_while_a_save_is_in_flight_where_two_fit(
    gloo_one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck, during = _in_flight(tmp_path, monkeypatch)
    # A worker lost now resumes from memory: the copy of the complete step 1 is still there.
    assert "step-1.rank-0.pt" in during
    ck.finish()
    assert copies(tmp_path) == ["step-2.rank-0.pt"]


def test_the_older_copy_goes_first_where_only_one_fits(
    gloo_one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.statvfs

    def room_for_one(path: Any) -> os.statvfs_result:
        """Free room: half a copy where one is kept (the older one's room would make two)."""
        kept = sorted((tmp_path / "shm" / "r1" / "pod-a").glob("step-*"))
        free = kept[0].stat().st_size // 2 if kept else 1 << 40
        return os.statvfs_result((1, 1, 1 << 41, free, free, *real(path)[5:]))

    monkeypatch.setattr(hostcopy.os, "statvfs", room_for_one)
    ck, during = _in_flight(tmp_path, monkeypatch)
    assert "step-1.rank-0.pt" not in during and ".step-2.rank-0.pt.tmp" in during
    ck.finish()
    assert copies(tmp_path) == ["step-2.rank-0.pt"]
