"""What rank 0's log says: the steps (or verification sweep sizes) it has done, and the
checkpoint a restart resumes from."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

STEP_LINE = re.compile(r"\bstep (\d+)\b")  # rank 0's training log line, "step 1450 loss ..."
# Rank 0's lines about a checkpoint it completed or resumed from (mnnvl.runtime.checkpoint):
# "saved checkpoint /ckpt/run/step-000150 (...)", "resumed from /ckpt/run/step-000150 (step 150)".
CHECKPOINT_LINE = re.compile(r"\b(?:saved checkpoint|resumed from) \S*?step-0*(\d+)\b")
# Rank 0's verification log line, "sweep size 1048576 bytes done (the sweep across all ranks)"
SWEEP_LINE = re.compile(r"\bsweep size (\d+) bytes done\b")


@dataclass
class Rank0Progress:
    """The last step rank 0 logged and when (monotonic), and its first one; for a
    verification, the last sweep size it finished."""

    first: tuple[int, float] | None = None
    last: tuple[int, float] | None = None
    sweep: tuple[int, float] | None = None
    checkpoint: int | None = None  # the step of the last checkpoint saved or resumed from

    def line(self, text: str) -> None:
        m = CHECKPOINT_LINE.search(text)
        if m:
            self.checkpoint = int(m.group(1))
            return
        m = STEP_LINE.search(text)
        if m:
            seen = (int(m.group(1)), time.monotonic())
            self.first = self.first or seen
            self.last = seen
        m = SWEEP_LINE.search(text)
        if m:
            self.sweep = (int(m.group(1)), time.monotonic())

    def describe(self) -> str:
        now = time.monotonic()
        if self.sweep is not None:
            size, at = self.sweep
            return f"rank 0 done with sweep size {size} bytes, {now - at:.0f} s ago"
        if self.last is None:
            return "rank 0 has logged no step or sweep size yet"
        return f"rank 0 at step {self.last[0]}, {now - self.last[1]:.0f} s ago"


def resumes_from(before: list[Rank0Progress], now: Rank0Progress | None) -> str:
    """Where the next attempt starts, as far as rank 0's logs (of the attempts ``before`` and
    of the one that ``now`` failed; None: not followed) tell."""
    done = [p.checkpoint for p in before] + [now.checkpoint if now is not None else None]
    step = max((s for s in done if s is not None), default=None)
    if step is not None:
        return f"from its checkpoint of step {step}"
    if now is None:
        return "from its last checkpoint, if it wrote one"
    return "from the start (rank 0 has logged no checkpoint)"
