"""The spec-hash annotation: what an object was created *for*, so a retry can tell.

A step that meets an object of its own run (a 409 on create) adopts it only when the object
was made from the same body: same kind, labels and ``spec`` (for a Job: the same module,
arguments, image, shape). The hash leaves out what legitimately differs between attempts of
one step (owner references, annotations) and what the server fills in (status, defaults:
the hash is read from the annotation, never recomputed from a server object).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SPEC_HASH_ANNOTATION = "mnnvl.io/spec-hash"


def spec_hash(body: dict[str, Any]) -> str:
    """A short, stable digest of ``body``'s identity: apiVersion, kind, labels and spec."""
    meta = body.get("metadata") or {}
    identity = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "labels": meta.get("labels") or {},
        "spec": body.get("spec"),
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_spec_hash(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``body`` carrying its spec hash as an annotation."""
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), SPEC_HASH_ANNOTATION: spec_hash(body)}
    return {**body, "metadata": meta}


def hash_of(obj: dict[str, Any]) -> str:
    """The spec hash an existing object was created with ("" when it carries none)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(SPEC_HASH_ANNOTATION, ""))
