"""``meta.k8s.io/v1`` Table answers: what ``kubectl get`` asks for and prints as columns.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io,…,application/json`` on
every ``get`` and prints the server's columns; a plain list leaves it only NAME and AGE. The
columns and cells follow kube-apiserver's printers (``pkg/printers/internalversion/printers.go``:
``printPod``, ``printJob``) and, for a custom resource without ``additionalPrinterColumns``
(the ComputeDomain CRD has none), the CRD default of NAME and AGE
(``apiextensions-apiserver`` ``tableconvertor``). Every other kind gets NAME and AGE as well.
Columns of priority 1 are the ones ``-o wide`` adds. ``kubectl get -w`` asks the same of a
watch: each event's object is a Table of its one row.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any

from mnnvl.sim.api.model import Obj

TABLE_MEDIA = {"as": "Table", "v": "v1", "g": "meta.k8s.io"}
Row = list[Any]


def wants_table(accept: str | None) -> bool:
    """Whether an ``Accept`` header's first media type the simulator serves is a v1 Table (it
    serves that and plain JSON; kubectl lists Table first and JSON as the fallback)."""
    for media in (accept or "").split(","):
        kind, *params = (p.strip() for p in media.split(";"))
        if kind not in ("application/json", "*/*", "application/*"):
            continue
        options = dict(p.partition("=")[::2] for p in params)
        if options.get("as") != "Table":
            return False  # plain JSON comes first
        if all(options.get(k) == v for k, v in TABLE_MEDIA.items()):
            return True
    return False


def age(timestamp: str | None, now: float | None = None) -> str:
    """How long before ``now`` (default: now) an RFC 3339 ``timestamp`` was, in kubectl's
    words (``45s``, ``3m20s``, ``2h``, ``5d``; apimachinery ``duration.HumanDuration``),
    ``<unknown>`` without one."""
    if not timestamp:
        return "<unknown>"
    s = int((time.time() if now is None else now) - _epoch(timestamp))
    m, h = s // 60, s // 3600
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 192:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    return f"{h // 24}d"


def _column(name: str, priority: int = 0, fmt: str = "") -> Obj:
    return {"name": name, "type": "string", "format": fmt, "description": "", "priority": priority}


def _pod_status(pod: Obj) -> str:
    """The STATUS cell: the phase, or the reason a container waits or ended with, or
    Terminating for a pod being deleted (``printPod``, init containers left out)."""
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        waiting, ended = state.get("waiting") or {}, state.get("terminated") or {}
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif ended.get("reason"):
            reason = ended["reason"]
        elif ended:
            signal = ended.get("signal")
            reason = f"Signal:{signal}" if signal else f"ExitCode:{ended.get('exitCode', 0)}"
    if pod["metadata"].get("deletionTimestamp"):
        return "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return str(reason)


def _pod_row(pod: Obj) -> Row:
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    containers = status.get("containerStatuses") or []
    ready = sum(1 for c in containers if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        _pod_status(pod),
        str(restarts),
        age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
    ]


def _job_status(job: Obj) -> str:
    """The STATUS cell: the first true condition of Failed, Complete, Suspended, else Running."""
    conditions = (job.get("status") or {}).get("conditions") or []
    true = {c.get("type") for c in conditions if c.get("status") == "True"}
    return next((c for c in ("Failed", "Complete", "Suspended") if c in true), "Running")


def _job_row(job: Obj) -> Row:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    done = int(status.get("succeeded") or 0)
    completions = f"{done}/{spec.get('completions', 1)}"
    if spec.get("completions") is None and spec.get("parallelism") is not None:
        completions = f"{done}/1 of {spec['parallelism']}"
    end = status.get("completionTime")
    duration = age(status.get("startTime"), _epoch(end) if end else None)
    return [
        job["metadata"]["name"],
        _job_status(job),
        completions,
        duration if status.get("startTime") else "",
        age(job["metadata"].get("creationTimestamp")),
    ]


def _epoch(timestamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC timestamp (the store writes whole seconds)."""
    return float(calendar.timegm(time.strptime(timestamp[:19], "%Y-%m-%dT%H:%M:%S")))


def _default_row(obj: Obj) -> Row:
    return [obj["metadata"]["name"], age(obj["metadata"].get("creationTimestamp"))]


NAME = _column("Name", fmt="name")
POD_COLUMNS = [NAME, *map(_column, ("Ready", "Status", "Restarts", "Age"))]
PRINTERS: dict[str, tuple[list[Obj], Callable[[Obj], Row]]] = {
    "pods": ([*POD_COLUMNS, _column("IP", 1), _column("Node", 1)], _pod_row),
    "jobs": ([NAME, *map(_column, ("Status", "Completions", "Duration", "Age"))], _job_row),
}
DEFAULT = ([NAME, _column("Age")], _default_row)


def table(plural: str, answer: Obj, include: str | None, columns_too: bool = True) -> Obj:
    """A list or one object (``answer``) as a Table; each row carries its object as
    ``include`` asks (``Object``, ``None``, else its metadata as ``PartialObjectMetadata``,
    the server's default). A watch's events after its first carry no columns
    (``columns_too``), as kube-apiserver sends them (``NoHeaders``)."""
    columns, row = PRINTERS.get(plural, DEFAULT)
    items = answer.get("items", [answer])

    def carried(obj: Obj) -> Obj | None:
        if include == "Object":
            return obj
        if include == "None":
            return None
        meta = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}
        return {**meta, "metadata": obj["metadata"]}

    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": answer["metadata"].get("resourceVersion", "")},
        "columnDefinitions": columns if columns_too else [],
        "rows": [{"cells": row(obj), "object": carried(obj)} for obj in items],
    }
