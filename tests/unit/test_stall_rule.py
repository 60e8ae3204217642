"""The launcher's stall timeout, derived from the training steps it sees: short once steps are
regular, the bound before them and while something long is announced (on a fake clock)."""

from __future__ import annotations

import time
import types

import pytest

from mnnvl.inputs.spec import TrainConfig
from mnnvl.runtime import progress
from mnnvl.runtime.progress import PROGRESS_ENV, Watchdog

BOUND = TrainConfig().stall_s  # the default: 2 x collective timeout + 60 s


class Worker:
    """One worker's progress file and the launcher's watchdog over it, on a clock of its own."""

    def __init__(self, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = str(tmp_path / "rank-0")
        monkeypatch.setenv(PROGRESS_ENV, path)
        self.now = 1000.0
        # progress's clock only: another thread of this process keeps the real one.
        clock = types.SimpleNamespace(monotonic=lambda: self.now, time=time.time)
        monkeypatch.setattr(progress, "time", clock)
        for name, fresh in (("last_at", None), ("seen", 0), ("intervals", [])):
            monkeypatch.setattr(progress._Steps, name, fresh)  # a new worker process
        self.dog = Watchdog({0: path})

    def report(self, what: str, after_s: float, **kind: bool) -> None:
        self.now += after_s
        progress.report(what, BOUND, **kind)
        assert self.dog.stalled() is None

    def steps(self, first: int, last: int, every_s: float) -> None:
        for step in range(first, last + 1):
            self.report(f"step {step}", every_s, step=True)

    def stalled_after(self) -> float:
        """How long the worker may now stay silent."""
        start = self.now
        while self.dog.stalled() is None:
            self.now += 1.0
            assert self.now - start < 10 * BOUND
        return self.now - start


@pytest.fixture
def worker(tmp_path, monkeypatch) -> Worker:
    return Worker(tmp_path, monkeypatch)


def test_regular_steps_shorten_the_default_timeout_to_the_floor(worker: Worker) -> None:
    assert BOUND == 660
    worker.report("process group ready", 0, hold=True)
    worker.report("step 1", 400, step=True)  # compile: slow, and not learned
    worker.steps(2, 8, every_s=0.5)
    assert worker.stalled_after() == pytest.approx(61, abs=1)
    stall = worker.dog.stalled()
    assert stall is not None and "stall timeout 60 s: 10 x the slowest recent step" in str(stall)


def test_slow_steps_give_ten_times_the_slowest(worker: Worker) -> None:
    worker.report("process group ready", 0, hold=True)
    worker.steps(1, 5, every_s=12.0)
    worker.steps(6, 7, every_s=20.0)
    assert worker.stalled_after() == pytest.approx(201, abs=1)


def test_before_enough_steps_and_during_a_save_the_bound_holds(worker: Worker) -> None:
    worker.report("process group ready", 0, hold=True)
    assert worker.stalled_after() == pytest.approx(BOUND + 1, abs=1)
    worker.report("step 1", 0, step=True)
    worker.steps(2, 10, every_s=1.0)
    worker.report("checkpoint step 10 saving", 1.0, hold=True)
    assert worker.stalled_after() == pytest.approx(BOUND + 1, abs=1)


def test_a_given_stall_timeout_is_kept_as_given(worker: Worker) -> None:
    worker.report("process group ready", 0)
    for step in range(1, 20):  # step=False: the user gave --stall-timeout-s
        worker.report(f"step {step}", 0.5)
    assert worker.stalled_after() == pytest.approx(BOUND + 1, abs=1)
