"""Schema admission of the simulated API server.

Built-in kinds (Jobs, Pods, Services, ResourceClaimTemplates) are validated against the
Kubernetes 1.34 OpenAPI schema in strict mode (unknown fields rejected) with the schemas that
ship in ``kubernetes_validate``; ComputeDomains against the ``openAPIV3Schema`` of the NVIDIA
driver's CRD of the chosen driver line, read from ``<schema dir>/nvidia-dra-driver/…/crds``
where the schema dir is ``SimCluster(schema_dir=…)`` or ``$MNNVL_SCHEMA_DIR``; TrainJobs against
Kubeflow Trainer's CRD at ``<schema dir>/kubeflow-trainer/crds`` where it is there
(:mod:`mnnvl.sim.api.trainer_crd`), strict.
``kubernetes_validate``, ``jsonschema`` and ``yaml`` are imported lazily, on the first object
validated, so importing ``mnnvl.sim`` stays standard-library only. Without a schema dir the
ComputeDomain keeps the built-in rules of :mod:`mnnvl.sim.policy.admission` (required fields, enum,
numNodes per driver line, immutability).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Any

from mnnvl.sim.api.model import RESOURCES, ApiError, Obj
from mnnvl.sim.api.trainer_crd import trainjob_crd_path, trainjob_schema

K8S_VERSION = "1.34.0"
STRICT = ("jobs", "pods", "services", "resourceclaimtemplates")
DRIVER_LINES = {"v25.12.0": "nvidia-dra-driver/crds", "v0.4.0": "nvidia-dra-driver/v0.4.0/crds"}
CRD_NAME = "computedomains.resource.nvidia.com"
CD_CRD_FILE = "resource.nvidia.com_computedomains.yaml"
VALIDATION_MODULES = ("jsonschema", "kubernetes_validate", "referencing", "yaml")
log = logging.getLogger(__name__)


class SchemaAdmission:
    """Cached validators, built on first use (building one costs ~0.1 s; using it ~1 ms)."""

    def __init__(self, schema_dir: str | None, driver_version: str) -> None:
        if driver_version not in DRIVER_LINES:
            raise ValueError(f"driver_version must be one of {sorted(DRIVER_LINES)}")
        configured = schema_dir or os.environ.get("MNNVL_SCHEMA_DIR") or ""
        self.driver_version = driver_version
        self.crd_path = (
            Path(configured) / DRIVER_LINES[driver_version] / CD_CRD_FILE if configured else None
        )
        if self.crd_path is not None and not self.crd_path.is_file():
            raise FileNotFoundError(
                f"ComputeDomain CRD {self.crd_path} not found: set MNNVL_SCHEMA_DIR to the "
                "directory `make schemas` fills"
            )
        trainer_crd = trainjob_crd_path(configured) if configured else None
        # TrainJobs against Trainer's CRD where the schema dir has it (strict: unknown fields
        # refused); ``claims_per_node`` False plays a Trainer before v2.4.0, without the field.
        self.trainer_crd = trainer_crd if trainer_crd and trainer_crd.is_file() else None
        self.claims_per_node = True
        self._lock = threading.Lock()
        self._validators: dict[str, Any] = {}
        # A plain `pip install` has no validation libraries (they come with the dev extra):
        # the simulator then serves without schema admission instead of failing requests.
        self.missing = [m for m in VALIDATION_MODULES if importlib.util.find_spec(m) is None]
        if self.missing:
            log.warning(
                "schema admission off: %s not installed (pip install 'mnnvl-pipelines[dev]')",
                ", ".join(self.missing),
            )

    def check(self, resource: str, obj: Obj) -> None:
        """Raise the 422 a real API server answers for an object its schema rejects."""
        if self.missing:
            return
        if resource in STRICT:
            self._check(resource, obj, self._builtin)
        elif resource == "computedomains" and self.crd_path is not None:
            self._check(resource, obj, self._crd)
        elif resource == "trainjobs" and self.trainer_crd is not None:
            self._check(resource, obj, self._trainjob)

    def _trainjob(self, resource: str) -> Any:
        import jsonschema

        assert self.trainer_crd is not None
        schema = trainjob_schema(self.trainer_crd)
        if not self.claims_per_node:
            trainer = schema["properties"]["spec"]["properties"]["trainer"]["properties"]
            trainer.pop("resourceClaimsPerNode", None)
        return jsonschema.Draft7Validator(schema)

    def _check(self, resource: str, obj: Obj, build: Any) -> None:
        with self._lock:
            validator = self._validators.get(resource)
            if validator is None:
                validator = self._validators[resource] = build(resource)
        body = {k: v for k, v in obj.items() if k != "status"}
        rt = RESOURCES[resource]
        body.setdefault("apiVersion", rt.api_version)
        body.setdefault("kind", rt.kind)
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        if errors:
            raise invalid(resource, obj, [describe(e) for e in errors])

    @staticmethod
    def _builtin(resource: str) -> Any:
        import jsonschema
        from kubernetes_validate import utils as kv
        from referencing import Registry, Resource

        rt = RESOURCES[resource]
        group = rt.group.split(".")[0]
        api = f"{group}-{rt.version}" if group else rt.version
        folder = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict"
        schema = kv.schema_contents(f"{folder}/{rt.kind.lower()}-{api}.json", K8S_VERSION)
        defs = kv.schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
        registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
        return jsonschema.Draft202012Validator(schema, registry=registry)

    def _crd(self, resource: str) -> Any:
        import jsonschema
        import yaml

        assert self.crd_path is not None
        crd = yaml.safe_load(self.crd_path.read_text(encoding="utf-8"))
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
        schema = dict(version["schema"]["openAPIV3Schema"])
        props = dict(schema.get("properties") or {})
        props.pop("status", None)  # written only through the status subresource
        schema["properties"] = props
        return jsonschema.Draft7Validator(schema)


def describe(err: Any) -> str:
    """One error the way the API server words it (``field.path: Reason: detail``)."""
    path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err.absolute_path)
    path = path.replace(".[", "[")
    where = path or "<root>"
    if err.validator == "required":
        missing = str(err.message).split("'")[1]
        return f"{path + '.' if path else ''}{missing}: Required value"
    if err.validator == "enum":
        allowed = ", ".join(f'"{v}"' for v in err.validator_value)
        return f'{where}: Unsupported value: "{err.instance}": supported values: {allowed}'
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties") or {}))
        return ", ".join(f'{path + "." if path else ""}{k}: unknown field "{k}"' for k in extra)
    if err.validator == "type":
        return (
            f'{where}: Invalid value: "{type(err.instance).__name__}": {where} in body must be '
            f"of type {err.validator_value}"
        )
    if err.validator == "minimum":
        return (
            f"{where}: Invalid value: {err.instance}: {where} in body should be greater than or "
            f"equal to {err.validator_value}"
        )
    return f"{where}: Invalid value: {err.message}"


def invalid(resource: str, obj: Obj, errors: list[str]) -> ApiError:
    rt = RESOURCES[resource]
    name = (obj.get("metadata") or {}).get("name", "")
    qual = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    msg = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return ApiError(
        422,
        "Invalid",
        f'{qual} "{name}" is invalid: {msg}',
        {
            "name": name,
            "group": rt.group,
            "kind": rt.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": e} for e in errors],
        },
    )


def crd_object() -> Obj:
    """The ComputeDomain CRD as installed and established (what discovery and the CLI look up)."""
    return {
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": "resource.nvidia.com",
            "scope": "Namespaced",
            "names": {
                "plural": "computedomains",
                "singular": "computedomain",
                "kind": "ComputeDomain",
                "listKind": "ComputeDomainList",
            },
            "versions": [
                {"name": "v1beta1", "served": True, "storage": True, "subresources": {"status": {}}}
            ],
        },
        "status": {
            "conditions": [
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}
            ],
            "acceptedNames": {"plural": "computedomains", "kind": "ComputeDomain"},
            "storedVersions": ["v1beta1"],
        },
    }
