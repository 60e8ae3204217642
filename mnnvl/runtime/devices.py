"""GPUs the pod asked for against GPUs the process can see.

The Job puts ``MNNVL_GPUS_PER_NODE`` into every worker's environment. A pod that asked for
GPUs but sees none (a missing device plugin, a wrong runtime class, CDI injection that did
not happen) must fail naming itself, never fall back to gloo on the CPU and report a
verification or a training run that did not use the GPUs.
"""

from __future__ import annotations

import os
import socket

GPUS_ENV = "MNNVL_GPUS_PER_NODE"


def pod_name() -> str:
    """The pod's name: Kubernetes sets ``HOSTNAME`` to it."""
    return os.environ.get("HOSTNAME") or socket.gethostname()


def missing_gpus_problem(visible: int) -> str | None:
    """A FAIL reason when GPUs were requested but ``visible`` is 0, else None."""
    try:
        requested = int(os.environ.get(GPUS_ENV, "0") or 0)
    except ValueError:
        return f"{GPUS_ENV}={os.environ[GPUS_ENV]!r} is not a number"
    if requested <= 0 or visible > 0:
        return None
    return (
        f"pod {pod_name()} requested {requested} GPU(s) but the worker sees none "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}); "
        "check the GPU device plugin / DRA claim and the container runtime on its node"
    )
