"""Client construction, the one retry wrapper, and generic dict-in/dict-out calls.

Every request, and every watch (re)opened, goes through :meth:`Api.call`: it retries only what
a retry can fix (429, 500, 502, 503, 504, connection refused/reset and read timeouts;
``Retry-After`` honoured; capped, jittered exponential backoff) and maps everything else to the
error family once. Retries go on while the API has been unreachable for less than the run's
outage tolerance (:class:`RetryPolicy`, ``--api-outage-s``): an API server restart or HA
fail-over is ridden out, with a progress line at least every 15 s. A request that keeps failing
while others are answered (a webhook answering 500) counts its own time and gives up past the
same tolerance, naming itself. 401/403 are retried only
right after the API was unreachable, as a restarted API server's (``RetryPolicy.refused_s``).
Bodies are plain dicts and responses are decoded JSON: kubernetes 30.1's typed models
predate ``resource.k8s.io/v1`` and would drop fields such as ``resourceClaimTemplateName``.
Streamed responses (watches, followed logs) are read line by line, and their connection is
released also when the caller stops early.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.dynamic import DynamicClient
from kubernetes.watch.watch import iter_resp_lines

from mnnvl.driver.retry import (
    DEFAULT_OUTAGE_S,
    MAX_ATTEMPTS,
    OUTAGE_REPORT_EVERY_S,
    TRANSIENT_STATUS,
    Outage,
    RetryPolicy,
    backoff_s,
    from_api_exception,
    retry_after_s,
)
from mnnvl.errors import ClusterUnavailable, MnnvlError, NoCluster, NotFound, SpecError
from mnnvl.manifests import CONTAINER

logger = logging.getLogger(__name__)

T = TypeVar("T")
CONNECT_TIMEOUT_S = 10.0
_VERBS = {"GET": "get", "POST": "create", "DELETE": "delete", "PATCH": "patch"}
# How long a request other than a watch or a followed log waits for an answer: a healthy API
# answers our small requests in well under a second, a hung one (stopped, a load balancer
# holding the connection) never does. One report interval, so the first "API unreachable"
# line comes about 15 s after the API fell silent; a slower answer is retried as transient.
REQUEST_TIMEOUT_S = OUTAGE_REPORT_EVERY_S


@dataclass(frozen=True)
class Kind:
    """REST coordinates of one resource type (namespace "": a cluster-scoped one)."""

    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str = "", sub: str = "") -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [root, f"namespaces/{namespace}" if namespace else "", self.plural, name, sub]
        return "/".join(part for part in parts if part)

    def describe(self, namespace: str, name: str = "") -> str:
        if not namespace:
            return f"{self.plural} {name}" if name else self.plural
        return f"{self.plural} {namespace}/{name}" if name else f"{self.plural} in {namespace}"


COMPUTE_DOMAIN = Kind("ComputeDomain", "resource.nvidia.com", "v1beta1", "computedomains")
RESOURCE_CLAIM_TEMPLATE = Kind(
    "ResourceClaimTemplate", "resource.k8s.io", "v1", "resourceclaimtemplates"
)
JOB = Kind("Job", "batch", "v1", "jobs")
POD = Kind("Pod", "", "v1", "pods")
SERVICE = Kind("Service", "", "v1", "services")
EVENT = Kind("Event", "", "v1", "events")
# Cluster-scoped, read only through the optional cluster reader (manifests/overlays/cluster-reader).
DEVICE_CLASS = Kind("DeviceClass", "resource.k8s.io", "v1", "deviceclasses")
RESOURCE_SLICE = Kind("ResourceSlice", "resource.k8s.io", "v1", "resourceslices")
NODE = Kind("Node", "", "v1", "nodes")


def _load_configuration(kubeconfig: str | None) -> client.Configuration:
    """Explicit kubeconfig, else in-cluster, else $KUBECONFIG, else ~/.kube/config."""
    cfg = client.Configuration()
    tried: list[str] = []
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)
            return cfg
        except ConfigException as e:
            tried.append(f"in-cluster config ({e})")
    elif not kubeconfig:
        tried.append("in-cluster config (KUBERNETES_SERVICE_HOST not set)")
    env_path = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
    path = kubeconfig or env_path or os.path.expanduser("~/.kube/config")
    if (kubeconfig or env_path) and not os.path.exists(path):  # a typo, not a missing cluster
        given = "kubeconfig" if kubeconfig else "KUBECONFIG"
        raise SpecError(given, f"{path!r} does not exist; check the path")
    _check_kubeconfig_yaml(path)
    try:
        config.load_kube_config(config_file=path, client_configuration=cfg)
        return cfg
    except (ConfigException, OSError, TypeError, ValueError) as e:
        tried.append(f"kubeconfig {path} ({e})")
    raise NoCluster(
        "no Kubernetes configuration found: tried "
        + "; ".join(tried)
        + ". Run inside a cluster, pass --kubeconfig PATH, or set KUBECONFIG"
    )


def _check_kubeconfig_yaml(path: str) -> None:
    """A kubeconfig that exists but is not a YAML mapping is named, not a traceback."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError:
        return  # missing or unreadable: the client's own message says so below
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise NoCluster(
            f"kubeconfig {path} is not valid YAML ({problem}{where}); "
            "fix the file or pass --kubeconfig with a working one"
        ) from e
    if not isinstance(doc, dict):
        found = "an empty file" if doc is None else f"a YAML {type(doc).__name__}"
        raise NoCluster(
            f"kubeconfig {path} is not a kubeconfig (a YAML mapping with clusters, contexts "
            f"and users; found {found}); pass --kubeconfig with a working one"
        )


def _timed_out(error: Exception) -> bool:
    """Whether the request was sent and no answer came in time (a hung API server); urllib3
    wraps the read timeout in ``MaxRetryError`` since its own retries are off."""
    cause = getattr(error, "reason", error)
    return isinstance(cause, urllib3.exceptions.ReadTimeoutError)


class Api:
    """One connection to an API server. Thread-safe for concurrent calls."""

    def __init__(self, api_client: client.ApiClient, policy: RetryPolicy) -> None:
        self.client, self.policy = api_client, policy
        self.outage = Outage(self.policy)  # shared by the Api's threads; waits read it too
        # Paths are built here, so the discovery a DynamicClient would do (extra requests
        # and a cache file under /tmp) is skipped.
        self._dynamic = DynamicClient(api_client, discoverer=_NoDiscovery)
        self.host = api_client.configuration.host

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, outage_s: float = DEFAULT_OUTAGE_S) -> Api:
        """A client from ``kubeconfig`` (see ``_load_configuration``) tolerating API outages
        up to ``outage_s``."""
        cfg = _load_configuration(kubeconfig)
        # urllib3's own retries are off: :meth:`call` is the one place that retries.
        cfg.retries = 0
        return cls(client.ApiClient(configuration=cfg), RetryPolicy(outage_s))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the retry wrapper -----------------------------------------------------------

    def call(self, fn: Callable[[], T], verb: str, what: str) -> T:
        """Call ``fn`` (``verb`` on ``what``, for messages) retrying transient failures (see the
        module); map the rest to the error family. Past ``outage_s`` the last failure is
        ``ClusterUnavailable`` (exit 5)."""
        attempt, failing_since, next_report = 0, 0.0, float("inf")
        while True:
            sent = time.monotonic()
            try:
                found = fn()
            except ApiException as e:
                if e.status in (401, 403):  # fatal, unless the tail of an outage (retry.py)
                    refused = f"{verb} {what} answered {e.status} {e.reason}"
                    if not self.outage.refusal_in_outage(refused):
                        raise from_api_exception(e, verb, what) from e
                elif e.status not in TRANSIENT_STATUS:
                    self.outage.up()  # an answer: the API is reachable
                    raise from_api_exception(e, verb, what) from e
                error: Exception = e
                delay = retry_after_s(e)
            except (urllib3.exceptions.HTTPError, ConnectionError) as e:
                error, delay = e, None
            else:
                self.outage.up()
                return found
            hung = _timed_out(error)
            outage_s, report_in_s = self.outage.down(sent if hung else None)
            if not attempt:  # this request's own clock: other requests' answers do not reset it
                failing_since, next_report = sent, sent + OUTAGE_REPORT_EVERY_S
            attempt += 1
            now = time.monotonic()
            down_s = max(outage_s, now - failing_since)
            if now >= next_report and down_s > outage_s:  # failing while other requests pass
                next_report = now + OUTAGE_REPORT_EVERY_S
                self._still_failing(error, verb, what, down_s)
            if attempt >= MAX_ATTEMPTS and down_s >= self.policy.outage_s:
                raise self._gave_up(error, verb, what, down_s) from error
            delay = backoff_s(attempt - 1) if delay is None else delay
            logger.debug("%s %s: %s, retrying in %.2f s", verb, what, error, delay)
            time.sleep(max(0.0, min(delay, report_in_s)))

    def _still_failing(self, error: Exception, verb: str, what: str, down_s: float) -> None:
        said = f"{error.status} {error.reason}" if isinstance(error, ApiException) else error
        logger.warning(
            "%s %s has failed for %.0f s while other requests are answered (%s); retrying for "
            "up to %g s (--api-outage-s)",
            verb,
            what,
            down_s,
            said,
            self.policy.outage_s,
        )

    def _gave_up(self, error: Exception, verb: str, what: str, down_s: float) -> MnnvlError:
        """The error for a transient failure that lasted past the outage tolerance."""
        lasted = (
            f"for {down_s:.0f} s, longer than --api-outage-s {self.policy.outage_s:g} tolerates"
        )
        if isinstance(error, ApiException):
            mapped = str(from_api_exception(error, verb, what))
            head, _, hint = mapped.partition("; ")
            return ClusterUnavailable(f"{head} {lasted}; {hint}")
        return ClusterUnavailable(
            f"cannot reach the Kubernetes API at {self.host} {lasted} ({verb} {what}): "
            f"{error}; check that the cluster is up and the kubeconfig points at it"
        )

    # ---- the one request path ---------------------------------------------------------

    def _raw(
        self,
        method: str,
        kind: Kind,
        namespace: str,
        name: str = "",
        *,
        sub: str = "",
        query: dict[str, Any] | None = None,
        body: Any = None,
        timeout: Any = (CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
        content_type: str = "application/json",
    ) -> Any:
        """One HTTP request; returns the urllib3 response (body not yet read).

        Every resource, built-in or custom, goes through here by its REST path.
        ``DynamicClient.request`` is the client's generic call on every release from 30
        to 37 (``ApiClient.call_api`` changed its signature in 36 and 37); it adds the
        bearer token, sends the body as JSON and raises an ``ApiException`` subclass on
        non-2xx. ``serialize=False`` keeps the raw response: bodies stay plain dicts and
        watches and followed logs can be streamed.
        """
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        return self._dynamic.request(
            method,
            kind.path(namespace, name, sub),
            body=body,
            query_params=params,
            header_params={"Accept": "application/json"},
            content_type=content_type,
            serialize=False,
            _request_timeout=timeout,
        )

    def _json(
        self, method: str, kind: Kind, namespace: str, name: str = "", *, about: str = "", **kw: Any
    ) -> Any:
        """One request decoded as JSON; ``about`` names the object in errors (POSTs have none)."""

        def once() -> Any:
            resp = self._raw(method, kind, namespace, name, **kw)
            try:
                return json.loads(resp.data or b"null")
            finally:
                resp.release_conn()

        what = kind.describe(namespace, name or about)
        verb = "list" if (method, name) == ("GET", "") else _VERBS.get(method, method.lower())
        return self.call(once, verb, what)

    def served(self, group: str, version: str) -> bool:
        """Whether the server serves ``group/version``, from discovery, which every account may
        read (the bootstrap ``system:discovery`` ClusterRole): it tells an API that is not
        installed from one this account may not use, since a real API server answers 403 before
        it looks for the resource."""
        path = f"/apis/{group}/{version}"

        def once() -> bool:
            resp = self._dynamic.request(
                "GET",
                path,
                header_params={"Accept": "application/json"},
                serialize=False,
                _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S),
            )
            resp.release_conn()
            return True

        try:
            return self.call(once, "get", path)
        except NotFound:
            return False

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        """The object; raises ``NotFound`` when there is none."""
        return self._json("GET", kind, namespace, name)

    def list(
        self,
        kind: Kind,
        namespace: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> dict[str, Any]:
        """The List object (``items`` and ``metadata.resourceVersion``)."""
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        lst: dict[str, Any] = self._json("GET", kind, namespace, query=query)
        lst["items"] = lst.get("items") or []
        return lst

    def create(
        self, kind: Kind, namespace: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Create from a dict body; raises ``AlreadyExists`` on 409. ``dry_run``: the server
        admits and validates it and stores nothing (``dryRun=All``)."""
        name = str(body.get("metadata", {}).get("name", ""))
        query = {"dryRun": "All" if dry_run else None}
        return self._json("POST", kind, namespace, about=name, body=body, query=query)

    def patch(self, kind: Kind, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7396: objects merge, lists are replaced whole); raises
        ``Invalid`` when the change breaks a validation rule (422)."""
        ctype = "application/merge-patch+json"
        return self._json("PATCH", kind, namespace, name, body=body, content_type=ctype)

    def delete(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        *,
        propagation: str | None = None,
        uid: str | None = None,
    ) -> bool:
        """Delete one object; False when it was already gone (404 counts as success).

        With ``uid`` the server deletes only that very object (``preconditions.uid``) and
        answers 409 (``HttpConflict``) when the name now belongs to another one.
        """
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._json("DELETE", kind, namespace, name, body=body)
        except NotFound:
            return False
        return True

    def watch(
        self,
        kind: Kind,
        namespace: str,
        *,
        resource_version: str,
        timeout_s: float,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events ``(type, object)`` from ``resource_version`` until the server ends the watch.

        The server-side ``timeoutSeconds`` and the client read timeout both come from
        ``timeout_s``, so a watch never outlives the caller's deadline. ``BOOKMARK`` events
        come through: their object carries only ``metadata.resourceVersion``, the point a
        resumed watch starts from (so a quiet watch never falls out of the server's history and
        needs no re-list). Raises ``WatchExpired`` on 410 Gone and the mapped API error on any
        other ERROR event.
        """
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": max(1, int(timeout_s)),
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
        }
        what = kind.describe(namespace)
        timeout = (CONNECT_TIMEOUT_S, max(0.05, timeout_s))
        resp = self.call(
            lambda: self._raw("GET", kind, namespace, query=query, timeout=timeout), "watch", what
        )
        try:
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                etype, obj = event.get("type", ""), event.get("object") or {}
                if etype == "ERROR":
                    raise _watch_error(obj, what)
                yield etype, obj
        except (urllib3.exceptions.HTTPError, ConnectionError) as e:
            # A read timeout or a dropped stream ends this watch; the caller re-watches or
            # stops at its deadline.
            logger.debug("watch %s ended: %s", what, e)
        finally:
            resp.release_conn()

    def _log(self, namespace: str, pod: str, follow: bool, container: str = CONTAINER) -> Any:
        query = {"container": container, "follow": "true" if follow else None}
        timeout = (CONNECT_TIMEOUT_S, None if follow else REQUEST_TIMEOUT_S)
        return self.call(
            lambda: self._raw("GET", POD, namespace, pod, sub="log", query=query, timeout=timeout),
            "follow" if follow else "get",
            f"pods/log {namespace}/{pod}",
        )

    def pod_log(self, namespace: str, pod: str, container: str = CONTAINER) -> str:
        """The whole log of the pod's worker container (a TrainJob's: ``node``; empty when the
        pod has no log yet)."""
        resp = self._log(namespace, pod, follow=False, container=container)
        try:
            return bytes(resp.data or b"").decode("utf-8", errors="replace")
        finally:
            resp.release_conn()

    def follow_log(self, namespace: str, pod: str, container: str = CONTAINER) -> Iterator[str]:
        """Lines of the worker container's log as they are written, until the container ends.

        A stream cut by the API server (a restart) just ends: the caller reads the stored log
        when it needs the whole of it.
        """
        resp = self._log(namespace, pod, follow=True, container=container)
        try:
            yield from iter_resp_lines(resp)
        except (urllib3.exceptions.HTTPError, ConnectionError) as e:
            logger.info("log stream cut (%s); the whole log is read again when the Job ends", e)
        finally:
            resp.release_conn()


def _watch_error(status: dict[str, Any], what: str) -> MnnvlError:
    """The error for a watch ERROR event: its object is the ``Status`` an error answer carries
    (410 Gone: ``WatchExpired``)."""
    error = ApiException(status=int(status.get("code") or 0), reason=str(status.get("reason")))
    error.body = json.dumps(status)
    return from_api_exception(error, "watch", what)


class _NoDiscovery:
    """A ``DynamicClient`` discoverer that discovers nothing: the driver knows its paths."""

    def __init__(self, client: Any, cache_file: Any = None) -> None:
        del client, cache_file
