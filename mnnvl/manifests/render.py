"""Everything one run creates, in creation order (``mnnvl.yaml_stream`` writes it as YAML).

Order: ComputeDomain (provision), the GPU claim template when GPUs come from a claim, then
for each step its headless Service before its Job (pod 0's DNS name must resolve as soon as
the pods start), then its Jobs (one per clique group): train first, then verify, as the
pipelines run them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mnnvl.errors import SpecError
from mnnvl.inputs.flags import to_args
from mnnvl.inputs.spec import (
    DomainSpec,
    TrainConfig,
    VerifyConfig,
    WorkloadSpec,
)
from mnnvl.inputs.storage import check_shared_storage
from mnnvl.manifests.claims import gpu_claim_template, wants_gpu_claim
from mnnvl.manifests.domain import compute_domain
from mnnvl.manifests.trainjob import take_trainjob, trainjob
from mnnvl.manifests.workload import TRAIN_MODULE, VERIFY_MODULE, headless_service, indexed_jobs

VERIFY_PURPOSES = ("verify", "verify-pre", "verify-post")
VERIFY_PROFILE = "verify-strict"


def step_workload(workload: WorkloadSpec, step: str) -> WorkloadSpec:
    """The workload as one step runs it.

    ``train`` runs with purpose ``train`` and the workload's NCCL profile. ``verify`` keeps a
    ``verify-*`` purpose (else ``verify``) and uses the ``verify-strict`` profile, except on
    ``single-host``, where MNNVL must stay off; verification always runs as the Indexed Job.
    """
    if step == "train":
        return dataclasses.replace(workload, purpose="train")
    if step == "verify":
        purpose = workload.purpose if workload.purpose in VERIFY_PURPOSES else "verify"
        profile = (
            workload.nccl_profile if workload.nccl_profile == "single-host" else VERIFY_PROFILE
        )
        return dataclasses.replace(workload, purpose=purpose, nccl_profile=profile, workload="job")
    raise SpecError("step", f"{step!r} is not one of train, verify")


def render_run(
    domain: DomainSpec,
    workload: WorkloadSpec,
    train: TrainConfig | None,
    verify: VerifyConfig | None,
) -> list[dict[str, Any]]:
    """Every object a run would create, in creation order (steps left as None are skipped)."""
    if domain.run_id != workload.run_id:
        raise SpecError(
            "run_id", f"domain {domain.run_id!r} and workload {workload.run_id!r} differ"
        )
    if domain.namespace != workload.namespace:
        raise SpecError(
            "namespace",
            f"domain {domain.namespace!r} and workload {workload.namespace!r} differ; "
            "the workload pods must be in the ComputeDomain's namespace",
        )
    objs = [compute_domain(domain)]
    steps: list[tuple[WorkloadSpec, str, list[str]]] = []
    if train is not None:
        check_shared_storage(workload, train)
        steps.append((step_workload(workload, "train"), TRAIN_MODULE, to_args(train)))
    if verify is not None:
        steps.append((step_workload(workload, "verify"), VERIFY_MODULE, to_args(verify)))
    if steps and wants_gpu_claim(workload):
        objs.append(gpu_claim_template(workload))
    for step, module, args in steps:
        objs.append(headless_service(step))
        objs += indexed_jobs(step, module, args)
    return objs


def render_trainjob(
    domain: DomainSpec,
    workload: WorkloadSpec,
    train: TrainConfig,
    runtime: str,
    own: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The train step as a Kubeflow Trainer TrainJob (``--workload trainjob``): the
    ComputeDomain, the GPU claim template when GPUs come from a claim, then the TrainJob, whose
    runtime makes the pods and their headless Service (no Job or Service of ours); with
    ``own`` (``--trainjob-file``), that TrainJob as the step takes it."""
    objs = render_run(domain, workload, None, None)
    check_shared_storage(workload, train)
    step = step_workload(workload, "train")
    if wants_gpu_claim(workload):
        objs.append(gpu_claim_template(workload))
    body = (
        take_trainjob(own, step) if own else trainjob(step, TRAIN_MODULE, to_args(train), runtime)
    )
    return [*objs, body]
