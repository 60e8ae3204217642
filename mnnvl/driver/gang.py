"""Gang restart: a run is one gang, so when one pod fails in a way a retry can fix, every
other pod of the step is deleted at once and all ranks restart together from the last
checkpoint, instead of the survivors waiting in a collective for a peer that is gone.

The Job controller creates the replacement pods (``backoffLimitPerIndex``); this module only
decides, deletes and keeps the record: which pod failed with which code, rank 0's last step
before the failure (from its log), and when the restarted rank 0 logged its first step.

A pod failure is retriable when its exit code is not one of
``exit_codes.NON_RETRIABLE_EXIT_CODES`` (those fail the Job through its podFailurePolicy)
and its index has a retry left: an index's attempts are the distinct pods it has had, since
a Job counts a pod deleted before it succeeded as a failed attempt. ``--max-restarts`` bounds
the restarts of the step.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from mnnvl.contract.exit_codes import NON_RETRIABLE_EXIT_CODES
from mnnvl.driver.api import POD, Api
from mnnvl.driver.diagnose import exit_code, pod_index
from mnnvl.driver.problem import Kind, problem
from mnnvl.driver.wait import Objects
from mnnvl.manifests import JOB_NAME_LABEL
from mnnvl.spec import WorkloadSpec

logger = logging.getLogger(__name__)

STEP_LINE = re.compile(r"\bstep (\d+)\b")  # rank 0's training log line, "step 1450 loss ..."


@dataclass
class Progress:
    """The last step rank 0 logged and when (monotonic), and its first one."""

    first: tuple[int, float] | None = None
    last: tuple[int, float] | None = None

    def line(self, text: str) -> None:
        m = STEP_LINE.search(text)
        if m:
            seen = (int(m.group(1)), time.monotonic())
            self.first = self.first or seen
            self.last = seen

    def describe(self) -> str:
        if self.last is None:
            return "rank 0 has logged no step yet"
        return f"rank 0 at step {self.last[0]}, {time.monotonic() - self.last[1]:.0f} s ago"


@dataclass
class Restart:
    pod: str
    exit_code: int | None
    at: float  # monotonic time the driver saw the failure
    last_step: int | None  # rank 0's last logged step before it
    after: Progress = field(default_factory=Progress)  # rank 0's log after the restart

    def record(self) -> dict[str, Any]:
        """``steps_lost``: steps rank 0 had logged past the step the restart resumed from;
        ``recovery_s``: from the failure to the restarted rank 0's first step."""
        first = self.after.first
        lost = None
        if first is not None and self.last_step is not None:
            lost = max(0, self.last_step - (first[0] - 1))
        return {
            "pod": self.pod,
            "exit_code": self.exit_code,
            "steps_lost": lost,
            "recovery_s": None if first is None else round(first[1] - self.at, 3),
        }


def _key(pod: dict[str, Any]) -> tuple[str, str]:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(JOB_NAME_LABEL, ""), pod_index(pod)


class Gang:
    """Watches the step's pods for a retriable failure and restarts every rank."""

    def __init__(self, api: Api, workload: WorkloadSpec) -> None:
        self.api, self.workload = api, workload
        self.attempts: dict[tuple[str, str], set[str]] = {}  # (Job, index) -> pod uids
        self.old: set[str] = set()  # pods of generations already restarted
        self.restarts: list[Restart] = []

    def check(self, pods: Objects, rank0: Progress | None) -> bool:
        """Restart the gang when a pod of the current generation failed retriably; True when
        it did. Raises ``WorkloadFailed`` past ``--max-restarts``."""
        for each in pods.values():
            self.attempts.setdefault(_key(each), set()).add(each["metadata"]["uid"])
        failed = [
            p
            for p in sorted(pods.values(), key=pod_index)
            if (p.get("status") or {}).get("phase") == "Failed"
            and p["metadata"]["uid"] not in self.old
        ]
        pod: dict[str, Any] | None = next((p for p in failed if self._retriable(p)), None)
        if pod is None:
            return False
        name, code = pod["metadata"]["name"], exit_code(pod)
        if len(self.restarts) >= self.workload.max_restarts:
            found = problem(
                Kind.RESTARTS_EXHAUSTED,
                pod=name,
                exit_code=code,
                restarts=len(self.restarts),
                max_restarts=self.workload.max_restarts,
            )
            logs = f"`kubectl logs -n {self.workload.namespace} {name}`"
            raise found.error(f"pod {name} {found.message}; check {logs}")
        last = rank0.last[0] if rank0 is not None and rank0.last else None
        self.restarts.append(Restart(name, code, time.monotonic(), last))
        logger.warning(
            "pod %s failed with exit code %s (retriable); restarting every rank from the last "
            "checkpoint (restart %d of at most %d; %s)",
            name,
            code,
            len(self.restarts),
            self.workload.max_restarts,
            rank0.describe() if rank0 is not None else "rank 0 not followed yet",
        )
        self._delete_others(pods, pod)
        self.old |= {p["metadata"]["uid"] for p in pods.values()}
        return True

    def _retriable(self, pod: dict[str, Any]) -> bool:
        code = exit_code(pod)
        if code in NON_RETRIABLE_EXIT_CODES or self.workload.backoff_limit_per_index == 0:
            return False
        return len(self.attempts[_key(pod)]) <= self.workload.backoff_limit_per_index

    def _delete_others(self, pods: Objects, failed: dict[str, Any]) -> None:
        ns = self.workload.namespace
        for pod in pods.values():
            meta = pod["metadata"]
            phase = (pod.get("status") or {}).get("phase")
            if pod is failed or phase in ("Failed", "Succeeded") or meta.get("deletionTimestamp"):
                continue
            logger.info("deleting pod %s/%s so that it restarts with the others", ns, meta["name"])
            self.api.delete(POD, ns, meta["name"], uid=meta["uid"])

    def summary(self) -> list[dict[str, Any]]:
        return [r.record() for r in self.restarts]
