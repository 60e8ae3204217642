"""Background checkpoints on one gloo rank: repeated saves, at most one in flight, each
checkpoint the state of its own step although training changed it while it was written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from mnnvl.inputs.spec import TrainConfig
from mnnvl.runtime import checkpoint
from mnnvl.runtime.checkpoint import Checkpointer
from mnnvl.runtime.parallel import DistInfo
from mnnvl.runtime.train import Trainer

torch.set_num_threads(1)
WRITE_DELAY_S = 0.4
SAVES = 4


def snapshot(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().full_tensor().clone() for n, p in trainer.model.named_parameters()}


def latest_name(root: Path) -> str | None:
    marker = root / checkpoint.LATEST
    return marker.read_text().strip() if marker.exists() else None


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write starts WRITE_DELAY_S late (the test hook, for every step)."""

    def delayed(path: Path, step: int, rank: int) -> checkpoint._DelayedWriter:
        writer = checkpoint._DelayedWriter(str(path))
        writer.delay_s = WRITE_DELAY_S
        return writer

    monkeypatch.setattr(checkpoint, "_writer", delayed)


@pytest.mark.parametrize("mode", ["async", "async-fresh"])
def test_repeated_background_saves_one_in_flight_each_the_state_of_its_step(
    gloo_one_rank: None, tmp_path: Path, slow_writes: None, mode: str
) -> None:
    """Host buffers reused from save to save (the default) or a new stager per save."""
    info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Trainer(TrainConfig(model="tiny", steps=SAVES * 2, warmup_steps=1), info)
    ckpt = Checkpointer(str(tmp_path), rank=0, mode=mode)
    trainer.ckpt = ckpt  # its steps wait for a save's copy before the optimizer changes state
    saved: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(1, SAVES + 1):
        trainer.step(step)  # changes the state while the previous save is being written
        saved[step] = snapshot(trainer)
        started = time.perf_counter()
        path = ckpt.save(step, trainer.model, trainer.opt, {"loss": 0.0, "scheduler": {}})
        held = time.perf_counter() - started
        # The save waited for the previous one: that one is complete, this one is not yet.
        assert latest_name(tmp_path) == (f"step-{step - 1}" if step > 1 else None)
        assert not (path / ".metadata").exists()
        if step > 1:
            assert held >= WRITE_DELAY_S * 0.5  # it waited out most of the previous write
    trainer.step(SAVES + 1)
    assert ckpt.finish() == tmp_path / f"step-{SAVES}"
    assert latest_name(tmp_path) == f"step-{SAVES}"
    stall = ckpt.stall_summary()
    assert stall is not None and stall["saves"] == SAVES
    assert ckpt.final_wait_s > 0
    # Only the newest two are kept; each holds the weights of its own step exactly.
    kept = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert kept == [f"step-{SAVES - 1}", f"step-{SAVES}"]
    for step in (SAVES - 1, SAVES):
        fresh = Trainer(TrainConfig(model="tiny", steps=SAVES * 2, seed=1), info)
        reader = Checkpointer(str(tmp_path), rank=0)
        reader.load(tmp_path / f"step-{step}", fresh.model, fresh.opt)
        loaded = snapshot(fresh)
        assert loaded.keys() == saved[step].keys()
        assert all(torch.equal(loaded[n], saved[step][n]) for n in loaded)
        assert any(not torch.equal(loaded[n], snapshot(trainer)[n]) for n in loaded)
        reader.finish()


def save_2_fails(trainer: Trainer, ckpt: Checkpointer, error: str) -> None:
    """Train step 2 and save it; the save's end raises ``error`` (a pattern)."""
    trainer.step(2)
    ckpt.save(2, trainer.model, trainer.opt, {"loss": 0.0, "scheduler": {}})
    with pytest.raises(RuntimeError, match=error):
        ckpt.finish()


def test_a_failed_background_write_never_becomes_latest(
    gloo_one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Trainer(TrainConfig(model="tiny", steps=4, warmup_steps=1), info)
    ckpt = Checkpointer(str(tmp_path), rank=0)
    trainer.step(1)
    ckpt.save(1, trainer.model, trainer.opt, {"loss": 0.0, "scheduler": {}})
    assert ckpt.wait() == tmp_path / "step-1"

    class BrokenWriter(checkpoint._DelayedWriter):
        def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
            raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "_writer", lambda path, step, rank: BrokenWriter(str(path)))
    save_2_fails(
        trainer, ckpt, r"^the write of checkpoint .*step-2 failed: rank 0: OSError: disk full$"
    )
    assert latest_name(tmp_path) == "step-1"
    assert ckpt.latest() == tmp_path / "step-1"
    assert not (tmp_path / "step-2" / ".metadata").exists()


def test_a_save_is_synced_to_storage_by_a_process_of_its_own(
    gloo_one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread of the worker waits in fsync (a killed worker would be reaped only once the
    flush ended); a sync that fails leaves the checkpoint incomplete, as a failed write does."""
    synced: list[str] = []

    def no_fsync_here(fd: int) -> None:
        raise AssertionError("fsync in the training process")

    monkeypatch.setattr("os.fsync", no_fsync_here)
    info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Trainer(TrainConfig(model="tiny", steps=4, warmup_steps=1), info)
    ckpt = Checkpointer(str(tmp_path), rank=0)
    trainer.step(1)
    original = checkpoint._durable
    monkeypatch.setattr(
        checkpoint, "_durable", lambda paths: synced.extend(map(str, paths)) or original(paths)
    )
    ckpt.save(1, trainer.model, trainer.opt, {"loss": 0.0, "scheduler": {}})
    assert ckpt.wait() == tmp_path / "step-1"
    step_dir = tmp_path / "step-1"
    data = sorted(str(p) for p in step_dir.glob("*.distcp"))
    assert data and set(data) <= set(synced)
    assert {str(step_dir / ".metadata"), str(step_dir)} <= set(synced)

    monkeypatch.setattr(checkpoint, "_FSYNC", "raise SystemExit('EIO: the volume is gone')")
    save_2_fails(trainer, ckpt, r"step-2 failed: .*could not sync .*EIO: the volume is gone")
    assert latest_name(tmp_path) == "step-1"
