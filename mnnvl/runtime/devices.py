"""GPUs the pod asked for against GPUs the process can see.

The Job puts ``MNNVL_GPUS_PER_NODE`` into every worker's environment. A pod that asked for
GPUs but sees none (a missing device plugin, a wrong runtime class, CDI injection that did
not happen) must fail naming itself, never fall back to gloo on the CPU and report a
verification or a training run that did not use the GPUs.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from mnnvl.contract.env import GPUS_PER_NODE

if TYPE_CHECKING:
    import torch


def pod_name() -> str:
    """The pod's name: Kubernetes sets ``HOSTNAME`` to it."""
    return os.environ.get("HOSTNAME") or socket.gethostname()


def missing_gpus_problem(visible: int) -> str | None:
    """A FAIL reason when GPUs were requested but ``visible`` is 0, else None."""
    try:
        requested = int(os.environ.get(GPUS_PER_NODE, "0") or 0)
    except ValueError:
        return f"{GPUS_PER_NODE}={os.environ[GPUS_PER_NODE]!r} is not a number"
    if requested <= 0 or visible > 0:
        return None
    return (
        f"pod {pod_name()} requested {requested} GPU(s) but the worker sees none "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}); "
        "check the GPU device plugin / DRA claim and the container runtime on its node"
    )


def nvml_ids(device: torch.device) -> list[str | int]:
    """The NVML identity of a CUDA device: its UUID, since ``CUDA_VISIBLE_DEVICES`` renumbers
    CUDA indexes and NVML indexes do not follow."""
    import torch  # here, not at the top: groups.py imports this module without torch

    if device.type != "cuda":
        return []
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return [text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"]
    # No UUID from torch: map the CUDA index back through CUDA_VISIBLE_DEVICES.
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    entry = visible[index] if index < len(visible) and visible[index] else str(index)
    return [entry if entry.startswith(("GPU-", "MIG-")) else int(entry)]
