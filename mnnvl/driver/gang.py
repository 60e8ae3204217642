"""Gang restart: a run is one gang, so when one pod fails in a way a retry can fix, every
other pod of the step is deleted at once and all ranks restart together from the last
checkpoint, instead of the survivors waiting in a collective for a peer that is gone.

The Job controller creates the replacement pods (``backoffLimitPerIndex``, which the Job
builder sets to ``--max-restarts``); this module only decides, deletes and keeps the record:
what failed first (:mod:`mnnvl.driver.attempts`: pod, node, rank, GPU and evidence, from pod
status), rank 0's last step before the failure (from its log), when every new pod ran and
when the restarted rank 0 logged its first step. A node blamed for two failed attempts, or
for one with hardware evidence, is kept out of the next one (:mod:`mnnvl.driver.exclude`:
the Jobs are suspended and resumed with a ``NotIn`` node-affinity term instead of the other
pods being deleted). The same error at the same step as the attempt before, on another
node, ends the step: a restart cannot change it.

A pod failure is retriable when its exit code is not one of
``exit_codes.NON_RETRIABLE_EXIT_CODES`` (those fail the Job through its podFailurePolicy),
it was not OOM-killed, and a restart stays within ``backoffLimitPerIndex`` for every index:
the Job controller counts each pod the restart deletes as a failure of its index (the kubelet
moves a deleted pod to Failed; only a ``DisruptionTarget`` pod is ignored), so the failed pod
and every pod deleted with it need a retry left. An index's failures so far are its pod's
``batch.kubernetes.io/job-index-failure-count`` annotation, which the Job controller sets on
each pod it creates. A restart costs each index one failure: a pod the Job controller already
made to replace a failed one is not deleted again. ``--max-restarts`` bounds the restarts of
the step.

A step that adopts a running Job (it was run again after its pod was lost) may find pods that
failed while nobody watched. A failure every live pod of the step was created after is
history: every rank has been replaced since (the Job controller restarted them all, or an
earlier attempt of the step did). Any other one restarts the gang: a survivor of it may be
blocked in a collective with the lost rank (NCCL waits until its timeout), and a replacement
may have joined the survivors' rendezvous. Timestamps have whole seconds: a failure in the
second a pod was created counts as not history, so a doubt costs a restart. Once an index has
succeeded no failure calls for one: the Job controller never runs that index again. Pods
already being deleted when the step first looks (a restart under way) are on their way out:
their failure (143) is no new fault.

An OOM-killed container (``reason: OOMKilled``: host memory past the container's limit, not
CUDA) fails the step at once: the same configuration on the same nodes allocates the same, so
a restart would only repeat the kill (the Job cannot tell it from another exit 137 by its
podFailurePolicy, the driver can).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mnnvl.contract.exit_codes import NON_RETRIABLE_EXIT_CODES
from mnnvl.driver.api import COMPUTE_DOMAIN, POD, Api
from mnnvl.driver.attempts import (
    Attempt,
    Restart,
    attribute,
    failed_elsewhere,
    no_restart_helps,
)
from mnnvl.driver.diagnose import (
    FAILURE_COUNT,
    Grace,
    exit_code,
    failed_problem,
    hint,
    imex_import,
    log_tail,
    pod_index,
    pod_phase,
    terminated,
)
from mnnvl.driver.exclude import NodeBlame
from mnnvl.driver.inplace import InPlaceLog, check_budget
from mnnvl.driver.problem import problem
from mnnvl.driver.rank0 import Rank0Progress, resumes_from
from mnnvl.driver.wait import Objects
from mnnvl.errors import NotFound, ProblemKind, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import JOB_NAME_LABEL

logger = logging.getLogger(__name__)

# Kubernetes' non-graceful node shutdown: pod GC force-deletes the Terminating pods of a
# not-ready node with this taint (kubernetes.io/docs/concepts/cluster-administration/
# node-shutdown/#non-graceful-node-shutdown).
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def _key(pod: dict[str, Any]) -> tuple[str, str]:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(JOB_NAME_LABEL, ""), pod_index(pod)


class Gang:
    """Watches the step's pods for a retriable failure and restarts every rank."""

    def __init__(self, api: Api, workload: WorkloadSpec, jobs: list[str] | None = None) -> None:
        self.api, self.workload = api, workload
        self.jobs = jobs or [RunNames.for_run(workload.run_id).job(workload.purpose)]
        self.attempts: dict[tuple[str, str], set[str]] = {}  # (Job, index) -> pod uids
        self.old: set[str] = set()  # pods of generations already restarted
        self.restarts: list[Restart] = []
        self.in_place = InPlaceLog()  # the pods' own restarts: the same budget
        self.lost_nodes: dict[str, str] = {}  # node -> what its lost pod's condition said
        # Blamed and excluded nodes. Under Kueue the Jobs' suspension is Kueue's: no exclusion.
        self.nodes = NodeBlame(api, workload.namespace, self.jobs, not workload.queue_name)
        # evicted pods left Terminating
        self.stranded = Grace(workload.deadlines.unschedulable_grace_s)
        self.stranded_logged: set[str] = set()  # pod uids already logged
        self.first = True  # no pods seen yet: failures seen now may predate the step

    def check(self, pods: Objects, rank0: Rank0Progress | None) -> bool:
        """Restart the gang when a pod of the current generation failed retriably; True when
        it did. Raises ``WorkloadFailed`` on an OOM kill, when a restart would use up an
        index's last retry, past ``--max-restarts`` (restarts in place counted) and when a
        restart cannot change the failure (the same error at the same step as the attempt
        before, on another node)."""
        budget = self.workload.recovery.max_restarts
        check_budget(self.restarts, self.in_place, budget, self.workload.namespace)
        if self.first and pods:
            self.first = False
            self.old |= _history(pods) | _leaving(pods)
        for each in pods.values():
            self.attempts.setdefault(_key(each), set()).add(each["metadata"]["uid"])
        self._note_running(pods)
        failed = self._new_failures(pods)
        for each in failed:
            if terminated(each).get("reason") == "OOMKilled":
                raise WorkloadFailed(self._oom_message(each), pod_exit_code=exit_code(each))
        if any(exit_code(p) in NON_RETRIABLE_EXIT_CODES for p in failed):
            return False  # the Job's podFailurePolicy fails the Job; its condition says why
        pod: dict[str, Any] | None = next((p for p in failed if self._retriable(p)), None)
        if pod is None:
            return False
        ns = self.workload.namespace
        attempt = attribute(failed, self.workload, lambda name: log_tail(self.api, ns, name))
        disruption = _disruption(pod)
        node = (pod.get("spec") or {}).get("nodeName")
        if disruption and node:
            self.lost_nodes[node] = f"pod {pod['metadata']['name']}: {disruption}"
        why = no_restart_helps(attempt, self.restarts[-1].attempt if self.restarts else None)
        if why:
            raise WorkloadFailed(
                f"{why}; check `kubectl logs -n {self.workload.namespace} {attempt.pod}` and "
                "fix the program or its inputs",
                pod_exit_code=attempt.exit_code,
            )
        # Before blame and budget: with its domain gone the pods failed for want of IMEX, which
        # is no node's doing, and no number of restarts left changes it.
        self._check_domain(attempt, rank0)
        self._forgive(pods)
        blamed = not failed_elsewhere(attempt, failed)
        excluded = self.nodes.suspect(attempt) if blamed else None
        self._check_budget(pods, pod, attempt, everyone=excluded is not None)
        generation = {p["metadata"]["uid"] for p in pods.values()} - self._replacements(pods)
        last = rank0.last[0] if rank0 is not None and rank0.last else None
        restart = Restart(attempt, time.monotonic(), last, excluded=excluded, blamed=blamed)
        restart.generation = generation
        self.restarts.append(restart)
        logger.warning(
            "attempt %d failed: %s, first: %s; restarting every rank %s (restart %d of at "
            "most %d; %s)",
            len(self.restarts),
            attempt.names(),
            attempt.evidence,
            resumes_from([r.after for r in self.restarts], rank0),
            len(self.restarts),
            self.workload.recovery.max_restarts,
            rank0.describe() if rank0 is not None else "rank 0 not followed yet",
        )
        if restart.excluded:
            self.nodes.exclude(restart.excluded, attempt)
            generation = {p["metadata"]["uid"] for p in pods.values()}
        else:
            self._delete_others(pods)
        self.old |= generation
        return True

    def _forgive(self, pods: Objects) -> None:
        """An earlier attempt's failure stops counting against its node once another node's
        pod of that attempt is seen to have failed on its own the same way: the program's."""
        for r in self.restarts:
            mine = [p for p in pods.values() if p["metadata"]["uid"] in r.generation]
            if r.blamed and r.attempt.node and failed_elsewhere(r.attempt, mine):
                r.blamed = False
                self.nodes.forgive(r.attempt.node)

    def _note_running(self, pods: Objects) -> None:
        """When every index of the generation after the last restart is Running."""
        if not self.restarts or self.restarts[-1].running is not None:
            return
        running = {
            _key(p)
            for p in pods.values()
            if p["metadata"]["uid"] not in self.old
            and pod_phase(p) == "Running"
            and not p["metadata"].get("deletionTimestamp")
        }
        if len(running) >= self.workload.nodes:
            self.restarts[-1].running = time.monotonic()

    def check_stranded(self, pods: Objects) -> None:
        """Fail the step when a pod the taint manager evicted stays Terminating for longer than
        the grace. Its node stopped answering, so no kubelet moves it to Failed, and the Job
        (``podReplacementPolicy: Failed``) never replaces its index: the other ranks would only
        restart and wait for it until ``--max-restarts``. Pod GC ends it once the Node object is
        deleted or tainted ``out-of-service``; the pod alone says which node (the step's Role
        cannot read nodes)."""
        self.stranded.retain(pods)
        for name, pod in sorted(pods.items()):
            why = _stranded(pod)
            left = self.stranded.left_s(f"stranded/{name}", bool(why))
            if left is None:
                continue
            node = pod["spec"]["nodeName"]
            if pod["metadata"]["uid"] not in self.stranded_logged:
                self.stranded_logged.add(pod["metadata"]["uid"])
                logger.warning(
                    "pod %s was evicted from node %s (%s) and stays Terminating: the node is not "
                    "answering; waiting %g s for the Node to be deleted or tainted out-of-service",
                    name,
                    node,
                    why,
                    self.stranded.grace_s,
                )
            if left > 0:
                continue
            found = problem(
                ProblemKind.STRANDED,
                pod=name,
                name=name,
                node=node,
                detail=why,
                index=pod_index(pod),
                grace_s=self.stranded.grace_s,
            )
            raise found.error(
                f"{found.message}; if the machine is down, run `kubectl taint nodes {node} "
                f"{OUT_OF_SERVICE}` (non-graceful node shutdown) or `kubectl delete node {node}`, "
                "then rerun: the run resumes from the last checkpoint"
            )

    def _check_budget(
        self, pods: Objects, failed: dict[str, Any], attempt: Attempt, everyone: bool = False
    ) -> None:
        """Raise when restarting would exceed ``--max-restarts`` or fail an index whose pod
        this restart deletes (the Job controller counts it; the Job would fail meanwhile).
        ``everyone``: the restart suspends the Jobs, so replacements go too."""
        name, code = failed["metadata"]["name"], exit_code(failed)
        first = f"; failed first: {attempt.names()}: {attempt.evidence}"
        if len(self.restarts) + len(self.in_place) >= self.workload.recovery.max_restarts:
            found = problem(
                ProblemKind.RESTARTS_EXHAUSTED,
                pod=name,
                exit_code=code,
                restarts=len(self.restarts) + len(self.in_place),
                max_restarts=self.workload.recovery.max_restarts,
            )
            ns = self.workload.namespace
            tail = log_tail(self.api, ns, name)
            seen = imex_import(failed_problem(failed), tail)
            why = f"; {seen.message}; {hint(seen, ns, '')}" if seen is not None else ""
            why += self.in_place.earlier(self.restarts)
            raise found.error(
                f"pod {name} {found.message}{first}{why}; check `kubectl logs -n {ns} {name}`; "
                f"last log lines:\n{tail}"
            )
        going = self._to_delete(pods)
        if everyone:
            fresh = self._replacements(pods)
            going += [p for p in pods.values() if p["metadata"]["uid"] in fresh]
        spent = next((p for p in going if not self._has_retry(p)), None)
        if spent is not None:
            why = (
                f"and restarting every rank would fail pod {spent['metadata']['name']}'s index "
                f"{pod_index(spent)}: it has had {self._failures(spent)} failure(s), "
                f"--max-restarts {self.workload.recovery.max_restarts}"
            )
            raise WorkloadFailed(
                f"pod {name} failed with exit code {code} {why}{first}; check "
                f"`kubectl logs -n {self.workload.namespace} {name}`",
                pod_exit_code=code,
            )

    def _check_domain(self, attempt: Attempt, rank0: Rank0Progress | None) -> None:
        """Raise when the run's ComputeDomain is gone or going: restarted pods could never get
        their IMEX channel (deleting a domain stops IMEX under its pods, which then fail). The
        failure is attributed as any attempt's, and not permanent: a provision clears it, so
        the step leaves no record that would fail the rerun its advice asks for."""
        ns, name = self.workload.namespace, RunNames.for_run(self.workload.run_id).domain
        try:
            gone = bool(self.api.get(COMPUTE_DOMAIN, ns, name)["metadata"].get("deletionTimestamp"))
        except NotFound:
            gone = True
        if gone:
            resumes = resumes_from([r.after for r in self.restarts], rank0)
            raise WorkloadFailed(
                f"{attempt.names()} failed ({attempt.evidence}), and ComputeDomain {ns}/{name} "
                "was deleted under the running workload, so a restart cannot run; provision "
                f"again and rerun the step: it resumes {resumes}; check `kubectl get events -n "
                f"{ns}` for who deleted it",
                pod_exit_code=attempt.pod_exit_code,
                problem=ProblemKind.MISSING_OBJECT,
                permanent=False,
            )

    def _retriable(self, pod: dict[str, Any]) -> bool:
        """Whether one more attempt is allowed for this failed pod, whose exit code is
        retriable (``check``). A DisruptionTarget pod (node lost, evicted, preempted): the
        Job's podFailurePolicy ignores it, so its failure uses up no retry."""
        return bool(_disruption(pod)) or self._has_retry(pod)

    def _has_retry(self, pod: dict[str, Any]) -> bool:
        """Whether one more counted failure of this pod leaves its index a retry."""
        return self._failures(pod) < self.workload.recovery.max_restarts

    def _failures(self, pod: dict[str, Any]) -> int:
        """Its index's counted failures before this pod: the Job controller's annotation,
        else (a cluster that does not set it) the index's earlier pods the driver saw."""
        text = str((pod["metadata"].get("annotations") or {}).get(FAILURE_COUNT, ""))
        return int(text) if text.isdigit() else len(self.attempts.get(_key(pod), ())) - 1

    def _oom_message(self, pod: dict[str, Any]) -> str:
        name = pod["metadata"]["name"]
        worker = ((pod.get("spec") or {}).get("containers") or [{}])[0]
        limit = ((worker.get("resources") or {}).get("limits") or {}).get("memory")
        return (
            f"pod {name} was OOM-killed (exit code 137, host memory past the container's "
            f"limit {limit or 'none: the node ran out'}); a restart would allocate the same, "
            f"so it is not retried: lower --batch-size or use --activation-checkpointing full, "
            f"or give the pods more memory; check `kubectl logs -n {self.workload.namespace} "
            f"{name}` and `kubectl describe pod -n {self.workload.namespace} {name}`"
        )

    def _new_failures(self, pods: Objects) -> list[dict[str, Any]]:
        """The failed pods of the current generation, by index."""
        return [
            p
            for p in sorted(pods.values(), key=pod_index)
            if pod_phase(p) == "Failed" and p["metadata"]["uid"] not in self.old
        ]

    def _replacements(self, pods: Objects) -> set[str]:
        """Uids of the pods the Job controller already made in place of a pod of this
        generation that failed: they belong to the next generation."""
        failed = {_key(p) for p in self._new_failures(pods)}
        return {
            p["metadata"]["uid"]
            for p in pods.values()
            if _key(p) in failed and pod_phase(p) != "Failed"
        }

    def _to_delete(self, pods: Objects) -> list[dict[str, Any]]:
        """The live pods of this generation (not the failed ones, nor their replacements)."""
        fresh = self._replacements(pods)
        return [
            p
            for p in pods.values()
            if pod_phase(p) not in ("Failed", "Succeeded")
            and not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["uid"] not in fresh
        ]

    def _delete_others(self, pods: Objects) -> None:
        ns = self.workload.namespace
        for pod in self._to_delete(pods):
            meta = pod["metadata"]
            logger.info("deleting pod %s/%s so that it restarts with the others", ns, meta["name"])
            self.api.delete(POD, ns, meta["name"], uid=meta["uid"])

    def lost(self) -> str:
        """The nodes the run lost (their pods were disrupted), for error messages."""
        return "; ".join(f"node {n} was lost ({why})" for n, why in sorted(self.lost_nodes.items()))

    def summary(self) -> list[dict[str, Any]]:
        """One record per restart (:meth:`Restart.record`), numbered from 1 as ``n``."""
        return [{"n": n, **r.record()} for n, r in enumerate(self.restarts, 1)]


def _history(pods: Objects) -> set[str]:
    """The uids of failed pods that every live pod was created after (see the module), or of
    every failed pod once an index has succeeded: the Job controller never runs that index
    again, so restarted ranks would wait for it. The API's timestamps are RFC 3339 in UTC
    with whole seconds, so they compare as text."""
    failed = [p for p in pods.values() if pod_phase(p) == "Failed"]
    if any(pod_phase(p) == "Succeeded" for p in pods.values()):
        return {p["metadata"]["uid"] for p in failed}
    live = [
        p
        for p in pods.values()
        if pod_phase(p) != "Failed" and not p["metadata"].get("deletionTimestamp")
    ]
    if not live:
        return set()  # the Job controller has replaced none yet: restart (nothing to delete)
    born = min(str(p["metadata"].get("creationTimestamp") or "") for p in live)
    return {
        p["metadata"]["uid"] for p in failed if str(terminated(p).get("finishedAt") or "~") < born
    }


def _leaving(pods: Objects) -> set[str]:
    """The uids of pods already being deleted when the step first sees them (a gang restart
    of an earlier attempt of the step, a suspension): they turn Failed (143) on the way out,
    which is no new fault. A pod evicted from a lost node (``DisruptionTarget``) is not
    among them: its peers may be blocked on it."""
    return {
        p["metadata"]["uid"]
        for p in pods.values()
        if p["metadata"].get("deletionTimestamp")
        and pod_phase(p) not in ("Failed", "Succeeded")
        and not _disruption(p)
    }


def _stranded(pod: dict[str, Any]) -> str:
    """The ``DisruptionTarget`` condition of a pod the taint manager deleted (its node carries a
    ``NoExecute`` not-ready/unreachable taint) that is still Terminating; "" otherwise."""
    why = _disruption(pod)
    if not why.startswith("DeletionByTaintManager") or not pod["metadata"].get("deletionTimestamp"):
        return ""
    if pod_phase(pod) in ("Failed", "Succeeded"):
        return ""
    return why if (pod.get("spec") or {}).get("nodeName") else ""


def _disruption(pod: dict[str, Any]) -> str:
    """``reason: message`` of a pod's ``DisruptionTarget`` condition ("" without one): the
    taint-eviction controller's ``DeletionByTaintManager``, pod GC's ``DeletionByPodGC``."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            return f"{c.get('reason', '')}: {c.get('message', '')}"
    return ""
