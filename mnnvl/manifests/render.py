"""Everything one run creates, in creation order, and a dependency-free YAML writer.

Order: ComputeDomain (provision), the GPU claim template when GPUs come from a claim, then
for each step its headless Service before its Job (pod 0's DNS name must resolve as soon as
the pods start), then its Jobs (one per clique group): train first, then verify, as the
pipelines run them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from mnnvl.errors import SpecError
from mnnvl.flags import to_args
from mnnvl.manifests.claims import gpu_claim_template, wants_gpu_claim
from mnnvl.manifests.domain import compute_domain
from mnnvl.manifests.workload import TRAIN_MODULE, VERIFY_MODULE, headless_service, indexed_jobs
from mnnvl.spec import (
    DomainSpec,
    TrainConfig,
    VerifyConfig,
    WorkloadSpec,
)
from mnnvl.storage import check_shared_storage

VERIFY_PURPOSES = ("verify", "verify-pre", "verify-post")
VERIFY_PROFILE = "verify-strict"


def step_workload(workload: WorkloadSpec, step: str) -> WorkloadSpec:
    """The workload as one step runs it.

    ``train`` runs with purpose ``train`` and the workload's NCCL profile. ``verify`` keeps a
    ``verify-*`` purpose (else ``verify``) and uses the ``verify-strict`` profile, except on
    ``single-host``, where MNNVL must stay off.
    """
    if step == "train":
        return dataclasses.replace(workload, purpose="train")
    if step == "verify":
        purpose = workload.purpose if workload.purpose in VERIFY_PURPOSES else "verify"
        profile = (
            workload.nccl_profile if workload.nccl_profile == "single-host" else VERIFY_PROFILE
        )
        return dataclasses.replace(workload, purpose=purpose, nccl_profile=profile)
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


# ---- YAML ----------------------------------------------------------------------------

# Plain (unquoted) only for strings that cannot read as anything else: no spaces, no
# indicator first, no trailing ':'; everything else is quoted.
_PLAIN = re.compile(r"^(?:[A-Za-z_/.]|--?(?=[A-Za-z]))[A-Za-z0-9_./@:=$()-]*(?<!:)$")
_AMBIGUOUS = re.compile(
    r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
    r"|null|Null|NULL|~|[-+]?\.?[0-9].*|\.(?:inf|Inf|INF|nan|NaN|NAN))$"
)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, str):
        if _PLAIN.match(value) and not _AMBIGUOUS.match(value):
            return value
        # A JSON string is a valid YAML double-quoted scalar.
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            head = f"{pad}{_scalar(str(key))}:"
            if isinstance(item, (dict, list)) and item:
                out.append(head)
                # Lists sit at the key's indent, as kubectl writes them.
                out += _lines(item, indent if isinstance(item, list) else indent + 2)
            else:
                out.append(f"{head} {_inline(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                nested = _lines(item, indent + 2)
                out.append(f"{pad}- {nested[0][indent + 2 :]}")
                out += nested[1:]
            else:
                out.append(f"{pad}- {_inline(item)}")
    else:
        out.append(pad + _scalar(value))
    return out


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(objs: list[dict[str, Any]]) -> str:
    """A multi-document YAML stream (``---`` before each object)."""
    docs = ["---\n" + "\n".join(_lines(obj, 0)) + "\n" for obj in objs]
    return "".join(docs)
