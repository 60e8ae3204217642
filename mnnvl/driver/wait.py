"""The one wait helper: list, check, then watch from that resourceVersion, under one deadline.

A wait tracks the set of objects a selector matches (one object for a ``metadata.name``
field selector, or e.g. a Job's pods for a label selector). On every change it calls
``fail`` (which raises a typed error to end the wait early) and then ``done``. A 410 Gone
re-lists and carries on; a watch the server ends before the deadline is resumed from the
last resourceVersion seen. There is no polling: between events the thread blocks on the
watch stream, and every watch asks the server to end by the deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from mnnvl.driver.api import Api, Kind
from mnnvl.driver.errors import WaitTimeout, WatchExpired

logger = logging.getLogger(__name__)

Objects = dict[str, dict[str, Any]]
"""Objects the wait's selector matches, by name (empty when none exist)."""


class Deadline:
    """A point on the monotonic clock; waits that share one never outlast it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.start = time.monotonic()
        self.at = self.start + timeout_s

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0


def wait_for(
    api: Api,
    kind: Kind,
    namespace: str,
    *,
    what: str,
    done: Callable[[Objects], bool],
    deadline: Deadline,
    name: str | None = None,
    label_selector: str | None = None,
    fail: Callable[[Objects], None] | None = None,
    describe: Callable[[Objects], str] | None = None,
    hint: str = "",
    recheck_in: Callable[[Objects], float | None] | None = None,
) -> Objects:
    """Block until ``done(objects)`` is true; return the objects seen at that moment.

    ``what`` names the goal for messages ("ResourceClaimTemplate x to exist"). ``fail``
    raises to stop early. On the deadline raises ``WaitTimeout`` with ``describe(objects)``
    (the last observed state) and ``hint`` (what to check next). ``recheck_in`` may name
    seconds after which ``fail``/``done`` must run again even without an event (a state
    that becomes fatal only after a grace period); the watch then ends at that time.
    """
    field_selector = f"metadata.name={name}" if name else None
    objects: Objects = {}
    while True:
        lst = api.list(
            kind, namespace, label_selector=label_selector, field_selector=field_selector
        )
        objects = {o["metadata"]["name"]: o for o in lst["items"]}
        version = str(lst.get("metadata", {}).get("resourceVersion") or "")
        if _check(objects, done, fail):
            return objects
        try:
            while True:
                remaining = deadline.remaining()
                if remaining <= 0:
                    raise _timeout(what, deadline, objects, describe, hint)
                soon = recheck_in(objects) if recheck_in else None
                for etype, obj in api.watch(
                    kind,
                    namespace,
                    resource_version=version,
                    timeout_s=remaining if soon is None else max(1.0, min(remaining, soon)),
                    label_selector=label_selector,
                    field_selector=field_selector,
                ):
                    meta = obj.get("metadata", {})
                    version = str(meta.get("resourceVersion") or version)
                    if etype == "DELETED":
                        objects.pop(meta.get("name", ""), None)
                    else:
                        objects[meta.get("name", "")] = obj
                    if _check(objects, done, fail):
                        return objects
                if soon is not None and _check(objects, done, fail):
                    return objects
        except WatchExpired:
            logger.debug("watch of %s expired (410); re-listing", kind.plural)


def _check(
    objects: Objects, done: Callable[[Objects], bool], fail: Callable[[Objects], None] | None
) -> bool:
    if fail is not None:
        fail(objects)
    return done(objects)


def _timeout(
    what: str,
    deadline: Deadline,
    objects: Objects,
    describe: Callable[[Objects], str] | None,
    hint: str,
) -> WaitTimeout:
    state = describe(objects) if describe else _default_state(objects)
    message = f"timed out after {deadline.timeout_s:g} s waiting for {what}; last observed: {state}"
    return WaitTimeout(f"{message}; {hint}" if hint else message)


def _default_state(objects: Objects) -> str:
    if not objects:
        return "no such object"
    parts = []
    for name, obj in sorted(objects.items()):
        meta = obj.get("metadata", {})
        extra = []
        if meta.get("deletionTimestamp"):
            extra.append(f"deleting since {meta['deletionTimestamp']}")
        if meta.get("finalizers"):
            extra.append("finalizers " + ", ".join(meta["finalizers"]))
        parts.append(f"{name} ({'; '.join(extra) or 'present'})")
    return ", ".join(parts)
