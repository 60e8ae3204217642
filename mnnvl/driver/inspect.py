"""What a run has in the cluster right now, for `mnnvl status` (read-only)."""

from __future__ import annotations

from typing import Any

from mnnvl.driver.api import COMPUTE_DOMAIN, JOB, POD, RESOURCE_CLAIM_TEMPLATE, SERVICE, Api
from mnnvl.driver.diagnose import pod_index, waiting_reason
from mnnvl.driver.exclude import excluded_nodes
from mnnvl.errors import NotFound
from mnnvl.inputs.names import RunNames


def run_status(api: Api, namespace: str, names: RunNames) -> dict[str, Any]:
    """The run's ComputeDomain (status and nodes), channel template, Jobs, pods and Services."""
    return {
        "domain": _domain(api, namespace, names.domain),
        "channel_template": _exists(api, namespace, names.channel_template),
        "jobs": [_job(j) for j in _items(api, JOB, namespace, names.selector)],
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
    lines += [f"Job {job['name']}: {job}" for job in found["jobs"]]
    lines += [
        f"Job {job['name']}: node {node} excluded (its pods failed there)"
        for job in found["jobs"]
        for node in job["excluded_nodes"]
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


def _job(job: dict[str, Any]) -> dict[str, Any]:
    status = job.get("status") or {}
    done = [c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"]
    counts = {k: status.get(k, 0) for k in ("active", "succeeded", "failed")}
    return {
        "name": job["metadata"]["name"],
        **counts,
        "conditions": done,
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
