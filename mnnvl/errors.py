"""One error family for the whole product; each class carries the CLI exit code.

Exit codes (``mnnvl.contract.exit_codes``): 0 ok, 2 bad input, 3 timeout, 4 workload or
verification failed, 5 cluster/API unavailable or CRD missing, 1 unexpected, 128+N signal N.
The base class and ``SpecError`` are defined in ``mnnvl.contract.errors`` (the worker's
contract raises them) and belong to this family's public names. The driver maps the official
client's ``ApiException`` onto the family once (``mnnvl.driver.retry.from_api_exception``).
``NotFound``, ``AlreadyExists``, ``HttpConflict`` and ``WatchExpired`` are signals the driver
handles itself (404 on delete is success, 409 on create means adopt-or-refuse, 409 on a delete
with a uid precondition means the object was replaced, 410 means re-list); they only reach a
user when something unexpected happened, and then they still say what failed.
"""

from __future__ import annotations

import enum
import signal
from typing import Any

from mnnvl.contract import exit_codes
from mnnvl.contract.errors import MnnvlError
from mnnvl.contract.errors import SpecError as SpecError  # one of this family's names

DRA_INSTALL_HINT = (
    "install the NVIDIA DRA driver (chart nvidia/nvidia-dra-driver-gpu or "
    "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu) with "
    "resources.computeDomains.enabled=true"
)


class ProblemKind(enum.Enum):
    """What is wrong with a workload: one value per diagnosis the driver can make
    (``mnnvl.driver.problem`` words them); the errors of a failed step carry it."""

    UNSCHEDULABLE = "unschedulable"
    NO_CLIQUE_ROOM = "no clique room"
    NO_CLIQUE_LABEL = "clique label missing"
    CLAIM_UNALLOCATABLE = "device claim not allocatable"
    MISSING_CLAIM = "missing volume claim"
    IMAGE_PULL = "image pull"
    IMAGE_REFERENCE = "invalid image reference"
    CONFIG = "container config error"
    CRASH_LOOP = "crash loop"
    CRASHED = "crashed"
    OOM_KILLED = "OOMKilled"
    OUT_OF_MEMORY = "CUDA out of memory"
    STALLED = "stalled"
    COLLECTIVE_TIMEOUT = "collective timeout"
    LOST_NODE = "lost node"
    STRANDED = "pod stranded on a lost node"
    PREPARE = "channel prepare refused"
    PREPARE_PENDING = "channel prepare pending"
    IMEX_NOT_READY = "IMEX daemon never Ready"
    IMEX_IMPORT = "IMEX import refused"
    NODE_HELD = "node held by another domain"
    POD_SECURITY = "pod security"
    WEBHOOK = "webhook denial"
    SERVICE_ACCOUNT = "missing service account"
    MISSING_OBJECT = "missing object"
    INVALID_SPEC = "invalid spec"
    QUOTA = "quota"
    REFUSED = "refused"
    DEADLINE = "deadline"
    RESTARTS_EXHAUSTED = "restarts exhausted"


class NotAdoptable(MnnvlError):
    """An object with a name this run needs exists and cannot be adopted: it belongs to another
    run (or to nobody), is being deleted, or was made from another spec."""

    exit_code = exit_codes.BAD_INPUT


class NotProvisioned(MnnvlError):
    """A workload step found no ComputeDomain for its run (never provisioned, or torn down)."""

    exit_code = exit_codes.BAD_INPUT


class WaitTimeout(MnnvlError):
    """A wait ran past its deadline; the message holds the last observed state, ``problem``
    what the driver diagnosed when it did (None when it diagnosed nothing)."""

    exit_code = exit_codes.TIMEOUT

    def __init__(self, message: str, *, problem: ProblemKind | None = None) -> None:
        super().__init__(message)
        self.problem = problem


class WorkloadFailed(MnnvlError):
    """A workload pod or Job failed (fail-fast), or its result was unusable.

    ``result`` holds rank 0's RESULT line when the worker printed one before failing
    (the verification worker does so for a FAIL verdict), so callers keep the numbers.
    ``pod_exit_code`` is the failed pod's container exit code when one was seen, ``problem``
    what the driver diagnosed (None when it diagnosed nothing). ``permanent`` is False when the
    cause may clear without a change of input (a pod that could not be placed, a quota, a
    node held by another domain): a rerun of the step then runs it again.
    """

    exit_code = exit_codes.FAILED

    def __init__(
        self,
        message: str,
        *,
        result: dict[str, Any] | None = None,
        pod_exit_code: int | None = None,
        problem: ProblemKind | None = None,
        permanent: bool = True,
    ) -> None:
        super().__init__(message)
        self.result = result
        self.pod_exit_code = pod_exit_code
        self.problem = problem
        self.permanent = permanent


class VerificationFailed(WorkloadFailed):
    """NVLink/NCCL verification returned FAIL; the message carries the numbers."""


class ClusterUnavailable(MnnvlError):
    """The Kubernetes API cannot be reached, refused us, or lacks a needed CRD."""

    exit_code = exit_codes.UNAVAILABLE


class NoCluster(ClusterUnavailable):
    """No cluster configuration could be loaded (none found, or a broken kubeconfig), so no
    request was sent to any API."""


class CrdMissing(ClusterUnavailable):
    """The ComputeDomain CRD (NVIDIA DRA driver) is not installed."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            "the ComputeDomain API (computedomains.resource.nvidia.com) is not served in this "
            f"cluster (namespace {namespace}): {DRA_INSTALL_HINT}"
        )


class Refused(ClusterUnavailable):
    """401/403 on a healthy connection: this account may not do that (RBAC, credentials)."""


class ApiError(MnnvlError):
    """The API refused a request for a reason no retry fixes (400, 422, unexpected 4xx/5xx)."""


class NotFound(ApiError):
    """404. ``details_kind`` says what kind of object was missing, when the server said.

    A missing object or namespace comes back as a ``Status`` naming it in ``details``; an
    unknown resource type (a CRD that is not installed) comes back without details.
    """

    def __init__(self, message: str, *, details_kind: str = "") -> None:
        super().__init__(message)
        self.details_kind = details_kind


class HttpConflict(ApiError):
    """409 on a write other than create: a precondition (uid, resourceVersion) did not hold."""


class AlreadyExists(HttpConflict):
    """409 on create: an object with that name exists."""


class Invalid(ApiError):
    """422: the object (or the change to it) breaks one of the API server's validation rules."""


class WatchExpired(ApiError):
    """410 Gone: the watch's resourceVersion is too old; re-list and watch again."""


class TeardownIncomplete(MnnvlError):
    """A teardown could not finish (the API stayed unreachable, or a deadline passed).

    ``leftovers`` names every object that may remain and ``cleanup`` the command that removes
    them (every ``MnnvlError`` has both; ``mnnvl run`` copies them onto the step's error it
    ends with); the exit code is the cause's (5 API unavailable, 3 deadline passed).
    """

    def __init__(self, message: str, *, exit_code: int, leftovers: list[str], cleanup: str):
        super().__init__(message)
        self.exit_code = exit_code
        self.leftovers = tuple(leftovers)
        self.cleanup = cleanup


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived; raised in the main thread so ``finally`` blocks run (not an
    ``MnnvlError``: ``except Exception`` lets it through). Carries a teardown's leftovers as
    ``MnnvlError`` does."""

    leftovers: tuple[str, ...] = ()
    cleanup = ""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.exit_code = exit_codes.INTERRUPTED_BASE + signum
