"""Kubeflow Trainer's TrainJob CRD: where it is read from and the ``resourceClaimsPerNode`` overlay.

The CRD is read from ``<schema dir>/kubeflow-trainer/crds/trainer.kubeflow.org_trainjobs.yaml``
(``scripts/fetch-schemas.sh`` fetches it at Trainer's v2.4.0 tag). A CRD without
``spec.trainer.resourceClaimsPerNode`` (Trainer v2.3 and earlier, where the field does not
exist) gets it from :data:`RESOURCE_CLAIMS_PER_NODE`, an overlay written from the field's
documented shape (Trainer v2.4.0, ``docs/operator-guides/dynamic-resource-allocation.md``: a
list of pod resource claims, merged by name), so that the TrainJobs this project writes validate
against either. A CRD that has the field is used as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRAINER_CRDS = "kubeflow-trainer/crds"
TRAINJOB_CRD_FILE = "trainer.kubeflow.org_trainjobs.yaml"
TRAINJOB_CRD_NAME = "trainjobs.trainer.kubeflow.org"
RUNTIME_CRD_NAME = "clustertrainingruntimes.trainer.kubeflow.org"
VERSION = "v1alpha1"

# OVERLAY, not upstream text: Trainer v2.4.0's field as documented (a PodResourceClaim list).
RESOURCE_CLAIMS_PER_NODE: dict[str, Any] = {
    "description": (
        "overlay (Trainer v2.4.0 field shape): pod resource claims added to every training "
        "node's pod and to its node container"
    ),
    "type": "array",
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["name"],
    "items": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            "resourceClaimName": {"type": "string"},
            "resourceClaimTemplateName": {"type": "string"},
        },
        "additionalProperties": False,
    },
}


def trainjob_crd_path(schema_dir: str | Path) -> Path:
    """Where the TrainJob CRD lies under a schema dir (``MNNVL_SCHEMA_DIR``'s layout)."""
    return Path(schema_dir) / TRAINER_CRDS / TRAINJOB_CRD_FILE


def trainjob_schema(crd_path: Path) -> dict[str, Any]:
    """The TrainJob's ``openAPIV3Schema`` without ``status``, with the overlay where needed."""
    import yaml

    crd = yaml.safe_load(crd_path.read_text(encoding="utf-8"))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
    schema = dict(version["schema"]["openAPIV3Schema"])
    props = dict(schema.get("properties") or {})
    props.pop("status", None)  # written only through the status subresource
    spec = dict(props["spec"])
    spec_props = dict(spec["properties"])
    trainer = dict(spec_props["trainer"])
    trainer_props = dict(trainer["properties"])
    trainer_props.setdefault("resourceClaimsPerNode", RESOURCE_CLAIMS_PER_NODE)
    trainer["properties"] = trainer_props
    spec_props["trainer"] = trainer
    spec["properties"] = spec_props
    props["spec"] = spec
    schema["properties"] = props
    return strict(schema)


def strict(schema: Any) -> Any:
    """The schema refusing unknown fields, as the API server's strict field validation does
    (a CRD's structural schema lists the known fields but does not forbid others; fields
    under ``x-kubernetes-preserve-unknown-fields`` stay open)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    open_ended = out.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in out
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out
