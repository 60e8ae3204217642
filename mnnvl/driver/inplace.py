"""In-place restarts as the driver sees them: from rank 0's log, without the pods changing.

The pods' launchers restart failed workers inside the pods (``mnnvl.runtime.inplace``); node
rank 0's launcher logs one line per in-place restart, which its pod's log follower hands here
with every other line. Each restart becomes a record like a recreated gang's
(``mnnvl.report_train`` names the keys) with ``how: "in-place"``: the pod, rank and exit code
that failed, ``restart_s`` (from the failure to every pod ready to start its workers again, on
the launchers' clocks), ``recovery_s`` (to rank 0's first resumed training step) and
``steps_lost`` (the failed rank's last step past the checkpoint resumed from).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mnnvl.driver.problem import problem
from mnnvl.errors import ProblemKind

# mnnvl.runtime.inplace.LINE, as rank 0's launcher logs it.
LINE = re.compile(
    r"in-place restart (?P<n>\d+) of at most \d+: pod (?P<pod>\S+) on node (?P<node>\S*) "
    r"rank (?P<rank>\S+) exit (?P<exit_code>-?\d+) \((?P<reason>[^)]*)\) "
    r"after (?P<step>.*?); every pod ready (?P<ready_s>[\d.]+) s after the failure "
    r"at (?P<at>[\d.]+)"
)
TRAIN_STEP = re.compile(r"\bstep (\d+) loss\b")  # rank 0's training line, "step 15 loss 2.3"
RESUMED = re.compile(r"\bresumed from \S+ \(step (\d+)\)")  # its checkpoint load
STEP_OF = re.compile(r"\bstep (\d+)\b")


@dataclass
class InPlace:
    """One in-place restart from the launcher's line, and what rank 0 logged after it."""

    n: int
    pod: str
    node: str
    rank: str
    exit_code: int
    reason: str
    failed_step: int | None
    at: float  # the failure, wall clock of the failing pod's launcher
    ready_s: float
    seen: float  # monotonic, when the driver read the line
    resumed: int | None = None  # the checkpoint's step the workers resumed from
    first_step_s: float | None = None  # from the line to rank 0's first resumed step

    def record(self) -> dict[str, Any]:
        lost = None
        if self.failed_step is not None and self.resumed is not None:
            lost = max(0, self.failed_step - self.resumed)
        recovery = None if self.first_step_s is None else self.ready_s + self.first_step_s
        return {
            "how": "in-place",
            "at": self.at,
            "pod": self.pod,
            "node": self.node or None,
            "rank": int(self.rank) if self.rank.isdigit() else None,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "restart_s": round(self.ready_s, 3),
            "recovery_s": None if recovery is None else round(recovery, 3),
            "steps_lost": lost,
        }


class InPlaceLog:
    """The in-place restarts of one step, from rank 0's log lines (of every pod it had)."""

    def __init__(self) -> None:
        self.restarts: list[InPlace] = []
        self._lock = threading.Lock()  # lines come from the log follower's thread

    def line(self, text: str) -> None:
        m = LINE.search(text)
        with self._lock:
            if m:
                key = (int(m["n"]), m["pod"], float(m["at"]))
                if any((r.n, r.pod, r.at) == key for r in self.restarts):
                    return  # read again from the stored log
                step = STEP_OF.search(m["step"])
                self.restarts.append(
                    InPlace(
                        n=int(m["n"]),
                        pod=m["pod"],
                        node=m["node"],
                        rank=m["rank"],
                        exit_code=int(m["exit_code"]),
                        reason=m["reason"],
                        failed_step=int(step.group(1)) if step else None,
                        at=float(m["at"]),
                        ready_s=float(m["ready_s"]),
                        seen=time.monotonic(),
                    )
                )
                return
            last = self.restarts[-1] if self.restarts else None
            if last is None or last.first_step_s is not None:
                return
            resumed = RESUMED.search(text)
            if resumed:
                last.resumed = int(resumed.group(1))
            elif TRAIN_STEP.search(text):
                last.first_step_s = time.monotonic() - last.seen
                last.resumed = last.resumed or 0  # no checkpoint: it started over

    def __len__(self) -> int:
        return len(self.restarts)

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.record() for r in self.restarts]

    def earlier(self, recreated: Sequence[Any] = ()) -> str:
        """The restarts so far, in place and (``recreated``: the gang's, each with
        ``attempt``) with the pods made again, for a message that ends the step ("" when none)."""
        with self._lock:
            return before(recreated, self.restarts)


def before(recreated: Sequence[Any], in_place: Sequence[InPlace]) -> str:
    """``; pods recreated before: …; restarted in place before: …`` ("" when neither)."""
    words = ""
    if recreated:
        pods = ", ".join(f"{r.attempt.names()} exit {r.attempt.exit_code}" for r in recreated)
        words += f"; pods recreated before: {pods}"
    if in_place:
        done = ", ".join(
            f"pod {r.pod} rank {r.rank} exit {r.exit_code} ({r.reason})" for r in in_place
        )
        words += f"; restarted in place before: {done}"
    return words


def check_budget(
    recreated: Sequence[Any], in_place: InPlaceLog, max_restarts: int, namespace: str
) -> None:
    """Raise (exit 4, ``RESTARTS_EXHAUSTED``) once an in-place restart goes past
    ``--max-restarts`` counted with the gangs recreated before it, naming every earlier
    restart. A recreated gang's launchers count only their own restarts in place (a running
    Job's next pods come from a template the Job API lets no one change, short of a
    suspension), so the driver, which sees both, holds the one budget. ``recreated``: the
    gang's restarts (each with ``attempt``)."""
    with in_place._lock:
        done = list(in_place.restarts)
    used = len(recreated) + len(done)
    if used <= max_restarts or not done:
        return
    last = done[-1]
    found = problem(
        ProblemKind.RESTARTS_EXHAUSTED,
        pod=last.pod,
        exit_code=last.exit_code,
        restarts=used - 1,
        max_restarts=max_restarts,
    )
    raise found.error(
        f"pod {last.pod} rank {last.rank} ({last.reason}) {found.message}"
        f"{before(recreated, done[:-1])}; check `kubectl logs -n {namespace} {last.pod}`"
    )


def merged(recreated: Sequence[Any], in_place: InPlaceLog) -> list[dict[str, Any]]:
    """Every restart of a step in the order the driver saw them, each with ``how`` it
    restarted: "recreated" (every pod made again; ``recreated``: the gang's restarts, with
    ``seen``, monotonic, and ``record()``) or "in-place" (the workers inside the pods)."""
    with in_place._lock:
        timed = [(r.seen, r.record()) for r in in_place.restarts]
    timed += [(r.seen, r.record()) for r in recreated]
    ordered = [record for _, record in sorted(timed, key=lambda t: t[0])]
    return [{**record, "n": n} for n, record in enumerate(ordered, 1)]


def restarts_words(recreated: int, in_place: int) -> str:
    """A step's restarts for its progress line."""
    return f"restarts {recreated + in_place} ({in_place} in place)"
