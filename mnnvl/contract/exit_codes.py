"""Exit codes shared by the CLI, the errors and the worker pods (standard library only).

0 ok · 1 unexpected · 2 bad input · 3 timeout · 4 workload or verification failed ·
5 cluster/API unavailable or CRD missing; 128 + signal when interrupted (130 SIGINT,
143 SIGTERM): a workload step leaves its Job for a retry to adopt, ``mnnvl run`` tears down.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

OK = 0
UNEXPECTED = 1
BAD_INPUT = 2
TIMEOUT = 3
FAILED = 4
UNAVAILABLE = 5
INTERRUPTED_BASE = 128

# Worker pod exit codes beyond the CLI's (``python -m mnnvl.runtime.launch`` exits with them).
OUT_OF_MEMORY = 10
COLLECTIVE_TIMEOUT = 11
STALLED = 12
# Codes of their own rather than 127 and 2: the pod's status alone (``kubectl get pod``, a
# driver that reads no termination message) then says which failure it was.
MODULE_NOT_FOUND = 13
CHECKPOINT_MISMATCH = 14
CANNOT_EXECUTE = 126  # the program exists but cannot be executed (shell convention)
PROGRAM_NOT_FOUND = 127  # the shell's "command not found"
# The container runtime could not start the container's program (containerd/CRI-O report a
# StartError with exit code 128, as the simulator's kubelet does for a missing program).
CANNOT_START = 128


@dataclass(frozen=True)
class ExitClass:
    """What one worker pod exit code means and whether a gang restart may clear it."""

    code: int
    reason: str  # the termination message's ``reason`` (``mnnvl.contract.termination``)
    cause: str
    retried: bool


# The one classification table of worker pod failures. ``retried=False``: a restart runs the
# same program on the same input and fails the same way, so the Job's podFailurePolicy fails
# the whole Job at once and the driver restarts nothing. Any code not listed (1: a crash, a
# rank lost, a rendezvous error; 128 + N: killed by signal N) is retried by a gang restart,
# at most max_restarts times.
TABLE = (
    ExitClass(BAD_INPUT, "bad-input", "bad input (argparse or a SpecError)", False),
    ExitClass(FAILED, "failed", "failed verification or training (non-finite loss)", False),
    ExitClass(OUT_OF_MEMORY, "out-of-memory", "CUDA out of memory", False),
    ExitClass(COLLECTIVE_TIMEOUT, "collective-timeout", "a collective timed out", True),
    ExitClass(STALLED, "stalled", "a worker made no progress (stall watchdog)", True),
    ExitClass(MODULE_NOT_FOUND, "module-not-found", "the module to run is not in the image", False),
    ExitClass(
        CHECKPOINT_MISMATCH,
        "checkpoint-mismatch",
        "the checkpoint directory holds another model or shape",
        False,
    ),
    ExitClass(CANNOT_EXECUTE, "cannot-execute", "the program cannot be executed", False),
    ExitClass(PROGRAM_NOT_FOUND, "program-not-found", "the program is not in the image", False),
    ExitClass(CANNOT_START, "cannot-start", "the container runtime could not start it", False),
)
NON_RETRIABLE_EXIT_CODES = tuple(c.code for c in TABLE if not c.retried)


def reason(code: int) -> str:
    """A worker's exit code as a short cause: the table's, ``killed`` (a signal), ``crashed``."""
    for row in TABLE:
        if row.code == code:
            return row.reason
    return "killed" if code > INTERRUPTED_BASE else "crashed"


# Exit codes of a launcher step (the ``mnnvl`` CLI) that a retry cannot change: bad input or a
# conflict, a failed workload or verification. 1, 3, 5 and a killed pod may clear.
NON_RETRIABLE_STEP_EXIT_CODES = (BAD_INPUT, FAILED)


# Exit codes of a launcher step whose pod was lost under it, not its workload: 143 stopped by
# SIGTERM (a node drain, an eviction: a workload step leaves its Job running and exits so),
# 137 killed (an OOM-killed launcher, or SIGTERM's grace period ran out). Argo reports "-1"
# for a pod that went before its container reported an exit code.
LOST_STEP_EXIT_CODES = (INTERRUPTED_BASE + 9, INTERRUPTED_BASE + 15)


def argo_retry_expression() -> str:
    """Argo's ``retryStrategy.expression``: retry unless the step exited with a code that a
    retry cannot change (Argo compares exit codes as strings)."""
    codes = ", ".join(f"'{code}'" for code in NON_RETRIABLE_STEP_EXIT_CODES)
    return f"!(lastRetry.exitCode in [{codes}])"


def argo_lost_pod_retry_expression() -> str:
    """Argo's ``retryStrategy.expression`` of the workload steps (train, verify, launch):
    retry a step whose pod was lost (an ``Error`` node, such as ``pod deleted``, or a lost
    step's exit code; a retry adopts the Job), never one that ended by itself (its workload
    failed, bad input, a deadline) nor one its own ``activeDeadlineSeconds`` stopped."""
    codes = ", ".join(f"'{code}'" for code in (*LOST_STEP_EXIT_CODES, -1))
    return (
        f"(lastRetry.status == 'Error' || lastRetry.exitCode in [{codes}]) "
        "&& !(lastRetry.message matches 'deadline')"
    )


def shell_code(exitcode: int) -> int:
    """A process exit status as a shell reports it: -N (killed by signal N) -> 128 + N."""
    return INTERRUPTED_BASE - exitcode if exitcode < 0 else exitcode


def worst_exit_code(failures: Iterable[tuple[float, int]]) -> int:
    """The exit code a node reports for its workers' ``(timestamp, exitcode)`` pairs
    (``exitcode`` as ``os.waitstatus_to_exitcode`` gives it: -N when killed by signal N).

    * A code a retry cannot change (``NON_RETRIABLE_EXIT_CODES``) when any worker exited
      with one, the earliest winning;
    * otherwise the earliest failure that exited by itself, else the earliest one killed by
      a signal (the launcher stops the surviving workers with SIGTERM once one failed, so
      those count as killed too and never hide the cause), as 128 + the signal number;
    * 0 when every worker exited 0.
    """
    ordered = [code for _, code in sorted(failures, key=lambda f: f[0]) if code != 0]
    for code in ordered:
        if code in NON_RETRIABLE_EXIT_CODES:
            return code
    exited = [code for code in ordered if code > 0] + [code for code in ordered if code < 0]
    return shell_code(exited[0]) if exited else OK
