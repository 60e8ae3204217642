"""What a run has in the cluster right now, for `mnnvl status` and `mnnvl logs` (read-only)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mnnvl.contract.env import NODE_RANK_BASE
from mnnvl.driver.api import COMPUTE_DOMAIN, JOB, POD, RESOURCE_CLAIM_TEMPLATE, SERVICE, Api
from mnnvl.driver.diagnose import pod_index, waiting_reason
from mnnvl.driver.domain import refused_namespace, require_namespace
from mnnvl.driver.exclude import excluded_nodes
from mnnvl.driver.trainjob import run_trainjobs
from mnnvl.errors import NotFound, Refused, SpecError
from mnnvl.inputs.names import RunNames
from mnnvl.manifests import CONTAINER
from mnnvl.manifests.trainjob import NODE


@contextmanager
def _namespace_named(namespace: str) -> Iterator[None]:
    """A read refused in ``namespace`` is bad input naming it (exit 2), as for teardown: with
    the shipped Role (namespaced) a namespace that does not exist answers 403."""
    try:
        yield
    except Refused as e:
        raise refused_namespace(namespace, e) from e


def run_status(api: Api, namespace: str, names: RunNames) -> dict[str, Any]:
    """The run's ComputeDomain (status and nodes), channel template, Jobs, TrainJobs, pods and
    Services."""
    with _namespace_named(namespace):
        found = _run_status(api, namespace, names)
    if not found["domain"] and not found["pods"]:  # a typo in the namespace, or nothing yet?
        require_namespace(api, namespace)
    return found


def node_rank(pod: dict[str, Any]) -> int | None:
    """The pod's node rank: its completion index plus its clique group's first rank."""
    index = pod_index(pod)
    if not index.isdigit():
        return None
    env = [e for c in (pod.get("spec") or {}).get("containers") or [] for e in c.get("env") or []]
    base = next((e.get("value") for e in env if e.get("name") == NODE_RANK_BASE), None) or "0"
    return int(index) + int(base)


def rank_pod(api: Api, namespace: str, names: RunNames, rank: int) -> tuple[str, str]:
    """The name of the run's newest worker pod of node rank ``rank`` (its latest step's), and
    its worker container's (a TrainJob's pods run the workers in Trainer's ``node``).

    Raises ``SpecError`` (exit 2) for a namespace that does not exist, a run with no pods
    there, and a rank none of its pods has; each says what to check next.
    """
    with _namespace_named(namespace):
        pods = _items(api, POD, namespace, names.selector)
    if not pods:
        require_namespace(api, namespace)
        raise SpecError(
            "run_id",
            f"run {names.run_id!r} has no worker pods in namespace {namespace!r} (none yet, "
            "torn down, or another run id or namespace); check with "
            f"`mnnvl status --run-id {names.run_id} --namespace {namespace}`",
        )
    ranked = [p for p in pods if node_rank(p) == rank]
    if not ranked:
        ranks = sorted({r for r in map(node_rank, pods) if r is not None})
        raise SpecError(
            "rank",
            f"run {names.run_id!r} has no pod of node rank {rank}; its pods have ranks "
            f"{', '.join(map(str, ranks)) or 'none'}: pass one of them",
        )
    newest = max(ranked, key=lambda p: str(p["metadata"].get("creationTimestamp")))
    containers = {c.get("name") for c in (newest.get("spec") or {}).get("containers") or []}
    return str(newest["metadata"]["name"]), NODE if NODE in containers else CONTAINER


def _run_status(api: Api, namespace: str, names: RunNames) -> dict[str, Any]:
    return {
        "domain": _domain(api, namespace, names.domain),
        "channel_template": _exists(api, namespace, names.channel_template),
        "jobs": [_job(j) for j in _items(api, JOB, namespace, names.selector)],
        "trainjobs": [
            {"name": t["metadata"]["name"], "conditions": _true_conditions(t)}
            for t in run_trainjobs(api, namespace, names.run_id)
        ],
        "pods": [_pod(p) for p in _items(api, POD, namespace, names.selector)],
        "services": [
            s["metadata"]["name"] for s in _items(api, SERVICE, namespace, names.selector)
        ],
    }


def status_lines(found: dict[str, Any], names: RunNames) -> list[str]:
    """``run_status`` as lines a person reads: an absent domain by the name it would have."""
    domain = found["domain"]
    if domain is None:
        lines = [f"ComputeDomain {names.domain}: absent"]
    else:
        nodes = ", ".join(f"{n['name']} {n['status']}" for n in domain["nodes"]) or "none yet"
        state = domain["status"] or "not reported yet"
        deleting = " (being deleted)" if domain["deleting"] else ""
        lines = [f"ComputeDomain {names.domain}: status {state}{deleting}; nodes: {nodes}"]
    present = "present" if found["channel_template"] else "absent"
    lines.append(f"channel template {names.channel_template}: {present}")
    lines += [
        f"Job {job['name']}: {job['active']} active, {job['succeeded']} succeeded, "
        f"{job['failed']} failed; {', '.join(job['conditions']) or 'no condition yet'}"
        for job in found["jobs"]
    ]
    lines += [
        f"Job {job['name']}: node {node} excluded (its pods failed there)"
        for job in found["jobs"]
        for node in job["excluded_nodes"]
    ]
    lines += [
        f"TrainJob {tj['name']}: {', '.join(tj['conditions']) or 'no condition yet'}"
        for tj in found["trainjobs"]
    ]
    lines += [
        f"Pod {pod['name']}: {pod['reason'] or pod['phase']} on {pod['node'] or 'no node'}"
        for pod in found["pods"]
    ]
    return lines


def _items(api: Api, kind: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    items = api.list(kind, namespace, label_selector=selector)["items"]
    return sorted(items, key=lambda o: str(o["metadata"]["name"]))


def _domain(api: Api, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        cd = api.get(COMPUTE_DOMAIN, namespace, name)
    except NotFound:
        return None
    status = cd.get("status") or {}
    return {
        "name": name,
        "uid": cd["metadata"].get("uid"),
        "deleting": bool(cd["metadata"].get("deletionTimestamp")),
        # Diagnostics only: Ready needs scheduled workload pods and is never waited for.
        "status": status.get("status"),
        "nodes": [
            {k: n.get(k) for k in ("name", "cliqueID", "index", "status")}
            for n in status.get("nodes") or []
        ],
    }


def _exists(api: Api, namespace: str, name: str) -> bool:
    try:
        api.get(RESOURCE_CLAIM_TEMPLATE, namespace, name)
    except NotFound:
        return False
    return True


def _true_conditions(obj: dict[str, Any]) -> list[str]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return [c["type"] for c in conditions if c.get("status") == "True"]


def _job(job: dict[str, Any]) -> dict[str, Any]:
    status = job.get("status") or {}
    counts = {k: status.get(k, 0) for k in ("active", "succeeded", "failed")}
    return {
        "name": job["metadata"]["name"],
        **counts,
        "conditions": _true_conditions(job),
        "excluded_nodes": excluded_nodes(job),  # kept out after failing there
    }


def _pod(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": pod["metadata"]["name"],
        "index": pod_index(pod),
        "phase": (pod.get("status") or {}).get("phase"),
        "reason": waiting_reason(pod) or None,
        "node": (pod.get("spec") or {}).get("nodeName"),  # None until scheduled
    }
