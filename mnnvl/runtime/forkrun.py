"""Start a node's workers by forking one process that has already imported torch.

``python -m mnnvl.runtime.forkrun --nproc-per-node N -m MODULE [args]`` does for a static
job what ``torchrun`` does, minus its start-up: torchrun imports torch in its agent and
then every worker imports it again (about 4 s each on a 2 x H200 host, in series with the
agent's), while here the parent imports torch once, forks the workers before anything
touches CUDA, and each worker runs ``MODULE`` as ``__main__`` with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
set. Several nodes use the Job's own variables: ``NNODES``, ``JOB_COMPLETION_INDEX`` (the
node rank), ``MASTER_ADDR`` and ``MASTER_PORT``; rank 0 hosts the rendezvous store.

No elastic restarts: a worker that fails ends the node (the others get SIGTERM after
``--grace-s``), and the exit status is the worst worker's exit code, so a verification
FAIL (4) or bad input (2) is what the container reports.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import time
from collections.abc import Sequence

from mnnvl.runtime.local import free_port


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Options up to ``-m MODULE``; everything after the module belongs to it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m mnnvl.runtime.forkrun", description=__doc__)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--grace-s", type=float, default=30.0)
    if "-m" not in argv or argv.index("-m") == len(argv) - 1:
        parser.error("-m MODULE is required")
    at = argv.index("-m")
    ns = parser.parse_args(argv[:at])
    ns.module, ns.args = argv[at + 1], argv[at + 2 :]
    if ns.nproc_per_node < 1:
        parser.error("--nproc-per-node must be at least 1")
    return ns


def worker_env(local_rank: int, nproc: int, environ: dict[str, str]) -> dict[str, str]:
    """The variables a worker sees, from the node's (the Job's) environment."""
    nnodes = int(environ.get("NNODES", "1") or 1)
    node = int(environ.get("JOB_COMPLETION_INDEX", "0") or 0)
    return {
        "RANK": str(node * nproc + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(nnodes * nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node),
        "MASTER_ADDR": environ.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(free_port()),
    }


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by signal N -> 128 + N


def run(ns: argparse.Namespace) -> int:
    import torch  # noqa: F401  (imported once, shared by every forked worker)

    shared = dict(os.environ)
    if "MASTER_PORT" not in shared and int(shared.get("NNODES", "1") or 1) == 1:
        shared["MASTER_PORT"] = str(free_port())
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for local_rank in range(ns.nproc_per_node):
        pid = os.fork()
        if pid == 0:  # the worker
            os.environ.update(worker_env(local_rank, ns.nproc_per_node, shared))
            sys.argv = [ns.module, *ns.args]
            code = 0
            try:
                runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
        children[pid] = local_rank
    return _wait(children, ns.grace_s)


def _wait(children: dict[int, int], grace_s: float) -> int:
    """Wait for every worker; the first failure's code wins over those of the workers it
    got stopped (their SIGTERM is a consequence, not the cause)."""
    first_failure, deadline, stopped = 0, None, False
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG if deadline else 0)
        if pid == 0:
            if not stopped and deadline is not None and time.monotonic() > deadline:
                for child in children:
                    os.kill(child, signal.SIGTERM)
                stopped = True
            time.sleep(0.1)
            continue
        code = _exit_code(status)
        rank = children.pop(pid)
        if code and not stopped:
            sys.stderr.write(f"forkrun: local rank {rank} exited with {code}\n")
            first_failure = first_failure or code
            deadline = deadline or time.monotonic() + grace_s
    return first_failure


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
