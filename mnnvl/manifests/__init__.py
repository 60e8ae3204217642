"""Pure builders for the Kubernetes objects of a run: plain dicts, no I/O, stdlib only.

``render_run`` lists everything a run creates, in creation order.
"""

from mnnvl.inputs.defaults import CLIQUE_LABEL
from mnnvl.manifests.claims import gpu_claim_template, wants_gpu_claim
from mnnvl.manifests.domain import compute_domain
from mnnvl.manifests.render import render_run, render_trainjob, step_workload
from mnnvl.manifests.spec_hash import SPEC_HASH_ANNOTATION, hash_of, spec_hash, with_spec_hash
from mnnvl.manifests.workload import (
    CHANNEL_CLAIM,
    CONTAINER,
    GPU_CLAIM,
    JOB_NAME_LABEL,
    KUEUE_QUEUE_LABEL,
    RUNTIME_UID,
    TRAIN_MODULE,
    VERIFY_MODULE,
    headless_service,
    indexed_job,
    indexed_jobs,
    rank0_job,
    step_selector,
)

__all__ = [
    "CHANNEL_CLAIM",
    "CLIQUE_LABEL",
    "CONTAINER",
    "GPU_CLAIM",
    "JOB_NAME_LABEL",
    "KUEUE_QUEUE_LABEL",
    "RUNTIME_UID",
    "SPEC_HASH_ANNOTATION",
    "TRAIN_MODULE",
    "VERIFY_MODULE",
    "compute_domain",
    "gpu_claim_template",
    "hash_of",
    "headless_service",
    "indexed_job",
    "indexed_jobs",
    "rank0_job",
    "render_run",
    "render_trainjob",
    "spec_hash",
    "step_selector",
    "step_workload",
    "wants_gpu_claim",
    "with_spec_hash",
]
