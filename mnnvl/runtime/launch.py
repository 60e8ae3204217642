"""The worker pod's entry: one torch import, the node's workers forked from it, and the
worst worker exit code as the container's.

``python -m mnnvl.runtime.launch [--nnodes N] [--nproc-per-node P] [--node-rank R]
[--master-addr A] [--master-port PORT] -m MODULE [ARGS]`` takes the static part of
torchrun's command line and starts the same workers (``MODULE`` as ``__main__`` with
torchrun's worker variables, no agent store: rank 0 hosts the rendezvous store as ``env://``
expects) without torchrun's start-up: torchrun imports torch in its agent and again in every
worker (about 4 s each on a 2 x H200 host, one after the other).

This process must never touch CUDA: a CUDA context does not survive ``fork``, so the parent
imports torch and calls nothing of it; every worker picks its own device (a test checks it).

Exit status, which the Job's podFailurePolicy reads: the workers' worst exit code
(:func:`mnnvl.contract.exit_codes.worst_exit_code`; torchrun turns any failure into 1, so a
Job could not tell bad input (2) or a failed verification (4) from a crash worth retrying).
The first failed worker, SIGTERM/SIGINT/SIGHUP (then 128 + the signal) or a worker silent
past its stall timeout (:mod:`mnnvl.runtime.progress`; then ``exit_codes.STALLED``) stops
every worker: SIGTERM followed by SIGCONT (a stopped worker ends at once), SIGKILL after
``--grace-s`` (after ``STOP_GRACE_S`` once a stop signal came: every wait of this process,
for the launchers' store, the other pods or its workers, ends at once on one). With
``--max-restarts N`` (the Job builder passes the step's) a retriable failure restarts the
workers of every pod in place, at most N times, and the pod fails only when the pods must
be recreated (:mod:`mnnvl.runtime.inplace`). A module that cannot be found exits
``exit_codes.MODULE_NOT_FOUND`` (not retried). On a failure of its own (not a stop signal)
this process writes what failed as the container's termination message
(:mod:`mnnvl.runtime.evidence`).

A clique group's pod gets no ``--node-rank``: its node rank is ``MNNVL_NODE_RANK_BASE`` plus
``JOB_COMPLETION_INDEX``, added here because the kubelet's ``$(VAR)`` expansion cannot add.
``--exec -- PROGRAM [ARGS]`` (a clique group's custom command) sets ``NODE_RANK`` to that sum
and replaces itself with ``PROGRAM`` (127 when there is no such program, 126 when it cannot
be executed). Bad options are a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from mnnvl.contract import env as contract_env
from mnnvl.contract.exit_codes import (
    CANNOT_EXECUTE,
    INTERRUPTED_BASE,
    MODULE_NOT_FOUND,
    PROGRAM_NOT_FOUND,
    STALLED,
    shell_code,
    worst_exit_code,
)
from mnnvl.contract.nccl import ASYNC_ERROR_HANDLING
from mnnvl.contract.termination import Evidence
from mnnvl.errors import SpecError
from mnnvl.runtime import evidence, inplace
from mnnvl.runtime.inplace import STOP_SIGNALS
from mnnvl.runtime.local import free_port
from mnnvl.runtime.progress import (
    PROGRESS_ENV,
    Stall,
    Watchdog,
    last_progress,
    read_words,
    write_words,
)

logger = logging.getLogger("mnnvl.runtime.launch")

GRACE_S = 15.0  # SIGTERM -> SIGKILL for workers; below a pod's default 30 s grace period
# SIGTERM -> SIGKILL for workers once the launcher itself is told to stop: its pod is being
# deleted (a gang restart, a suspension that keeps a node out), which waits for it to end.
STOP_GRACE_S = 2.0
WATCHED = STOP_SIGNALS | {signal.SIGCHLD}
EXEC = "--exec"  # a clique group's custom command (see the module docstring)
DEFAULT_PORT = 29500  # torchrun's default rendezvous port for several nodes
WORDS_LINES = 12  # a traceback's last lines kept as a failed worker's words
Codes = list[tuple[float, int, int]]  # (when reaped, global rank, exit code) per worker


def group_node_rank(environ: Mapping[str, str]) -> int | None:
    """A clique group's pod's node rank: the group's first plus the completion index."""
    if contract_env.NODE_RANK_BASE not in environ:
        return None
    try:
        return int(environ[contract_env.NODE_RANK_BASE]) + int(
            environ[contract_env.JOB_COMPLETION_INDEX]
        )
    except (KeyError, ValueError):
        raise SpecError(
            contract_env.NODE_RANK_BASE,
            "a clique group's pod needs it and JOB_COMPLETION_INDEX as whole numbers",
        ) from None


def with_node_rank(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` with ``--node-rank`` of a clique group's pod added (unchanged otherwise, and
    when the launcher's own options, those before ``-m``, give one: the module's own
    arguments after it may hold anything, ``--node-rank-file`` among them)."""
    own = argv[: argv.index("-m")] if "-m" in argv else argv
    if {a.split("=", 1)[0] for a in own} & {"--node-rank", "--node_rank"}:
        return list(argv)
    rank = group_node_rank(environ)
    return list(argv) if rank is None else [f"--node-rank={rank}", *argv]


def exec_program(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """``[--] PROGRAM ARGS`` run in place of this process with the group's ``NODE_RANK``;
    returns only when it cannot start: 127 no such program in the image, 126 not executable
    (the shell's codes; no restart changes either), with the reason as termination message."""
    args = list(argv[1:] if argv[:1] == ["--"] else argv)
    if not args:
        raise SpecError("command", "--exec needs a program to run")
    env = dict(environ)
    rank = group_node_rank(environ)
    if rank is not None:
        env[contract_env.NODE_RANK] = str(rank)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args[0], args, env)
    except OSError as e:
        missing = isinstance(e, FileNotFoundError)
        code = PROGRAM_NOT_FOUND if missing else CANNOT_EXECUTE
        words = (
            f"cannot run {args[0]!r} in this image: {e}; check the command and that the "
            "image holds the program (on the PATH, executable)"
        )
        logger.error("%s", words)
        evidence.write(evidence.of_code(code, words))
        return code
    raise AssertionError("unreachable: execvpe returned")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Options up to ``-m MODULE``; everything after the module belongs to it."""
    argv = list(argv)
    parser = argparse.ArgumentParser(
        prog="python -m mnnvl.runtime.launch", description=__doc__, allow_abbrev=False
    )
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1)
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0)
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    parser.add_argument("--master-port", "--master_port", type=int, default=None)
    parser.add_argument("--grace-s", type=float, default=GRACE_S)
    parser.add_argument("--max-restarts", type=int, default=0)
    if "-m" not in argv or argv.index("-m") == len(argv) - 1:
        parser.error("-m MODULE is required")
    at = argv.index("-m")
    ns = parser.parse_args(argv[:at])
    ns.module, ns.args = argv[at + 1], argv[at + 2 :]
    if ns.nnodes < 1 or ns.nproc_per_node < 1:
        parser.error("--nnodes and --nproc-per-node must be at least 1")
    if not 0 <= ns.node_rank < ns.nnodes:
        parser.error(f"--node-rank must be in 0..{ns.nnodes - 1}, got {ns.node_rank}")
    if ns.master_port is None:
        ns.master_port = free_port() if ns.nnodes == 1 else DEFAULT_PORT
    return ns


def worker_env(local_rank: int, ns: argparse.Namespace) -> dict[str, str]:
    """The variables one worker gets on top of the node's environment."""
    rank = ns.node_rank * ns.nproc_per_node + local_rank
    world = ns.nnodes * ns.nproc_per_node
    progress = getattr(ns, "progress_dir", "")
    rounds = getattr(ns, "round", None)  # None: no launchers' store, rank 0 hosts its own
    return {
        **({PROGRESS_ENV: os.path.join(progress, f"rank-{rank}")} if progress else {}),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        contract_env.WORLD_SIZE: str(world),
        "LOCAL_WORLD_SIZE": str(ns.nproc_per_node),
        "GROUP_RANK": str(ns.node_rank),
        "GROUP_WORLD_SIZE": str(ns.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        contract_env.MASTER_ADDR: ns.master_addr,
        contract_env.MASTER_PORT: str(ns.master_port),
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(ns.max_restarts if rounds is not None else 0),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        **(inplace.worker_env(rounds) if rounds is not None else {}),
        **{k: os.environ.get(k, v) for k, v in ASYNC_ERROR_HANDLING.items()},
    }


def _run_worker(local_rank: int, ns: argparse.Namespace, mask: set[int | signal.Signals]) -> int:
    """In the forked child: run the module as ``__main__`` with the signal mask this process
    started with; its exit code. A failing worker leaves its last words for the launcher."""
    import runpy
    import traceback

    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.environ.update(worker_env(local_rank, ns))
    sys.argv = [ns.module, *ns.args]
    errors = evidence.LastErrors()
    logging.getLogger().addHandler(errors)
    try:
        missing = evidence.missing_module(ns.module)
        if missing is not None:
            words = (
                f"cannot run module {ns.module!r}: {missing}; check --module and that the "
                "image (or PYTHONPATH) holds it"
            )
            sys.stderr.write(words + "\n")
            write_words(words)
            return MODULE_NOT_FOUND
        runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            if e.code:
                write_words("\n".join(errors.lines))
            return e.code or 0
        sys.stderr.write(f"{e.code}\n")
        write_words(str(e.code))
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED_BASE + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        write_words("".join(traceback.format_exc().splitlines(keepends=True)[-WORDS_LINES:]))
        return 1
    return 0


def exit_now(code: int) -> NoReturn:
    """Exit as a normal interpreter exit would (atexit functions, logs and output flushed)
    without tearing down the interpreter, which with torch loaded takes up to a second
    that every pod of a Job would spend after its work is done."""
    import atexit

    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def _fork_worker(local_rank: int, ns: argparse.Namespace, mask: set[int | signal.Signals]) -> int:
    """Fork one worker; never returns in the child."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _run_worker(local_rank, ns, mask)
    finally:
        exit_now(code)


def _reap(children: dict[int, int], codes: Codes) -> None:
    """Collect every worker that has ended: ``(time, global rank, exit code)``; orphans
    re-parented to this process (PID 1 of a container) are reaped and ignored."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rank = children.pop(pid, None)
        if rank is not None:
            codes.append((time.monotonic(), rank, os.waitstatus_to_exitcode(status)))


def _stop(
    children: dict[int, int], codes: Codes, grace_s: float, beat: Callable[[], None] | None = None
) -> int | None:
    """SIGTERM every remaining worker, SIGKILL those still there after ``grace_s`` (after
    ``STOP_GRACE_S`` once a stop signal comes: the pod is going); ``beat`` tells the other
    pods' launchers this one is alive meanwhile. Returns the stop signal that came, or None."""
    stopped_by: int | None = None
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for pid in children:
            try:
                os.kill(pid, sig)
                if sig == signal.SIGTERM:  # a stopped worker takes SIGTERM only once continued
                    os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + wait_s
        while children and time.monotonic() < deadline:
            info = signal.sigtimedwait(WATCHED, min(0.5, max(deadline - time.monotonic(), 0.0)))
            if info is not None and info.si_signo in STOP_SIGNALS and stopped_by is None:
                stopped_by = info.si_signo
                deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
            _reap(children, codes)
            if beat is not None:
                beat()
        if not children:
            break
    return stopped_by


def supervise(
    children: dict[int, int],
    grace_s: float,
    watchdog: Watchdog,
    rounds: inplace.Rounds | None = None,
) -> tuple[Codes, int | None, Stall | None]:
    """Wait for the workers with ``WATCHED`` blocked: each SIGCHLD reaps, the first failure,
    a stop signal, a stalled worker or another pod's failure announced in ``rounds`` stops the
    rest. Returns (the codes, the stop signal, also one that came while the workers were being
    stopped, or None, the stall or None)."""
    codes: Codes = []
    beat = rounds.beat if rounds is not None else None
    while children:
        if rounds is not None and rounds.peer_failure() is not None:
            logger.error("a worker of another pod failed; stopping the workers")
            return codes, _stop(children, codes, grace_s, beat), None
        _reap(children, codes)
        for _, rank, _ in codes:
            watchdog.forget(rank)
        if any(code for _, _, code in codes):
            return codes, _stop(children, codes, grace_s, beat), None
        if not children:
            break
        stall = watchdog.stalled()
        if stall is not None:
            pid = next(p for p, rank in children.items() if rank == stall.rank)
            stall = dataclasses.replace(stall, state=evidence.process_state(pid))
            logger.error("%s; stopping the workers", stall)
            return codes, _stop(children, codes, grace_s, beat), stall
        # A lost SIGCHLD costs a second at most; another pod's failure a quarter of one.
        info = signal.sigtimedwait(WATCHED, 1.0 if rounds is None else 0.25)
        if info is not None and info.si_signo in STOP_SIGNALS:
            logger.error("stopped by %s; stopping the workers", signal.Signals(info.si_signo).name)
            _stop(children, codes, min(grace_s, STOP_GRACE_S), beat)
            return codes, info.si_signo, None
    return codes, None, None


def run(ns: argparse.Namespace) -> int:
    """Import torch once, fork ``--nproc-per-node`` workers (again after each in-place
    restart), return the node's exit code; on a failure of its own, the pod's evidence is its
    termination message."""
    if ns.nproc_per_node > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun; read when torch loads
        if "torch" in sys.modules:  # loaded before this module ran (a process forked from one)
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # Blocked before torch starts any thread, so that no thread of this process takes a
    # stop signal's default action; the workers unblock them after the fork.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    import torch  # noqa: F401  (imported once, shared by every forked worker; no CUDA here)

    try:
        try:
            rounds = inplace.open_rounds(ns)
        except inplace.Stopped as e:
            return INTERRUPTED_BASE + e.signo
        while True:
            ns.round = rounds.round if rounds is not None else None
            code, found, stopped_by, stop_s = attempt(ns, old_mask, rounds)
            if stopped_by is not None:  # the pod was stopped: not its own failure
                return INTERRUPTED_BASE + stopped_by
            peer = rounds.peer_failure() if rounds is not None else None
            if not code and peer is None:
                if rounds is not None:
                    rounds.release()
                return 0
            if rounds is None or rounds.lost:
                evidence.write(found)
                return code
            stopped_by, done = rounds.after_failure(code, found, stop_s)
            if stopped_by is not None:
                return INTERRUPTED_BASE + stopped_by
            if done is not None:
                return done
    finally:
        while signal.sigtimedwait(WATCHED, 0) is not None:
            pass  # consumed here: the workers are gone, nothing is left to stop
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def attempt(
    ns: argparse.Namespace, old_mask: set[int | signal.Signals], rounds: inplace.Rounds | None
) -> tuple[int, Evidence, int | None, float]:
    """One attempt: fork the workers, supervise them. Returns (the node's exit code, its
    evidence, the stop signal or None, seconds from the first failure to every worker gone)."""
    children: dict[int, int] = {}
    ns.progress_dir = tempfile.mkdtemp(prefix="mnnvl-progress-")
    files = {}
    try:
        try:
            for local_rank in range(ns.nproc_per_node):
                pid = _fork_worker(local_rank, ns, old_mask)
                rank = children[pid] = ns.node_rank * ns.nproc_per_node + local_rank
                files[rank] = worker_env(local_rank, ns)[PROGRESS_ENV]
        except BaseException:
            _stop(children, [], ns.grace_s)
            raise
        gpus = evidence.GpuWatch.of_pod()  # after the forks: NVML only in this process
        watchdog = Watchdog(dict(files))
        codes, stopped_by, stall = supervise(children, ns.grace_s, watchdog, rounds)
        failed_at = [t for t, _, c in codes if c] or [time.monotonic()]
        stop_s = time.monotonic() - min(failed_at)
        if watchdog.margin():
            logger.info("stall watchdog: %s", watchdog.margin())
        code = STALLED if stall is not None else worst_exit_code((t, c) for t, _, c in codes)
        found = _evidence(code, codes, stall, files, bool(gpus.devices))
        if code and stopped_by is None:
            gpus.findings(found)
            found = evidence.merged(evidence.take_own(), found)
    finally:
        while signal.sigtimedwait({signal.SIGCHLD}, 0) is not None:
            pass  # the workers are gone; a stop signal stays pending for the next wait
        shutil.rmtree(ns.progress_dir, ignore_errors=True)
    if stopped_by is not None:
        return code, found, stopped_by, stop_s
    if stall is not None:
        logger.error("worker stalled (%s); exiting with %d", stall, STALLED)
    elif code:
        failed = sorted((r, shell_code(c)) for _, r, c in codes if c)
        ranks = ", ".join(f"rank {r}: exit {c}" for r, c in failed)
        then = "exit code" if rounds is not None else "exiting with"  # in place: maybe not
        logger.error("workers failed (%s); %s %d", ranks, then, code)
    return code, found, None, stop_s


def _evidence(
    code: int, codes: Codes, stall: Stall | None, files: dict[int, str], gpus: bool
) -> Evidence:
    """The node's failure as its termination message: the worker that failed first (or
    stalled), its exit code, last progress and words, and the pod's verdict."""
    found = evidence.of_code(code)
    first = (stall.rank, STALLED) if stall else evidence.first_failure(codes)
    if first is not None:
        found.rank, found.exit_code = first
        found.local_rank = first[0] % len(files)
        found.gpu = str(found.local_rank) if gpus else None  # a worker uses its local rank's
        found.step = last_progress(files[first[0]]) or None
        found.error = str(stall) if stall else read_words(files[first[0]])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == [EXEC]:
            return exec_program(argv[1:], os.environ)
        full = with_node_rank(argv, os.environ)
    except SpecError as e:
        logger.error("%s", e)
        evidence.write(evidence.of_code(e.exit_code, str(e)))
        return e.exit_code
    return run(parse(full))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    exit_now(main())
