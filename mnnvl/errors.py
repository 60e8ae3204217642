"""One error family for the whole product; each class carries the CLI exit code.

Exit codes (``mnnvl.contract.exit_codes``): 0 ok, 2 bad input, 3 timeout, 4 workload or
verification failed, 5 cluster/API unavailable or CRD missing, 1 unexpected. The base class
and ``SpecError`` are defined in ``mnnvl.contract.errors`` (the worker's contract raises them)
and belong to this family's public names.
"""

from __future__ import annotations

from typing import Any

from mnnvl.contract import exit_codes
from mnnvl.contract.errors import MnnvlError, SpecError

__all__ = [
    "ClusterUnavailable",
    "ConflictError",
    "CrdMissing",
    "MnnvlError",
    "NoCluster",
    "NotProvisioned",
    "SpecError",
    "VerificationFailed",
    "WaitTimeout",
    "WorkloadFailed",
]


class ConflictError(MnnvlError):
    """An object with our name exists but does not belong to this run."""

    exit_code = exit_codes.BAD_INPUT


class NotProvisioned(MnnvlError):
    """A workload step found no ComputeDomain for its run (never provisioned, or torn down)."""

    exit_code = exit_codes.BAD_INPUT


class WaitTimeout(MnnvlError):
    """A wait ran past its deadline; the message holds the last observed state."""

    exit_code = exit_codes.TIMEOUT


class WorkloadFailed(MnnvlError):
    """A workload pod or Job failed (fail-fast), or its result was unusable.

    ``result`` holds rank 0's RESULT line when the worker printed one before failing
    (the verification worker does so for a FAIL verdict), so callers keep the numbers.
    ``pod_exit_code`` is the failed pod's container exit code when one was seen.
    """

    exit_code = exit_codes.FAILED

    def __init__(
        self,
        message: str,
        *,
        result: dict[str, Any] | None = None,
        pod_exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.result = result
        self.pod_exit_code = pod_exit_code


class VerificationFailed(WorkloadFailed):
    """NVLink/NCCL verification returned FAIL; the message carries the numbers."""

    exit_code = exit_codes.FAILED


class ClusterUnavailable(MnnvlError):
    """The Kubernetes API cannot be reached, refused us, or lacks a needed CRD."""

    exit_code = exit_codes.UNAVAILABLE


class NoCluster(ClusterUnavailable):
    """No cluster configuration could be loaded (none found, or a broken kubeconfig), so no
    request was sent to any API."""


class CrdMissing(ClusterUnavailable):
    """The ComputeDomain CRD (NVIDIA DRA driver) is not installed."""


class TeardownIncomplete(MnnvlError):
    """A teardown could not finish (the API stayed unreachable, or a deadline passed).

    ``leftovers`` names every object that may remain and ``cleanup`` the command that removes
    them; the exit code is the cause's (5 API unavailable, 3 deadline passed).
    """

    def __init__(self, message: str, *, exit_code: int, leftovers: list[str], cleanup: str):
        super().__init__(message)
        self.exit_code = exit_code
        self.leftovers = leftovers
        self.cleanup = cleanup
