"""Local process helpers: a free port for a rendezvous, torchrun on this machine (stdlib only)."""

from __future__ import annotations

import sys

from mnnvl.ports import free_port


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
