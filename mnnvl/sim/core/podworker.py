"""One pod's container on its node, run as a local process by the simulated kubelet.

A pod stays Pending/ContainerCreating until its claims are prepared (a channel claim waits for
the node's IMEX daemon, like the real plugin, and its channel devices appear in the pod's own
``/dev``); then the container's command runs with
``$(VAR)`` expansion, the current interpreter for ``python``/``python3``, cluster DNS names mapped
to 127.0.0.1, ``MASTER_PORT`` set to a free local port per Service, and ``CUDA_VISIBLE_DEVICES``
from the node's share of local GPUs. stdout+stderr go to a per-pod log file served by ``/log``.
Deleting the pod stops its container (SIGTERM, then SIGKILL after the grace period); when the
container's main process exits, for whatever reason, every other process it started is killed
before the pod's status says so (see :mod:`mnnvl.sim.core.procs`).
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from typing import Protocol

from mnnvl.sim.api.events import record_event
from mnnvl.sim.api.faults import Faults
from mnnvl.sim.api.model import TERMINAL
from mnnvl.sim.api.store import Obj, Store, now_iso
from mnnvl.sim.core.podenv import ProcessEnv, image_problem, termination_file
from mnnvl.sim.core.procs import Container
from mnnvl.sim.core.scheduler import INDEX_LABEL, JOB_LABEL
from mnnvl.sim.nvidia.dra import ComputeDomainDriver, PrepareError, prepare_failure

log = logging.getLogger(__name__)
MAX_GRACE_S = 5.0  # the simulator caps terminationGracePeriodSeconds to keep teardown quick
# The kubelet's limits on a termination message: the file's, and the log fallback's.
MAX_MESSAGE_BYTES, MAX_LOG_BYTES, MAX_LOG_LINES = 4096, 2048, 80


class Host(Protocol):
    """What a pod worker uses of its kubelet (:class:`mnnvl.sim.core.kubelet.Kubelet`)."""

    store: Store
    faults: Faults
    driver: ComputeDomainDriver
    env: ProcessEnv
    unreachable: set[str]  # nodes whose kubelet the API server lost
    token: str  # this kubelet's part of each container's marker


class PodWorker:
    """One pod's lifecycle on its node; its thread ends when the container has ended."""

    def __init__(self, kubelet: Host, pod: Obj) -> None:
        self.k, self.pod = kubelet, pod
        self.ns, self.name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.node = pod["spec"]["nodeName"]
        self.container = (pod["spec"].get("containers") or [{}])[0]
        self.cancel = threading.Event()
        self.proc: Container | None = None  # the container's current (or last) run
        self.marker = f"{kubelet.token}/{pod['metadata']['uid']}"
        self.workdir = tempfile.mkdtemp(prefix=f"sim-{self.name}-")
        self.log_path = os.path.join(self.workdir, "container.log")
        self.started = threading.Event()
        self.finished = threading.Event()
        self.claims: list[Obj] = []
        self.restarts = 0
        self.lost: str | None = None  # why the IMEX domain went away under the container
        self.terminating = False
        self.oom = False  # the last attempt was OOM-killed (fault injection)
        self.exit_code: int | None = None  # of the last container run
        self.started_at: str | None = None
        labels = pod["metadata"].get("labels") or {}
        self.job, idx = labels.get(JOB_LABEL), labels.get(INDEX_LABEL)
        self.index = int(idx) if idx is not None else None
        self.thread = threading.Thread(target=self._run, name=f"sim-pod-{self.name}", daemon=True)

    def _status(self, phase: str, state: Obj, ready: bool, last: Obj | None = None) -> None:
        if self.node in self.k.unreachable:
            return  # a kubelet the API server cannot hear from reports nothing
        now = now_iso()
        c = self.container
        cs = {
            "name": c.get("name", "main"),
            "image": c.get("image", "sim"),
            "imageID": f"sim://{c.get('image', 'sim')}",
            "ready": ready,
            "restartCount": self.restarts,
            "started": "running" in state,
            "state": state,
            "lastState": last or {},
        }
        flags = dict(Initialized=True, ContainersReady=ready, Ready=ready, PodScheduled=True)

        def write(o: Obj) -> None:
            st = o.setdefault("status", {})
            st.update(
                phase=phase,
                hostIP="127.0.0.1",
                podIP="127.0.0.1",
                podIPs=[{"ip": "127.0.0.1"}],
                containerStatuses=[cs],
            )
            st.setdefault("startTime", now)
            old = {x["type"]: x for x in st.get("conditions") or []}
            st["conditions"] = []
            for t, v in flags.items():
                val = "True" if v else "False"
                cond = {"type": t, "status": val, "lastTransitionTime": now, "lastProbeTime": None}
                if t in old and old[t].get("status") == val:
                    cond = old[t]  # unchanged: it keeps its transition time
                st["conditions"].append(cond)

        self.k.store.mutate("pods", self.ns, self.name, write)

    def _event(self, type_: str, reason: str, message: str) -> None:
        if self.node in self.k.unreachable:
            return
        record_event(self.k.store, self.pod, type_, reason, message, "kubelet")

    def _run(self) -> None:
        try:
            self._lifecycle()
        except Exception:
            log.exception("kubelet: pod %s/%s failed", self.ns, self.name)
        finally:
            self.finished.set()
            self._unprepare()

    def _lifecycle(self) -> None:
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        self._status("Pending", waiting, False)
        # As the real kubelet: claims are prepared first, then the image is pulled.
        if not self._prepare() or not self._pull() or not self._config():
            return
        policy = self.pod["spec"].get("restartPolicy", "Always")
        while not self.cancel.is_set():
            code, started = self._run_container()
            if code is None:
                return
            if self.lost is not None:
                self._imex_lost(code, started)
                return
            term = _terminated(
                code, started, "OOMKilled" if self.oom else "Error", **self._message(code)
            )
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                self._unprepare()
                self._status("Succeeded" if code == 0 else "Failed", term, False)
                return
            self.restarts += 1
            backoff = min(0.2 * 2 ** (self.restarts - 1), 2.0)
            self._event("Warning", "BackOff", "Back-off restarting failed container")
            self._status("Running", {"waiting": {"reason": "CrashLoopBackOff"}}, False, term)
            self.cancel.wait(backoff)

    def _pull(self) -> bool:
        """The image "pull": an invalid reference or an injected pull failure holds the pod."""
        image = self.container.get("image", "")
        problem = image_problem(image)
        if problem is None and self.k.faults.pod_fault(self.job, self.index, "ImagePullBackOff"):
            self._event("Normal", "Pulling", f'Pulling image "{image}"')
            self._event("Warning", "Failed", f'Failed to pull image "{image}": simulated fault')
            problem = ("ImagePullBackOff", f'Back-off pulling image "{image}"')
        if problem is None:
            self._event("Normal", "Pulled", f'Container image "{image}" already present on machine')
            return True
        if problem[0] == "InvalidImageName":
            self._event("Warning", "InspectFailed", problem[1])
            self._event("Warning", "Failed", "Error: InvalidImageName")
        waiting = {"waiting": {"reason": problem[0], "message": problem[1]}}
        self._status("Pending", waiting, False)
        self.cancel.wait()
        return False

    def _config(self) -> bool:
        """A missing Secret or ConfigMap of the env holds the container Waiting in
        CreateContainerConfigError; the kubelet retries each sync, so creating it lets it run."""
        said = ""
        while not self.cancel.is_set():
            problem = self.k.env.config_problem(self.pod, self.container)
            if not problem:
                return True
            if problem != said:
                said = problem
                self._event("Warning", "Failed", f"Error: {problem}")
                waiting = {"reason": "CreateContainerConfigError", "message": problem}
                self._status("Pending", {"waiting": waiting}, False)
            self.cancel.wait(0.5)
        return False

    def _imex_lost(self, code: int, started: str) -> None:
        """The container died because its node's IMEX daemon went away: the pod fails."""
        self._unprepare()
        msg = str(self.lost)
        self._event("Warning", "IMEXDomainLost", msg)
        self._status("Failed", _terminated(code, started, "Error", message=msg), False)
        self.k.store.mutate(
            "pods",
            self.ns,
            self.name,
            lambda o: o["status"].update(reason="IMEXDomainLost", message=msg),
        )

    def running(self) -> Container | None:
        proc = self.proc
        return proc if proc is not None and not proc.exited.is_set() else None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the running container: SIGSTOP is a hung worker
        (a wedged GPU or NVLink, as its peers see it), SIGKILL a lost one."""
        proc = self.running()
        if proc is None:
            raise ValueError(f"pod {self.ns}/{self.name} has no running container")
        proc.signal(sig)

    def lose_imex(self, message: str) -> None:
        """Kill a running container whose IMEX domain was torn down (as on real hardware)."""
        proc = self.running()
        if proc is None or self.cancel.is_set():
            return
        self.lost = message
        proc.stop(None)

    def _prepare(self) -> bool:
        statuses = {
            s["name"]: s.get("resourceClaimName")
            for s in (self.pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        for entry in self.pod["spec"].get("resourceClaims") or []:
            cname = statuses.get(entry["name"]) or entry.get("resourceClaimName")
            claim = self.k.store.find("resourceclaims", self.ns, cname or "")
            if claim is None:
                self._event(
                    "Warning", "FailedPrepareDynamicResources", f"resource claim {cname} not found"
                )
                return False
            # recorded before prepare: a half-done prepare (node labelled, channel taken) must
            # be undone when the pod goes away while it waits for IMEX
            self.claims.append(claim)
            while True:
                try:
                    self._inject(self.k.driver.prepare(self.node, claim, self.cancel))
                    break
                except PrepareError as e:
                    if self.cancel.is_set():
                        return False
                    self._event(
                        "Warning", "FailedPrepareDynamicResources", prepare_failure(claim, e)
                    )
                    if self.cancel.wait(0.5):  # the real kubelet retries with back-off
                        return False
        return not self.cancel.is_set()

    def _inject(self, channels: list[str]) -> None:
        """The container runtime's part of a prepared channel claim (CDI device nodes): an
        empty file per channel in the pod's own ``/dev`` (``ProcessEnv.devices_dir``)."""
        if not channels:
            return
        where = os.path.join(self.k.env.devices_dir(self.workdir), "nvidia-caps-imex-channels")
        os.makedirs(where, exist_ok=True)
        for name in channels:
            open(os.path.join(where, name), "a").close()

    def _unprepare(self) -> None:
        while self.claims:
            self.k.driver.unprepare(self.node, self.claims.pop())

    def _run_container(self) -> tuple[int | None, str]:
        """Start the container once; return (exit code or None when cancelled, startedAt)."""
        name = self.container.get("name", "main")
        self._event("Normal", "Created", f"Created container {name}")
        started = now_iso()
        fault = self.k.faults.pod_fault(self.job, self.index, "Failed", "OOMKilled", "CrashLoop")
        if fault is not None:
            # "Failed"/"OOMKilled" hit one attempt; "CrashLoop" keeps crashing every restart.
            self.k.faults.pod_fault(self.job, self.index, "Failed", "OOMKilled", consume=True)
            self.oom = fault.mode == "OOMKilled"
            self._event("Normal", "Started", f"Started container {name}")
            with open(self.log_path, "ab") as f:
                f.write(f"simulated {fault.mode} fault: exit code {fault.exit_code}\n".encode())
            self.started.set()
            return fault.exit_code, started
        bad = self.k.faults.node_fault(self.node)
        if bad is not None:  # a bad node: the worker dies as it starts, every time
            if bad[1]:
                with open(termination_file(self.workdir), "w") as f:
                    f.write(bad[1])
            with open(self.log_path, "ab") as f:
                f.write(f"simulated fault of node {self.node}: exit code {bad[0]}\n".encode())
            self.started.set()
            return bad[0], started
        try:
            cmd, env = self.k.env.command_and_env(self.pod, self.container, self.workdir)
            self.proc = Container(cmd, env, self.workdir, self.log_path, self.marker)
        except OSError as e:
            self._event("Warning", "Failed", f"Error: failed to start container {name}: {e}")
            with open(self.log_path, "ab") as f:
                f.write(f"failed to start: {e}\n".encode())
            self.started.set()
            return 128, started
        self.started.set()
        if self.cancel.is_set():  # deleted while starting: kill() may have missed the process
            self.proc.signal(signal.SIGKILL)
        else:
            self._event("Normal", "Started", f"Started container {name}")
            self._status("Running", {"running": {"startedAt": started}}, True)
        self.exit_code, self.started_at = self.proc.wait(), started
        if self.cancel.is_set() and self.lost is None:
            return None, started
        return self.exit_code, started

    def mark_terminated(self) -> None:
        """A deleted pod's last status before it goes: the real kubelet moves a deleted pod to
        a terminal phase (Failed unless its containers exited 0) so that its Job controller
        can count it."""
        current = self.k.store.find("pods", self.ns, self.name)
        if current is None or (current.get("status") or {}).get("phase") in TERMINAL:
            return
        code = 137 if self.exit_code is None else self.exit_code
        if self.exit_code is None and self.proc is None:
            state: Obj = {"terminated": {"exitCode": code, "reason": "ContainerStatusUnknown"}}
        else:
            state = _terminated(code, self.started_at, "Error", **self._message(code))
        self._status("Succeeded" if code == 0 else "Failed", state, False)

    def _message(self, code: int) -> dict[str, str]:
        """The container's termination message, as the kubelet reads it
        (``pkg/kubelet/kuberuntime/kuberuntime_container.go``): the file's first
        ``maxContainerTerminationMessageLength`` (4096) bytes; with ``FallbackToLogsOnError``,
        when the file is empty and the container failed, its log's last 80 lines, at most
        2048 bytes."""
        try:
            with open(termination_file(self.workdir), "rb") as f:
                data = f.read(MAX_MESSAGE_BYTES)
        except OSError:
            data = b""
        fallback = self.container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        if not data and fallback and code != 0:
            with open(self.log_path, "rb") as f:
                lines = f.read().splitlines(keepends=True)[-MAX_LOG_LINES:]
            data = b"".join(lines)[-MAX_LOG_BYTES:]
        return {"message": data.decode(errors="replace")} if data else {}

    def kill(self, grace_s: float | None = None) -> None:
        """SIGTERM the container, SIGKILL it after the grace period (capped at MAX_GRACE_S)."""
        self.cancel.set()
        proc = self.running()
        if proc is None:
            return
        if grace_s is None:
            grace_s = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        proc.stop(min(grace_s, MAX_GRACE_S))


def _terminated(code: int, started: str | None, failure: str, **more: str) -> Obj:
    """A container's terminated state: reason Completed for exit code 0, else ``failure``."""
    reason = "Completed" if code == 0 else failure
    state = {"exitCode": code, "reason": reason, **more, "startedAt": started}
    return {"terminated": state | {"finishedAt": now_iso()}}
