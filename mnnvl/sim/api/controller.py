"""``Controller``: the thread skeleton every simulated controller shares.

A real controller is an informer feeding a work queue and a worker loop; here that is one
store subscription (``kinds``) read by one thread. The loop takes what is queued as one
burst and hands it to ``on_events`` (a burst of pod updates becomes one scheduling pass, as
a work queue folds repeated keys), calls ``on_tick`` every ``period_s`` where a controller
resyncs on a clock, and ends when the subscription is closed. ``requeue``/``wake_at`` put a
``SYNC`` event on the queue later: deadlines, back-off and a pending pod's due time.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from mnnvl.sim.api.store import Store, WatchEvent

log = logging.getLogger(__name__)
WAKE_SLACK_S = 0.01  # a wake-up lands just after the time it was asked for, not just before


class Controller:
    """Subclasses set ``name`` and ``kinds`` (or ``period_s``) and override the hooks."""

    name = "sim-controller"
    kinds: tuple[str, ...] = ()  # the resources whose events feed the loop
    period_s: float | None = None  # call on_tick this often (None: never)

    def __init__(self, store: Store) -> None:
        self.store = store
        # Subscribed now, not at start: what happens in between is queued, not missed.
        self._sub = store.subscribe(self.kinds)
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        self._timers_lock = threading.Lock()
        self._wake_at = 0.0

    def on_events(self, events: list[WatchEvent]) -> None:
        """One burst of events, oldest first."""

    def on_tick(self) -> None:
        """The periodic resync (only with ``period_s``)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Cancel pending wake-ups, close the subscription and wait for the loop to end."""
        with self._timers_lock:
            timers, self._timers = self._timers, []
        for t in timers:
            t.cancel()
        self.store.unsubscribe(self._sub)
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        next_tick = self._next_tick()
        while True:
            timeout = None if next_tick is None else max(next_tick - time.monotonic(), 0.0)
            try:
                ev = self._sub.queue.get(timeout=timeout)
            except queue.Empty:
                self._guarded(self.on_tick)
                next_tick = self._next_tick()
                continue
            burst = [ev]
            while ev is not None and not self._sub.queue.empty():
                ev = self._sub.queue.get()
                burst.append(ev)
            if ev is None:
                return  # closed: what is left of the burst is not worth a pass
            self._guarded(self.on_events, burst)

    def _next_tick(self) -> float | None:
        return None if self.period_s is None else time.monotonic() + self.period_s

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        # A failed pass is logged and the loop goes on, as a controller requeues and retries.
        try:
            fn(*args)
        except Exception:
            log.exception("%s: pass failed", self.name)

    def requeue(self, delay_s: float, resource: str, namespace: str = "", name: str = "") -> None:
        """Feed a ``SYNC`` event for this object to the loop after ``delay_s`` seconds."""
        ev = WatchEvent(0, resource, namespace, "SYNC", {"metadata": {"name": name}})
        timer = threading.Timer(max(delay_s, 0.0), self._sub.queue.put, (ev,))
        timer.daemon = True
        with self._timers_lock:
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def wake_at(self, at: float) -> None:
        """A pass at monotonic time ``at``; one timer for the earliest wake-up asked for."""
        now = time.monotonic()
        if now < self._wake_at <= at:
            return  # an earlier wake-up is already armed
        self._wake_at = at
        self.requeue(at - now + WAKE_SLACK_S, "")
