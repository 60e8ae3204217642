"""The base every simulated controller runs on: events in bursts, a periodic tick, delayed
wake-ups, and a stop that leaves no thread or timer behind."""

from __future__ import annotations

import threading
import time

from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.store import Store, WatchEvent
from tests.sim.simkit import wait_for


class Recorder(Controller):
    name = "test-recorder"
    kinds = ("services",)

    def __init__(self, store: Store, period_s: float | None = None) -> None:
        self.period_s = period_s
        super().__init__(store)
        self.bursts: list[list[WatchEvent]] = []
        self.ticks = 0
        self.fail_next = False

    def on_events(self, events: list[WatchEvent]) -> None:
        self.bursts.append(events)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("a failed pass")

    def on_tick(self) -> None:
        self.ticks += 1

    def seen(self) -> list[tuple[str, str]]:
        return [(e.type, e.obj["metadata"]["name"]) for b in self.bursts for e in b]


def new_store() -> Store:
    store = Store()
    store.create("namespaces", {"metadata": {"name": "default"}})
    return store


def service(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {}}


def test_events_made_before_start_are_delivered_and_a_failed_pass_does_not_end_the_loop() -> None:
    store = new_store()
    ctl = Recorder(store)
    store.create("services", service("early"))  # before start: queued, not missed
    ctl.fail_next = True
    ctl.start()
    try:
        wait_for(lambda: ("ADDED", "early") in ctl.seen(), what="the early event")
        store.create("services", service("later"))
        wait_for(lambda: ("ADDED", "later") in ctl.seen(), what="an event after a failed pass")
        store.create("namespaces", {"metadata": {"name": "x"}})  # not one of its kinds
        store.create("services", service("last"))
        wait_for(lambda: ("ADDED", "last") in ctl.seen(), what="an event after the namespace")
        assert all(e.resource == "services" for b in ctl.bursts for e in b)
    finally:
        ctl.stop()


def test_requeue_and_wake_at_arrive_later_and_the_earliest_wake_up_wins() -> None:
    store = new_store()
    ctl = Recorder(store)
    ctl.start()
    try:
        start = time.monotonic()
        ctl.requeue(0.3, "services", "default", "again")
        ev = wait_for(
            lambda: next((e for b in ctl.bursts for e in b if e.type == "SYNC"), None),
            what="the requeued event",
        )
        assert (ev.resource, ev.namespace, ev.obj["metadata"]["name"]) == (
            "services",
            "default",
            "again",
        )
        assert time.monotonic() - start >= 0.3
        ctl.bursts.clear()
        now = time.monotonic()
        ctl.wake_at(now + 0.2)
        ctl.wake_at(now + 5.0)  # later than the one armed: folded into it
        wait_for(lambda: ctl.bursts, what="the wake-up")
        ctl.requeue(0.1, "services", "default", "after")  # later than a second 0.2 s wake-up
        wait_for(lambda: len(ctl.bursts) > 1, what="the requeued event")
        assert [e.obj["metadata"]["name"] for e in ctl.bursts[1]] == ["after"]
    finally:
        ctl.stop()


def test_period_ticks_and_stop_ends_the_thread_and_cancels_pending_wake_ups() -> None:
    store = new_store()
    ctl = Recorder(store, period_s=0.05)
    ctl.start()
    wait_for(lambda: ctl.ticks >= 3, what="three ticks")
    ctl.requeue(0.3, "services", "default", "never")
    ctl.stop()
    assert not any(t.name == "test-recorder" for t in threading.enumerate())
    wait_for(
        lambda: not any(isinstance(t, threading.Timer) for t in threading.enumerate()),
        timeout=0.2,
        what="the pending wake-up's timer to be cancelled",
    )
    ticks, bursts = ctl.ticks, len(ctl.bursts)
    time.sleep(0.5)
    assert (ctl.ticks, len(ctl.bursts)) == (ticks, bursts)
    assert store._subs == []  # the subscription is closed
