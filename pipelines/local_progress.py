"""Progress lines for the local run: pipeline stages from kfp.local's log, objects from the sim.

kfp.local takes over the root logger and stdout while a pipeline runs, so stage lines use
their own logger bound to the real stderr.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
import time
from typing import Any, TextIO

from mnnvl.pipelines.kfp_pipeline import task_names

ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STARTED = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
_PIPELINE = re.compile(r"Pipeline '([^']+)' finished with status (\w+)")
# A step's own one-line failure (``mnnvl.components.bodies.one_line``), as KFP's executor logs it.
_FAILED = re.compile(r"ERROR\]: \w+ failed: (.+)$")
# The last line of a task's traceback, e.g. "ValueError: ...".
_ERROR = re.compile(
    r"^\s*((?:[\w]+\.)*\w*(?:Error|Exception|Failed|Timeout|Missing|Unavailable)): (.+)$"
)


def stage_logger() -> logging.Logger:
    """A logger that writes to the process's real stderr, whatever kfp.local does."""
    logger = logging.getLogger("mnnvl.pipelines.progress")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


class KfpLogTap(io.TextIOBase):
    """A stdout replacement: keeps kfp.local's output in a file and reports task stages."""

    def __init__(self, sink: TextIO, *, echo: TextIO | None, start: float, pipeline: str) -> None:
        super().__init__()
        self._stages = task_names(pipeline)  # kfp.local's task names -> the pipeline's
        self._sink = sink
        self._echo = echo
        self._start = start
        self._partial = ""
        self._task = ""
        self._log = stage_logger()
        self.task_errors: dict[str, str] = {}
        """Stage -> the last error line its task logged."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._sink.write(text)
        if self._echo is not None:
            self._echo.write(text)
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._scan(ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        self._sink.flush()
        if self._echo is not None:
            self._echo.flush()

    def _stage(self, message: str, *args: Any) -> None:
        self._log.info("[%6.1fs] " + message, time.monotonic() - self._start, *args)

    def _scan(self, line: str) -> None:
        if m := _STARTED.search(line):
            self._task = self._stages.get(m.group(1), m.group(1))
            self._stage("%s: started", self._task)
        elif m := _FINISHED.search(line):
            stage = self._stages.get(m.group(1), m.group(1))
            self._stage("%s: %s", stage, m.group(2))
            if m.group(2) != "SUCCESS" and stage in self.task_errors:
                self._stage("%s: %s", stage, self.task_errors[stage])
        elif self._task and (m := _FAILED.search(line)):
            self.task_errors[self._task] = m.group(1)
        elif self._task and (m := _ERROR.match(line)):
            self.task_errors[self._task] = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"
        elif m := _PIPELINE.search(line):
            self._stage("pipeline %s: %s", m.group(1), m.group(2))


class ObjectWatcher:
    """Polls the simulated cluster and reports objects as they appear and go away."""

    def __init__(self, sim: Any, *, start: float, interval_s: float = 0.2) -> None:
        self._sim = sim
        self._interval_s = interval_s
        self._seen: dict[tuple[str, str, str], None] = {}
        self._current: set[tuple[str, str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-objects", daemon=True)
        self._start = start
        self._log = stage_logger()

    def __enter__(self) -> ObjectWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()

    def created(self) -> list[str]:
        """Every object seen during the run, in order of appearance."""
        return [f"{kind} {ns}/{name}" for kind, ns, name in self._seen]

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._poll()

    def _poll(self) -> None:
        now = set(self._sim.objects())
        elapsed = time.monotonic() - self._start
        for obj in sorted(now - self._current):
            self._seen.setdefault(obj, None)
            self._log.info("[%6.1fs]   + %s %s/%s", elapsed, *obj)
        for obj in sorted(self._current - now):
            self._log.info("[%6.1fs]   - %s %s/%s", elapsed, *obj)
        self._current = now
