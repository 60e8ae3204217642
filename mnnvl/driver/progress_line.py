"""Rank 0's log as a person reads it: one progress line instead of every line.

A training worker's log line ends ``; 10 of 20 steps, ETA 3 s`` and a verification's sweep
line ``, 5 of 11 sizes`` (``mnnvl.runtime.train``, ``mnnvl.runtime.progress``). From them the
launcher shows ``train: step 10/20, loss 6.1596, 9116 tokens/s, ETA 3 s`` or ``verify: 5 of 11
sizes done (16 KiB, the sweep across all ranks)``: once at INFO when the first such line
arrives (training: the first with an ETA), after that in the wait's progress line. Every log
line itself is echoed at DEBUG (``-v``).
"""

from __future__ import annotations

import re

from mnnvl.units import human_bytes

TRAIN_LINE = re.compile(
    r"\bstep (\d+) loss (\S+) .*\btok/s (\d+)\b.*; \d+ of (\d+) steps(?:, ETA (.+))?$"
)
SWEEP_LINE = re.compile(r"\bsweep size (\d+) bytes done \((.*)\), (\d+) of (\d+) sizes$")


class ProgressLine:
    """The last progress rank 0 logged, as one line (``text``; "" before any)."""

    def __init__(self) -> None:
        self.text = ""
        self.announced = False

    def line(self, log_line: str) -> str | None:
        """Read one log line; return the progress line to show now (the first one), else None."""
        train, sweep = TRAIN_LINE.search(log_line), SWEEP_LINE.search(log_line)
        if train:
            step, loss, tokens_s, total, eta = train.groups()
            self.text = f"train: step {step}/{total}, loss {loss}, {tokens_s} tokens/s"
            if not eta:
                return None  # the first step's line: its rate includes compiling
            self.text += f", ETA {eta}"
        elif sweep and sweep.group(4) != "0":
            size, label, done, total = sweep.groups()
            self.text = f"verify: {done} of {total} sizes done ({human_bytes(int(size))}, {label})"
        else:
            return None
        if self.announced:
            return None
        self.announced = True
        return self.text
