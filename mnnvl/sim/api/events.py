"""Core/v1 Events written by the simulated controllers and kubelet."""

from __future__ import annotations

import logging
import uuid

from mnnvl.sim.api.model import ApiError, Obj, now_iso
from mnnvl.sim.api.store import Store


def record_event(
    store: Store, obj: Obj, type_: str, reason: str, message: str, component: str
) -> None:
    """Write a core/v1 Event about ``obj``; repeats of the same event bump its count."""
    meta = obj.get("metadata", {})
    ns = meta.get("namespace") or "default"
    digest = uuid.uuid5(uuid.NAMESPACE_OID, meta.get("uid", "") + reason + message).hex[:16]
    name = f"{meta.get('name', 'unknown')}.{digest}"
    now = now_iso()

    def bump(ev: Obj) -> None:
        ev["count"] = ev.get("count", 1) + 1
        ev["lastTimestamp"] = now

    with store.lock:
        if store.mutate("events", ns, name, bump) is not None:
            return
        try:
            store.create(
                "events",
                {
                    "metadata": {"name": name, "namespace": ns},
                    "involvedObject": {
                        "kind": obj.get("kind"),
                        "apiVersion": obj.get("apiVersion"),
                        "name": meta.get("name"),
                        "namespace": ns,
                        "uid": meta.get("uid"),
                    },
                    "type": type_,
                    "reason": reason,
                    "message": message,
                    "count": 1,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "source": {"component": component},
                    "reportingComponent": component,
                },
            )
        except ApiError as e:  # namespace deleted under us: the event has nowhere to go
            logging.getLogger(__name__).debug("event %s dropped: %s", reason, e)
