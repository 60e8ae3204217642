"""The worker pod's entry: torchrun, exiting with the worst worker exit code.

``python -m mnnvl.runtime.launch [torchrun options] -m MODULE [ARGS]`` takes torchrun's own
command line and runs the same elastic launch in this process. torchrun alone turns any
worker failure into exit 1, so a Job could not tell a bad input (2) or a failed
verification (4) from a crash worth retrying; this entry reads torchelastic's record of the
failed workers (``ChildFailedError.failures``) and exits with:

* a code a retry cannot change (``NON_RETRIABLE_EXIT_CODES``) when any worker exited with
  one, the earliest such failure winning;
* otherwise the earliest failure that exited by itself, else the earliest one killed by a
  signal (torchrun stops the surviving workers with SIGTERM once one failed, so those
  show up as killed too); a signal counts as 128 + its number, as a shell reports it;
* 128 + the signal number when this launcher itself was told to stop (SIGTERM on pod
  deletion: 143), after torchrun has stopped the workers.

A clique group's pod (one Indexed Job per group) gets no ``--node-rank``: its node rank is
the group's first node rank (``MNNVL_NODE_RANK_BASE``) plus ``JOB_COMPLETION_INDEX``,
added here because the kubelet's ``$(VAR)`` expansion cannot add.

Everything else (a rendezvous that never forms, a bad torchrun option) keeps torchrun's own
behaviour: an exception (exit 1) or a usage error (exit 2).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from mnnvl.contract.exit_codes import NON_RETRIABLE_EXIT_CODES
from mnnvl.errors import SpecError
from mnnvl.spec import NODE_RANK_BASE_ENV

logger = logging.getLogger("mnnvl.runtime.launch")


def shell_code(exitcode: int) -> int:
    """A process exit status as a shell reports it: -N (killed by signal N) -> 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def worst_exit_code(failures: Iterable[tuple[float, int]]) -> int:
    """The exit code to report for ``(timestamp, exitcode)`` pairs of failed workers."""
    ordered = [code for _, code in sorted(failures, key=lambda f: f[0]) if code != 0]
    for code in ordered:
        if code in NON_RETRIABLE_EXIT_CODES:
            return code
    exited = [code for code in ordered if code > 0] + [code for code in ordered if code < 0]
    return shell_code(exited[0]) if exited else 1


def with_node_rank(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` with ``--node-rank`` of a clique group's pod added (unchanged otherwise)."""
    if NODE_RANK_BASE_ENV not in environ or any(a.startswith("--node-rank") for a in argv):
        return list(argv)
    try:
        rank = int(environ[NODE_RANK_BASE_ENV]) + int(environ["JOB_COMPLETION_INDEX"])
    except (KeyError, ValueError):
        raise SpecError(
            NODE_RANK_BASE_ENV,
            "a clique group's pod needs it and JOB_COMPLETION_INDEX as whole numbers",
        ) from None
    return [f"--node-rank={rank}", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        full = with_node_rank(sys.argv[1:] if argv is None else argv, os.environ)
    except SpecError as e:
        logger.error("%s", e)
        return e.exit_code
    args = parse_args(full)
    try:
        run(args)
    except ChildFailedError as e:
        code = worst_exit_code((f.timestamp, f.exitcode) for f in e.failures.values())
        ranks = ", ".join(
            f"rank {rank}: exit {shell_code(f.exitcode)}" for rank, f in sorted(e.failures.items())
        )
        logger.error("workers failed (%s); exiting with %d", ranks, code)
        return code
    except SignalException as e:
        logger.error("stopped by %s; workers were shut down", e.sigval.name)
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    sys.exit(main())
