"""In-memory object store of the simulated cluster: resourceVersion, finalizers, GC, watch fan-out.

One lock guards everything; every change gets the next global resourceVersion, is kept in a
bounded history (so watches can resume from a resourceVersion, or get 410 Expired when it is
older than the history) and is pushed to every subscribed queue. Controllers and HTTP watches
both consume these queues, so nothing in the simulator polls the store.
"""

from __future__ import annotations

import builtins
import itertools
import queue
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mnnvl.sim.api.model import (
    RESOURCES,
    ApiError,
    Key,
    Obj,
    clone,
    iso_after,
    not_found,
    now_iso,
)
from mnnvl.sim.api.objindex import ObjectIndex

__all__ = ["RESOURCES", "ApiError", "Obj", "Store", "clone", "not_found", "now_iso"]
FOREGROUND = "foregroundDeletion"


@dataclass
class WatchEvent:
    rv: int
    resource: str
    namespace: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj  # never mutated after the event is made


@dataclass
class Subscription:
    resources: frozenset[str]
    namespace: str | None
    queue: queue.SimpleQueue[WatchEvent | None] = field(default_factory=queue.SimpleQueue)
    name: str | None = None  # a watch of one object (fieldSelector metadata.name=...)

    def wants(self, ev: WatchEvent) -> bool:
        return (
            ev.resource in self.resources
            and self.namespace in (None, ev.namespace)
            and self.name in (None, ev.obj["metadata"].get("name"))
        )


class Store:
    """Objects keyed by (plural, namespace, name); all methods are thread-safe."""

    def __init__(self, history: int = 10000) -> None:
        self.lock = threading.RLock()
        self._objs = ObjectIndex()
        self._uids: dict[str, Key] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque()
        self._history_max = history
        self._floor = 0  # events with rv <= floor are no longer retained
        self._subs: list[Subscription] = []
        self.sticky: Callable[[str, str, str], bool] = lambda resource, ns, name: False

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, resource: str, ns: str, name: str) -> Obj:
        with self.lock:
            obj = self._objs.get((resource, ns, name))
            if obj is None:
                raise not_found(resource, name)
            return clone(obj)

    def find(self, resource: str, ns: str, name: str) -> Obj | None:
        try:
            return self.get(resource, ns, name)
        except ApiError:
            return None

    def list(
        self, resource: str, ns: str | None = None, match: Callable[[Obj], bool] | None = None
    ) -> tuple[builtins.list[Obj], int]:
        with self.lock:
            # Only this resource's keys (an index): lists are frequent and the store is
            # shared by every kind.
            keys = sorted(k for k in self._objs.of_resource(resource) if ns in (None, k[1]))
            objs = (self._objs[k] for k in keys)
            items = [clone(o) for o in objs if match is None or match(o)]
            return items, self._rv

    def create(self, resource: str, obj: Obj, *, dry_run: bool = False) -> Obj:
        """POST semantics; ``dry_run`` (``dryRun=All``) checks everything and returns what
        would be stored, without a resourceVersion, storing and announcing nothing."""
        rt = RESOURCES[resource]
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if rt.namespaced else ""
        with self.lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = meta.get("name")
            if not name:
                raise ApiError(
                    422, "Invalid", f"{rt.kind} is invalid: metadata.name: Required value"
                )
            details = {"name": name, "group": rt.group, "kind": resource}
            if rt.namespaced:
                meta["namespace"] = ns = ns or "default"
                nsobj = self._objs.get(("namespaces", "", ns))
                if nsobj is None:
                    raise not_found("namespaces", ns)
                if nsobj["metadata"].get("deletionTimestamp"):
                    raise ApiError(
                        403,
                        "Forbidden",
                        f'{resource} "{name}" is forbidden: unable to create new content in '
                        f"namespace {ns} because it is being terminated",
                        details,
                    )
            key = (resource, ns, name)
            if key in self._objs:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists', details)
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
            for k in ("deletionTimestamp", "resourceVersion"):
                meta.pop(k, None)
            if dry_run:
                return clone(obj)
            self._objs[key] = obj
            self._uids[meta["uid"]] = key
            self._emit("ADDED", key, obj)
            created = clone(obj)
            # The garbage collector deletes a dependent that appears while its owner waits in
            # foreground deletion, as it deleted the ones there were (it would block the owner).
            if any(
                self._in_foreground_deletion(str(r.get("uid")))
                for r in meta.get("ownerReferences") or []
            ):
                self.delete(resource, ns, name, "Foreground")
            return created

    def _in_foreground_deletion(self, uid: str) -> bool:
        key = self._uids.get(uid)
        return key is not None and FOREGROUND in (
            self._objs[key]["metadata"].get("finalizers") or []
        )

    def update(
        self,
        resource: str,
        ns: str,
        name: str,
        new: Obj,
        subresource: str | None = None,
        *,
        dry_run: bool = False,
    ) -> Obj:
        """PUT semantics: server-owned metadata is kept; status only through ``/status``.
        ``dry_run``: the object as it would be stored, at its current resourceVersion."""
        with self.lock:
            key = (resource, ns, name)
            old = self._objs.get(key)
            if old is None:
                raise not_found(resource, name)
            want_rv = new.get("metadata", {}).get("resourceVersion")
            if want_rv and want_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {resource} "
                    f'"{key[2]}": the object has been modified; please apply your '
                    "changes to the latest version and try again",
                )
            return self._replace(key, old, clone(new), subresource, dry_run)

    def mutate(self, resource: str, ns: str, name: str, fn: Callable[[Obj], Any]) -> Obj | None:
        """Controller read-modify-write under the lock, status included; returns None when the
        object is gone (``fn`` returning False: nothing to write)."""
        with self.lock:
            key = (resource, ns, name)
            old = self._objs.get(key)
            if old is None:
                return None
            new = clone(old)
            if fn(new) is False:
                return clone(old)
            return self._replace(key, old, new, "all")

    def _replace(
        self, key: Key, old: Obj, new: Obj, subresource: str | None, dry_run: bool = False
    ) -> Obj:
        rt = RESOURCES[key[0]]
        if subresource == "status":
            merged = clone(old)
            if "status" in new:
                merged["status"] = new["status"]
            new = merged
        elif subresource is None and rt.status_subresource:
            new.pop("status", None)
            if "status" in old:
                new["status"] = clone(old["status"])
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        for k in (
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if k in old_meta:
                meta[k] = old_meta[k]
            else:
                meta.pop(k, None)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        if self.sticky(*key):
            # A stuck finalizer (fault injection) can never be removed.
            meta["finalizers"] = list(
                dict.fromkeys((meta.get("finalizers") or []) + (old_meta.get("finalizers") or []))
            )
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        strip = ("metadata", "status", "apiVersion", "kind")
        if {k: v for k, v in new.items() if k not in strip} != {
            k: v for k, v in old.items() if k not in strip
        }:
            meta["generation"] = old_meta.get("generation", 1) + 1
        meta["resourceVersion"] = old_meta["resourceVersion"]  # a new one once it is stored
        if new == old:
            return clone(old)  # no-op writes do not bump the resourceVersion
        if dry_run:
            return clone(new)
        self._objs[key] = new
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        ):
            self._remove(key)
        else:
            self._emit("MODIFIED", key, new)
        return clone(new)

    def delete(
        self,
        resource: str,
        ns: str,
        name: str,
        propagation: str | None = None,
        grace_s: float | None = None,
        *,
        precondition_uid: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE semantics: finalizers, graceful pod termination, propagation, namespaces.
        ``precondition_uid`` (``preconditions.uid``) that is not the object's → 409 Conflict.
        ``dry_run``: the object as the delete would leave it; nothing changes."""
        with self.lock:
            key = (resource, ns, name)
            obj = self._objs.get(key)
            if obj is None:
                raise not_found(resource, name)
            if precondition_uid and obj["metadata"]["uid"] != precondition_uid:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                    f"UID in precondition: {precondition_uid}, "
                    f"UID in object meta: {obj['metadata']['uid']}",
                )
            # batch/v1 Jobs orphan their pods unless asked otherwise, like the real API server.
            policy = propagation or ("Orphan" if resource == "jobs" else "Background")
            uid = obj["metadata"]["uid"]
            finalizers = list(obj["metadata"].get("finalizers") or [])
            if policy == "Foreground" and self._objs.owned_by(uid):
                finalizers = list(dict.fromkeys([*finalizers, FOREGROUND]))
            graceful = resource == "pods" and grace_s != 0 and obj["spec"].get("nodeName")
            if resource == "namespaces" or graceful:
                marked: Obj | None = self._terminating(obj, grace_s)
            else:
                marked = self._finalizing(obj, finalizers, grace_s)
            if dry_run:
                return clone(marked or obj)
            if policy == "Orphan":
                self._orphan(uid)
            if marked is None:
                self._remove(key)
                return clone(obj)
            if marked is not obj:
                self._objs[key] = marked
                self._emit("MODIFIED", key, marked)
            if resource == "namespaces":
                self._delete_contents(name)
            elif not graceful and FOREGROUND in finalizers:
                for dep in self._objs.owned_by(uid):
                    if dep in self._objs:
                        self.delete(*dep, "Foreground")
                self._finish_foreground(uid)
            return clone(self._objs.get(key, marked))

    def _remove(self, key: Key) -> None:
        obj = self._objs.pop(key)
        self._uids.pop(obj["metadata"]["uid"], None)
        self._emit("DELETED", key, obj)
        self._collect(obj["metadata"]["uid"])
        for ref in obj["metadata"].get("ownerReferences") or []:
            self._finish_foreground(str(ref.get("uid")))
        if key[1] and key[0] != "namespaces":
            self._finish_namespace(key[1])

    def _terminating(self, obj: Obj, grace_s: float | None) -> Obj:
        """A namespace or a pod bound to a node marked Terminating (a copy; ``obj`` itself
        when it already is): the namespace until every object in it is gone, the pod for its
        grace period, until its kubelet has stopped it and deletes it again with grace 0."""
        if obj["metadata"].get("deletionTimestamp"):
            return obj
        obj = clone(obj)
        if obj["kind"] == "Namespace":
            obj["metadata"]["deletionTimestamp"] = now_iso()
            obj.update(spec={"finalizers": ["kubernetes"]}, status={"phase": "Terminating"})
        else:
            grace = _grace_s(obj, grace_s)
            obj["metadata"].update(
                deletionTimestamp=iso_after(grace), deletionGracePeriodSeconds=grace
            )
        return obj

    def _finalizing(
        self, obj: Obj, finalizers: builtins.list[str], grace_s: float | None
    ) -> Obj | None:
        """The object marked for deletion while ``finalizers`` hold it (a copy; ``obj`` itself
        when it already is), or None when nothing holds it. Grace 0 (a kubelet's final
        delete) ends the grace period: the object goes as soon as its last finalizer does."""
        if not finalizers:
            return None
        meta = obj["metadata"]
        shorten = grace_s == 0 and meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and not shorten and finalizers == meta.get("finalizers"):
            return obj
        obj = clone(obj)
        obj["metadata"].setdefault("deletionTimestamp", now_iso())
        obj["metadata"].setdefault("deletionGracePeriodSeconds", 0)
        if shorten:
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
        obj["metadata"]["finalizers"] = finalizers
        return obj

    def _delete_contents(self, ns: str) -> None:
        """A Terminating namespace: everything in it is deleted, then the namespace goes."""
        for dep in sorted(k for k in self._objs if k[1] == ns and k[0] != "namespaces"):
            if dep in self._objs and not self._objs[dep]["metadata"].get("deletionTimestamp"):
                self.delete(*dep, "Background")
        self._finish_namespace(ns)

    def _finish_namespace(self, ns: str) -> None:
        nskey = ("namespaces", "", ns)
        nsobj = self._objs.get(nskey)
        if nsobj is None or not nsobj["metadata"].get("deletionTimestamp"):
            return
        if not any(k[1] == ns for k in self._objs if k[0] != "namespaces"):
            self._remove(nskey)

    def _finish_foreground(self, owner_uid: str) -> None:
        """Drop ``foregroundDeletion`` once no dependent blocks the owner's deletion any more."""
        key = self._uids.get(owner_uid)
        if key is None or FOREGROUND not in (self._objs[key]["metadata"].get("finalizers") or []):
            return
        if any(
            r.get("uid") == owner_uid and r.get("blockOwnerDeletion")
            for dep in self._objs.owned_by(owner_uid)
            for r in self._objs[dep]["metadata"].get("ownerReferences") or []
        ):
            return
        self.mutate(*key, lambda o: o["metadata"]["finalizers"].remove(FOREGROUND))

    def _collect(self, uid: str) -> None:
        """Garbage collection: delete dependents whose owners are all gone."""
        for dep in self._objs.owned_by(uid):
            if dep not in self._objs:
                continue
            refs = self._objs[dep]["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") in self._uids for r in refs):
                self.delete(*dep, "Background")

    def _orphan(self, uid: str) -> None:
        def drop_owner(o: Obj) -> None:
            refs = o["metadata"]["ownerReferences"]
            refs[:] = [r for r in refs if r.get("uid") != uid]

        for dep in self._objs.owned_by(uid):
            self.mutate(*dep, drop_owner)

    def _emit(self, type_: str, key: Key, obj: Obj) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        ev = WatchEvent(self._rv, key[0], key[1], type_, clone(obj))
        self._history.append(ev)
        while len(self._history) > self._history_max:
            self._floor = self._history.popleft().rv
        for sub in self._subs:
            if sub.wants(ev):
                sub.queue.put(ev)

    def subscribe(
        self,
        resources: Iterable[str],
        namespace: str | None = None,
        since: str | None = None,
        match: Callable[[Obj], bool] | None = None,
        name: str | None = None,
    ) -> Subscription:
        """Start a watch. ``since`` "" or "0" (or None) replays current objects as ADDED;
        a resourceVersion replays retained history after it, or raises 410 Expired. With
        ``name`` only that object's events are queued (a thousand single-object watches
        would otherwise each be woken by every event of their resource)."""
        sub = Subscription(frozenset(resources), namespace, name=name)
        with self.lock:
            if since not in (None, "", "0"):
                try:
                    start = int(str(since))
                except ValueError as e:
                    raise ApiError(400, "BadRequest", f"invalid resourceVersion {since}") from e
                if start < self._floor:
                    raise ApiError(
                        410, "Expired", f"too old resource version: {start} ({self._floor + 1})"
                    )
                # Retained events have consecutive resourceVersions: skip straight to start.
                first = self._history[0].rv if self._history else start + 1
                for ev in itertools.islice(self._history, max(start + 1 - first, 0), None):
                    if sub.wants(ev):
                        sub.queue.put(ev)
            else:
                keys = (k for r in sub.resources for k in self._objs.of_resource(r))
                for key in sorted(keys):
                    obj = self._objs[key]
                    if namespace in (None, key[1]) and (match is None or match(obj)):
                        rv = int(obj["metadata"]["resourceVersion"])
                        sub.queue.put(WatchEvent(rv, key[0], key[1], "ADDED", clone(obj)))
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self.lock:
            if sub in self._subs:
                self._subs.remove(sub)
        sub.queue.put(None)

    def compact(self) -> None:
        """Drop the watch history, like an etcd compaction: older resourceVersions expire."""
        with self.lock:
            self._history.clear()
            self._floor = self._rv

    def close(self) -> None:
        """Wake every watcher with None so its thread ends."""
        with self.lock:
            subs, self._subs = self._subs, []
        for sub in subs:
            sub.queue.put(None)


def _grace_s(pod: Obj, grace_s: float | None) -> int:
    """The delete's grace period, else the pod's, else Kubernetes' default of 30 s."""
    grace = grace_s if grace_s is not None else pod["spec"].get("terminationGracePeriodSeconds")
    return 30 if grace is None else max(int(grace), 0)
