"""The HTTP front of the simulated cluster: Kubernetes REST paths, verbs, watches and Status errors.

Served with the stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (HTTP/1.1 keep-alive, chunked
streams for watches and followed logs) so the unmodified ``kubernetes`` client works against it.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mnnvl.sim.api import protobuf, tables
from mnnvl.sim.api.faults import Faults
from mnnvl.sim.api.model import TRAINER_GROUP, dry_run_requested
from mnnvl.sim.api.rbac import (
    ANONYMOUS,
    MASTERS,
    Authenticator,
    Request,
    User,
    allowed,
    forbidden,
    rules_review,
)
from mnnvl.sim.api.resources import (
    CD,
    default_on_create,
    discovery,
    ensure_default_service_account,
    job_update_error,
    openapi_v3,
    validate,
)
from mnnvl.sim.api.schemas import SchemaAdmission, invalid
from mnnvl.sim.api.selectors import merge_patch, object_matcher
from mnnvl.sim.api.serving import ServingServer
from mnnvl.sim.api.store import RESOURCES, ApiError, Obj, Store

log = logging.getLogger(__name__)
KUEUE_GROUP = "kueue.x-k8s.io"
RBAC_VERBS = {v: v.lower() for v in ("GET", "LIST", "WATCH", "PATCH", "DELETE")}
RBAC_VERBS |= {"POST": "create", "PUT": "update"}
FAULT_REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError"}
FAULT_REASONS |= {503: "ServiceUnavailable", 404: "NotFound", 403: "Forbidden"}
# /readyz of a kube-apiserver whose informers have not synced (healthz.handleRootHealth answers
# 500 with each check's line; reasons are withheld from this public endpoint).
READYZ_UNSYNCED = (
    b"[+]ping ok\n[+]etcd ok\n[-]informer-sync failed: reason withheld\nreadyz check failed\n"
)


class ApiServer(ServingServer):
    def __init__(
        self,
        store: Store,
        faults: Faults,
        logs: Callable[..., Iterator[bytes]],
        crd_installed: bool,
        tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(Handler)
        self.store, self.faults, self.logs, self.crd_installed = store, faults, logs, crd_installed
        self.tls = tls  # HTTPS (``mnnvl sim up``: kubectl sends credentials only over TLS)
        self.schemas: SchemaAdmission | None = None
        # Mutating admission (e.g. the Kueue stand-in suspending queued Jobs on create).
        self.mutators: list[Callable[[str, Obj], None]] = []
        # Validating admission after schema validation (PodSecurity, webhooks, quota).
        self.validators: list[Callable[[str, Obj], None]] = []
        self.kueue_served = False  # the Kueue CRDs exist only with the Kueue stand-in
        self.minor = 36  # the Kubernetes minor version whose Job update rules apply
        self.trainer_served = False  # the Trainer CRDs only with the Trainer stand-in
        self.bookmark_interval_s = 1.0
        self.request_count = 0
        self.counters: Counter[tuple[str, str]] = Counter()
        # What an RBAC audit would see: (verb, API group, resource[/subresource]) per request.
        self.rbac_requests: set[tuple[str, str, str]] = set()
        self._count_lock = threading.Lock()
        self.authenticator = Authenticator()

    def unserved(self) -> frozenset[str]:
        """The API groups not installed, which discovery and OpenAPI leave out."""
        installed = {
            "resource.nvidia.com": self.crd_installed,
            KUEUE_GROUP: self.kueue_served,
            TRAINER_GROUP: self.trainer_served,
        }
        return frozenset(group for group, on in installed.items() if not on)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that drops its keep-alive connection (or fails the TLS handshake) is
        normal, not a server error."""
        if isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError)):
            log.debug("client %s closed its connection", client_address)
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.server_address[1]}"

    def count(self, verb: str, resource: str, group: str = "", rbac_verb: str = "") -> None:
        with self._count_lock:
            self.request_count += 1
            self.counters[(verb, resource)] += 1
            if rbac_verb:
                self.rbac_requests.add((rbac_verb, group, resource))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiServer
    user: User  # who sent the request being handled (set before it is routed)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def setup(self) -> None:
        if self.server.tls is not None:  # the handshake runs here, not in the accept loop
            self.request = self.server.tls.wrap_socket(self.request, server_side=True)
        super().setup()
        self.server.track(self.connection)  # an outage cuts every open connection

    def finish(self) -> None:
        self.server.untrack(self.connection)
        super().finish()
        if self.server.tls is not None:  # the server closes the socket it accepted, not this
            self.connection.close()

    def do_GET(self) -> None:
        self._handle(self.command)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        if code == 429:  # what a real API server's priority and fairness answers
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode())

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() == protobuf.MEDIA_TYPE:
            return protobuf.decode(raw)
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {e}") from e

    def _handle(self, method: str) -> None:
        if self.server.down.is_set():  # a request that slipped in as the outage began
            self.close_connection = True
            return
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        try:
            self.user = self.server.authenticator.user(self.headers.get("Authorization"))
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            code = self.server.faults.request_error(method, self.path)
            if code is not None:
                self.server.count(method, "fault")
                raise ApiError(code, FAULT_REASONS.get(code, "InternalError"), "injected fault")
            self._route(method, parts, q, body)
        except ApiError as e:
            self._json(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method: str, parts: list[str], q: dict[str, str], body: Any) -> None:
        if parts == ["readyz"]:
            if self.server.caches_synced():
                return self._send(200, b"ok", "text/plain; charset=utf-8")
            return self._send(500, READYZ_UNSYNCED, "text/plain; charset=utf-8")
        if parts in (["api"], ["apis"], ["version"]) or (
            len(parts) in (2, 3)
            and parts[0] in ("api", "apis")
            and method == "GET"
            and (len(parts) == 2) == (parts[0] == "api")
        ):
            self.server.count("GET", "discovery")
            return self._json(200, discovery(parts, self.server.unserved()))
        if parts[:2] == ["openapi", "v3"] and method == "GET":
            self.server.count("GET", "openapi")
            return self._json(200, openapi_v3(parts[2:], self.server.unserved()))
        if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectrulesreviews"]:
            review = Request(
                "create", "authorization.k8s.io", "selfsubjectrulesreviews", "", "", ""
            )
            if self.user == ANONYMOUS:  # system:basic-user grants it to the authenticated only
                raise forbidden(self.user, review)
            if method != "POST" or not isinstance(body, dict):
                raise ApiError(405, "MethodNotAllowed", "selfsubjectrulesreviews: only create")
            self.server.count("POST", "selfsubjectrulesreviews", "authorization.k8s.io", "create")
            ns = str((body.get("spec") or {}).get("namespace") or "")
            return self._json(201, rules_review(self.server.store, self.user, ns))
        if not parts or parts[0] not in ("api", "apis") or len(parts) < 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        group, version, rest = (
            ("", parts[1], parts[2:]) if parts[0] == "api" else (parts[1], parts[2], parts[3:])
        )
        ns = ""
        # Parsed from the path alone, as kube-apiserver's RequestInfoFactory does
        # (k8s.io/apiserver pkg/endpoints/request/requestinfo.go): a namespace's own
        # subresources are status and finalize, anything else after its name is a resource.
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            ns, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1:2] or [""])[0], (rest[2:3] or [""])[0]
        if method == "GET" and not name:
            verb = "WATCH" if _flag(q, "watch") else "LIST"
        else:
            verb = "GET" if method == "GET" else method
        rbac_verb = RBAC_VERBS[verb] if name or verb != "DELETE" else "deletecollection"
        request = Request(rbac_verb, group, plural, sub, ns, name)
        rt = RESOURCES.get(plural)
        served = not (
            rt is None
            or (rt.group, rt.version) != (group, version)
            or len(rest) > 3
            or (plural == CD and not self.server.crd_installed)
            or (rt.group == KUEUE_GROUP and not self.server.kueue_served)
            or (rt.group == TRAINER_GROUP and not self.server.trainer_served)
        )
        if served:
            self.server.count(verb, f"{plural}/{sub}" if sub else plural, group, rbac_verb)
        # Authorization comes before routing: DefaultBuildHandlerChain (k8s.io/apiserver
        # pkg/server/config.go) wraps the API handler in WithAuthorization, so a caller without
        # the permission gets 403 even for a resource no API serves. Just restarted, the
        # authorizer's caches have not synced: it allows nothing yet.
        synced = self.server.caches_synced() or MASTERS in self.user.groups
        if not (synced and allowed(self.server.store, self.user, request)):
            raise forbidden(self.user, request)
        if not served:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == "log" and plural == "pods" and method == "GET":
            return self._logs(ns, name, q)
        if sub and sub != "status":
            raise ApiError(404, "NotFound", f"unknown subresource {sub}")
        self._verb(verb, request, q, body)

    def _verb(self, verb: str, request: Request, q: dict[str, str], body: Any) -> None:
        store = self.server.store
        plural, ns, name, sub = request.resource, request.namespace, request.name, request.sub
        if verb == "WATCH":
            return self._watch(plural, ns or None, q)
        dry_run = dry_run_requested(verb, q)
        if verb in ("LIST", "GET"):
            if verb == "LIST":
                match = object_matcher(q.get("labelSelector"), q.get("fieldSelector"), plural)
                items, rv = store.list(plural, ns or None, match)
                answer = _list(plural, items, {"resourceVersion": str(rv)})
            else:
                answer = store.get(plural, ns, name)
            if tables.wants_table(self.headers.get("Accept")):  # kubectl get
                answer = tables.table(plural, answer, q.get("includeObject"))
            return self._json(200, answer)
        if verb == "POST":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "body must be a JSON object")
            body.setdefault("metadata", {})
            if ns:
                body["metadata"]["namespace"] = ns
            default_on_create(plural, body)
            for admit in self.server.mutators:
                admit(plural, body)
            validate(plural, body, None, self.server.schemas)
            for check in self.server.validators:
                check(plural, body)
            created = store.create(plural, body, dry_run=dry_run)
            if plural == "namespaces" and not dry_run:
                ensure_default_service_account(store, created["metadata"]["name"])
            return self._json(201, created)
        if verb == "DELETE":
            if not name:
                return self._delete_collection(plural, ns, q, dry_run)
            opts = body or {}
            policy = opts.get("propagationPolicy") or q.get("propagationPolicy")
            if opts.get("orphanDependents") is True:
                policy = "Orphan"
            grace = opts.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
            grace_s = None if grace is None else float(grace)
            uid = (opts.get("preconditions") or {}).get("uid")
            deleted = store.delete(
                plural, ns, name, policy, grace_s, precondition_uid=uid, dry_run=dry_run
            )
            return self._json(200, deleted)
        with store.lock:  # read-modify-write of one object must not interleave
            old = store.get(plural, ns, name)
            if verb == "PUT":
                new = body if isinstance(body, dict) else {}
            else:
                ctype = (self.headers.get("Content-Type") or "").split(";")[0]
                if ctype == "application/json-patch+json":
                    new = _json_patch(old, body or [])
                else:
                    new = merge_patch(old, body or {})
            new.setdefault("metadata", {}).update(name=name)
            if ns:
                new["metadata"]["namespace"] = ns
            if not sub:
                validate(plural, new, old, self.server.schemas)
                refused = job_update_error(new, old, self.server.minor) if plural == "jobs" else ""
                if refused:
                    raise invalid(plural, new, [refused])
            result = store.update(plural, ns, name, new, sub or None, dry_run=dry_run)
        self._json(200, result)

    def _delete_collection(self, plural: str, ns: str, q: dict[str, str], dry_run: bool) -> None:
        store = self.server.store
        match = object_matcher(q.get("labelSelector"), q.get("fieldSelector"), plural)
        items, _ = store.list(plural, ns or None, match)
        for obj in items:
            meta = obj["metadata"]
            store.delete(
                plural,
                meta.get("namespace", ""),
                meta["name"],
                q.get("propagationPolicy"),
                dry_run=dry_run,
            )
        self._json(200, _list(plural, items, {}))

    def _start_stream(self, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_stream(self) -> None:
        """The last chunk, unless an outage cut the stream (then it ends without one)."""
        if self.server.down.is_set():
            self.close_connection = True
        else:
            self._chunk(b"")

    def _watch(self, plural: str, ns: str | None, q: dict[str, str]) -> None:
        store = self.server.store
        match = object_matcher(q.get("labelSelector"), q.get("fieldSelector"), plural)
        timeout = float(q.get("timeoutSeconds") or 1800)
        self._start_stream("application/json")
        try:
            if self.server.faults.take_watch_expiry():
                raise ApiError(410, "Expired", "too old resource version (injected fault)")
            name = _selected_name(q.get("fieldSelector"))
            sub = store.subscribe([plural], ns, q.get("resourceVersion"), match, name)
        except ApiError as e:
            self._chunk(json.dumps({"type": "ERROR", "object": e.status()}).encode() + b"\n")
            self._chunk(b"")
            return
        deadline = time.monotonic() + timeout
        bookmarks = _flag(q, "allowWatchBookmarks")
        as_table = tables.wants_table(self.headers.get("Accept"))  # kubectl get -w
        sent = 0
        # kube-apiserver's cacher sends a bookmark every interval and one 2 s before a
        # watch's deadline, none after that (cacheWatcher.nextBookmarkTime), so a client
        # resumes from near now.
        every = self.server.bookmark_interval_s

        def next_bookmark(now: float) -> float:
            due = min(now + every, deadline - 2.0)
            return due if bookmarks and due > now else math.inf

        due = next_bookmark(time.monotonic())
        try:
            while not (self.server.stopping.is_set() or self.server.down.is_set()):
                now = time.monotonic()
                if now >= deadline:
                    break
                if now >= due:
                    self._chunk(_bookmark(plural, store.resource_version))
                    due = next_bookmark(now)
                try:
                    ev = sub.queue.get(timeout=min(deadline, due, now + 1.0) - now)
                except queue.Empty:
                    continue
                if ev is None:
                    break
                if match(ev.obj):
                    obj = ev.obj
                    if as_table:
                        obj = tables.table(plural, obj, q.get("includeObject"), not sent)
                    sent += 1
                    self._chunk(json.dumps({"type": ev.type, "object": obj}).encode() + b"\n")
            self._end_stream()
        finally:
            store.unsubscribe(sub)

    def _logs(self, ns: str, name: str, q: dict[str, str]) -> None:
        pod = self.server.store.get("pods", ns, name)
        if not (pod.get("spec") or {}).get("nodeName"):
            # kube-apiserver has no kubelet to ask for an unscheduled pod's log: it answers
            # an empty log (200), not an error (registry/core/pod LogLocation).
            self._start_stream("text/plain")
            self._chunk(b"")
            return
        tail = int(q["tailLines"]) if q.get("tailLines") else None
        stop = threading.Event()
        stream = self.server.logs(ns, name, q.get("container"), _flag(q, "follow"), tail, stop)
        first = next(stream, None)  # errors (container not started) surface before headers
        self._start_stream("text/plain")
        try:
            if first:
                self._chunk(first)
            for data in stream:
                if self.server.stopping.is_set() or self.server.down.is_set():
                    break
                if data:
                    self._chunk(data)
            self._end_stream()
        finally:
            stop.set()


def _flag(q: dict[str, str], key: str) -> bool:
    return q.get(key, "").lower() in ("true", "1")


def _list(plural: str, items: list[Obj], metadata: Obj) -> Obj:
    rt = RESOURCES[plural]
    return {
        "kind": f"{rt.kind}List",
        "apiVersion": rt.api_version,
        "metadata": metadata,
        "items": items,
    }


def _bookmark(plural: str, rv: int) -> bytes:
    """A BOOKMARK event: only apiVersion, kind and metadata.resourceVersion (the watch's
    progress; a client resumes from it without replaying anything)."""
    rt = RESOURCES[plural]
    obj = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": {"resourceVersion": str(rv)}}
    return json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n"


def _selected_name(field_selector: str | None) -> str | None:
    """The name in a ``metadata.name=<name>`` term of a field selector, if there is one."""
    for term in (field_selector or "").split(","):
        key, sep, value = term.strip().partition("=")
        if sep and key.strip() == "metadata.name":  # "=" or "==", never "!="
            return value.lstrip("=").strip()
    return None


def _json_patch(target: Obj, ops: list[Obj]) -> Obj:
    """An RFC 6902 patch (``kubectl patch --type json``), applied by the jsonpatch library."""
    import jsonpatch  # only a JSON patch needs it

    try:
        patched: Obj = jsonpatch.apply_patch(target, ops)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise ApiError(422, "Invalid", f"json patch: {e}") from e
    return patched
