"""What is wrong with a workload, as data: ``Problem(kind, message, pod, exit_code, permanent)``.

:mod:`mnnvl.driver.diagnose` reads the evidence (pod status, Events, the API's refusals) and
returns a ``Problem``; callers pick the step's exit code, the hint and whether to fail now from
``kind`` and ``permanent``, never from the sentence. Every sentence is written from
``TEMPLATES`` here, so rewording one changes no decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mnnvl.contract import exit_codes
from mnnvl.errors import ProblemKind, WaitTimeout, WorkloadFailed

# The one place each diagnosis is worded; fields are filled by ``problem()``.
UNSCHEDULABLE = "Unschedulable for more than {grace_s:g} s: "
REFUSED = "the API refused to create the pods of Job {job} (FailedCreate: {detail})"
STILL_REFUSED = REFUSED + "; still refused after {grace_s:g} s (--unschedulable-grace-s)"
EXITED = "Failed with exit code {code}"
TEMPLATES: dict[ProblemKind, str] = {
    ProblemKind.UNSCHEDULABLE: UNSCHEDULABLE + "{detail}",
    ProblemKind.NO_CLIQUE_ROOM: UNSCHEDULABLE + "{detail}",
    ProblemKind.NO_CLIQUE_LABEL: UNSCHEDULABLE + "at most {carrying} of {total} nodes carry the "
    "clique label {label} and a clique group needs {needed} nodes with one value of it ({detail})",
    ProblemKind.CLAIM_UNALLOCATABLE: UNSCHEDULABLE + "no node could allocate the pod's device "
    "claims ({detail})",
    ProblemKind.MISSING_CLAIM: "Unschedulable: {detail}",
    ProblemKind.IMAGE_PULL: "{detail}",
    ProblemKind.IMAGE_REFERENCE: "{detail}",
    ProblemKind.CONFIG: "CreateContainerConfigError: {detail}",
    ProblemKind.CRASH_LOOP: "CrashLoopBackOff",
    ProblemKind.CRASHED: EXITED,
    ProblemKind.OOM_KILLED: EXITED + " (OOMKilled: over its memory limit)",
    ProblemKind.OUT_OF_MEMORY: EXITED + " (CUDA out of memory)",
    ProblemKind.STALLED: EXITED + " (a worker stalled: no progress)",
    ProblemKind.COLLECTIVE_TIMEOUT: EXITED + " (a collective timed out on a peer)",
    ProblemKind.LOST_NODE: EXITED + " (its node's IMEX domain was lost: {detail})",
    ProblemKind.STRANDED: "node {node} was lost and pod {name} has stayed Terminating on it for "
    "more than {grace_s:g} s ({detail}): no kubelet finishes it while the Node object exists, so "
    "its Job never replaces index {index}",
    ProblemKind.PREPARE: "FailedPrepareDynamicResources: {detail}",
    ProblemKind.PREPARE_PENDING: "FailedPrepareDynamicResources, transient: the kubelet retries "
    "until the node's IMEX daemon is Ready in the domain ({detail})",
    ProblemKind.IMEX_NOT_READY: "pod {name} waited {elapsed_s:.0f} s in ContainerCreating on node "
    "{node}, whose IMEX daemon is not Ready in ComputeDomain {domain} ({state})",
    ProblemKind.IMEX_IMPORT: EXITED + ": CUDA refused to import a peer's memory through IMEX "
    "({detail}) although the domain's IMEX daemons look healthy",
    ProblemKind.NODE_HELD: "FailedPrepareDynamicResources for more than {grace_s:g} s: {detail}",
    ProblemKind.POD_SECURITY: REFUSED,
    ProblemKind.WEBHOOK: REFUSED,
    ProblemKind.SERVICE_ACCOUNT: REFUSED,
    ProblemKind.MISSING_OBJECT: REFUSED,
    ProblemKind.INVALID_SPEC: REFUSED,
    ProblemKind.QUOTA: STILL_REFUSED,
    ProblemKind.REFUSED: STILL_REFUSED,
    ProblemKind.DEADLINE: "Job {job} failed ({detail})",
    ProblemKind.RESTARTS_EXHAUSTED: "failed with exit code {code} after {restarts} restart(s) of "
    "every rank (--max-restarts {max_restarts})",
}

# Kinds that wait out the unschedulable grace before they fail a step (they may clear).
GRACED = frozenset(
    {
        ProblemKind.UNSCHEDULABLE,
        ProblemKind.NO_CLIQUE_ROOM,
        ProblemKind.NO_CLIQUE_LABEL,
        ProblemKind.CLAIM_UNALLOCATABLE,
        ProblemKind.NODE_HELD,
        ProblemKind.QUOTA,
        ProblemKind.REFUSED,
        ProblemKind.STRANDED,
    }
)

# Kinds found when a deadline passed (exit 3): the Job's, or the pods' to be Running.
TIMED_OUT = frozenset({ProblemKind.DEADLINE, ProblemKind.IMEX_NOT_READY})
# Kinds that clear by themselves: a step waits them out (bounded by its deadlines).
TRANSIENT = frozenset({ProblemKind.PREPARE_PENDING})


@dataclass(frozen=True)
class Problem:
    """A diagnosis: ``kind`` decides, ``message`` is for people.

    ``pod`` names the pod it is about ("" for a Job-level refusal), ``exit_code`` is that
    pod's container exit code when it exited, and ``permanent`` says no waiting clears it
    (a person must change the image, the namespace, the policy or the input)."""

    kind: ProblemKind
    message: str
    pod: str = ""
    exit_code: int | None = None
    permanent: bool = True

    def error(self, text: str) -> WaitTimeout | WorkloadFailed:
        """The step's error carrying ``text`` (the message with its evidence and hint) and
        the kind (callers decide by it): exit 3 when a deadline passed, else 4, and whether a
        rerun of the step with the same inputs fails the same way (``permanent``; a failed step
        records only those, see ``record_failure``): when no waiting clears the problem, and
        when a worker's exit ended the step (a code a restart cannot change, or its restarts
        spent)."""
        if self.kind in TIMED_OUT:
            return WaitTimeout(text, problem=self.kind)
        final = self.permanent or self.exit_code is not None
        return WorkloadFailed(
            text, pod_exit_code=self.exit_code, problem=self.kind, permanent=final
        )


def problem(
    kind: ProblemKind,
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


def exited_kind(code: int | None, reason: str, pod_reason: str) -> ProblemKind:
    """Which failure a terminated container's exit code and reasons (the container's
    ``terminated.reason``, the pod's ``status.reason``) show."""
    if pod_reason == "IMEXDomainLost":
        return ProblemKind.LOST_NODE
    if reason == "OOMKilled":
        return ProblemKind.OOM_KILLED
    return {
        exit_codes.OUT_OF_MEMORY: ProblemKind.OUT_OF_MEMORY,
        exit_codes.STALLED: ProblemKind.STALLED,
        exit_codes.COLLECTIVE_TIMEOUT: ProblemKind.COLLECTIVE_TIMEOUT,
    }.get(code if code is not None else -1, ProblemKind.CRASHED)
