"""In-place restarts: a failed worker restarts the workers of every pod, not the pods.

The launchers of a run (one per pod) share one store: torch's ``TCPStore``, hosted by node
rank 0's launcher on ``MASTER_PORT`` for the life of its pod, as torchelastic's agent hosts
its own. The workers rendezvous on it too (``TORCHELASTIC_USE_AGENT_STORE``) under a prefix
of their attempt, ``/worker/attempt_<round>``, so that no worker of an old attempt can join a
new one (:func:`rendezvous`).

One round per attempt. A launcher whose worker failed (or stalled) writes the failure under
``fail/<round>`` (the first writer wins, ``compare_set``); every other launcher polls that key
while it supervises its workers (torchelastic's agent polls ``num_nodes_waiting`` the same
way), so they all stop their workers at once instead of waiting for a collective timeout.
Each launcher then decides from the same records, so they all decide alike: restart in place,
or exit so that the driver recreates the pods. The pods are recreated when the failure is not
retriable (:mod:`mnnvl.contract.exit_codes`), when the restart budget (``--max-restarts``) is
spent, when two attempts in a row failed the same way (same rank, same exit code), or when the
evidence points at the node's hardware (fabric or NVLink, which a node exclusion needs).
Restarting in place, every launcher waits at ``ready/<round + 1>`` until all have stopped their
workers, then starts them again; a launcher that does not arrive within ``barrier_s`` (its pod
was killed or its launcher hangs) makes the others exit too.

Workers and launchers never talk to the Kubernetes API: the driver learns of each in-place
restart from rank 0's log (:data:`LINE`, one line per restart).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mnnvl.contract import env as contract_env
from mnnvl.contract.termination import STOP, Evidence
from mnnvl.runtime import evidence

logger = logging.getLogger("mnnvl.runtime.launch")

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})

PREFIX = "mnnvl/launch/"
WORKER_PREFIX = "/worker/attempt_"  # torchelastic's prefix of one attempt's worker store
ROUND_ENV = "TORCHELASTIC_RESTART_COUNT"  # the attempt, in torchelastic's name
CONNECT_S = 600.0  # as the workers' join timeout: pods start minutes apart on a cluster
TRY_S = 1.0  # one attempt to reach the store, between looks for a stop signal
# A launcher beats at least every half second, also while it stops its workers; one silent
# this long is stopped (SIGSTOP) or gone: the others stop waiting for it. Also the longest a
# request to the store may take: none waits for a key, and a launcher blocked in one could
# not see a stop signal (a store whose node vanished never answers).
SILENT_S = 5.0
# The line rank 0's launcher logs per in-place restart; the driver parses it
# (mnnvl.driver.inplace), so its words are part of the contract.
LINE = (
    "in-place restart {n} of at most {max}: pod {pod} on node {node} rank {rank} exit "
    "{exit_code} ({reason}) "
    "after {step}; every pod ready {ready_s:.3f} s after the failure at {at:.3f}, starting "
    "round {n}"
)


@dataclass(frozen=True)
class Failure:
    """One attempt's first failure, as every launcher reads it from the store."""

    pod: str
    node: str
    rank: int | None
    exit_code: int
    reason: str
    step: str
    retried: bool
    hardware: bool
    at: float  # when its first worker failed (wall clock: the driver reads it across pods)

    @classmethod
    def of(cls, found: Evidence, at: float) -> Failure:
        return cls(
            at=at,
            pod=os.environ.get(contract_env.POD_NAME) or socket.gethostname(),
            node=os.environ.get(contract_env.NODE_NAME, ""),
            rank=found.rank,
            exit_code=found.exit_code if found.exit_code is not None else 1,
            reason=found.reason,
            step=found.step or "start-up",
            retried=found.verdict != STOP,
            hardware=found.hardware,
        )

    def same_as(self, other: Failure) -> bool:
        return (self.rank, self.exit_code) == (other.rank, other.exit_code)

    def text(self) -> str:
        return f"pod {self.pod} rank {self.rank} exit {self.exit_code} ({self.reason})"


class Stopped(Exception):
    """A stop signal came while the launcher waited for the launchers' store."""

    def __init__(self, signo: int) -> None:
        super().__init__(f"stopped by signal {signo}")
        self.signo = signo


def serve_or_connect(host: str, port: int, node_rank: int, nnodes: int) -> Any:
    """The run's store: hosted here on node rank 0 (before any worker starts), else joined,
    signed in under this node rank with the pod's name (:func:`_sign_in`): a store where
    another pod has it is an earlier gang's (node rank 0's old pod, not yet deleted, still
    answers at its address). Raises ``Stopped`` on a stop signal."""
    import torch.distributed as dist

    me = os.environ.get(contract_env.POD_NAME) or f"{socket.gethostname()}/{os.getpid()}"
    if node_rank == 0:
        timeout = datetime.timedelta(seconds=SILENT_S)
        store = dist.TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False)
        store.set(f"{PREFIX}launcher/0", me)
        return store
    logger.info("waiting for the launchers' store at %s:%d (node rank 0's pod)", host, port)
    stop = _StopWatch()

    def pause(seconds: float) -> None:
        stop.wait(seconds)
        if stop.signo is not None:
            raise Stopped(stop.signo)

    store = _sign_in(
        host,
        port,
        world=None,
        key=f"{PREFIX}launcher/{node_rank}",
        me=me,
        try_s=TRY_S,
        deadline=time.monotonic() + CONNECT_S,
        earlier=f"the store there is an earlier gang's (pod {{holder}} has node rank {node_rank})",
        missing=f"no launchers' store at {host}:{port}",
        pause=pause,
    )
    store.set_timeout(datetime.timedelta(seconds=SILENT_S))
    return store


def _sign_in(
    host: str,
    port: int,
    *,
    world: int | None,
    key: str,
    me: str,
    try_s: float,
    deadline: float,
    earlier: str,
    missing: str,
    pause: Callable[[float], None],
) -> Any:
    """A client of the store at ``host:port`` where this process signs in once, setting
    ``key`` to ``me``: a sign-in retried after its answer came too late finds ``me`` there.
    A store where another value holds ``key`` is an earlier gang's or attempt's, still
    answering (``earlier``, with ``{holder}``, says so once); it is waited out, as is a store
    not there yet (pods start minutes apart on a cluster), until ``deadline`` (monotonic),
    then raises ``missing: why``. ``pause(s)`` waits between tries (and may raise)."""
    import torch.distributed as dist

    timeout, said = datetime.timedelta(seconds=try_s), ""
    while True:
        try:
            store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
            holder = store.compare_set(key, "", me).decode()
            if holder == me:
                return store
            why = earlier.format(holder=holder)
            if why != said:
                logger.warning("%s; waiting", why)
                said = why
        except RuntimeError as e:  # not there yet
            why = str(e)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{missing}: {why}")
        pause(0.25)


class Rounds:
    """The launchers' agreement on each attempt (see the module)."""

    def __init__(
        self, store: Any, nnodes: int, max_restarts: int, barrier_s: float, node_rank: int = 0
    ) -> None:
        self.store, self.nnodes, self.node_rank = store, nnodes, node_rank
        self.max_restarts, self.barrier_s = max_restarts, barrier_s
        self.round = 0
        self.failures: list[Failure] = []  # one per finished round
        self.lost = ""  # why the store stopped answering ("" while it answers)
        self.late = ""  # why the last barrier failed

    def beat(self) -> None:
        """This launcher is alive (a counter the others watch at the barrier)."""
        if not self.lost:
            try:
                self.store.add(f"{PREFIX}beat/{self.node_rank}", 1)
            except RuntimeError as e:
                self.lost = f"the launchers' store stopped answering: {e}"

    def _key(self, what: str, n: int | None = None) -> str:
        return f"{PREFIX}{what}/{self.round if n is None else n}"

    def peer_failure(self) -> Failure | None:
        """The failure another launcher announced for this round, if any. A store that stops
        answering (node rank 0's pod is gone) ends the polling: the workers' collectives fail
        on their own, and the driver recreates the pods."""
        if self.lost:
            return None
        self.beat()
        try:
            if not self.store.check([self._key("fail")]):
                return None
            return Failure(**json.loads(self.store.get(self._key("fail"))))
        except (RuntimeError, ValueError, TypeError) as e:
            self.lost = f"the launchers' store stopped answering: {e}"
            logger.warning("%s; in-place restarts are off for this pod", self.lost)
            return None

    def announce(self, own: Failure) -> Failure:
        """Write this pod's failure for the round unless one is already there; the round's
        failure (another pod's when it was first)."""
        key = self._key("fail")
        won = self.store.compare_set(key, "", json.dumps(asdict(own)))
        return Failure(**json.loads(won))

    def recreate_because(self, failure: Failure) -> str:
        """Why the pods must be recreated after this round's ``failure``; "" to restart the
        workers in place. The same on every launcher: it reads only the shared records."""
        previous = self.failures[-1] if self.failures else None
        if self.lost:
            return self.lost
        if not failure.retried:
            return f"{failure.text()} is not retried"
        if failure.hardware:
            return f"{failure.text()} has fabric or NVLink evidence: its node must be excluded"
        if self.round >= self.max_restarts:
            return f"{self.round} in-place restart(s) spent --max-restarts {self.max_restarts}"
        if previous is not None and previous.same_as(failure):
            return f"two attempts in a row failed the same way ({failure.text()})"
        return ""

    def next_round(self, stop_requested: Callable[[], bool]) -> bool:
        """Wait until every launcher has stopped its workers for the next round; False when one
        does not arrive within ``barrier_s``, one that has not arrived stops beating for
        ``SILENT_S`` (its pod is stopped or gone), or this pod is being stopped."""
        keys = [f"{self._key('ready', self.round + 1)}/{n}" for n in range(self.nnodes)]
        heard: dict[int, tuple[int, float]] = {}  # node rank -> its beats, when they changed
        try:
            self.store.set(keys[self.node_rank], "1")
            deadline = time.monotonic() + self.barrier_s
            while not self.store.check(keys):
                self.beat()
                silent = self._silent(keys, heard)
                if silent is not None:
                    self.late = f"node rank {silent}'s launcher went silent for {SILENT_S:g} s"
                    return False
                if stop_requested() or time.monotonic() > deadline:
                    self.late = f"not every pod's launcher was ready within {self.barrier_s:g} s"
                    return False
                time.sleep(0.05)
        except RuntimeError as e:
            self.lost = f"the launchers' store stopped answering: {e}"
            return False
        self.round += 1
        return True

    def _silent(self, keys: list[str], heard: dict[int, tuple[int, float]]) -> int | None:
        """A node rank not at the barrier whose launcher has not beaten for ``SILENT_S``."""
        now = time.monotonic()
        for n, key in enumerate(keys):
            if n == self.node_rank or self.store.check([key]):
                continue
            beats = int(self.store.add(f"{PREFIX}beat/{n}", 0))
            if heard.get(n, (None, 0.0))[0] != beats:
                heard[n] = (beats, now)
            elif now - heard[n][1] > SILENT_S:
                return n
        return None

    def release(self) -> None:
        """On node rank 0, whose pod ends with the store: first wait until every pod's launcher
        has joined it (one still starting would wait for a store that is gone), at most
        ``CONNECT_S``; a stop signal or a store that stops answering ends the wait."""
        stop = _StopWatch()
        deadline = time.monotonic() + CONNECT_S
        try:
            while self.node_rank == 0 and time.monotonic() < deadline and stop.signo is None:
                if self.store.check([f"{PREFIX}launcher/{n}" for n in range(self.nnodes)]):
                    return
                stop.wait(0.1)
        except RuntimeError:
            return

    def after_failure(
        self, code: int, found: Evidence, stop_s: float
    ) -> tuple[int | None, int | None]:
        """After a failed attempt (``found``: this pod's evidence, ``code`` its exit code, 0
        when another pod failed): agree on the round's failure, then restart in place
        (returns (None, None)) or exit (returns (None, the pod's exit code): the driver then
        recreates the pods); (the stop signal, None) when one came meanwhile."""
        own = Failure.of(found, time.time() - stop_s)
        try:
            failure = self.peer_failure() or (self.announce(own) if code else None)
        except RuntimeError as e:
            self.lost = f"the launchers' store stopped answering: {e}"
            failure = None
        if failure is None:  # the store is gone: the pods are recreated
            evidence.write(found)
            return None, code or 1
        why = self.recreate_because(failure)
        self.failures.append(failure)
        stop = _StopWatch()
        if not why and self.next_round(stop.requested):
            logger.warning(
                LINE.format(
                    n=self.round,
                    max=self.max_restarts,
                    **{
                        k: getattr(failure, k)
                        for k in ("pod", "node", "rank", "exit_code", "reason")
                    },
                    step=failure.step,
                    at=failure.at,
                    ready_s=time.time() - failure.at,
                )
            )
            return None, None
        if stop.signo is not None:
            return stop.signo, None
        why = why or self.late or self.lost
        if failure.retried:
            logger.error("not restarting in place: %s; the pods are recreated", why)
        if code and failure == own:
            if not failure.retried:
                logger.error("exiting with %d, which a retry cannot change", code)
            evidence.write(found)
            return None, code
        # Another pod failed first: it exits now, and the driver deletes this pod (SIGTERM).
        stop.wait(self.barrier_s)
        if stop.signo is not None:
            return stop.signo, None
        evidence.write(evidence.of_code(1, f"stopped because {failure.text()} failed: {why}"))
        return None, 1


class _StopWatch:
    """A stop signal (SIGTERM, SIGINT, SIGHUP) taken while the launchers agree."""

    signo: int | None = None

    def requested(self) -> bool:
        info = signal.sigtimedwait(STOP_SIGNALS, 0)
        if info is not None:
            self.signo = info.si_signo
        return self.signo is not None

    def wait(self, timeout_s: float) -> None:
        info = signal.sigtimedwait(STOP_SIGNALS, timeout_s)
        if info is not None:
            self.signo = info.si_signo


def open_rounds(ns: argparse.Namespace) -> Rounds | None:
    """The launchers' store for in-place restarts (``ns``: the launcher's options); None when
    they are off: no budget (``--max-restarts 0``) or ``MNNVL_IN_PLACE_RESTARTS=0``."""
    if ns.max_restarts < 1 or os.environ.get(contract_env.IN_PLACE_RESTARTS, "1") == "0":
        return None
    store = serve_or_connect(ns.master_addr, ns.master_port, ns.node_rank, ns.nnodes)
    # Every launcher stops its workers within the grace period; one that is not ready some
    # seconds later lost its pod or hangs.
    return Rounds(store, ns.nnodes, ns.max_restarts, ns.grace_s + 10.0, ns.node_rank)


def rendezvous(rank: int, world: int, timeout_s: float, join_s: float) -> dict[str, Any]:
    """A worker's ``init_process_group`` store, rank and world size, as ``env://`` makes them
    but with a join timeout of its own, ``join_s`` (a gang's ranks start minutes apart on a
    cluster: a restarted rank 0 is rescheduled, waits for its IMEX channel, pulls its image);
    {} when no rendezvous is described. Under launchers that restart workers in place, node
    rank 0's launcher hosts the store and each attempt rendezvouses under its own prefix.
    Else rank 0 hosts it, and every other rank signs in there under its rank once: a store
    where another process holds its rank is an earlier attempt's (a restarted container
    whose rank 0 has not exited yet), which it waits out rather than join a dying group."""
    import torch.distributed as dist

    if contract_env.MASTER_ADDR not in os.environ:
        return {}  # init_process_group says what is missing
    host, port = os.environ[contract_env.MASTER_ADDR], int(os.environ[contract_env.MASTER_PORT])
    timeout = datetime.timedelta(seconds=max(join_s, timeout_s))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store: Any = dist.TCPStore(host, port, None, is_master=False, timeout=timeout)
        store = dist.PrefixStore(f"{WORKER_PREFIX}{os.environ.get(ROUND_ENV, '0')}", store)
    elif rank == 0:
        store = dist.TCPStore(host, port, world, is_master=True, timeout=timeout)
    else:
        store = _sign_in(
            host,
            port,
            world=world,
            key=f"{PREFIX}worker/{rank}",
            me=uuid.uuid4().hex,
            try_s=SILENT_S,
            deadline=time.monotonic() + timeout.total_seconds(),
            earlier=f"the store at {host}:{port} is an earlier attempt's (rank {rank} is in it)",
            missing=f"no rendezvous at {host}:{port} within {timeout}",
            pause=time.sleep,
        )
        store.set_timeout(timeout)
    return {"store": store, "rank": rank, "world_size": world}


def worker_env(round_: int) -> dict[str, str]:
    """The variables that make a worker of round ``round_`` rendezvous on the launchers' store
    under its attempt's prefix (torch's own agent-store convention)."""
    return {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        ROUND_ENV: str(round_),
    }
