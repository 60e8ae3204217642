"""torchrun for one pod of a clique group: ``python -m mnnvl.runtime.grouprun [torchrun args]``.

A run with several NVLink clique groups has one Indexed Job per group, so each pod's
``JOB_COMPLETION_INDEX`` counts within its group. The global node rank is that index plus
the group's first node rank (``MNNVL_NODE_RANK_BASE``, set by the Job builder); the kubelet's
``$(VAR)`` expansion cannot add, so this replaces itself with torchrun and that node rank.
Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from mnnvl.spec import NODE_RANK_BASE_ENV


def node_rank(environ: Mapping[str, str]) -> int:
    try:
        return int(environ.get(NODE_RANK_BASE_ENV, "0")) + int(environ["JOB_COMPLETION_INDEX"])
    except (KeyError, ValueError):
        print(
            f"grouprun: needs JOB_COMPLETION_INDEX and {NODE_RANK_BASE_ENV} as whole numbers "
            "(it runs as the command of a clique group's Indexed Job)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def torchrun_argv(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--node-rank={node_rank(environ)}",
        *argv,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = torchrun_argv(sys.argv[1:] if argv is None else argv, os.environ)
    os.execv(sys.executable, args)


if __name__ == "__main__":
    main()
