"""Pods the API refuses to create: the Job controller's ``FailedCreate`` Events on a Job, read
into a :class:`~mnnvl.driver.problem.Problem`.

The API's message is the only evidence (an Event carries no structured cause), so this is the
one place that reads kube-apiserver's wording: the PodSecurity, webhook, ServiceAccount,
validation, missing-object and ResourceQuota refusals each map to a ``ProblemKind``. A refusal that
cannot clear by itself is ``permanent`` and fails the step at once; a quota (or an unknown
refusal) may clear when other work ends and fails only after the unschedulable grace.
"""

from __future__ import annotations

import re
from typing import Any

from mnnvl.driver.diagnose import Grace, event_order, pod_phase
from mnnvl.driver.problem import Problem, problem
from mnnvl.driver.wait import Objects
from mnnvl.errors import ProblemKind
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import JOB_NAME_LABEL

FAILED_CREATE = "FailedCreate"
QUOTA_REFUSAL = re.compile(r"exceeded quota: ([^,]+),")
POD_SECURITY_REFUSAL = re.compile(r'violates PodSecurity "([a-z]+):')
# Fragments of kube-apiserver's refusals, most specific first (a missing service account's
# message also ends in "not found").
REFUSAL_KINDS = (
    ("denied the request", ProblemKind.WEBHOOK),
    ("error looking up service account", ProblemKind.SERVICE_ACCOUNT),
    (" is invalid: ", ProblemKind.INVALID_SPEC),
    (" not found", ProblemKind.MISSING_OBJECT),
)


def create_refusal(job: dict[str, Any], events: Objects, pods: Objects) -> str:
    """The message of the Job controller's latest refused pod create (a ``FailedCreate``
    Event on this Job, this uid), or "" when its latest create succeeded or no pod is missing."""
    name, uid = job["metadata"]["name"], job["metadata"].get("uid")
    live = [
        p
        for p in pods.values()
        if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == name
        and pod_phase(p) not in ("Succeeded", "Failed")
    ]
    if len(live) >= int((job.get("spec") or {}).get("parallelism") or 1):
        return ""
    creates = [
        e
        for e in events.values()
        if (e.get("involvedObject") or {}).get("uid") == uid
        and e.get("reason") in (FAILED_CREATE, "SuccessfulCreate")
    ]
    latest = max(creates, key=event_order, default=None)
    if latest is None or latest.get("reason") != FAILED_CREATE:
        return ""
    return str(latest.get("message") or FAILED_CREATE)


def refusal_kind(message: str) -> ProblemKind:
    """Which refusal the API's message is."""
    if POD_SECURITY_REFUSAL.search(message):
        return ProblemKind.POD_SECURITY
    if QUOTA_REFUSAL.search(message):
        return ProblemKind.QUOTA
    return next(
        (kind for fragment, kind in REFUSAL_KINDS if fragment in message), ProblemKind.REFUSED
    )


def refusal_problem(workload: WorkloadSpec, job: str, message: str, grace: Grace) -> Problem | None:
    """The step's diagnosis of this refusal, or None while it may still clear: at once for a
    refusal that cannot clear by itself, after the unschedulable grace for a quota (or an
    unknown refusal, e.g. a webhook that could not be called)."""
    ns = workload.namespace
    kind = refusal_kind(message)
    found = problem(kind, job=f"{ns}/{job}", detail=message, grace_s=grace.grace_s)
    if not found.permanent:
        left = grace.left_s(f"refused/{job}", True)
        if left is None or left > 0:
            return None
    return found


def refusal_fix(found: Problem, namespace: str, message: str) -> str:
    """What a person changes so the pods are admitted, for each kind of refusal."""
    ns = namespace
    level = POD_SECURITY_REFUSAL.search(message)
    quota = QUOTA_REFUSAL.search(message)
    fixes = {
        ProblemKind.POD_SECURITY: f"namespace {ns} enforces Pod Security level "
        f"{level.group(1) if level else '?'} (`kubectl get namespace {ns} --show-labels`): the "
        "worker pods pass restricted with --pod-security restricted (the default; the image "
        "must run as a non-root user), or label the namespace "
        "pod-security.kubernetes.io/enforce=baseline for --pod-security baseline",
        ProblemKind.WEBHOOK: "an admission webhook refused the pod: check its policy "
        "(`kubectl get validatingwebhookconfigurations`) with the cluster's administrators",
        ProblemKind.SERVICE_ACCOUNT: f"create that service account in namespace {ns} "
        f"(`kubectl create serviceaccount -n {ns} <name>`) or set another worker_service_account",
        ProblemKind.INVALID_SPEC: "the pod spec is invalid: fix the input named in the message",
        ProblemKind.MISSING_OBJECT: "create the missing object the pod refers to in namespace "
        f"{ns}",
        ProblemKind.QUOTA: f"ResourceQuota {quota.group(1) if quota else '?'} in namespace {ns} is "
        "used up; wait for other work to end, raise the quota (`kubectl describe "
        f"resourcequota {quota.group(1) if quota else ''} -n {ns}`) or ask for fewer nodes",
    }
    return fixes.get(found.kind, f"check `kubectl describe job -n {ns}` and the cluster's policies")
