"""The one retry policy of every request and watch: what is transient, how long to back off,
and how long an unreachable API is tolerated (``--api-outage-s``). :meth:`mnnvl.driver.api.Api.call`
applies it.

A kube-apiserver that has just started serves requests before its authenticator's and RBAC
authorizer's informers have synced, and refuses permitted requests meanwhile (401/403): a
refusal right after the API was unreachable is the end of the outage, not a verdict. Such
refusals are retried like the outage for at most ``RetryPolicy.refused_s`` from the first one,
and never past ``outage_s``; a refusal on a healthy connection is fatal at once.
What is not retried is mapped onto the error family here, exactly once
(:func:`from_api_exception`), and chained with ``raise ... from e``.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from mnnvl.errors import (
    AlreadyExists,
    ApiError,
    ClusterUnavailable,
    HttpConflict,
    Invalid,
    MnnvlError,
    NotFound,
    Refused,
    WatchExpired,
)

logger = logging.getLogger(__name__)

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
# Tried at least this often, whatever the outage tolerance: a blip of a second is never fatal.
MAX_ATTEMPTS = 6
BACKOFF_BASE_S = 0.1
BACKOFF_MAX_S = 5.0
DEFAULT_OUTAGE_S = 300.0
OUTAGE_REPORT_EVERY_S = 15.0
RETRY_AFTER_MAX_S = 30.0
# How long 401/403 answers after an outage still count as part of it: a restarted API server's
# RBAC caches sync in a few hundred ms on a small cluster and in seconds with many bindings.
REFUSED_AFTER_OUTAGE_S = 30.0
RBAC_HINT = (
    "check that the namespace exists and that the launcher's service account has the "
    "mnnvl-runner Role of manifests/base/rbac.yaml there (kubectl apply -n <namespace> -k "
    "manifests/overlays/kfp, or manifests/overlays/argo); a Role only covers its own namespace"
)


def from_api_exception(e: ApiException, verb: str, what: str) -> MnnvlError:
    """Map an ``ApiException`` of ``verb`` on ``what`` (e.g. "computedomains x") to the family."""
    status = int(e.status or 0)
    try:  # the ``Status`` object the API server sent with the error, if any
        body: Any = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        body = {}
    body = body if isinstance(body, dict) else {}
    message = str(body.get("message") or e.reason or "").strip()
    reason = str(body.get("reason") or e.reason or "")
    if status in (401, 403):
        return Refused(f"{verb} {what} was refused ({status} {reason}: {message}); {RBAC_HINT}")
    if status == 404:
        details = body.get("details") or {}
        return NotFound(
            f"{verb} {what}: not found ({message})", details_kind=str(details.get("kind") or "")
        )
    if status == 409:
        return (AlreadyExists if verb == "create" else HttpConflict)(f"{verb} {what}: {message}")
    if status == 410:
        return WatchExpired(f"{verb} {what}: {message}")
    if status == 422:
        return Invalid(f"{verb} {what} failed: {status} {reason}: {message}")
    if status in TRANSIENT_STATUS:
        return ClusterUnavailable(
            f"{verb} {what}: the API server kept answering {status} {reason} ({message}); "
            "check the API server's health and load"
        )
    return ApiError(f"{verb} {what} failed: {status} {reason}: {message}")


def retry_after_s(e: ApiException) -> float | None:
    headers = e.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return min(float(value), RETRY_AFTER_MAX_S) if value is not None else None
    except ValueError:  # an HTTP date instead of seconds: fall back to our own backoff
        return None


def backoff_s(attempt: int) -> float:
    return random.uniform(0.5, 1.0) * min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** min(attempt, 16))


@dataclass(frozen=True)
class RetryPolicy:
    """How long requests and watches ride out an unreachable or overloaded API server.

    ``outage_s`` is the longest outage tolerated (``--api-outage-s``): counted from the first
    failed request after the last answer, over every request of one :class:`Api` (so several
    watches retrying at once report one outage), and for each request from its own first
    failure, which no other request's answer resets (a pod delete a webhook keeps answering
    500 fails after ``outage_s`` while the watches are answered). 0 keeps only the
    ``MAX_ATTEMPTS`` quick tries.
    ``refused_s`` is how long 401/403 answers right after an outage are retried as part of it.
    """

    outage_s: float = DEFAULT_OUTAGE_S
    refused_s: float = REFUSED_AFTER_OUTAGE_S


class Outage:
    """When the API stopped answering (None while it answers), shared by an Api's threads."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._since: float | None = None
        self._back_at = float("-inf")  # when the API last answered again after an outage
        self._next_report = 0.0
        self._answered_at = float("-inf")  # when any request last got an answer
        self._refused_since: float | None = None  # the first 401/403 since the API went away

    def up(self) -> None:
        with self._lock:
            self._answered_at = time.monotonic()
            self._refused_since = None
            if self._since is not None:
                down_s = time.monotonic() - self._since
                if down_s >= OUTAGE_REPORT_EVERY_S:
                    logger.info("API reachable again after %.0f s", down_s)
                self._back_at = time.monotonic()
            self._since = None

    def refusal_in_outage(self, refused: str) -> bool:
        """Whether a 401/403 (``refused``: what was refused) is part of an outage: the API was
        unreachable and no request got an answer since, and refusals began less than
        ``refused_s`` ago. Outside an outage, or past that bound, a refusal is a verdict."""
        with self._lock:
            if self._since is None:
                return False
            now = time.monotonic()
            if self._refused_since is None:
                self._refused_since = now
                logger.info(
                    "%s right after the API was unreachable: an API server that has just "
                    "started refuses requests until its authorization caches sync; "
                    "retrying for up to %g s",
                    refused,
                    self.policy.refused_s,
                )
            return now - self._refused_since < self.policy.refused_s

    def unsettled(self, settle_s: float) -> bool:
        """True while the API is unreachable, and for ``settle_s`` after it answered again
        (resumed watches are still replaying what they missed)."""
        with self._lock:
            return self._since is not None or time.monotonic() - self._back_at < settle_s

    def down(self, silent_since: float | None = None) -> tuple[float, float]:
        """Seconds the API has been unreachable, and seconds until the next progress line
        is due (a retry sleeps no longer, so the line comes at least every
        ``OUTAGE_REPORT_EVERY_S``).

        ``silent_since``: when the failed request was sent, for a request that timed out
        waiting for an answer: a hung API server has been unreachable since then (or since
        the last answer any request got), not only since the client gave up waiting."""
        every = OUTAGE_REPORT_EVERY_S
        with self._lock:
            now = time.monotonic()
            if self._since is None:
                since = now if silent_since is None else max(silent_since, self._answered_at)
                self._since = min(since, now)
                self._next_report = self._since + every
            if now >= self._next_report:
                logger.warning(
                    "API unreachable for %.0f s (tolerating up to %g s)",
                    now - self._since,
                    self.policy.outage_s,
                )
                self._next_report = now + every
            return now - self._since, self._next_report - now
