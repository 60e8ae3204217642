"""The simulated kubelet's fork server: pods that run the product's own runtime modules start
as forks of one interpreter that has imported torch already.

Why: every pod of the simulator that runs ``python3 -m mnnvl.runtime.<module> …`` (the
launcher, verification) is a new interpreter that imports torch, about 1.1 CPU-seconds, and a
training worker adds ``torch.distributed.tensor`` (another 0.6). A suite of simulated runs
starts hundreds of such pods on a machine of two cores. The server imports them once; a
container of such a command is then a fork of it (milliseconds) that makes itself what
``python -m`` would have made.

What is the same as exec: the environment (``os.environ`` and ``getenv`` see exactly the pod's;
nothing of the server's or the simulator's), the working directory, stdout and stderr to the
container log, stdin from /dev/null, ``sys.argv`` and ``sys.path[0]`` as ``python -m`` sets
them, a session of its own (``os.killpg(pid, …)`` and ``procs.members`` work), the signal
dispositions of a new interpreter and an empty signal mask, fresh ``random`` seeds, the exit
code (``SystemExit``'s, 1 with the traceback for an uncaught exception, the signal's) and the
end of a normal interpreter exit (threads joined, atexit functions run, output flushed).
``/proc/<pid>/environ`` (the environment a process was exec'd with) is the server's, with the
pod's marker (``procs.MARKER_ENV``) written into a slot of it, since ``procs.members`` finds a
container's processes there.

What differs, and why it may: ``OMP_NUM_THREADS`` is read when libgomp loads, so the child
applies it with ``torch.set_num_threads`` (or the count a new process would take), and the
launcher applies its workers' ``OMP_NUM_THREADS=1`` the same way. The other
variables the product's pods set are read later, in the pod: ``NCCL_*`` and
``TORCH_NCCL_*`` when a communicator is created, ``TORCH_SYMM_MEM_*`` and ``NVSHMEM_*`` when
symmetric memory is, ``CUDA_VISIBLE_DEVICES`` when CUDA initialises, which the server never
does; so the host's pinned values (``podenv.with_image_env``) reach the pod as they do by exec.
A pod whose environment sets differently from the server's a variable read when the
interpreter or a library loads (``LOAD_PREFIXES``) cannot be made the same and is exec'd, as
is any other command (a shell, ``python -c``, a user's script). ``str`` hashes use the
server's seed (``PYTHONHASHSEED`` is read once per interpreter), and the modules the server
imported are imported already. The server holds no state between pods.

A real container runtime execs the image's entrypoint in namespaces of its own; each pod pays
torch's import once, and the launcher forks its workers from it (``mnnvl/runtime/launch.py``).
On by default; ``MNNVL_SIM_FORK_SERVER=0`` starts every pod by exec. The server answers a
start with the child's pid only once the child is in a session of its own with its marker
written, so a pod deleted at once is still found and stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import Any

log = logging.getLogger(__name__)
SWITCH_ENV = "MNNVL_SIM_FORK_SERVER"  # "0": every pod by exec; else forked where it can be
SLOT = 128  # bytes of the marker's slot in the server's environment block
PACKAGES: tuple[str, ...] = ("mnnvl.runtime",)  # whose modules are forked: the product's pods
PRELOAD = ("torch", "torch.distributed.tensor")  # by name: the simulator itself never loads them
# Read when the interpreter starts or a library loads (the dynamic loader, the locale, libgomp,
# MKL, torch's C++ logging, torch's Python logging: `_logging._init_logs()` at the end of
# torch/__init__.py): a pod must have the server's values to be forked. Compiler settings
# (TORCHINDUCTOR_*, TORCHDYNAMO_*) are read when torch.compile's modules load, in the pod.
LOAD_PREFIXES = (
    *("PYTHON", "LD_", "LANG", "LC_", "OMP_", "GOMP_", "KMP_", "MKL_"),
    *("TORCH_CPP_", "TORCH_LOGS", "TORCH_TRACE"),
)
THREADS_ENV = "OMP_NUM_THREADS"  # applied in the child instead


def load_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that a process reads as it loads (``THREADS_ENV`` apart)."""
    return {k: v for k, v in env.items() if k.startswith(LOAD_PREFIXES) and k != THREADS_ENV}


class ForkServer:
    """One server process; its methods may be called from any thread."""

    def __init__(self, env: dict[str, str], marker_env: str) -> None:
        self.env = env
        # one message per request and per reply, each with the descriptors it carries
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock, self._lock = ours, threading.Lock()
        self.proc = subprocess.Popen(
            # this file alone, not the simulator's package (its import is the simulator's)
            [sys.executable, __file__, str(theirs.fileno()), marker_env],
            pass_fds=[theirs.fileno()],
            env={**env, marker_env: " " * SLOT},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # a file as a pod's stdout is: block-buffered
            cwd="/",
            start_new_session=True,  # a Ctrl-C of the terminal's process group misses it
        )
        theirs.close()
        self.ready = self._reply().get("ready", False)

    def _reply(self) -> dict[str, Any]:
        msg = self._sock.recv(1 << 16)
        return json.loads(msg) if msg else {}  # nothing: the server is gone

    def start(
        self, module: str, args: list[str], env: dict[str, str], cwd: str, log_fd: int
    ) -> int:
        """Fork a container running ``python -m module args``; its pid (not yet reaped)."""
        cwd_fd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY)  # a missing cwd fails here, as exec
        try:
            request = {"module": module, "args": args, "env": env}
            with self._lock:
                socket.send_fds(self._sock, [json.dumps(request).encode()], [cwd_fd, log_fd])
                reply = self._reply()
        finally:
            os.close(cwd_fd)
        if "pid" not in reply:
            why = reply.get("error", "it exited")
            raise OSError(
                f"the simulator's fork server failed ({why}); "
                f"unset {SWITCH_ENV} to start pods by exec"
            )
        return int(reply["pid"])

    def reap(self, pid: int) -> int:
        """The exit status of ``pid``, which has exited (``Popen.returncode``'s convention)."""
        with self._lock:
            try:
                self._sock.sendall(json.dumps({"reap": pid}).encode())
                reply = self._reply()
            except OSError:  # the server is gone, and the container with it
                reply = {}
        return int(reply.get("code", -signal.SIGKILL))

    def release(self) -> None:
        """The end of a use that ``server_for`` counted."""
        release()

    def close(self) -> None:
        self._sock.close()  # the server reads its end and exits
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:  # stuck: it holds nothing a pod needs
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_server: ForkServer | None = None
_users = 0


def acquire() -> None:
    """One more user (a kubelet, a forked container) of the shared server."""
    global _users
    with _lock:
        _users += 1


def release() -> None:
    """One user fewer; the server goes with the last."""
    global _server, _users
    with _lock:
        _users -= 1
        if _users <= 0 and _server is not None:
            _server.close()
            _server = None


def server_for(
    cmd: list[str], env: dict[str, str], marker_env: str
) -> tuple[ForkServer, str] | None:
    """The running server (started now if need be) and the module, when ``cmd`` may be forked
    from it (see the module's docstring), the caller counted as a user; None: exec it.
    ``marker_env`` names the variable of ``env`` that marks the container's processes."""
    global _server, _users
    if os.environ.get(SWITCH_ENV, "1") == "0" or len(cmd) < 3 or cmd[1] != "-m":
        return None
    if cmd[2].rpartition(".")[0] not in PACKAGES or len(env[marker_env].encode()) > SLOT:
        return None
    if not env.get(THREADS_ENV, "1").isdigit() or int(env.get(THREADS_ENV, "1")) < 1:
        return None  # a value torch would refuse: as exec, with its own warning
    exe = shutil.which(cmd[0], path=env.get("PATH", os.defpath))
    if exe is None or not os.path.samefile(exe, sys.executable):
        return None
    with _lock:
        if _server is None or (_server.ready and _server.proc.poll() is not None):
            base = {k: v for k, v in env.items() if k in ("PATH", "HOME")}
            _server = ForkServer({**base, **load_env(env)}, marker_env)  # none yet, or killed
            if not _server.ready:  # kept as it is: every pod is exec'd from now on
                log.warning("fork server off: it could not import %s", ", ".join(PRELOAD))
        if not _server.ready or load_env(env) != load_env(_server.env):
            return None
        _users += 1  # the caller's, until it calls release()
        return _server, cmd[2]


def serve(fd: int, marker_env: str) -> None:
    """The server's process: import ``PRELOAD``, then fork a container per request."""
    import importlib

    sys.path[0] = os.getcwd()  # not this file's folder: the pods' modules resolve as in a pod
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    sock = socket.socket(fileno=fd)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except ImportError:
        sock.sendall(json.dumps({"ready": False}).encode())
        return
    torch = sys.modules["torch"]
    threads = torch.get_num_threads()  # a new process's count: the server has no THREADS_ENV
    sock.sendall(json.dumps({"ready": True}).encode())
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)  # one request per message
        if not msg:
            return  # the simulator closed its end, or is gone
        request = json.loads(msg)
        if "reap" in request:
            try:
                _, status = os.waitpid(request["reap"], 0)
                reply: dict[str, Any] = {"code": os.waitstatus_to_exitcode(status)}
            except ChildProcessError as e:
                reply = {"error": str(e)}
        else:
            # The pid goes back once the child is in a session of its own with its marker
            # written: a container stopped sooner would otherwise miss it (``procs.members``).
            ready, done = os.pipe()
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.close(ready)
                _child(request, fds, threads, marker_env, done)
            os.close(done)
            os.read(ready, 1)  # b"" when it ended first
            os.close(ready)
            reply = {"pid": pid}
            for f in fds:
                os.close(f)
        sock.sendall(json.dumps(reply).encode())


def _child(
    request: dict[str, Any], fds: list[int], threads: int, marker_env: str, done: int
) -> None:
    """Become the container (see the module's docstring), telling the server on ``done`` once
    it can be found as one; never returns."""
    code = 1
    try:
        os.setsid()
        env = request["env"]
        _write_marker(marker_env, env[marker_env])
        os.write(done, b"1")
        os.close(done)
        cwd_fd, log_fd = fds
        os.fchdir(cwd_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, to in ((null, 0), (log_fd, 1), (log_fd, 2)):
            os.dup2(fd, to)
        for fd in (null, *fds):
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        _fresh_signals()
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        import random

        random.seed()  # a new interpreter seeds from the OS; the server's seed is shared
        sys.modules["torch"].set_num_threads(int(env.get(THREADS_ENV, threads)))
        code = _run(request["module"], request["args"])
    except BaseException:  # the setup failed: its traceback in the log, exit 1
        traceback.print_exc()
    finally:
        _exit(code)


def _write_marker(name: str, marker: str) -> None:
    """Write the marker into this process's environment block, which ``/proc/<pid>/environ``
    shows (``setenv`` leaves that block as it is)."""
    import ctypes

    with open("/proc/self/stat", "rb") as f:
        env_start = int(f.read().rsplit(b")", 1)[1].split()[47])  # field 50: env_start
    with open("/proc/self/environ", "rb") as f:
        block = b"\0" + f.read()  # every entry after a NUL, the first too
    at = block.index(f"\0{name}=".encode()) + len(name) + 1
    ctypes.memmove(env_start + at, marker.encode().ljust(SLOT, b"\0"), SLOT)


def _fresh_signals() -> None:
    """The dispositions a new interpreter has: default, but SIGINT raises KeyboardInterrupt and
    SIGPIPE and SIGXFSZ are ignored; nothing blocked."""
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):  # the C library's own (32, 33)
                signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _run(module: str, args: list[str]) -> int:
    """Run ``module`` as ``__main__``; its exit code as the interpreter would make it."""
    import importlib.util
    import runpy

    if importlib.util.find_spec(module) is None:
        sys.stderr.write(f"{sys.executable}: No module named {module}\n")
        return 1
    sys.argv = ["-m", *args]  # run_module puts the module's file first, as `python -m`
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        sys.stderr.write(f"{e.code}\n")
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return -signal.SIGINT  # the interpreter ends itself with SIGINT after its cleanup
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit(code: int) -> None:
    """End as a normal interpreter exit does (non-daemon threads joined, atexit functions,
    output flushed) without tearing down torch, which takes up to a second."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter's exit calls
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


if __name__ == "__main__":  # the server's process
    serve(int(sys.argv[1]), sys.argv[2])
    os._exit(0)  # nothing to flush; tearing down torch would hold up the simulator's stop
