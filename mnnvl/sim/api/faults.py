"""Fault injection for the simulated cluster (``SimCluster.faults``).

Every fault is explicit and counted: request faults and watch expiries are consumed as they fire
(``random_errors`` draws them with a seeded generator instead); pod faults ``Failed``,
``OOMKilled`` (exit code 137, reason OOMKilled) and ``CrashLoop`` hit the first pod of that Job
index that starts, while ``ImagePullBackOff`` and ``Unschedulable`` hold every pod of that index;
``fail_node`` ends every container that starts on that node (a bad node).
``api_outage`` takes the API server off the network for a while, then lets it refuse requests
for a moment as a restarted kube-apiserver does (see ``mnnvl.sim.api.serving``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from mnnvl.sim.api.model import resolve_kind

POD_MODES = ("Failed", "OOMKilled", "ImagePullBackOff", "Unschedulable", "CrashLoop")
# How long a restarted API server refuses requests before its authorization caches have synced
# (0.2-0.3 s observed on a small cluster).
UNSYNCED_S = 0.5


@dataclass
class PodFault:
    job_name: str
    index: int
    mode: str
    exit_code: int


class Faults:
    def __init__(self, imex_delay_s: float = 0.2, schedule_delay_s: float = 0.25) -> None:
        self._lock = threading.Lock()
        self._requests: list[list] = []  # [method, path_substring, status, remaining]
        self._watch_expiries = 0
        self._random: tuple[float, tuple[int, ...], float] | None = None
        self._rng = random.Random(0)
        self._pods: list[PodFault] = []
        self._sticky: set[tuple[str, str]] = set()
        self._no_rct: set[str] = set()
        self._nodes: dict[str, tuple[int, str]] = {}  # bad node -> (exit code, message)
        self.imex_delay_s = imex_delay_s
        # Nodes whose host nvidia-imex service is not ready (host-managed IMEX only).
        self.host_imex_down: set[str] = set()
        # How long after its creation the scheduler first looks at a pod (the real one
        # binds or marks Unschedulable asynchronously, a moment after the pod was listed).
        self.schedule_delay_s = schedule_delay_s
        self.outage_hook: Callable[[float, float], None] | None = None  # set by the cluster

    def api_outage(self, seconds: float, unsynced_s: float = UNSYNCED_S) -> None:
        """From now, for ``seconds``, the API server refuses connections and has cut every
        open one (watches, followed logs); controllers, kubelet and pods keep running. Then,
        for ``unsynced_s``, it answers every resource request 403 Forbidden and ``/readyz``
        fails, as a kube-apiserver does until its authorization caches have synced."""
        if self.outage_hook is None:
            raise RuntimeError("the simulated cluster is not running")
        self.outage_hook(seconds, unsynced_s)

    def fail_requests(self, method: str, path_substring: str, status: int, count: int = 1) -> None:
        """The next ``count`` requests with this HTTP method whose path contains the substring
        get ``status`` with a Status body."""
        with self._lock:
            self._requests.append([method.upper(), path_substring, int(status), int(count)])

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def random_errors(
        self,
        rate: float,
        codes: tuple[int, ...] = (500, 429),
        watch_expiry_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        """From now on each request fails with probability ``rate`` (a code drawn from
        ``codes``) and each watch is answered 410 Expired with ``watch_expiry_rate``."""
        with self._lock:
            self._random = (rate, tuple(codes), watch_expiry_rate)
            self._rng = random.Random(seed)

    def request_error(self, method: str, path: str) -> int | None:
        with self._lock:
            for rule in self._requests:
                if rule[3] > 0 and rule[0] in (method, "*") and rule[1] in path:
                    rule[3] -= 1
                    return int(rule[2])
            if self._random is not None and self._rng.random() < self._random[0]:
                return self._rng.choice(self._random[1])
        return None

    def expire_watches(self, count: int = 1) -> None:
        """The next ``count`` watch streams deliver one ERROR 410 Expired event and end."""
        with self._lock:
            self._watch_expiries += count

    def take_watch_expiry(self) -> bool:
        with self._lock:
            if self._watch_expiries > 0:
                self._watch_expiries -= 1
                return True
            return self._random is not None and self._rng.random() < self._random[2]

    def fail_pod(
        self, job_name: str, index: int = 0, mode: str = "Failed", exit_code: int = 1
    ) -> None:
        if mode not in POD_MODES:
            raise ValueError(f"mode must be one of {POD_MODES}, got {mode!r}")
        with self._lock:
            self._pods.append(PodFault(job_name, index, mode, exit_code))

    def clear_pod_faults(self, job_name: str) -> None:
        """Lift every pod fault of that Job (an unschedulable index becomes placeable)."""
        with self._lock:
            self._pods = [f for f in self._pods if f.job_name != job_name]

    def pod_fault(
        self, job_name: str | None, index: int | None, *modes: str, consume: bool = False
    ) -> PodFault | None:
        if job_name is None or index is None:
            return None
        with self._lock:
            for f in self._pods:
                if (f.job_name, f.index) == (job_name, index) and f.mode in modes:
                    if consume:
                        self._pods.remove(f)
                    return f
        return None

    def fail_node(self, node: str, exit_code: int = 137, message: str = "") -> None:
        """A bad node: every container that starts there from now on ends at once with
        ``exit_code`` (137: killed), ``message`` written to its termination message file."""
        with self._lock:
            self._nodes[node] = (exit_code, message)

    def heal_node(self, node: str) -> None:
        """Lift ``fail_node``."""
        with self._lock:
            self._nodes.pop(node, None)

    def node_fault(self, node: str) -> tuple[int, str] | None:
        with self._lock:
            return self._nodes.get(node)

    def stick_finalizer(self, kind: str, name: str) -> None:
        """The object (kind "ComputeDomain" or a plural, and name) never loses its finalizers."""
        with self._lock:
            self._sticky.add((resolve_kind(kind), name))

    def unstick_finalizer(self, kind: str, name: str) -> None:
        with self._lock:
            self._sticky.discard((resolve_kind(kind), name))

    def is_sticky(self, resource: str, namespace: str, name: str) -> bool:
        return (resource, name) in self._sticky

    def no_rct(self, domain_name: str) -> None:
        """The ComputeDomain controller never creates the channel template of this domain."""
        with self._lock:
            self._no_rct.add(domain_name)

    def allow_rct(self, domain_name: str) -> None:
        """Lift ``no_rct``: the controller's next sync creates the channel template."""
        with self._lock:
            self._no_rct.discard(domain_name)

    def blocks_rct(self, domain_name: str) -> bool:
        return domain_name in self._no_rct
