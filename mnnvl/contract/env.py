"""Environment variables the launcher side and the workers agree on: names and rules.

The Job builder (``mnnvl.manifests``) writes these into every worker pod, the input checks
(``mnnvl.inputs.checks``/``mnnvl.inputs.spec``) refuse user values for them, the simulator's kubelet
rewrites the rendezvous ones, and the worker side (``mnnvl.runtime``) reads them. Each name
is spelled here only. Standard library only.
"""

from __future__ import annotations

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
    IMEX_CHANNELS,
    CLIQUE_LABEL,
)
# Set on the GPU hosts to keep NVLink multicast off; nothing we ship may override them.
PINNED = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
# Values that silently disable MNNVL, with why; refused wherever a user can pass environment
# and again in the worker before NCCL starts.
FORBIDDEN = {
    "NCCL_CUMEM_ENABLE": ("0", "silently disables MNNVL (NCCL needs cuMem for fabric memory)"),
}


def forbidden_problem(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """``(name, reason)`` of the first variable in ``environ`` set to a forbidden value."""
    for name, (value, why) in FORBIDDEN.items():
        if str(environ.get(name, "")).strip() == value:
            return name, f"{name}={value} {why}; unset it"
    return None
