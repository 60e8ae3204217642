"""Keeping a bad node out of a gang's next attempt, through the Job API only.

Every Job of the step is suspended (the Job controller deletes its pods), and once its pods
have all ended it is resumed with a ``NotIn`` term on ``kubernetes.io/hostname`` for the node,
ANDed into each of its required node-affinity terms (so a clique group's own clique still
applies: the spare comes from the same clique), in one patch.

Kubernetes 1.36 accepts that patch: a Job's pod template is immutable, except the scheduling
directives (node affinity, node selector, tolerations, scheduling gates, template labels and
annotations) of a suspended Job that never started or that carries the ``Suspended``
condition with no active pods (feature ``MutableSchedulingDirectivesForSuspendedJobs``, beta
and on by default in 1.36; ``pkg/apis/batch/validation/validation.go``
``validatePodTemplateUpdate``, its options from ``pkg/registry/batch/job/strategy.go``; the
Job controller also clears ``status.startTime`` on suspension, so ``activeDeadlineSeconds``
counts again from the resume). 1.34 and 1.35 allow it only before a Job first starts and
answer 422: there the Job is made again, the same body with the term (same name and
spec-hash annotation, so a rerun of the step adopts it), after its pods have ended.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from mnnvl.contract.exit_codes import COLLECTIVE_TIMEOUT
from mnnvl.driver.api import JOB, Api
from mnnvl.driver.attempts import Attempt
from mnnvl.driver.diagnose import CLAIMS_UNALLOCATABLE, pod_phase, unschedulable
from mnnvl.driver.wait import Objects
from mnnvl.errors import AlreadyExists, Invalid, ProblemKind, WorkloadFailed
from mnnvl.manifests import JOB_NAME_LABEL
from mnnvl.manifests.workload import HOSTNAME_LABEL

logger = logging.getLogger(__name__)
# On a Job the step suspended to keep this node out: a rerun of the step that finds the Job
# still suspended resumes it with the term, instead of taking it for a queued one.
EXCLUDING = "mnnvl.io/excluding-node"
# Labels the API server adds to a Job's template from its uid: a new Job must not carry them.
SERVER_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")


def excluded_nodes(job: dict[str, Any]) -> list[str]:
    """The nodes a Job's pod template keeps out (``NotIn`` on the hostname label)."""
    found: set[str] = set()
    for term in _terms(((job.get("spec") or {}).get("template") or {}).get("spec") or {}):
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "NotIn":
                found |= set(expr.get("values") or [])
    return sorted(found)


def without_node(affinity: dict[str, Any] | None, node: str) -> dict[str, Any]:
    """``affinity`` with ``node`` kept out of every required node-affinity term."""
    result = copy.deepcopy(affinity or {})
    required = result.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    )
    terms = required.setdefault("nodeSelectorTerms", []) or [{}]
    for term in terms:
        exprs = term.setdefault("matchExpressions", [])
        mine = next(
            (e for e in exprs if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn"),
            None,
        )
        if mine is None:
            exprs.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": [node]})
        elif node not in mine["values"]:
            mine["values"] = sorted({*mine["values"], node})
    required["nodeSelectorTerms"] = terms
    return result


class Exclusion:
    """One node being taken out of every Job of the step (suspend → wait → resume)."""

    def __init__(
        self, api: Api, namespace: str, jobs: list[str], node: str, suspend: bool = True
    ) -> None:
        self.api, self.namespace, self.node = api, namespace, node
        self.waiting = set(jobs)  # suspended, not yet resumed
        self.remade: dict[str, dict[str, Any]] = {}  # Job -> the body to create again
        mark = {"metadata": {"annotations": {EXCLUDING: node}}, "spec": {"suspend": True}}
        for name in jobs if suspend else ():
            self.api.patch(JOB, namespace, name, mark)

    def advance(self, jobs: Objects, pods: Objects) -> bool:
        """Resume each suspended Job whose pods have all ended; True once every one is."""
        for name in sorted(self.waiting):
            if name in self.remade:
                self._create(name)
                continue
            job = jobs.get(name)
            if job is None or not _settled(job, name, pods):
                continue
            self._resume(job)
        return not self.waiting

    def _resume(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        template = (job.get("spec") or {}).get("template") or {}
        affinity = without_node((template.get("spec") or {}).get("affinity"), self.node)
        patch = {
            "metadata": {"annotations": {EXCLUDING: None}},  # merge patch: null removes it
            "spec": {"suspend": False, "template": {"spec": {"affinity": affinity}}},
        }
        try:
            self.api.patch(JOB, self.namespace, name, patch)
        except Invalid as e:  # Kubernetes 1.34/1.35: the template of a Job that ran is fixed
            logger.info(
                "Job %s/%s: the API refused the node-affinity change of a suspended Job "
                "(%s); making the Job again with it",
                self.namespace,
                name,
                e,
            )
            self.remade[name] = _again(job, affinity)
            self.api.delete(
                JOB, self.namespace, name, propagation="Background", uid=job["metadata"]["uid"]
            )
            self._create(name)
            return
        self.waiting.discard(name)

    def _create(self, name: str) -> None:
        try:
            self.api.create(JOB, self.namespace, self.remade[name])
        except AlreadyExists:
            return  # the old Job is still going: the next change of the view tries again
        del self.remade[name]
        self.waiting.discard(name)


class NodeBlame:
    """The nodes a step's failed attempts were blamed on, and those kept out of its Jobs.

    A node blamed for two failed attempts, or for one with hardware evidence (NVLink,
    fabric, ECC, Xid), is excluded from the next attempt. The first pod to fail is blamed,
    unless its collective timed out: then it waited for a silent peer."""

    def __init__(self, api: Api, namespace: str, jobs: list[str], enabled: bool = True) -> None:
        self.api, self.namespace, self.jobs, self.enabled = api, namespace, jobs, enabled
        self.blamed: dict[str, int] = {}  # node -> failed attempts it was blamed for
        self.excluded: dict[str, str] = {}  # node -> the evidence that excluded it
        self.last: Attempt | None = None  # the failure that excluded the latest node
        self.exclusion: Exclusion | None = None  # a node being taken out of the Jobs now

    def suspect(self, attempt: Attempt) -> str | None:
        """Count the attempt against its node; the node when it is to be excluded now. A
        collective that timed out (exit 11) is not its node's doing: a peer was silent."""
        node = attempt.node
        if not node or node in self.excluded:
            return None
        if attempt.exit_code == COLLECTIVE_TIMEOUT and not attempt.hardware:
            return None
        self.blamed[node] = self.blamed.get(node, 0) + 1
        if not (attempt.hardware or self.blamed[node] >= 2):
            return None
        if self.enabled:
            return node
        logger.warning(
            "node %s failed the gang %d time(s) (%s), but Kueue admits these Jobs (it owns their "
            "suspension), so it is not kept out: `kubectl cordon %s` keeps it out",
            node,
            self.blamed[node],
            attempt.evidence,
            node,
        )
        return None

    def forgive(self, node: str) -> None:
        """One failed attempt no longer counts against ``node`` (it was not the node's)."""
        self.blamed[node] = max(0, self.blamed.get(node, 0) - 1)

    def exclude(self, node: str, attempt: Attempt) -> None:
        """Suspend every Job of the step; :meth:`excluding` resumes them with the term."""
        self.excluded[node] = attempt.evidence
        self.last = attempt
        logger.warning(
            "node %s is kept out of the next attempt (%s); suspending Job(s) %s to add a "
            "NotIn node-affinity term for it",
            node,
            "hardware evidence"
            if attempt.hardware
            else f"blamed for {self.blamed[node]} failed attempts",
            ", ".join(self.jobs),
        )
        self.exclusion = Exclusion(self.api, self.namespace, self.jobs, node)

    def adopt(self, jobs: Objects) -> None:
        """Carry on an exclusion an earlier attempt of the step began (a Job it suspended
        and marked, then lost): resume the Jobs with the term once their pods have ended."""
        if self.exclusion is not None or not self.enabled:
            return
        for name in self.jobs:
            meta = (jobs.get(name) or {}).get("metadata") or {}
            node = (meta.get("annotations") or {}).get(EXCLUDING)
            if node and ((jobs.get(name) or {}).get("spec") or {}).get("suspend"):
                logger.info(
                    "Job %s/%s was suspended to keep node %s out", self.namespace, name, node
                )
                self.excluded.setdefault(node, "kept out by an earlier attempt of this step")
                self.exclusion = Exclusion(self.api, self.namespace, self.jobs, node, suspend=False)
                return

    def excluding(self, jobs: Objects, pods: Objects) -> set[str] | None:
        """While a node is being excluded, the uids of the pods going with the suspension
        (the Jobs are resumed once those have ended); None once the view shows every Job
        resumed."""
        if self.exclusion is None:
            return None
        leaving: set[str] = set()
        if self.exclusion.waiting:
            leaving = {p["metadata"]["uid"] for p in pods.values()}
            self.exclusion.advance(jobs, pods)
        if self.exclusion.waiting or any(
            (jobs.get(n) or {"spec": {"suspend": True}})["spec"].get("suspend") for n in self.jobs
        ):
            return leaving
        self.exclusion = None
        return None

    def check_placed(self, fresh: Objects) -> None:
        """Fail at once when a pod of an attempt after an exclusion cannot be scheduled: no
        other node can take the excluded node's place. Device claims that cannot be allocated
        yet are left to the unschedulable grace: the last attempt's claims may still be
        being released."""
        if not self.excluded:
            return
        for name, pod in sorted(fresh.items()):
            why = unschedulable(pod)
            if not why or CLAIMS_UNALLOCATABLE in why:
                continue
            nodes = ", ".join(sorted(self.excluded))
            evidence = "; ".join(f"{n}: {e}" for n, e in sorted(self.excluded.items()))
            cordon = " && ".join(f"kubectl cordon {n}" for n in sorted(self.excluded))
            code = self.last.pod_exit_code if self.last is not None else None
            first = f"{self.last.names()} failed with exit code {code}; " if self.last else ""
            raise WorkloadFailed(
                f"{first}node {nodes} was excluded after failing ({evidence}), and no other "
                f"node can take pod {name}'s place ({why}); a platform team takes the node out "
                f"of service (`{cordon}`, or a NoSchedule taint) and frees or adds a node, then "
                "reruns the step; if the program fails this way on any node, fix it first "
                f"(`kubectl logs -n {self.namespace} {self.last.pod if self.last else name}`)",
                problem=ProblemKind.UNSCHEDULABLE,
                pod_exit_code=code,
            )


def _terms(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    node = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def _settled(job: dict[str, Any], name: str, pods: Objects) -> bool:
    """Suspended (the controller says so), no active pod and every pod of it ended or gone:
    then no replacement can be created beside a pod still on its node."""
    status = job.get("status") or {}
    suspended = any(
        c.get("type") == "Suspended" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    mine = [
        p for p in pods.values() if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == name
    ]
    ended = all(pod_phase(p) in ("Failed", "Succeeded") for p in mine)
    return suspended and not status.get("active") and ended


def _again(job: dict[str, Any], affinity: dict[str, Any]) -> dict[str, Any]:
    """The Job's body to create again: its own name, labels, annotations and owners, its spec
    without what the server made from its uid, resumed, with ``affinity``."""
    meta = job["metadata"]
    spec = copy.deepcopy(job["spec"])
    spec.pop("selector", None)
    spec["suspend"] = False
    template = spec["template"]
    labels = template.setdefault("metadata", {}).get("labels") or {}
    template["metadata"]["labels"] = {k: v for k, v in labels.items() if k not in SERVER_LABELS}
    template.setdefault("spec", {})["affinity"] = affinity
    keep = ("name", "namespace", "labels", "annotations", "ownerReferences")
    body = {k: copy.deepcopy(meta[k]) for k in keep if k in meta}
    body["annotations"] = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != EXCLUDING
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": body, "spec": spec}
