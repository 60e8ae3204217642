"""What a run owns: the checks before it adopts or deletes anything.

Every object a run creates carries ``app.kubernetes.io/managed-by=mnnvl-pipelines``,
``mnnvl.io/run-id=<run id>`` and the spec-hash annotation (:mod:`mnnvl.manifests.spec_hash`).
An object with our name that lacks those labels belongs to someone else: a create refuses it
(exit 2), a teardown or reap leaves it alone and names it. A create that meets an object of
its own run adopts it only when it was made from the same spec and is not terminating; a
Failed Job, or the record of a step that failed (:func:`failed_reason`), made from another
spec is replaced instead. Every delete works from an object as read and sends
``preconditions.uid``, so an object replaced between the read and the delete is never removed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from mnnvl.driver.api import Api, Kind
from mnnvl.errors import (
    AlreadyExists,
    HttpConflict,
    MnnvlError,
    NotAdoptable,
    NotFound,
    SpecError,
    TeardownIncomplete,
)
from mnnvl.inputs.names import (
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_RUN_ID,
    MANAGED_BY,
    RunNames,
)
from mnnvl.manifests import hash_of, with_spec_hash

logger = logging.getLogger(__name__)


def owned_by_run(obj: dict[str, Any], run_id: str) -> bool:
    """True when ``obj`` carries our managed-by label and ``run_id``'s run label."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_MANAGED_BY) == MANAGED_BY and labels.get(LABEL_RUN_ID) == run_id


def _owner_text(obj: dict[str, Any]) -> str:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    ours = {k: v for k, v in labels.items() if k in (LABEL_MANAGED_BY, LABEL_RUN_ID)}
    return f"its labels: {ours}" if ours else "it has none of our labels"


# On the Job that records a failed step (mnnvl.driver.workload.record_failure): the failure
# as JSON (message, exit codes, any RESULT), so a retry with the same inputs repeats it.
FAILURE_ANNOTATION = "mnnvl.io/step-failure"


def failed_reason(obj: dict[str, Any]) -> str:
    """The reason of a ``Failed=True`` condition (a Job that failed), "StepFailed" for the
    record of a step that failed, else ""."""
    if FAILURE_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {}):
        return "StepFailed"
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return str(cond.get("reason") or "Failed")
    return ""


class StaleObject(NotAdoptable):
    """An object of this run that failed (a Job) made from another spec: the step may
    replace it."""

    def __init__(self, message: str, existing: dict[str, Any]) -> None:
        super().__init__(message)
        self.existing = existing


def create_or_adopt(api: Api, kind: Kind, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create ``body`` (stamped with its spec hash); on 409 adopt the object only if it is
    this run's, made from the same spec, and not terminating (a Failed one too: its failure
    is the step's, which the caller reports).

    Returns ``(object, adopted)``. Raises ``SpecError`` when the namespace does not exist,
    ``StaleObject`` for a failed object of the run made from another spec (the caller may
    delete and recreate it) and ``NotAdoptable`` (exit 2) for anything else in the way.
    """
    body = with_spec_hash(body)
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    run_id = str(meta.get("labels", {}).get(LABEL_RUN_ID, ""))
    for attempt in range(2):
        try:
            return api.create(kind, namespace, body), False
        except NotFound as e:
            if e.details_kind != "namespaces":
                raise
            # Told by the create's 404, never by a GET: a namespace-scoped account may not.
            raise SpecError(
                "namespace",
                f"{namespace!r} does not exist (the API answered 404 for it when creating the "
                f"run's first object); create it (kubectl create namespace {namespace}) or set "
                "another namespace",
            ) from e
        except AlreadyExists as e:
            try:
                existing = api.get(kind, namespace, name)
            except NotFound:
                if attempt:
                    raise
                continue  # deleted between the create and the read: create again
            _check_adoptable(kind, existing, body, run_id, e)
            return existing, True
    raise AssertionError("unreachable")


def _check_adoptable(
    kind: Kind, existing: dict[str, Any], body: dict[str, Any], run_id: str, cause: Exception
) -> None:
    meta = existing.get("metadata") or {}
    what = f"{kind.kind} {meta.get('namespace')}/{meta.get('name')}"
    teardown = (
        f"tear the run down (mnnvl teardown --run-id {run_id} --namespace "
        f"{meta.get('namespace')}) or use another run id"
    )
    if kind.kind == "Job" and (meta.get("labels") or {}).get(LABEL_COMPONENT) == "verify":
        # `mnnvl verify` replaces its own earlier measurement when asked; the domain stays.
        teardown = (
            f"to measure again with these inputs, `mnnvl verify … --measure-again`; or {teardown}"
        )
    if not owned_by_run(existing, run_id):
        raise NotAdoptable(
            f"{what} already exists and is not part of run {run_id!r} ({_owner_text(existing)}); "
            f"delete it if it is stale (kubectl delete {kind.plural} -n {meta.get('namespace')} "
            f"{meta.get('name')}) or use another run id"
        ) from cause
    if meta.get("deletionTimestamp"):
        raise NotAdoptable(
            f"{what} of run {run_id} is being deleted (a teardown is in progress); "
            "wait for it to finish, then try again"
        ) from cause
    have, want = hash_of(existing), hash_of(body)
    if have == want:
        return
    reason = failed_reason(existing)
    if reason:
        # Run again with other input: only evidence is left of the failed Job (its pods are
        # done), so it may be replaced. Its result is never taken as this step's.
        raise StaleObject(
            f"{what} of run {run_id} failed earlier ({reason}) with another spec; {teardown}",
            existing,
        ) from cause
    raise NotAdoptable(
        f"{what} of run {run_id} exists with a different spec (spec-hash {have or 'none'}, "
        f"this step's {want}): another command or step made it with this run id; {teardown}"
    ) from cause


@dataclass
class Deletions:
    """What a teardown or reap of one run did: objects deleted, objects left alone (and why)."""

    run_id: str
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def delete(
        self, api: Api, kind: Kind, obj: dict[str, Any], *, propagation: str | None = None
    ) -> bool:
        """Delete ``obj`` (as read from the API) if it is the run's; True when deleted now."""
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        what = f"{kind.kind} {namespace}/{name}"
        if not owned_by_run(obj, self.run_id):
            self._skip(what, f"not part of run {self.run_id} ({_owner_text(obj)})")
            return False
        try:
            deleted = api.delete(kind, namespace, name, propagation=propagation, uid=meta["uid"])
        except HttpConflict:
            self._skip(what, "was replaced by another object while being deleted")
            return False
        if deleted:
            self.deleted.append(what)
            logger.debug("deleted %s", what)  # the teardown's one line counts them
        return deleted

    def delete_named(
        self, api: Api, kind: Kind, namespace: str, name: str, *, propagation: str | None = None
    ) -> bool:
        """Read ``namespace/name`` and delete it if it is the run's; False if absent or not ours."""
        try:
            obj = api.get(kind, namespace, name)
        except NotFound:
            return False
        return self.delete(api, kind, obj, propagation=propagation)

    def incomplete(self, namespace: str, cause: MnnvlError) -> TeardownIncomplete:
        """The error of a teardown that could not finish (``cause``): every object that may be
        left, and the command that removes them once the cluster answers."""
        names = RunNames.for_run(self.run_id)
        leftovers = [*self.deleted]  # deleted, but not seen gone
        leftovers += [
            f"Jobs, Pods, Services and ResourceClaimTemplates in {namespace} labelled "
            f"{names.selector}",
            f"ComputeDomain {namespace}/{names.domain} (with its ResourceClaimTemplate "
            f"{namespace}/{names.channel_template})",
        ]
        cleanup = f"mnnvl teardown --run-id {self.run_id} --namespace {namespace}"
        reap = f"mnnvl reap --namespace {namespace} --live-run-ids <runs still running>"
        message = (
            f"teardown of run {self.run_id} could not finish: {cause}; may be left: "
            f"{'; '.join(leftovers)}; remove them with `{cleanup}` once the cluster answers "
            f"(or `{reap}`)"
        )
        return TeardownIncomplete(
            message, exit_code=cause.exit_code, leftovers=leftovers, cleanup=cleanup
        )

    def _skip(self, what: str, why: str) -> None:
        message = f"{what}: {why}; left alone"
        self.skipped.append(message)
        logger.warning("%s", message)
