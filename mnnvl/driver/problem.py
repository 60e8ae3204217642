"""What is wrong with a workload, as data: ``Problem(kind, message, pod, exit_code, permanent)``.

:mod:`mnnvl.driver.diagnose` reads the evidence (pod status, Events, the API's refusals) and
returns a ``Problem``; callers pick the step's exit code, the hint and whether to fail now from
``kind`` and ``permanent``, never from the sentence. Every sentence is written from
``TEMPLATES`` here, so rewording one changes no decision.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from mnnvl.contract import exit_codes
from mnnvl.errors import MnnvlError, WaitTimeout, WorkloadFailed


class Kind(enum.Enum):
    """One value per diagnosis the driver can make."""

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


# The one place each diagnosis is worded; fields are filled by ``problem()``.
TEMPLATES: dict[Kind, str] = {
    Kind.UNSCHEDULABLE: "Unschedulable for more than {grace_s:g} s: {detail}",
    Kind.NO_CLIQUE_ROOM: "Unschedulable for more than {grace_s:g} s: {detail}",
    Kind.NO_CLIQUE_LABEL: "Unschedulable for more than {grace_s:g} s: at most {carrying} of "
    "{total} nodes carry the clique label {label} and a clique group needs {needed} nodes with "
    "one value of it ({detail})",
    Kind.CLAIM_UNALLOCATABLE: "Unschedulable for more than {grace_s:g} s: no node could allocate "
    "the pod's device claims ({detail})",
    Kind.MISSING_CLAIM: "Unschedulable: {detail}",
    Kind.IMAGE_PULL: "{detail}",
    Kind.IMAGE_REFERENCE: "{detail}",
    Kind.CONFIG: "CreateContainerConfigError: {detail}",
    Kind.CRASH_LOOP: "CrashLoopBackOff",
    Kind.CRASHED: "Failed with exit code {code}",
    Kind.OOM_KILLED: "Failed with exit code {code} (OOMKilled: over its memory limit)",
    Kind.OUT_OF_MEMORY: "Failed with exit code {code} (CUDA out of memory)",
    Kind.STALLED: "Failed with exit code {code} (a worker stalled: no progress)",
    Kind.COLLECTIVE_TIMEOUT: "Failed with exit code {code} (a collective timed out on a peer)",
    Kind.LOST_NODE: "Failed with exit code {code} (its node's IMEX domain was lost: {detail})",
    Kind.STRANDED: "node {node} was lost and pod {name} has stayed Terminating on it for more "
    "than {grace_s:g} s ({detail}): no kubelet finishes it while the Node object exists, so its "
    "Job never replaces index {index}",
    Kind.PREPARE: "FailedPrepareDynamicResources: {detail}",
    Kind.PREPARE_PENDING: "FailedPrepareDynamicResources, transient: the kubelet retries until "
    "the node's IMEX daemon is Ready in the domain ({detail})",
    Kind.IMEX_NOT_READY: "pod {name} waited {elapsed_s:.0f} s in ContainerCreating on node "
    "{node}, whose IMEX daemon is not Ready in ComputeDomain {domain} ({state})",
    Kind.IMEX_IMPORT: "Failed with exit code {code}: CUDA refused to import a peer's memory "
    "through IMEX ({detail}) although the domain's IMEX daemons look healthy",
    Kind.NODE_HELD: "FailedPrepareDynamicResources for more than {grace_s:g} s: {detail}",
    Kind.POD_SECURITY: "the API refused to create the pods of Job {job} (FailedCreate: {detail})",
    Kind.WEBHOOK: "the API refused to create the pods of Job {job} (FailedCreate: {detail})",
    Kind.SERVICE_ACCOUNT: "the API refused to create the pods of Job {job} (FailedCreate: "
    "{detail})",
    Kind.MISSING_OBJECT: "the API refused to create the pods of Job {job} (FailedCreate: {detail})",
    Kind.INVALID_SPEC: "the API refused to create the pods of Job {job} (FailedCreate: {detail})",
    Kind.QUOTA: "the API refused to create the pods of Job {job} (FailedCreate: {detail}); "
    "still refused after {grace_s:g} s (--unschedulable-grace-s)",
    Kind.REFUSED: "the API refused to create the pods of Job {job} (FailedCreate: {detail}); "
    "still refused after {grace_s:g} s (--unschedulable-grace-s)",
    Kind.DEADLINE: "Job {job} failed ({detail})",
    Kind.RESTARTS_EXHAUSTED: "failed with exit code {code} after {restarts} restart(s) of every "
    "rank (--max-restarts {max_restarts})",
}

# Kinds that wait out the unschedulable grace before they fail a step (they may clear).
GRACED = frozenset(
    {
        Kind.UNSCHEDULABLE,
        Kind.NO_CLIQUE_ROOM,
        Kind.NO_CLIQUE_LABEL,
        Kind.CLAIM_UNALLOCATABLE,
        Kind.NODE_HELD,
        Kind.QUOTA,
        Kind.REFUSED,
        Kind.STRANDED,
    }
)

# Kinds found when a deadline passed (exit 3): the Job's, or the pods' to be Running.
TIMED_OUT = frozenset({Kind.DEADLINE, Kind.IMEX_NOT_READY})
# Kinds that clear by themselves: a step waits them out (bounded by its deadlines).
TRANSIENT = frozenset({Kind.PREPARE_PENDING})


@dataclass(frozen=True)
class Problem:
    """A diagnosis: ``kind`` decides, ``message`` is for people.

    ``pod`` names the pod it is about ("" for a Job-level refusal), ``exit_code`` is that
    pod's container exit code when it exited, and ``permanent`` says no waiting clears it
    (a person must change the image, the namespace, the policy or the input)."""

    kind: Kind
    message: str
    pod: str = ""
    exit_code: int | None = None
    permanent: bool = True

    def step_exit_code(self) -> int:
        """The step's exit code: 3 when a deadline passed, else 4 (the workload failed)."""
        return exit_codes.TIMEOUT if self.kind in TIMED_OUT else exit_codes.FAILED

    def error(self, text: str) -> MnnvlError:
        """The step's error carrying ``text`` (the message with its evidence and hint)."""
        err: MnnvlError
        if self.step_exit_code() == exit_codes.TIMEOUT:
            err = WaitTimeout(text)
        else:
            err = WorkloadFailed(text, pod_exit_code=self.exit_code)
        setattr(err, "problem_kind", self.kind)  # noqa: B010  (callers decide by the kind)
        return err


def problem(
    kind: Kind,
    *,
    pod: str = "",
    exit_code: int | None = None,
    permanent: bool | None = None,
    **fields: Any,
) -> Problem:
    """A ``Problem`` worded from ``TEMPLATES[kind]``; permanent unless the kind is graced."""
    message = TEMPLATES[kind].format(code=exit_code, **fields)
    return Problem(
        kind,
        message,
        pod=pod,
        exit_code=exit_code,
        permanent=kind not in GRACED | TRANSIENT if permanent is None else permanent,
    )


def exited_kind(code: int | None, reason: str, pod_reason: str) -> Kind:
    """Which failure a terminated container's exit code and reasons (the container's
    ``terminated.reason``, the pod's ``status.reason``) show."""
    if pod_reason == "IMEXDomainLost":
        return Kind.LOST_NODE
    if reason == "OOMKilled":
        return Kind.OOM_KILLED
    return {
        exit_codes.OUT_OF_MEMORY: Kind.OUT_OF_MEMORY,
        exit_codes.STALLED: Kind.STALLED,
        exit_codes.COLLECTIVE_TIMEOUT: Kind.COLLECTIVE_TIMEOUT,
    }.get(code if code is not None else -1, Kind.CRASHED)
