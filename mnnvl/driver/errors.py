"""The driver's errors: the product's one family, plus the mapping from API failures into it.

``ApiException`` from the official client is turned into a family member exactly once, in
:func:`from_api_exception` (called by the retry helper), and chained with ``raise ... from e``.
``NotFound``, ``AlreadyExists``, ``Conflict`` and ``WatchExpired`` are signals the driver
handles itself (404 on delete is success, 409 on create means adopt-or-conflict, 409 on a
delete with a uid precondition means the object was replaced, 410 means re-list); they
only reach a user when something unexpected happened, and then they still say what failed.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from mnnvl.errors import (
    ClusterUnavailable,
    ConflictError,
    CrdMissing,
    MnnvlError,
    SpecError,
    VerificationFailed,
    WaitTimeout,
    WorkloadFailed,
)

__all__ = [
    "RBAC_HINT",
    "AlreadyExists",
    "ApiError",
    "ClusterUnavailable",
    "Conflict",
    "ConflictError",
    "CrdMissing",
    "MnnvlError",
    "NotFound",
    "Refused",
    "SpecError",
    "VerificationFailed",
    "WaitTimeout",
    "WatchExpired",
    "WorkloadFailed",
    "crd_missing",
    "from_api_exception",
]

RBAC_HINT = (
    "check that the namespace exists and that the launcher's service account has the "
    "mnnvl-runner Role of manifests/base/rbac.yaml there (kubectl apply -n <namespace> -k "
    "manifests/overlays/kfp, or manifests/overlays/argo); a Role only covers its own namespace"
)
DRA_INSTALL_HINT = (
    "install the NVIDIA DRA driver (chart nvidia/nvidia-dra-driver-gpu or "
    "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu) with "
    "resources.computeDomains.enabled=true"
)


class ApiError(MnnvlError):
    """The API refused a request for a reason no retry fixes (400, 422, unexpected 4xx/5xx)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Refused(ClusterUnavailable):
    """401/403 on a healthy connection: this account may not do that (RBAC, credentials)."""


class NotFound(ApiError):
    """404. ``details_kind``/``details_name`` say which object was missing, when the server said.

    A missing object or namespace comes back as a ``Status`` naming it in ``details``; an
    unknown resource type (a CRD that is not installed) comes back without details.
    """

    def __init__(self, message: str, *, details_kind: str = "", details_name: str = "") -> None:
        super().__init__(message, status=404, reason="NotFound")
        self.details_kind = details_kind
        self.details_name = details_name


class Conflict(ApiError):
    """409 on a write other than create: a precondition (uid, resourceVersion) did not hold."""


class AlreadyExists(Conflict):
    """409 on create: an object with that name exists."""


class WatchExpired(ApiError):
    """410 Gone: the watch's resourceVersion is too old; re-list and watch again."""


def api_status_body(e: ApiException) -> dict[str, Any]:
    """The ``Status`` object the API server sent with an error, or {} if it sent none."""
    try:
        body = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def crd_missing(namespace: str) -> CrdMissing:
    return CrdMissing(
        "the ComputeDomain API (computedomains.resource.nvidia.com) is not served in this "
        f"cluster (namespace {namespace}): {DRA_INSTALL_HINT}"
    )


def from_api_exception(e: ApiException, verb: str, what: str) -> MnnvlError:
    """Map an ``ApiException`` of ``verb`` on ``what`` (e.g. "computedomains x") to the family."""
    status = int(e.status or 0)
    body = api_status_body(e)
    message = str(body.get("message") or e.reason or "").strip()
    reason = str(body.get("reason") or e.reason or "")
    if status in (401, 403):
        return Refused(f"{verb} {what} was refused ({status} {reason}: {message}); {RBAC_HINT}")
    if status == 404:
        details = body.get("details") or {}
        return NotFound(
            f"{verb} {what}: not found ({message})",
            details_kind=str(details.get("kind") or ""),
            details_name=str(details.get("name") or ""),
        )
    if status == 409:
        conflict = AlreadyExists if verb == "create" else Conflict
        return conflict(f"{verb} {what}: {message}", status=status, reason=reason)
    if status == 410:
        return WatchExpired(f"{verb} {what}: {message}", status=status, reason=reason)
    if status in (429, 500, 502, 503, 504):
        return ClusterUnavailable(
            f"{verb} {what}: the API server kept answering {status} {reason} ({message}); "
            "check the API server's health and load"
        )
    return ApiError(
        f"{verb} {what} failed: {status} {reason}: {message}", status=status, reason=reason
    )
