"""Local processes of the simulated kubelet: a container's command and every process it starts.

A real runtime runs a container in a cgroup and a PID namespace of its own: when the main
process exits, for whatever reason, the kernel kills everything else in it, so no worker of a
dead container holds a port or GPU memory. Here each container runs in a session of its own
and carries a marker in its environment (``MNNVL_SIM_CONTAINER``); a process belongs to the
container when ``/proc/<pid>/environ`` holds its marker or its session is the container's.

Why the environment: it is inherited through fork and exec, and it stays through ``setsid``, a
new process group and re-parenting to init, which are exactly how processes leave a tree or a
group (torchrun starts each worker with ``Popen(start_new_session=True)`` and a copy of its own
environment; multiprocessing's spawn and forkserver children inherit it too). It needs no
privileges (cgroups do) and it names the container (a child subreaper would only make the
simulator the parent of every orphan of every pod). The session catches a process that drops
the marker from its environment but stays in the container's session. The main process's
exit is awaited without reaping it, so its pid, and with it the session id, cannot be reused
before the rest has been killed. A container that runs one of the product's runtime modules is
forked from a server that has imported torch already (``forkserver``), the same to the pod.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mnnvl.sim.core.forkserver import ForkServer

log = logging.getLogger(__name__)
MARKER_ENV = "MNNVL_SIM_CONTAINER"
KILL_WAIT_S = 5.0  # how long to wait for a container's processes to exit after SIGKILL
# Memory of one process of a simulated pod with torch imported (the pod's launcher and each
# of its workers): RSS measured 225..290 MiB on CPU (a 2-node CPU run, Python 3.11, torch 2.13).
PROCESS_MIB = 300


class Container:
    """One run of a container's command. :meth:`wait` belongs to the thread that started it."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], cwd: str, log_path: str, marker: str
    ) -> None:
        self.marker = marker
        self.exited = threading.Event()  # the main process has exited and the rest is gone
        env = {**env, MARKER_ENV: marker}
        self.proc: subprocess.Popen[bytes] | None = None
        self.server: ForkServer | None = None
        # imported here: the Guard runs this file alone, on the standard library only
        from mnnvl.sim.core import forkserver

        with open(log_path, "ab") as logf:
            forkable = forkserver.server_for(cmd, env, MARKER_ENV)
            if forkable is not None:
                self.server, module = forkable
                try:
                    self.pid = self.server.start(module, cmd[3:], env, cwd, logf.fileno())
                except BaseException:
                    self.server.release()
                    raise
                return
            self.proc = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        self.pid = self.proc.pid

    def wait(self) -> int:
        """Wait for the main process to exit, kill every other process of the container, then
        return the exit code (128 + the signal's number when a signal ended it)."""
        if self.server is not None:  # the server's child: exited once its pidfd is readable
            fd = os.pidfd_open(self.pid)
            try:
                select.select([fd], [], [])
            finally:
                os.close(fd)
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        kill_all(self.marker, {self.pid: self.marker})
        if self.server is not None:
            code = self.server.reap(self.pid)
            self.server.release()
        else:
            assert self.proc is not None
            code = self.proc.wait()
        self.exited.set()
        return 128 - code if code < 0 else code

    def signal(self, sig: int) -> None:
        for pid, _ in members(self.marker, {self.pid: self.marker}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self, grace_s: float | None) -> None:
        """SIGTERM the container's process group, SIGKILL every process of the container once
        ``grace_s`` has passed (None: at once, what a process sees when the hardware goes
        away); return when the container has exited."""
        if grace_s is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            if self.exited.wait(grace_s):
                return
        kill_all(self.marker, {self.pid: self.marker})
        self.exited.wait(KILL_WAIT_S)


def members(prefix: str, sessions: Mapping[int, str]) -> list[tuple[int, str]]:
    """(pid, marker) of every live process whose marker starts with ``prefix`` or whose session
    is one of ``sessions`` (session id -> marker)."""
    key = f"{MARKER_ENV}={prefix}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state, _ppid, _pgrp, session = f.read().rsplit(b")", 1)[1].split()[:4]
            if state in (b"Z", b"X"):
                continue  # exited: a zombie holds no port and no memory
            marker = sessions.get(int(session))
            if marker is None:
                with open(f"/proc/{name}/environ", "rb") as f:
                    entry = next((e for e in f.read().split(b"\0") if e.startswith(key)), None)
                if entry is None:
                    continue
                marker = entry.split(b"=", 1)[1].decode()
        except OSError:  # gone meanwhile, or another user's
            continue
        found.append((int(name), marker))
    return found


def kill_all(prefix: str, sessions: Mapping[int, str]) -> None:
    """SIGKILL the processes of :func:`members` until none is left, waiting for each to exit
    (by then it has closed its sockets and released its memory)."""
    deadline = time.monotonic() + KILL_WAIT_S
    while pids := [pid for pid, _ in members(prefix, sessions)]:
        if time.monotonic() > deadline:
            log.warning("processes %s of %s did not exit after SIGKILL", pids, prefix)
            return
        fds = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(pid))
                signal.pidfd_send_signal(fds[-1], signal.SIGKILL)
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)  # readable once the process has exited
        try:
            left = set(fds)
            while left and (remaining := deadline - time.monotonic()) > 0:
                for fd, _ in poller.poll(remaining * 1000):
                    poller.unregister(fd)
                    left.discard(fd)
        finally:
            for fd in fds:
                os.close(fd)


def machine_problem(nodes: int, workers_per_pod: int) -> str:
    """Why this machine cannot run a simulated cluster of ``nodes`` ("" when it can): each
    node runs one pod whose launcher and ``workers_per_pod`` workers are local processes of
    about ``PROCESS_MIB`` each, and they must fit the memory available now (MemAvailable)."""
    with open("/proc/meminfo", encoding="ascii") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    per_node = (1 + workers_per_pod) * PROCESS_MIB
    most = kib // 1024 // per_node
    if nodes <= most:
        return ""
    return (
        f"{nodes} simulated nodes do not fit this machine: each runs a pod of "
        f"{1 + workers_per_pod} local processes of about {PROCESS_MIB} MiB, so the "
        f"{kib // 1024} MiB available now hold at most {most} nodes; simulate fewer nodes"
    )


class Guard:
    """Kills every container of a kubelet (``prefix``) once this process is gone, however it
    ends (SIGKILL included), as the kernel kills a node's containers with the node: a small
    process of its own session waits for the end of a pipe that only this process can write
    to, which the kernel closes when this process exits."""

    def __init__(self, prefix: str) -> None:
        read, self._write = os.pipe()  # not inherited by any child (PEP 446)
        env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
        # This file alone, on the standard library only (-I -S): about 10 ms of start-up
        # instead of 150 ms for importing the simulator, once per cluster.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, prefix],
            stdin=read,
            env=env,
            start_new_session=True,  # a Ctrl-C of the terminal's process group misses it
        )
        os.close(read)

    def close(self) -> None:
        """This process stops its containers itself: let the guard go."""
        os.close(self._write)
        self.proc.wait(KILL_WAIT_S + 5)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc."""
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


def guard(prefix: str) -> None:
    """The ``Guard``'s process: wait for the end of its stdin, then kill the containers."""
    sys.stdin.buffer.read()  # returns at EOF: the simulator closed its end, or is gone
    kill_all(prefix, {})


if __name__ == "__main__":  # the Guard's process
    guard(sys.argv[1])
