"""Simulated kubelet: starts a :class:`~mnnvl.sim.core.podworker.PodWorker` for each pod bound to a
node, terminates it when the pod is deleted (then deletes the pod for good), serves its log,
lists the processes of its pods' containers and plays a node dropping off the network."""

from __future__ import annotations

import logging
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.faults import Faults
from mnnvl.sim.api.model import TERMINAL
from mnnvl.sim.api.selectors import label_matcher
from mnnvl.sim.api.store import ApiError, Obj, Store, WatchEvent
from mnnvl.sim.core import forkserver
from mnnvl.sim.core.podenv import ProcessEnv
from mnnvl.sim.core.podworker import MAX_GRACE_S, PodWorker
from mnnvl.sim.core.procs import Guard, kill_all, members
from mnnvl.sim.nvidia.dra import ComputeDomainDriver, channel_domain

log = logging.getLogger(__name__)


class Kubelet(Controller):
    name = "sim-kubelet"
    kinds = ("pods",)

    def __init__(
        self, store: Store, faults: Faults, driver: ComputeDomainDriver, env: ProcessEnv
    ) -> None:
        super().__init__(store)
        self.faults, self.driver, self.env = faults, driver, env
        self.workers: dict[tuple[str, str], PodWorker] = {}
        self.unreachable: set[str] = set()  # nodes whose kubelet the API server lost
        self.token = uuid.uuid4().hex[:12]  # marks this kubelet's containers (procs.MARKER_ENV)
        self.ran: dict[str, Obj] = {}  # container marker -> its pod's metadata
        self._lock = threading.Lock()
        self._guard = Guard(self.token + "/")
        forkserver.acquire()  # held while the kubelet runs: restarts reuse the server

    def stop(self) -> None:
        super().stop()
        with self._lock:
            workers = list(self.workers.items())
        removers = [threading.Thread(target=self._remove, args=kw, daemon=True) for kw in workers]
        for t in removers:
            t.start()
        for t in removers:
            t.join(timeout=2 * (MAX_GRACE_S + 6))
        kill_all(self.token + "/", {})  # whatever no worker knew of any more
        forkserver.release()
        self._guard.close()
        self.env.close()

    def on_events(self, events: list[WatchEvent]) -> None:
        for ev in events:
            with self._lock:
                self._on_pod(ev)

    def _on_pod(self, ev: WatchEvent) -> None:
        """One pod event (under the lock): start, terminate or forget its worker."""
        key = (ev.namespace, ev.obj["metadata"]["name"])
        worker = self.workers.get(key)
        if worker is not None and worker.pod["metadata"]["uid"] != ev.obj["metadata"]["uid"]:
            worker = None  # an older pod of the same name
        if ev.type == "DELETED":
            if worker is not None:
                self._spawn(self._remove, key, worker, 0.0)
            return
        if worker is not None and worker.node in self.unreachable:
            return  # it never hears of the deletion; the pod goes by force
        if ev.obj["metadata"].get("deletionTimestamp"):
            grace = float(ev.obj["metadata"].get("deletionGracePeriodSeconds") or 0)
            if worker is None:
                self._spawn(self._finish_delete, ev.obj)
            elif not worker.terminating:
                worker.terminating = True
                self._spawn(self._remove, key, worker, grace, True)
            return
        node = ev.obj["spec"].get("nodeName")
        phase = (ev.obj.get("status") or {}).get("phase")
        if worker is None and node and phase not in TERMINAL:
            worker = self.workers[key] = PodWorker(self, ev.obj)
            self.ran[worker.marker] = ev.obj["metadata"]
            worker.thread.start()

    @staticmethod
    def _spawn(fn: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=fn, args=args, daemon=True).start()

    def _finish_delete(self, pod: Obj) -> None:
        ns, name, uid = (pod["metadata"][k] for k in ("namespace", "name", "uid"))
        current = self.store.find("pods", ns, name)
        if current is not None and current["metadata"]["uid"] == uid:
            try:
                self.store.delete("pods", ns, name, grace_s=0)
            except ApiError as e:  # deleted meanwhile
                log.debug("final delete of pod %s: %s", name, e)

    def node_unreachable(self, node: str) -> None:
        """The node dropped off the network: its containers are stopped (to their peers a
        lost node is silent, not a closed connection), and its kubelet reports nothing more.
        They are killed only when their pod object is gone (force-deleted)."""
        with self._lock:
            self.unreachable.add(node)
            workers = [w for w in self.workers.values() if w.node == node]
        for w in workers:
            if (proc := w.running()) is not None:
                proc.signal(signal.SIGSTOP)

    def signal_pod(self, ns: str, name: str, sig: int) -> None:
        with self._lock:
            worker = self.workers.get((ns, name))
        if worker is None:
            raise ValueError(f"no pod {ns}/{name} on a node")
        worker.signal(sig)

    def processes(self, label_selector: str | None) -> list[tuple[str, str, int]]:
        """(namespace, pod, pid) of every live process of the containers this kubelet started
        for pods matching ``label_selector``."""
        with self._lock:
            sessions = {p.pid: w.marker for w in self.workers.values() if (p := w.running())}
        match, ran = label_matcher(label_selector), self.ran
        found = [(ran[m], pid) for pid, m in members(self.token + "/", sessions)]
        return sorted(
            (meta["namespace"], meta["name"], pid)
            for meta, pid in found
            if match(meta.get("labels") or {})
        )

    def imex_lost(self, domain_uid: str, nodes: set[str] | None, message: str) -> None:
        """The IMEX daemons of a domain stopped (on ``nodes``, or all): fail its running pods."""
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            if (nodes is None or w.node in nodes) and any(
                channel_domain(c) == domain_uid for c in w.claims
            ):
                w.lose_imex(message)

    def _remove(
        self,
        key: tuple[str, str],
        worker: PodWorker,
        grace_s: float | None = None,
        terminating: bool = False,
    ) -> None:
        """Stop the pod's container and forget it. A Terminating pod then gets its last status
        and is deleted for good (it 404s) before its log goes (readable while the pod is
        Terminating, as on a real node)."""
        worker.kill(grace_s)
        worker.finished.wait(MAX_GRACE_S + 6)
        if terminating:
            worker.mark_terminated()
            self._finish_delete(worker.pod)
        with self._lock:
            if self.workers.get(key) is worker:
                del self.workers[key]
        shutil.rmtree(worker.workdir, ignore_errors=True)
        shutil.rmtree(self.env.shm_dir(worker.workdir), ignore_errors=True)  # its memory emptyDir

    def log_stream(
        self,
        ns: str,
        name: str,
        container: str | None,
        follow: bool,
        tail_lines: int | None,
        stop: threading.Event,
    ) -> Iterator[bytes]:
        """Chunks of the container's log; with ``follow`` until the container has ended. It
        raises before the first chunk when the container has not started."""
        with self._lock:
            worker = self.workers.get((ns, name))
        if worker is None or not worker.started.is_set():
            cname = container or "main"
            raise ApiError(
                400,
                "BadRequest",
                f'container "{cname}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        if container and container != worker.container.get("name"):
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        with open(worker.log_path, "rb") as f:
            data = f.read()
            if tail_lines is not None:
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
            yield data
            while follow and not stop.is_set():
                more = f.read()
                if more:
                    yield more
                elif worker.finished.is_set() or (
                    worker.proc is not None and worker.proc.exited.is_set()
                ):
                    yield f.read()
                    return
                else:
                    time.sleep(0.05)  # file tail on the server side; clients never poll
