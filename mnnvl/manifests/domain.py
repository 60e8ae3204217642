"""The ComputeDomain, plus the metadata helpers every builder shares.

``numNodes`` is always 0: the field is deprecated, a non-zero value only makes the global
``Ready`` wait for workload pods (which we never wait for), and v25.12 CRDs still require
the field while v0.4+ default it to 0, so writing 0 validates against both lines.
"""

from __future__ import annotations

from typing import Any

from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, OwnerRef

API_VERSION = "resource.nvidia.com/v1beta1"
KIND = "ComputeDomain"
COMPONENT = "compute-domain"


def object_meta(
    name: str, namespace: str, labels: dict[str, str], owner: OwnerRef | None
) -> dict[str, Any]:
    """``metadata`` for a namespaced object of the run, with owner references backing up
    teardown through garbage collection.

    ``controller`` and ``blockOwnerDeletion`` stay false: the owner (a launcher pod or an
    Argo Workflow) does not manage these objects, and blocking its deletion on ours would
    need extra RBAC (``update`` on the owner's finalizers) for no gain.
    """
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ]
    return meta


def compute_domain(spec: DomainSpec) -> dict[str, Any]:
    """The run's ComputeDomain; the DRA controller creates the channel template it names."""
    names = RunNames.for_run(spec.run_id)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": object_meta(names.domain, spec.namespace, names.labels(COMPONENT), spec.owner),
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": names.channel_template},
                "allocationMode": spec.allocation_mode,
            },
        },
    }
