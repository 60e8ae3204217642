"""Worker progress for the launcher's watchdog, and who a timed-out collective waited for.

A worker reports each thing it finished (a step, a sweep size, a checkpoint) to a file the
launcher names, one JSON object replaced atomically (``{"seq": n, "stall_timeout_s": s,
"what": "step 1450"}``): a stopped or wedged worker cannot block on it as on a full pipe, and
the launcher notes when ``seq`` changed on its own clock. Standard library only at import
(the launcher imports it before torch). ``Arrivals``: each rank's last step and heartbeat in
the process group's store, so a rank whose collective timed out can name the ranks that never
arrived (torch's own message names none for gloo).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

PROGRESS_ENV = "MNNVL_PROGRESS_FILE"  # set per worker by mnnvl.runtime.launch
# Test hook of the training and verify workers: ``<step or bytes>:<rank>:<SIGNAME>``.
SIGNAL_AT_ENV = "MNNVL_TEST_SIGNAL_AT"
WORDS_CHARS = 3000  # a worker's last words kept: the termination message holds 4096 bytes

_seq = 0
logger = logging.getLogger(__name__)


class _Steps:
    """This worker's step cadence, on its own clock: the launcher polls about once a second
    and would miss most steps of a fast model."""

    last_at: float | None = None  # the last report, when it was a step's
    seen = 0
    intervals: list[float] = []

    @classmethod
    def slowest(cls, step: bool) -> float | None:
        """Note a report; the slowest of the recent step intervals once enough are known."""
        now = time.monotonic()
        if step and cls.last_at is not None and cls.seen >= LEARN_AFTER:
            cls.intervals = [*cls.intervals[1 - WINDOW :], now - cls.last_at]
        cls.seen += step
        cls.last_at = now if step else None  # a step after something else is not learned
        return max(cls.intervals) if len(cls.intervals) >= MIN_LEARNED else None


def report(what: str, stall_timeout_s: float, *, step: bool = False, hold: bool = False) -> None:
    """Tell the launcher this worker is alive and what it just finished; arms its watchdog
    with ``stall_timeout_s`` (0 disarms it), the bound of the derived timeout (:class:`Seen`).
    ``step``: a training step, whose cadence may shorten the timeout (only when the user gave
    no stall timeout); ``hold``: something long may follow (start-up, a checkpoint save or
    load, the last write), so the bound applies until the next report. A no-op outside
    ``mnnvl.runtime.launch``."""
    global _seq
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    _seq += 1
    tmp = f"{path}.tmp"
    body = {"seq": _seq, "stall_timeout_s": stall_timeout_s, "what": what, "hold": hold}
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({**body, "slowest_step_s": _Steps.slowest(step)}, f)
    os.replace(tmp, path)


def words_path(progress_file: str) -> str:
    """Where a worker leaves its last words (its exception's last lines) when it fails: beside
    its progress file, for the launcher's termination message."""
    return f"{progress_file}.error"


def write_words(text: str) -> None:
    """A failing worker's last words for its launcher (a no-op outside the launcher); never
    raises: the exit code is what matters."""
    path = os.environ.get(PROGRESS_ENV)
    if not path or not text:
        return
    try:
        with open(words_path(path), "w", encoding="utf-8") as f:
            f.write(text[-WORDS_CHARS:])
    except OSError as e:
        logger.warning("could not keep the failure's words for the launcher: %s", e)


def last_progress(progress_file: str) -> str:
    """What a worker last reported done ("" when nothing)."""
    try:
        with open(progress_file, encoding="utf-8") as f:
            return str(json.load(f).get("what", ""))
    except (OSError, ValueError):
        return ""


def read_words(progress_file: str) -> str:
    """A worker's last words, "" when it left none."""
    try:
        with open(words_path(progress_file), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def signal_at(point: int, rank: int, what: str, marker_dir: str | None = None) -> None:
    """Test hook ``SIGNAL_AT_ENV``: that rank signals itself after ``point`` (``what``: a training
    step or a sweep size); with ``marker_dir`` only once (a marker there stops a restarted run)."""
    at = os.environ.get(SIGNAL_AT_ENV, "")
    if not at:
        return
    at_point, at_rank, name = at.split(":")
    if (int(at_point), int(at_rank)) != (point, rank):
        return
    if marker_dir is not None:
        marker = os.path.join(marker_dir, f".signal-{at.replace(':', '-')}")
        if os.path.exists(marker):
            return
        open(marker, "w").close()
    logger.warning("test hook: %s to rank %d after %s %d", name, rank, what, point)
    os.kill(os.getpid(), signal.Signals[name])


def is_collective_timeout(error: BaseException) -> bool:
    """A collective that gave up on a peer (gloo: "Timed out waiting ...", NCCL with
    blocking wait: "... operation timeout"); other runtime errors, a peer's closed
    connection among them, are crashes (exit 1, also retried)."""
    text = str(error).lower()
    return "timed out" in text or "timeout" in text


class SweepProgress:
    """The all-reduce sweep's progress (``collectives.SweepPlan.progress``): sizes started and
    done and timed loops (at most once a second) go to the watchdog, so a moving sweep never
    looks stalled; rank 0 logs ``SWEEP_DONE`` per size to ``log`` (the driver's progress lines
    show it); ``doing`` names the size in progress for a timed-out collective's message."""

    SWEEP_DONE = "sweep size %d bytes done (%s), %d of %d sizes"

    def __init__(self, stall_timeout_s: float, rank: int, log: logging.Logger) -> None:
        self.stall_timeout_s, self.rank, self.log = stall_timeout_s, rank, log
        self.label = "the sweep across all ranks"  # the per-clique run names each sweep
        self.sizes: list[int] = []  # the plan's sizes, for "N of M sizes"
        self.doing = "start-up"
        self.reported = 0.0

    def __call__(self, size: int, event: str) -> None:
        """``event``: start (a size or the warm-up at it begins), loop, done."""
        now = time.monotonic()
        if event == "start":
            self.doing = f"the all-reduce of {size} bytes in {self.label}"
        elif event == "loop" and now - self.reported < 1.0:
            return
        self.reported = now
        state = "done" if event == "done" else "running"
        report(f"sweep size {size} bytes {state} ({self.label})", self.stall_timeout_s)
        if event == "done":
            if self.rank == 0:
                done = self.sizes.index(size) + 1 if size in self.sizes else 0
                self.log.info(self.SWEEP_DONE, size, self.label, done, len(self.sizes))
            signal_at(size, self.rank, "sweep size")


class Arrivals:
    """Each rank's pod, last started step and a heartbeat (every second, from a thread, so a
    rank blocked in a collective still beats while a stopped or dead one falls silent) in
    the default process group's store."""

    KEY = "mnnvl/rank/{}"
    READ_TIMEOUT_S = 5.0  # rank 0's store may be on the hung node
    SILENT_S = 5.0  # a heartbeat older than this (clocks of nodes agree far better)
    BEAT_S = 1.0

    def __init__(self, rank: int, world_size: int) -> None:
        import threading

        import torch.distributed as dist

        # No public accessor for the store init_process_group made; it is the rendezvous's.
        self.store = dist.distributed_c10d._get_default_store()
        self.rank, self.world_size = rank, world_size
        self.step = 0  # the step this rank is in now, set by the trainer
        self.host = os.environ.get("HOSTNAME", "") or "?"
        self._stopped = threading.Event()
        # A daemon, so that a heartbeat stuck on a lost store cannot hold the exit; stopped at
        # exit too where stop() was not called (a crash), before the interpreter tears down.
        self._beating = threading.Thread(target=self._beat, name="mnnvl-heartbeat", daemon=True)
        self._beating.start()
        atexit.register(self.stop)

    def _beat(self) -> None:
        while not self._stopped.is_set():
            try:
                self.store.set(self.KEY.format(self.rank), f"{time.time()} {self.step} {self.host}")
            except RuntimeError:
                return  # the store is gone: the process group is being torn down
            self._stopped.wait(self.BEAT_S)

    def stop(self) -> None:
        """End the heartbeat; call it before the process group is destroyed. A heartbeat still
        inside a store call when the interpreter exits aborts the process (``terminate called
        without an active exception``, exit 134): torch's binding takes the interpreter lock
        back in a destructor, and an exiting interpreter ends such a thread by unwinding it."""
        atexit.unregister(self.stop)
        self._stopped.set()
        self._beating.join(self.READ_TIMEOUT_S)  # a store on a lost node: give up waiting

    def behind(self) -> str:
        """The ranks that fell silent, else those in an earlier step than the furthest, with
        their pods ("unknown" when the store on rank 0's node does not answer)."""
        import datetime

        try:
            self.store.set_timeout(datetime.timedelta(seconds=self.READ_TIMEOUT_S))
            keys = [self.KEY.format(r) for r in range(self.world_size)]
            found = [self.store.get(k).decode().split(" ", 2) for k in keys]
        except RuntimeError as e:
            return f"unknown (the store on rank 0 did not answer: {e})"
        now, top = time.time(), max(int(f[1]) for f in found)
        silent = [
            f"rank {r} (pod {f[2]}, silent for {now - float(f[0]):.0f} s, in step {f[1]})"
            for r, f in enumerate(found)
            if now - float(f[0]) > self.SILENT_S
        ]
        late = [
            f"rank {r} (pod {f[2]}, in step {f[1]})" for r, f in enumerate(found) if int(f[1]) < top
        ]
        return ", ".join(silent or late) or "not known (every rank is alive and in the same step)"


# The derived stall timeout (training with no --stall-timeout-s): STEP_FACTOR x the slowest of
# the last WINDOW step intervals, at least FLOOR_S, at most the bound the worker reports
# (2 x collective timeout + 60 s). Learned by the worker from consecutive step reports after
# its first LEARN_AFTER steps (they compile and warm up), and used once MIN_LEARNED are known
# and the last report does not announce something long (``hold``).
FLOOR_S = 60.0
STEP_FACTOR = 10.0
WINDOW = 20
LEARN_AFTER = 2
MIN_LEARNED = 3


@dataclass
class Seen:
    """The last progress the launcher saw of one worker, on the launcher's clock."""

    seq: int = 0
    what: str = ""
    stall_timeout_s: float = 0.0
    at: float = 0.0
    hold: bool = False
    slowest_step_s: float | None = None

    def update(self, data: dict[str, Any], now: float) -> None:
        self.seq, self.what, self.at = data["seq"], str(data.get("what", "")), now
        self.stall_timeout_s = float(data.get("stall_timeout_s") or 0)
        self.hold = bool(data.get("hold"))
        slowest = data.get("slowest_step_s")
        self.slowest_step_s = None if slowest is None else float(slowest)

    def timeout(self) -> tuple[float, str]:
        """The stall timeout in force and how it was set."""
        slowest = self.slowest_step_s
        if self.hold or slowest is None or not self.stall_timeout_s:
            return self.stall_timeout_s, f"--stall-timeout-s {self.stall_timeout_s:g}"
        derived = min(self.stall_timeout_s, max(FLOOR_S, STEP_FACTOR * slowest))
        return derived, (
            f"stall timeout {derived:g} s: {STEP_FACTOR:g} x the slowest recent step "
            f"({slowest:.2f} s), at least {FLOOR_S:g} s"
        )


@dataclass(frozen=True)
class Stall:
    rank: int
    what: str
    age_s: float
    stall_timeout_s: float
    rule: str = ""  # how the timeout was set
    state: str = ""  # its process's state, when known

    def __str__(self) -> str:
        last = f"last progress: {self.what}" if self.what else "no progress reported"
        rule = self.rule or f"--stall-timeout-s {self.stall_timeout_s:g}"
        state = f"; its process is {self.state}" if self.state else ""
        return f"rank {self.rank} made no progress for {self.age_s:.0f} s ({rule}; {last}{state})"


class Watchdog:
    """Reads each worker's progress file; ``stalled()`` names a worker past its timeout.

    A worker is watched from its first report on (start-up waits for the other pods and is
    bounded by the rendezvous timeout, not by this)."""

    def __init__(self, files: dict[int, str]) -> None:
        self.files = files  # global rank -> progress file
        self.seen = {rank: Seen() for rank in files}
        self.closest: tuple[float, float, float, str] = (0.0, 0.0, 0.0, "")

    def stalled(self) -> Stall | None:
        """The first watched worker whose last progress is older than its stall timeout."""
        now = time.monotonic()
        for rank, path in self.files.items():
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue  # not written yet (or a torn read, which os.replace rules out)
            seen = self.seen[rank]
            if data.get("seq") != seen.seq:
                if seen.seq:
                    self._note_gap(rank, seen, now)
                seen.update(data, now)
        for rank, seen in sorted(self.seen.items()):
            age = now - seen.at
            timeout, rule = seen.timeout()
            if seen.seq and timeout > 0 and age > timeout:
                return Stall(rank, seen.what, age, timeout, rule)
        return None

    def _note_gap(self, rank: int, seen: Seen, now: float) -> None:
        """Keep the silence closest to its timeout: the watchdog's false-alarm margin."""
        timeout, _ = seen.timeout()
        gap = now - seen.at
        if timeout > 0 and gap / timeout > self.closest[0]:
            self.closest = (gap / timeout, gap, timeout, f"rank {rank} before {seen.what!r}")

    def margin(self) -> str:
        """The longest silence relative to the timeout then in force, as a log line's words
        ("" before a worker reported twice)."""
        ratio, gap, timeout, where = self.closest
        if not ratio:
            return ""
        return f"longest silence {gap:.1f} s of a {timeout:g} s stall timeout ({where})"

    def forget(self, rank: int) -> None:
        """A worker that ended is not watched any more."""
        self.seen.pop(rank, None)
        self.files.pop(rank, None)
