"""The optional GPU ResourceClaimTemplate (``gpu_mode='claim'``).

Used on clusters where the NVIDIA DRA driver serves GPUs (``resources.gpus.enabled=true``);
there a pod must not also ask for ``nvidia.com/gpu`` limits, because the DeviceClass maps that
extended resource and such a pod fails to schedule. One template per run: every pod of
every Job of the run gets its own claim from it.

``gpu_mode='auto'`` is decided by the steps at run time (:mod:`mnnvl.driver.gpus`); the pure
builders, and so ``mnnvl render`` and the examples, render it as ``limits``, so that rendering
never needs a cluster and always gives the same objects.
"""

from __future__ import annotations

from typing import Any

from mnnvl.errors import SpecError
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests.domain import object_meta

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceClaimTemplate"
COMPONENT = "gpu-claim"
GPU_REQUEST = "gpus"


def wants_gpu_claim(workload: WorkloadSpec) -> bool:
    """True when the pods get their GPUs through a DRA claim rather than limits."""
    return workload.placement.gpu_mode == "claim" and workload.gpus_per_node > 0


def gpu_claim_template(workload: WorkloadSpec) -> dict[str, Any]:
    """A template asking for exactly ``gpus_per_node`` devices of ``gpu_device_class``."""
    if not wants_gpu_claim(workload):
        raise SpecError(
            "gpu_mode",
            f"a GPU claim template needs gpu_mode='claim' and gpus_per_node > 0 "
            f"(got {workload.placement.gpu_mode!r}, {workload.gpus_per_node})",
        )
    names = RunNames.for_run(workload.run_id)
    labels = names.labels(COMPONENT)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": object_meta(names.gpu_template, workload.namespace, labels, workload.owner),
        "spec": {
            # Labels on the generated claims, so the run's selector finds them too.
            "metadata": {"labels": dict(labels)},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": GPU_REQUEST,
                            "exactly": {
                                "deviceClassName": workload.placement.gpu_device_class,
                                "allocationMode": "ExactCount",
                                "count": workload.gpus_per_node,
                            },
                        }
                    ]
                }
            },
        },
    }
