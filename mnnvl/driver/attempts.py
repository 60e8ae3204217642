"""What failed in one failed attempt of a gang, read from pod status only, and the failure
that ended a Job for good (:func:`job_failure`), attributed the same way.

The first pod of the attempt to fail (the earliest ``finishedAt``; the lowest index on a tie)
is the one blamed: its node, the rank and GPU that failed first and the evidence, from the
worker container's termination message (:mod:`mnnvl.contract.termination`, which the
launcher writes) or, for a program that writes none, the last log lines the kubelet put
there instead (``terminationMessagePolicy: FallbackToLogsOnError``); no log is read to
attribute an attempt.
:class:`Restart` is the record of the restart that followed, with what it cost.
"""

from __future__ import annotations

import calendar
import dataclasses
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mnnvl.contract.termination import STOP, Evidence, parse
from mnnvl.driver.api import POD, Api
from mnnvl.driver.diagnose import (
    exit_code,
    failed_problem,
    hint,
    imex_import,
    index_set,
    last_failures,
    log_tail,
    node_of,
    pod_events,
    pod_index,
    pod_phase,
    terminated,
)
from mnnvl.driver.domain import domain_state
from mnnvl.driver.problem import Problem, problem
from mnnvl.driver.rank0 import Rank0Progress
from mnnvl.errors import ProblemKind
from mnnvl.inputs.names import LABEL_CLIQUE_GROUP, RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import JOB_NAME_LABEL

LOG_LINES = 3  # of a log tail the kubelet handed over instead of a message: the last lines


@dataclass
class Attempt:
    """One failed attempt, as the driver attributes it (the record's keys are the report's)."""

    pod: str
    node: str | None
    rank: int | None
    gpu: str | None
    exit_code: int | None
    reason: str
    evidence: str  # one human line
    at: str  # RFC 3339 UTC of the fault as seen: the container's finishedAt, else now
    detect_s: float | None  # from finishedAt to the driver seeing it
    step: str | None = None  # the last step the failing worker reported, when it said
    words: str = ""  # the worker's own last line, when it said
    hardware: bool = False  # NVLink, fabric, ECC or Xid evidence: the node is suspect at once
    stop: bool = False  # the worker's launcher says no restart can change it
    pod_exit_code: int | None = None  # the container's own, as the other pods' compare

    def names(self) -> str:
        """``pod P (rank R, GPU G) on node N``, with what is known."""
        who = ", ".join(
            part
            for part in (
                f"rank {self.rank}" if self.rank is not None else "",
                f"GPU {self.gpu}" if self.gpu is not None else "",
            )
            if part
        )
        return f"pod {self.pod}{f' ({who})' if who else ''} on node {self.node or 'unknown'}"

    def signature(self) -> tuple[Any, ...] | None:
        """What makes two failures "the same error at the same step" (None: not knowable)."""
        if self.step is None or not self.words:
            return None
        return (self.exit_code, self.step, self.words)


def attribute(
    failed: list[dict[str, Any]], workload: WorkloadSpec, tail: Callable[[str], str] | None = None
) -> Attempt:
    """The attempt's first failure among ``failed`` (pods of one generation). ``tail(pod)``:
    its log's last lines, read only when its evidence carries no words of the worker (one that
    printed its error and exited, which its launcher cannot see)."""
    pod = min(failed, key=lambda p: (_finished(p) or "~", int(pod_index(p) or 0)))
    state = terminated(pod)
    message = str(state.get("message") or "")
    said = parse(message)
    if said is not None and not said.error and tail is not None:
        said = dataclasses.replace(said, error=tail(pod["metadata"]["name"]))
        message = said.error
    evidence = said or Evidence(error=message)
    code = evidence.exit_code if evidence.exit_code is not None else exit_code(pod)
    finished = _finished(pod)
    seen = time.time()
    at = finished or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen))
    detect = None if finished is None else round(max(0.0, seen - _epoch(finished)), 3)
    lines = [line.strip() for line in evidence.error.splitlines() if line.strip()]
    return Attempt(
        pod=pod["metadata"]["name"],
        node=(pod.get("spec") or {}).get("nodeName"),
        rank=evidence.rank if evidence.rank is not None else _first_rank(pod, workload),
        gpu=evidence.gpu,
        exit_code=code,
        reason=evidence.reason or str(state.get("reason") or ""),
        evidence=describe(evidence, code, LOG_LINES if message == evidence.error else 1),
        at=at,
        detect_s=detect,
        step=evidence.step,
        words=lines[-1] if lines else "",
        hardware=evidence.hardware,
        stop=evidence.verdict == STOP,
        pod_exit_code=exit_code(pod),
    )


def job_failure(
    api: Api,
    workload: WorkloadSpec,
    job: str,
    failed: dict[str, Any],
    failed_indexes: str,
    restarts: int = 0,
) -> Problem:
    """The Job's Failed condition plus its last failures: kind ``DEADLINE`` when the Job ran
    past its ``activeDeadlineSeconds``, else the diagnosis of the last failed pod of a failed
    index, attributed as each failed attempt is (:func:`attribute`: pod,
    rank, GPU, node and the evidence of its termination message), with events and log tail
    (``CRASHED`` when no failed pod is left to inspect), and the last failed pods of the other
    indexes with their exit codes. After gang restarts an index has a failed pod per attempt:
    the last one is why the Job failed, and the indexes of ``status.failedIndexes`` come first
    (a pod that a restart deleted is not)."""
    ns, domain = workload.namespace, RunNames.for_run(workload.run_id).domain
    condition = f"{failed.get('reason')}: {failed.get('message')}"
    head = problem(ProblemKind.DEADLINE, job=f"{ns}/{job}", detail=condition).message
    if restarts:
        head += (
            f" after {restarts} restart(s) of every rank "
            f"(--max-restarts {workload.recovery.max_restarts})"
        )
    pods = api.list(POD, ns, label_selector=f"{JOB_NAME_LABEL}={job}")["items"]
    bad = last_failures(pods, index_set(failed_indexes))
    found = failed_problem(bad[0]) if bad else problem(ProblemKind.CRASHED, permanent=True)
    tail = log_tail(api, ns, bad[0]["metadata"]["name"]) if bad else ""
    found = imex_import(found, tail) or found
    if failed.get("reason") == "DeadlineExceeded":  # the Job condition's reason: API data
        found = replace(found, kind=ProblemKind.DEADLINE)
    if not bad:
        evidence = f"no failed pod left to inspect; {domain_state(api, domain, ns)}"
        return replace(found, message=f"{head}; {evidence}")
    name, ended = found.pod, attribute(bad[:1], workload, lambda _pod: tail)
    others = "".join(
        f"; also pod {p['metadata']['name']} (index {pod_index(p)}) failed with exit code "
        f"{exit_code(p)}"
        for p in bad[1:]
    )
    return replace(
        found,
        message=f"{head}; {ended.names()} (index {pod_index(bad[0])}): {found.message}; "
        f"{ended.evidence}; events: {pod_events(api, ns, name)}; "
        f"{hint(found, ns, node_of(bad[0]))}{others}; "
        f"last log lines of {name}:\n{tail}",
    )


@dataclass
class Restart:
    attempt: Attempt  # what failed
    seen: float  # monotonic time the driver saw the failure
    last_step: int | None  # rank 0's last logged step before it
    after: Rank0Progress = field(default_factory=Rank0Progress)  # rank 0's log after the restart
    running: float | None = None  # monotonic: every pod of the next generation Running
    excluded: str | None = None  # the node kept out of the next attempt
    generation: set[str] = field(default_factory=set)  # uids of the attempt's pods
    blamed: bool = False  # counted against its node

    def record(self) -> dict[str, Any]:
        """One flat, JSON-able record: what failed (:class:`Attempt`), ``excluded``, and
        ``detect_s`` (fault → seen), ``restart_s`` (seen → every new pod Running),
        ``recovery_s`` (fault, or when it was seen, → the restarted rank 0's first step),
        ``steps_lost`` (steps rank 0 had logged past the step the restart resumed from)."""
        a, first = self.attempt, self.after.first
        lost = None
        if first is not None and self.last_step is not None:
            lost = max(0, self.last_step - (first[0] - 1))
        recovery = None if first is None else round(first[1] - self.seen + (a.detect_s or 0), 3)
        restart = None if self.running is None else round(self.running - self.seen, 3)
        keys = ("pod", "node", "rank", "gpu", "exit_code", "reason", "evidence", "at", "detect_s")
        return {
            "how": "recreated",
            **{k: getattr(a, k) for k in keys},
            "excluded": self.excluded,
            "restart_s": restart,
            "recovery_s": recovery,
            "steps_lost": lost,
        }


def failed_elsewhere(attempt: Attempt, pods: list[dict[str, Any]]) -> bool:
    """Whether a pod on another node failed with the attempt's exit code (not being deleted:
    a pod a restart deletes is no failure of its own)."""
    return any(
        pod_phase(p) == "Failed"
        and not p["metadata"].get("deletionTimestamp")
        and (p.get("spec") or {}).get("nodeName") != attempt.node
        and exit_code(p) == attempt.pod_exit_code
        for p in pods
    )


def no_restart_helps(attempt: Attempt, before: Attempt | None) -> str:
    """Why a restart cannot change this failure ("" when it may): the worker's launcher said
    so (``verdict: stop``), or the same error at the same step as the attempt ``before``, on
    another node (one that repeats on one node only is that node's: exclusion)."""
    if attempt.stop:
        return (
            f"{attempt.names()} failed in a way no restart can change ({attempt.reason}: "
            f"{attempt.evidence})"
        )
    if before is None or attempt.node == before.node:
        return ""
    if attempt.signature() is None or attempt.signature() != before.signature():
        return ""
    return (
        f"{attempt.names()} failed with the same error at {_step(attempt.step)} as "
        f"{before.names()} in the attempt before, so a restart cannot change it "
        f"({attempt.evidence})"
    )


def describe(evidence: Evidence, code: int | None, lines_kept: int = 1) -> str:
    """One human line: how it ended, the hardware evidence, the worker's last line (its
    log's last ``lines_kept`` lines, joined by " | ", where only the log tail was handed
    over: the launcher's own closing line may follow the worker's words)."""
    parts = [_ending(code)]
    for gpu, counters in sorted(evidence.nvlink.items()):
        rising = ", ".join(f"{k} +{v}" for k, v in sorted(counters.items()) if v)
        parts.append(f"NVLink errors on GPU {gpu}: {rising}")
    parts += [f"fabric on GPU {gpu}: {text}" for gpu, text in sorted(evidence.fabric.items())]
    parts += [f"ECC errors on GPU {gpu}: {n}" for gpu, n in sorted(evidence.ecc.items())]
    parts += [f"Xid {xid} on GPU {gpu}" for gpu, xid in evidence.xid]
    if evidence.step is not None:
        parts.append(f"at {_step(evidence.step)}")
    lines = [line.strip()[:300] for line in evidence.error.splitlines() if line.strip()]
    if lines:
        kept = lines[-lines_kept:]
        parts.append(f"last line{'s' if len(kept) > 1 else ''}: {' | '.join(kept)}")
    return "; ".join(parts)


def _ending(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code > 128:
        try:
            return f"exit code {code} (signal {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exit code {code}"


def _first_rank(pod: dict[str, Any], workload: WorkloadSpec) -> int | None:
    """The pod's first global rank: its node rank (the clique group's base plus its
    completion index) times the processes per node."""
    index = pod_index(pod)
    if not index.isdigit():
        return None
    group = str(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_CLIQUE_GROUP, ""))
    base = int(group) * workload.group_nodes if group.isdigit() else 0
    return (base + int(index)) * workload.procs_per_node


def _finished(pod: dict[str, Any]) -> str | None:
    value = terminated(pod).get("finishedAt")
    return str(value) if value else None


def _epoch(rfc3339: str) -> float:
    return float(calendar.timegm(time.strptime(rfc3339[:19], "%Y-%m-%dT%H:%M:%S")))


def _step(step: str | None) -> str:
    """The worker's last progress as words: "40" and "step 40" both read "step 40"."""
    text = str(step or "")
    return f"step {text}" if text[:1].isdigit() else text
