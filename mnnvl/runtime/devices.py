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

from mnnvl.contract.env import GPUS_PER_NODE, IMEX_CHANNEL_DIR, IMEX_CHANNELS, NODE_NAME

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


def missing_channel_problem() -> str | None:
    """A FAIL reason when the pod's ComputeDomain channel claim brought no IMEX channel
    device (the Job names the directory in ``MNNVL_IMEX_CHANNELS``), else None.

    The driver prepares the claim of a node without a clique ID and injects no channel
    (``CliqueID() == ""`` in ``cmd/compute-domain-kubelet-plugin/device_state.go``, in both
    IMEX modes): the pod starts, and its GPUs can share no memory with other nodes.
    """
    where = os.environ.get(IMEX_CHANNELS, "")
    if not where:
        return None  # not a worker pod of a run (a bare torchrun, a test)
    try:
        if any(name.startswith("channel") for name in os.listdir(where)):
            return None
    except OSError:
        pass  # no directory: nothing was injected
    node = os.environ.get(NODE_NAME) or "its node"
    return (
        f"pod {pod_name()} on node {node} has no IMEX channel device in {IMEX_CHANNEL_DIR}: "
        "its ComputeDomain channel claim was prepared without one, which the DRA driver does "
        "on a node without an NVLink clique ID (GPU fabric not registered, or with "
        "host-managed IMEX the node outside every IMEX domain); check the GPUs' fabric state "
        f"(nvidia-smi -q, Fabric) and the nvidia.com/gpu.clique label of {node}"
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
