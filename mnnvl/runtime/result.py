"""The worker's result line: rank 0 of an entry point ends with ``RESULT {json}`` on stdout.

One definition for the writer (``mnnvl.runtime.train``/``verify``) and every reader (the
launcher step reading pod 0's log, benchmarks and tests reading torchrun's output).
Standard library only.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

RESULT_PREFIX = "RESULT "

# Exit codes of a worker pod whose cause a retry cannot change: 2 bad input (argparse or a
# SpecError), 4 a failed verification or training (non-finite loss), 126/127 an image that
# cannot run python3. The Job's podFailurePolicy fails the whole Job on them at once; any
# other code (1: a crash, a rank lost, a rendezvous error) is retried within
# backoff_limit_per_index. ``python -m mnnvl.runtime.launch`` keeps these codes intact
# through torchrun, which on its own reports every worker failure as 1.
NON_RETRIABLE_EXIT_CODES = (2, 4, 126, 127)


def emit_result(result: dict[str, Any]) -> None:
    """Print the result line (one line of compact JSON) and flush it."""
    print(RESULT_PREFIX + json.dumps(result, separators=(",", ":")), flush=True)


def parse_result(text: str) -> dict[str, Any] | None:
    """The last result line of ``text``, or None; ``ValueError`` when its JSON is broken."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(RESULT_PREFIX):
            try:
                result = json.loads(line[len(RESULT_PREFIX) :])
            except ValueError as e:
                raise ValueError(f"the RESULT line is not valid JSON ({e}): {line[:200]}") from e
            return result if isinstance(result, dict) else {"value": result}
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a local rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(module: str, args: list[str], nproc: int) -> list[str]:
    """``python -m torch.distributed.run`` of ``module`` on this machine, ``nproc`` processes."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={free_port()}",
        "-m",
        module,
        *args,
    ]
