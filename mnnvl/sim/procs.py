"""Local processes of the simulated kubelet: start a container's command, kill its whole tree.

A container runs in a session of its own so that a signal to its process group reaches
everything it started in that group. A program may start processes in sessions of their own,
which a real container's cgroup would still take down; here the tree is read from /proc
before signalling and whatever outlives the group is SIGKILLed by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

KILL_WAIT_S = 5.0  # how long to wait for the group to exit after SIGKILL


def start_process(
    cmd: list[str], env: dict[str, str], cwd: str, log_path: str
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a new session, stdout and stderr appended to ``log_path``."""
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            cmd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


def kill_process_tree(proc: subprocess.Popen[bytes], grace_s: float | None) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace_s``, then SIGKILL any survivor;
    ``grace_s=None``: SIGKILL at once (what a process sees when the hardware goes away)."""
    # Remembered before signalling: once a parent dies its children are re-parented and
    # can no longer be found from ``proc.pid``.
    tree = descendants(proc.pid)
    steps = [(signal.SIGKILL, KILL_WAIT_S)]
    if grace_s is not None:
        steps.insert(0, (signal.SIGTERM, grace_s))
    for sig, wait_s in steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (empty where /proc is absent)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
