"""Serving the simulated API on a port that can go away and come back: an API server outage.

A real kube-apiserver that restarts (an upgrade, an HA fail-over) refuses new connections and
cuts the open ones, watches included, for seconds to minutes, while the controllers, the
scheduler and the kubelets (and so the pods) carry on. :meth:`ServingServer.outage` does the
same: it stops the accept loop, closes the listening socket (connecting is refused), shuts
down every open connection (a watch or a followed log ends mid-stream, a keep-alive connection
is dropped), and listens again on the same port after the outage. Only the HTTP front stops;
the store, controllers and pod processes are untouched.

Then, as a kube-apiserver that has just started, it serves before its authorization caches have
synced: for ``unsynced_s`` (:meth:`ServingServer.caches_synced` is False) the API server refuses
resource requests with 403 and ``/readyz`` fails (``api.apiserver``). kube-apiserver's RBAC
authorizer reads Roles and bindings from shared informers (``pkg/kubeapiserver/authorizer``),
which a post-start hook starts after the port is already open.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

SERVER_POLL_S = 0.05  # how often the accept loop looks for shutdown (stdlib default 0.5 s)


class ServingServer(ThreadingHTTPServer):
    """A threading HTTP server on 127.0.0.1 that serves in a thread and can have outages."""

    daemon_threads = True
    request_queue_size = 4096  # many clients connect at once under load; none is refused
    allow_reuse_address = True

    def __init__(self, handler: Any) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.stopping = threading.Event()  # the whole server is stopping for good
        self.down = threading.Event()  # an outage is on: handlers end their streams
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._outage_timer: threading.Timer | None = None
        self._synced_at = float("-inf")  # when the authorization caches are synced again

    def start_serving(self) -> None:
        threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": SERVER_POLL_S},
            name="sim-apiserver",
            daemon=True,
        ).start()

    def track(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def caches_synced(self) -> bool:
        """False for the ``unsynced_s`` after an outage, while requests are refused."""
        return time.monotonic() >= self._synced_at

    def outage(self, seconds: float, unsynced_s: float = 0.0) -> None:
        """Stop answering now, for ``seconds``, then refuse requests for ``unsynced_s``
        (see :meth:`caches_synced`); returns once connections are refused."""
        with self._lock:
            if self.stopping.is_set() or self.down.is_set():
                raise RuntimeError("the simulated API server is stopping or already down")
            self.down.set()
        self.shutdown()  # the accept loop ends within SERVER_POLL_S
        self.socket.close()
        with self._lock:
            open_now = list(self._connections)
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        log.info("API server outage for %g s (%d connections cut)", seconds, len(open_now))
        self._outage_timer = threading.Timer(seconds, self._come_back, (unsynced_s,))
        self._outage_timer.daemon = True
        self._outage_timer.start()

    def _come_back(self, unsynced_s: float) -> None:
        with self._lock:
            if self.stopping.is_set():
                return
            self._synced_at = time.monotonic() + unsynced_s
            self.socket = socket.socket(self.address_family, self.socket_type)
            self.server_bind()  # the same port: server_address kept it
            self.server_activate()
            self.down.clear()
        self.start_serving()
        log.info("API server answering again at port %d", self.server_address[1])

    def stop_serving(self) -> None:
        """Stop for good (also during an outage); safe to call twice."""
        with self._lock:
            self.stopping.set()
            was_down = self.down.is_set()
        if self._outage_timer is not None:
            self._outage_timer.cancel()
        if not was_down:
            self.shutdown()
            self.server_close()
