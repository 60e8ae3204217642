"""Local process helpers: torchrun and the pods' entry on this machine (stdlib only)."""

from __future__ import annotations

import sys

from mnnvl.ports import free_port


def torchrun_command(module: str, args: list[str], nproc: int) -> list[str]:
    """``python -m torch.distributed.run`` of ``module`` on this machine, ``nproc`` processes."""
    return _command("torch.distributed.run", module, args, nproc)


def pod_entry_command(module: str, args: list[str], nproc: int) -> list[str]:
    """``python -m mnnvl.runtime.launch`` of ``module``: what a worker pod runs, one process per
    GPU. Unlike torchrun (which exits 1 for any failed worker) it exits with the workers' own
    code, so 4 (verification failed), 10 (out of memory) and 12 (stalled) reach the caller."""
    return _command("mnnvl.runtime.launch", module, args, nproc)


def _command(launcher: str, module: str, args: list[str], nproc: int) -> list[str]:
    port = f"--master-port={free_port()}"
    return [sys.executable, "-m", launcher, f"--nproc-per-node={nproc}", port, "-m", module, *args]
