"""Shared storage for the workers: ``--pvc CLAIM:/mount/path[:ro]``, and checkpoints and token
files under a PersistentVolumeClaim every worker pod mounts. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mnnvl.errors import SpecError
from mnnvl.inputs.checks import check_subdomain

PVC_ITEM = re.compile(r"^(?P<claim>[^:]+):(?P<path>/[^:]*)(?P<ro>:ro)?$")
RESERVED_MOUNTS = ("/dev/shm", "/dev", "/proc", "/sys", "/")


@dataclass(frozen=True)
class PvcMount:
    """One ``CLAIM:/mount/path[:ro]`` item of ``--pvc``."""

    claim: str
    path: str
    read_only: bool


def parse_pvc(items: tuple[str, ...]) -> list[PvcMount]:
    """Parse ``--pvc`` items (each may hold several, comma-separated); the field named in errors."""
    mounts: list[PvcMount] = []
    for item in (i.strip() for entry in items for i in entry.split(",")):
        if not item:
            continue
        m = PVC_ITEM.match(item)
        if not m:
            raise SpecError("pvc", f"{item!r} must look like CLAIM:/mount/path or CLAIM:/path:ro")
        claim, path = m["claim"], m["path"].rstrip("/") or "/"
        check_subdomain("pvc", claim, "PersistentVolumeClaim")
        if path in RESERVED_MOUNTS or "/../" in path + "/" or "//" in path:
            raise SpecError("pvc", f"{item!r}: {path!r} cannot be a mount path")
        if any(path == o.path for o in mounts):
            raise SpecError("pvc", f"two claims are mounted at {path}")
        mounts.append(PvcMount(claim=claim, path=path, read_only=bool(m["ro"])))
    return mounts


def check_shared_storage(workload: Any, config: Any) -> None:
    """A ``TrainConfig``'s ``checkpoint_dir`` and file ``data`` must lie under a PVC the
    ``WorkloadSpec`` mounts in every worker (``spec`` imports this module, hence ``Any``): else
    each pod sees another directory. ``allow_local_checkpoint``: single-node runs only."""
    mounts = parse_pvc(workload.pod.pvc)
    local_ok = config.allow_local_checkpoint
    if local_ok and workload.nodes > 1:
        raise SpecError(
            "allow_local_checkpoint",
            f"only for single-node runs; with {workload.nodes} nodes mount a shared volume "
            "(pvc CLAIM:/mount/path)",
        )
    paths = {"checkpoint_dir": config.checkpoint_dir}
    if config.data != "synthetic":
        paths["data"] = config.data
    for name, path in paths.items():
        if not path or local_ok:
            continue
        if not path.startswith("/"):
            raise SpecError(name, f"{path!r} must be an absolute path under a pvc mount")
        under = [m for m in mounts if f"{path.rstrip('/')}/".startswith(f"{m.path}/")]
        if not under:
            where = ", ".join(m.path for m in mounts) or "none"
            single = (
                ", or set recovery.allow_local_checkpoint (single node)"
                if workload.nodes == 1
                else ""
            )
            raise SpecError(
                name,
                f"{path} is not under a mounted PVC (mounts: {where}); every worker pod must "
                f"see it: add a pvc CLAIM:/mount/path{single}",
            )
        if name == "checkpoint_dir" and under[0].read_only:
            raise SpecError(name, f"{path} is under {under[0].claim}, which is mounted read-only")
