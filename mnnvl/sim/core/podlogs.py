"""Serving a pod's container log (``GET …/pods/<name>/log``, with ``follow`` and ``tailLines``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from mnnvl.sim.api.model import ApiError


def follow_log(
    worker: Any,
    container: str | None,
    follow: bool,
    tail_lines: int | None,
    stop: threading.Event,
) -> Iterator[bytes]:
    """Chunks of the worker's log file; with ``follow`` until its container has ended."""
    name = worker.name
    if container and container != worker.container.get("name"):
        raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
    with open(worker.log_path, "rb") as f:
        data = f.read()
        if tail_lines is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
        yield data
        while follow and not stop.is_set():
            more = f.read()
            if more:
                yield more
            elif worker.finished.is_set() or (
                worker.proc is not None and worker.proc.exited.is_set()
            ):
                yield f.read()
                return
            else:
                time.sleep(0.05)  # file tail on the server side; clients never poll
