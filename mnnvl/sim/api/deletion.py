"""Deletion semantics of the store: graceful pod termination, namespace finalization,
Foreground propagation and ownerReference garbage collection (mixed into ``Store``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mnnvl.sim.api.model import Key, Obj, clone, iso_after, now_iso
from mnnvl.sim.api.objindex import ObjectIndex

FOREGROUND = "foregroundDeletion"


class Deletion:
    """Helpers called by ``Store.delete``/``Store._remove`` with the store's lock held."""

    _objs: ObjectIndex
    _uids: dict[str, Key]
    _emit: Callable[[str, Key, Obj], None]
    _remove: Callable[[Key], None]
    delete: Callable[..., Obj]
    mutate: Callable[..., Any]

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

    def _finalizing(self, obj: Obj, finalizers: list[str], grace_s: float | None) -> Obj | None:
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
                self.delete(dep[0], dep[1], dep[2], "Background")
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
            for dep in self._dependents(owner_uid)
            for r in self._objs[dep]["metadata"].get("ownerReferences") or []
        ):
            return
        self.mutate(
            key[0],
            key[1],
            key[2],
            lambda o: o["metadata"].__setitem__(
                "finalizers", [f for f in o["metadata"]["finalizers"] if f != FOREGROUND]
            ),
        )

    def _dependents(self, uid: str) -> list[Key]:
        return self._objs.owned_by(uid)

    def _collect(self, uid: str) -> None:
        """Garbage collection: delete dependents whose owners are all gone."""
        for dep in self._dependents(uid):
            if dep not in self._objs:
                continue
            refs = self._objs[dep]["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") in self._uids for r in refs):
                self.delete(dep[0], dep[1], dep[2], "Background")

    def _orphan(self, uid: str) -> None:
        for dep in self._dependents(uid):
            self.mutate(
                dep[0],
                dep[1],
                dep[2],
                lambda o: o["metadata"].__setitem__(
                    "ownerReferences",
                    [r for r in o["metadata"]["ownerReferences"] if r.get("uid") != uid],
                ),
            )


def _grace_s(pod: Obj, grace_s: float | None) -> int:
    """The delete's grace period, else the pod's, else Kubernetes' default of 30 s."""
    grace = grace_s if grace_s is not None else pod["spec"].get("terminationGracePeriodSeconds")
    return 30 if grace is None else max(int(grace), 0)
