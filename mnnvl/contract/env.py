"""Environment variables the launcher side and the workers agree on: names and rules.

The Job builder (``mnnvl.manifests``) writes these into every worker pod, the input checks
(``mnnvl.inputs.checks``/``mnnvl.inputs.spec``) refuse user values for them, the simulator's kubelet
rewrites the rendezvous ones, and the worker side (``mnnvl.runtime``) reads them. Each name
is spelled here only. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Rendezvous, in torchrun's names: the Job builder sets them, ``mnnvl.runtime.launch`` reads
# them and hands MASTER_* and WORLD_SIZE on to every worker.
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
NNODES = "NNODES"
NPROC_PER_NODE = "NPROC_PER_NODE"
WORLD_SIZE = "WORLD_SIZE"
NODE_RANK = "NODE_RANK"
# Set by the Job controller on every pod of an Indexed Job.
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"

RUN_ID = "MNNVL_RUN_ID"
# The NCCL profile the worker applies at start-up (``mnnvl.contract.nccl``).
NCCL_PROFILE = "MNNVL_NCCL_PROFILE"
# GPUs the pod asked for: a worker that sees none fails naming its pod instead of using gloo.
GPUS_PER_NODE = "MNNVL_GPUS_PER_NODE"
# Placement across NVLink cliques (one Job per group), read by ``mnnvl.runtime.groups`` and,
# for the node rank of a group's pod, by ``mnnvl.runtime.launch``.
NUM_GROUPS = "MNNVL_NUM_GROUPS"
GROUP_INDEX = "MNNVL_GROUP_INDEX"
NODES_PER_GROUP = "MNNVL_NODES_PER_GROUP"
NODE_RANK_BASE = "MNNVL_NODE_RANK_BASE"
# The pod's node (downward API ``spec.nodeName``), named by a worker's failure reasons.
NODE_NAME = "MNNVL_NODE_NAME"
# The pod's name (downward API ``metadata.name``), named by an in-place restart's log line.
POD_NAME = "MNNVL_POD_NAME"
# Where the container runtime puts the IMEX channel devices of the ComputeDomain's channel
# claim (the compute-domain kubelet plugin's CDI spec). Every worker pod carries that claim,
# and the Job names this directory in ``IMEX_CHANNELS``: verify fails a pod that has none
# there. The simulated kubelet, whose containers share one machine's /dev, rewrites the value
# to the pod's own directory.
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
IMEX_CHANNELS = "MNNVL_IMEX_CHANNELS"
# The node label the placement keeps each group inside (``--clique-label``): the workers name it
# when the GPUs' NVML clique IDs show a group that spans two cliques.
CLIQUE_LABEL = "MNNVL_CLIQUE_LABEL"

# Where each rank keeps a host copy of its part of the newest checkpoint: a folder per run and
# pod, ``<run id>/<pod name>``, in the pod's memory-backed /dev/shm (``mnnvl.runtime.hostcopy``).
HOST_COPY_DIR = "/dev/shm/mnnvl-hostcopy"
# A pod's /dev/shm where it is not the container's own: the simulated kubelet, whose containers
# share one machine's /dev/shm, names a directory of the pod's own and the size of the memory
# emptyDir mounted there (bytes; its sizeLimit), which the host copy's room check honours as
# the tmpfs of that size on a cluster node would.
SHM_DIR = "MNNVL_SHM_DIR"
SHM_SIZE = "MNNVL_SHM_SIZE"

# "0" turns in-place restarts off (``mnnvl.runtime.inplace``): every restart recreates the
# pods. A user value (``--env``), read by the pod's launcher.
IN_PLACE_RESTARTS = "MNNVL_IN_PLACE_RESTARTS"

# Set by the Job itself (rendezvous, rank, profile); a user value would break the run.
JOB_OWNED = (
    MASTER_ADDR,
    WORLD_SIZE,
    NODE_RANK,
    MASTER_PORT,
    NNODES,
    NPROC_PER_NODE,
    RUN_ID,
    JOB_COMPLETION_INDEX,
    NCCL_PROFILE,
    GPUS_PER_NODE,
    NUM_GROUPS,
    GROUP_INDEX,
    NODES_PER_GROUP,
    NODE_RANK_BASE,
    NODE_NAME,
    POD_NAME,
    IMEX_CHANNELS,
    CLIQUE_LABEL,
)
# Set on the GPU hosts to keep NVLink multicast off; nothing we ship may override them.
PINNED = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
# Variables whose value can silently disable MNNVL, with why; a value NCCL reads as "off" is
# refused wherever a user can pass environment and again in the worker before NCCL starts.
CUMEM_ENABLE = "NCCL_CUMEM_ENABLE"
FORBIDDEN = {CUMEM_ENABLE: "silently disables MNNVL (NCCL needs cuMem for fabric memory)"}
# NCCL reads an integer parameter with strtoll(value, nullptr, 0) and checks only errno, not
# where parsing stopped (NVIDIA/nccl src/misc/param.cc, ncclLoadParam, v2.21.5-1 to v2.30.7-1):
# leading white space and a sign are taken, 0x is hex, a leading 0 octal, and a value with no
# digits ("false", "true", "off") is 0. Out of range (ERANGE) keeps the default.
_STRTOLL = re.compile(r"[ \t\n\v\f\r]*([+-]?)(?:0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9][0-9]*))?")


def cumem_param(value: str) -> int | None:
    """What NCCL makes of ``NCCL_CUMEM_ENABLE=value``: strtoll's number kept as a C ``int``
    (src/misc/cudawrap.cc, ncclCuMemEnable, the same releases), or None where NCCL keeps its
    default (empty, or out of the 64-bit range)."""
    sign, hex_digits, octal, decimal = _STRTOLL.match(value).groups()  # type: ignore[union-attr]
    number = int(hex_digits, 16) if hex_digits else int(octal, 8) if octal else int(decimal or 0)
    number = -number if sign == "-" else number
    if not value or not -(2**63) <= number < 2**63:
        return None
    return (number + 2**31) % 2**32 - 2**31


def forbidden_problem(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """``(name, reason)`` of the first variable in ``environ`` set to a forbidden value: NCCL
    uses cuMem for a positive ``NCCL_CUMEM_ENABLE`` or -2 (auto, the default) only."""
    value = str(environ.get(CUMEM_ENABLE, ""))
    param = cumem_param(value)
    if param is None or param > 0 or param == -2:
        return None
    reads = "" if value.strip() == str(param) else f" (NCCL reads it as {param})"
    return CUMEM_ENABLE, (
        f"{CUMEM_ENABLE}={value}{reads} {FORBIDDEN[CUMEM_ENABLE]}; unset it (1 or -2 keep cuMem on)"
    )
