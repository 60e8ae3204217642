"""The store's objects with two indexes kept beside them: keys by resource and by owner uid.

Lists, watch replays and garbage collection then touch only the objects of one resource or of
one owner instead of every object in the cluster; with a thousand concurrent runs (and their
events) a full scan under the store's lock on each of those calls made the simulator's time
grow with the square of the number of runs.
"""

from __future__ import annotations

from collections.abc import Iterator

from mnnvl.sim.api.model import Key, Obj


def owner_uids(obj: Obj) -> set[str]:
    return {str(r.get("uid")) for r in obj["metadata"].get("ownerReferences") or []}


class ObjectIndex(dict[Key, Obj]):
    """``dict`` of (plural, namespace, name) -> object; writes go through ``[]=`` and ``pop``."""

    def __init__(self) -> None:
        super().__init__()
        self._by_resource: dict[str, dict[Key, None]] = {}
        self._by_owner: dict[str, set[Key]] = {}

    def __setitem__(self, key: Key, obj: Obj) -> None:
        old = self.get(key)
        if old is not None:
            self._unindex(key, old)
        super().__setitem__(key, obj)
        self._by_resource.setdefault(key[0], {})[key] = None
        for uid in owner_uids(obj):
            self._by_owner.setdefault(uid, set()).add(key)

    def pop(self, key: Key) -> Obj:  # type: ignore[override]
        obj = super().pop(key)
        self._unindex(key, obj)
        return obj

    def _unindex(self, key: Key, obj: Obj) -> None:
        keys = self._by_resource.get(key[0], {})
        keys.pop(key, None)
        for uid in owner_uids(obj):
            owned = self._by_owner.get(uid)
            if owned is not None:
                owned.discard(key)
                if not owned:
                    del self._by_owner[uid]

    def of_resource(self, resource: str) -> Iterator[Key]:
        return iter(list(self._by_resource.get(resource, {})))

    def owned_by(self, uid: str) -> list[Key]:
        """Keys of the objects whose ownerReferences name ``uid`` (checked again here)."""
        return [k for k in sorted(self._by_owner.get(uid, ())) if uid in owner_uids(self[k])]
