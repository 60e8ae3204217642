"""The one wait loop: list, check, then watch from that resourceVersion, under a deadline.

A wait tracks one or more *sources*: the set of objects a selector matches (one object for a
``metadata.name`` field selector, or e.g. a Job's pods for a label selector). Each source is
listed and then watched from the list's resourceVersion in its own thread; events reach the
waiting thread through one queue. On every change the waiting thread runs the wait's check,
which raises a typed error to end the wait early or returns a value to finish it.

The waiting thread also wakes up on its own, independent of events: at the deadline, when the
check asked to be re-run (a state that becomes fatal only after a grace period, e.g. a pod
Unschedulable for longer than allowed, which no further event announces), and every
``PROGRESS_EVERY_S`` to log a progress line naming what it waits for. A 410 Gone re-lists and
carries on; a watch the server ends is resumed from the last resourceVersion seen (bookmarks
move it forward). While the API is unreachable (an outage the retry policy rides out) the wait
reaches no verdict and lets no deadline or grace period end it: the view may be stale, so they
are judged on what the watches show once the API answers again. Outside outages nothing
polls: between events and timers the threads block on watch streams and on the queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mnnvl.driver.api import Api, Kind
from mnnvl.errors import WaitTimeout, WatchExpired

logger = logging.getLogger(__name__)

Objects = dict[str, dict[str, Any]]
"""Objects a source's selector matches, by name (empty when none exist)."""
View = dict[str, Objects]
"""Every source's objects, by source key."""

PROGRESS_EVERY_S = 15.0
# While the API is unreachable, and this long after it answered again (resumed watches replay
# what they missed), the view may be stale: the wait looks again this often meanwhile.
STALE_S = 1.0
# A watch is re-opened at least this often, so a watch thread ends soon after its wait did.
WATCH_CHUNK_S = 30.0
# How long past its deadline a wait lets a first list finish its retries (see Api.call).
LISTING_GRACE_S = 60.0


class Deadline:
    """A point on ``clock`` (monotonic seconds); ``timeout_s`` of 0 or less means no limit."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.clock = timeout_s, clock
        self.start = clock()
        self.at = self.start + timeout_s if timeout_s > 0 else float("inf")

    def remaining(self) -> float:
        return self.at - self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0


@dataclass(frozen=True)
class Source:
    """One watched set of objects: a kind in the wait's namespace plus selectors."""

    kind: Kind
    name: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    @property
    def fields(self) -> str | None:
        parts = [f"metadata.name={self.name}"] if self.name else []
        parts += [self.field_selector] if self.field_selector else []
        return ",".join(parts) or None


def watch_until(
    api: Api,
    namespace: str,
    sources: dict[str, Source],
    check: Callable[[View], Any],
    *,
    deadline: Deadline,
    on_timeout: Callable[[View], Exception],
    progress: Callable[[View], str],
    recheck_in: Callable[[View], float | None] = lambda view: None,
) -> Any:
    """Run ``check`` on every change of ``sources`` until it returns non-None (returned here).

    ``check`` raises to end the wait early. ``recheck_in(view)``: seconds after which the check
    must run again even without an event, or None. Raises what ``check`` raises, a watch
    thread's API error, or ``on_timeout(view)`` at the deadline. Logs ``progress(view)`` (what
    the wait waits for and how far it got) at least every ``PROGRESS_EVERY_S``.
    """
    events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
    stop = threading.Event()
    watchers = [
        _Watcher(api, namespace, key, source, events, stop, deadline)
        for key, source in sources.items()
    ]
    view: View = {}
    next_progress = deadline.clock() + PROGRESS_EVERY_S
    try:
        for w in watchers:
            w.start()
        while True:
            now = deadline.clock()
            synced = len(view) == len(sources)
            wake = [deadline.remaining(), next_progress - now]
            soon = recheck_in(view) if synced else None
            if soon is not None:
                wake.append(soon)
            if api.outage.unsettled(STALE_S):
                wake = [STALE_S]
            try:
                key, etype, payload = events.get(timeout=max(0.0, min(wake)))
                _apply(view, key, etype, payload)
            except queue.Empty:
                pass
            if api.outage.unsettled(STALE_S):
                # During an API outage (retried in Api.call, which logs it) the view may be
                # stale: no verdict, no deadline until the API answers and the watches resume.
                continue
            if len(view) == len(sources):
                found = check(view)
                if found is not None:
                    return found
            if deadline.expired:
                _settle_listing(events, view, sources)
                raise on_timeout(view)
            if deadline.clock() >= next_progress:
                next_progress = deadline.clock() + PROGRESS_EVERY_S
                line = progress(view) if len(view) == len(sources) else "listing"
                logger.info("waiting %.0f s: %s", deadline.elapsed(), line)
    finally:
        stop.set()


def _settle_listing(
    events: queue.Queue[tuple[str, str, Any]], view: View, sources: dict[str, Source]
) -> None:
    """At the deadline, let a source that never listed finish its (retried) list first: an
    API that keeps failing is then reported as such (exit 5), not as a timeout."""
    limit = time.monotonic() + LISTING_GRACE_S
    while len(view) < len(sources) and time.monotonic() < limit:
        try:
            key, etype, payload = events.get(timeout=max(0.0, limit - time.monotonic()))
        except queue.Empty:
            return
        _apply(view, key, etype, payload)


def _apply(view: View, key: str, etype: str, payload: Any) -> None:
    if etype == "ERROR":
        raise payload
    if etype == "SYNC":
        view[key] = payload
        return
    meta = payload.get("metadata", {})
    objects = view.setdefault(key, {})
    if etype == "DELETED":
        objects.pop(meta.get("name", ""), None)
    else:
        objects[meta.get("name", "")] = payload


class _Watcher(threading.Thread):
    """Lists one source, then watches it, feeding ``events`` until ``stop`` is set."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        key: str,
        source: Source,
        events: queue.Queue[tuple[str, str, Any]],
        stop: threading.Event,
        deadline: Deadline,
    ) -> None:
        super().__init__(name=f"watch-{source.kind.plural}-{key}", daemon=True)
        self.api, self.namespace, self.key, self.source = api, namespace, key, source
        self.events, self.stop, self.deadline = events, stop, deadline

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                version = self._list()
                try:
                    self._watch(version)
                except WatchExpired:
                    logger.debug("watch of %s expired (410); re-listing", self.source.kind.plural)
        except Exception as e:  # handed to the waiting thread, which raises it
            self.events.put((self.key, "ERROR", e))

    def _list(self) -> str:
        src = self.source
        lst = self.api.list(
            src.kind, self.namespace, label_selector=src.label_selector, field_selector=src.fields
        )
        self.events.put((self.key, "SYNC", {o["metadata"]["name"]: o for o in lst["items"]}))
        return str(lst.get("metadata", {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> None:
        src = self.source
        while not self.stop.is_set():
            chunk = max(1.0, min(WATCH_CHUNK_S, self.deadline.remaining()))
            for etype, obj in self.api.watch(
                src.kind,
                self.namespace,
                resource_version=version,
                timeout_s=chunk,
                label_selector=src.label_selector,
                field_selector=src.fields,
            ):
                if self.stop.is_set():
                    return
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                if etype != "BOOKMARK":  # a bookmark only moves the resume point
                    self.events.put((self.key, etype, obj))


# ---- the common case: one source, a done predicate, an optional fail predicate -----------------


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
) -> Objects:
    """Block until ``done(objects)`` is true; return the objects seen at that moment.

    ``what`` names the goal for messages ("ResourceClaimTemplate x to exist"). ``fail``
    raises to stop early. On the deadline raises ``WaitTimeout`` with ``describe(objects)``
    (the last observed state) and ``hint`` (what to check next).
    """
    state = describe or _default_state

    def check(view: View) -> Objects | None:
        if fail is not None:
            fail(view["it"])
        return dict(view["it"]) if done(view["it"]) else None

    return watch_until(
        api,
        namespace,
        {"it": Source(kind, name=name, label_selector=label_selector)},
        check,
        deadline=deadline,
        on_timeout=lambda view: timeout_error(what, deadline, state(view.get("it", {})), hint),
        progress=lambda view: f"{what}; now: {state(view['it'])}",
    )


def wait_gone(
    api: Api,
    kind: Kind,
    namespace: str,
    *,
    what: str,
    deadline: Deadline,
    hint: str,
    name: str | None = None,
    label_selector: str | None = None,
) -> None:
    """Block until nothing is left of a delete: the object ``name`` (its GET answers 404) or
    every object matching ``label_selector``. ``what`` names what goes ("Job ns/x and its
    pods"); on the deadline ``WaitTimeout`` names what is still there and ``hint``."""
    wait_for(
        api,
        kind,
        namespace,
        name=name,
        label_selector=label_selector,
        what=f"{what} to be gone",
        done=lambda objects: not objects,
        deadline=deadline,
        hint=hint,
    )


def timeout_error(what: str, deadline: Deadline, state: str, hint: str) -> WaitTimeout:
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
