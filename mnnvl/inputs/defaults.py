"""What the inputs start from and the values they may take: default images, model presets and
their training defaults, choice sets and limits. Data only. Standard library only.
"""

from __future__ import annotations

from mnnvl.contract.nccl import PROFILES

DEFAULT_IMAGE = "ghcr.io/mnnvl-pipelines/runtime:0.1.0"
DEFAULT_LAUNCHER_IMAGE = "ghcr.io/mnnvl-pipelines/launcher:0.1.0"

ALLOCATION_MODES = ("Single", "All")
# auto: decided at run time from what the cluster shows (mnnvl.driver.gpus); rendered as limits.
GPU_MODES = ("auto", "limits", "claim")
# The Pod Security Standard the worker pods meet (restricted: non-root; baseline: root allowed).
POD_SECURITY_LEVELS = ("restricted", "baseline")
NCCL_PROFILES = tuple(PROFILES)
PURPOSES = ("train", "verify-pre", "verify-post", "verify", "job")
MODEL_PRESETS = ("tiny", "small", "125m", "350m", "1b", "3b", "8b")
DTYPES = ("auto", "bf16", "fp32")
SWITCHES = ("auto", "true", "false")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")  # a toleration's effect
MAX_NODES = 18  # one IMEX domain (NVL72 rack: 18 compute trays); MNNVL never spans cliques
MAX_GROUPS = 999_999  # clique groups of one run (bounded only by the 63-character hostnames)
MAX_GPUS_PER_NODE = 8
# The node label naming a node's NVLink clique (``<cluster UUID>.<clique ID>``): set by GPU
# Feature Discovery (GPU Operator ClusterPolicy) or by the DRA driver's compute-domain kubelet
# plugin with gpuCliqueLabelEnabled; some providers label cliques under a key of their own.
CLIQUE_LABEL = "nvidia.com/gpu.clique"

# Training defaults a model preset picks where its input is left at auto (batch_size 0,
# activation_checkpointing auto, reshard_after_forward auto). 8b: the 2 x H200 winner at its
# sequence length 2048, 48.3 % MFU and 93 GiB peak against 36 % with full checkpointing at
# batch 2 (bench/RESULTS.md, Training). 1b: batch 8, 53.7 % MFU and 34 GiB peak against
# 27.1 % and 14 GiB at batch 2. Every other preset keeps PLAIN_TRAIN_DEFAULTS.
PLAIN_TRAIN_DEFAULTS: dict[str, int | str] = {
    "batch_size": 2,
    "activation_checkpointing": "none",
    "reshard_after_forward": "true",
}
# Presets whose blocks torch.compile compiles when ``compile`` is left at auto, on GPUs only:
# there the compiled blocks buy MFU that pays for the first step's compile within a short run
# (docs/training.md; bench/gpu_goodput.sh measures both); on CPU, and for the tiny and small
# presets, the compile time is not won back.
COMPILED_PRESETS = ("125m", "350m", "1b", "3b", "8b")
PRESET_TRAIN_DEFAULTS: dict[str, dict[str, int | str]] = {
    "1b": {"batch_size": 8},
    "8b": {
        "batch_size": 4,
        "activation_checkpointing": "every-2",
        "reshard_after_forward": "false",
    },
}
