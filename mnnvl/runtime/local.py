"""Local process helpers: a free port for a rendezvous, torchrun on this machine (stdlib only)."""

from __future__ import annotations

import socket
import sys


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
