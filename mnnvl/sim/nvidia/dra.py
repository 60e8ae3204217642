"""ComputeDomain controller and kubelet plugin with the NVIDIA DRA driver's semantics.

The controller (fed by the store's watch fan-out) keeps the finalizer, the workload
ResourceClaimTemplate and ``status`` (``Ready`` iff ``len(nodes) >= numNodes`` and every node
Ready), and on deletion drops the template, the node labels and the finalizer. The kubelet
plugin's ``prepare`` labels the node, starts its simulated IMEX daemon (Ready after
``faults.imex_delay_s``) and blocks until it is Ready, exactly where the real plugin holds a
pod in ContainerCreating; a node without a clique ID gets no channel device (upstream's
``CliqueID() == ""`` branch).

Host-managed IMEX (``imex_mode="hostManaged"``, upstream ``onAddOrUpdateHostManaged`` in
``cmd/compute-domain-controller/computedomain.go`` and
``applyComputeDomainChannelConfigHostManaged`` in
``cmd/compute-domain-kubelet-plugin/device_state.go``): the controller makes only the channel
template, with ``allocationMode`` forced to ``Single`` (``channelAllocationModeFor``), and marks
the domain Ready at once; no daemons, node labels or ``status.nodes``. ``prepare`` checks the
host's ``nvidia-imex`` service (down on the nodes in ``faults.host_imex_down``) only on a node
with a clique ID.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.events import record_event
from mnnvl.sim.api.faults import Faults
from mnnvl.sim.api.store import Obj, Store, WatchEvent

log = logging.getLogger(__name__)

CD, RCT = "computedomains", "resourceclaimtemplates"
FINALIZER = "resource.nvidia.com/computeDomain"
LABEL_CD = "resource.nvidia.com/computeDomain"
LABEL_TARGET = "resource.nvidia.com/computeDomainTarget"
LABEL_CLIQUE = "nvidia.com/gpu.clique"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DRIVER = "compute-domain.nvidia.com"
COMPONENT = "compute-domain-controller"


class PrepareError(Exception):
    """NodePrepareResources failed with the message the driver's
    ``applyComputeDomainChannelConfig`` returns; the kubelet retries (the pod stays
    ContainerCreating), also after the errors the driver marks permanent."""


@dataclass
class Daemon:
    """One node's simulated IMEX daemon for one ComputeDomain."""

    uid: str
    namespace: str
    name: str
    clique: str
    index: int
    ip: str
    ready: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    timer: threading.Timer | None = None

    def stop(self) -> None:
        self.stopped.set()
        if self.timer is not None:
            self.timer.cancel()


def prepare_failure(claim: Obj, err: Exception) -> str:
    """The kubelet's FailedPrepareDynamicResources message, wrapped as the driver wraps it."""
    meta = claim["metadata"]
    return (
        "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources "
        f"failed for ResourceClaim {meta['name']}: error preparing devices for claim "
        f"{meta['namespace']}/{meta['name']}:{meta['uid']}: prepare devices failed: "
        f"error applying config: {err}"
    )


def channel_template(ns: str, name: str, uid: str, allocation_mode: str) -> Obj:
    """The workload claim template the real controller generates."""
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "finalizers": [FINALIZER],
            "labels": {LABEL_CD: uid, LABEL_TARGET: "Workload"},
        },
        "spec": {  # a ResourceClaimTemplate's spec holds the claim's spec
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}
                    ],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": "resource.nvidia.com/v1beta1",
                                    "kind": "ComputeDomainChannelConfig",
                                    "domainID": uid,
                                    "allocationMode": allocation_mode,
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


def channel_domain(claim: Obj) -> str | None:
    """The ComputeDomain UID a claim's channel config points at (None: not a channel claim)."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    if not any(
        (r.get("exactly") or {}).get("deviceClassName") == CHANNEL_CLASS
        for r in devices.get("requests") or []
    ):
        return None
    for cfg in devices.get("config") or []:
        params = (cfg.get("opaque") or {}).get("parameters") or {}
        if params.get("kind") == "ComputeDomainChannelConfig":
            return str(params.get("domainID") or "")
    return ""


class ComputeDomainDriver(Controller):
    name = "sim-cd-controller"
    kinds = (CD, RCT)

    def __init__(
        self, store: Store, faults: Faults, cliques: dict[str, str], imex_mode: str
    ) -> None:
        super().__init__(store)
        self.faults = faults
        # node -> clique ID as the GPUs report it (NVML), whatever label the nodes carry.
        self.cliques = cliques
        self.host_managed = imex_mode == "hostManaged"
        self._lock = threading.RLock()
        self._daemons: dict[str, Daemon] = {}  # node -> daemon
        self._channels: dict[str, str] = {}  # node -> claim uid holding channel-0
        self._warned: set[str] = set()
        # Set by the kubelet: kill running containers of a domain (on some nodes, or all).
        self.on_imex_lost: Callable[[str, set[str] | None, str], None] = lambda u, n, m: None

    def stop(self) -> None:
        super().stop()
        with self._lock:
            for d in self._daemons.values():
                d.stop()

    def on_events(self, events: list[WatchEvent]) -> None:
        for ev in events:  # each event on its own: one failed reconcile leaves the rest
            try:
                if ev.resource == RCT:
                    self._on_template(ev.namespace, ev.obj["metadata"]["name"])
                elif ev.type != "DELETED":
                    self.reconcile(ev.namespace, ev.obj["metadata"]["name"])
            except Exception:
                log.exception("ComputeDomain controller: reconcile failed")

    def _on_template(self, ns: str, name: str) -> None:
        """A template came or went: reconcile domains that want this name (recreate / unstick)."""
        for cd in self.store.list(CD, ns)[0]:
            if cd["spec"].get("channel", {}).get("resourceClaimTemplate", {}).get("name") == name:
                self.reconcile(ns, cd["metadata"]["name"])

    def reconcile(self, ns: str, name: str) -> None:
        cd = self.store.find(CD, ns, name)
        if cd is None:
            return
        if cd["metadata"].get("deletionTimestamp"):
            self._teardown(cd)
            return
        if FINALIZER not in (cd["metadata"].get("finalizers") or []):
            self.store.mutate(
                CD, ns, name, lambda o: o["metadata"].setdefault("finalizers", []).append(FINALIZER)
            )
        if self.faults.blocks_rct(name):
            self.requeue(0.5, CD, ns, name)  # the real controller keeps retrying its sync
            return
        uid = cd["metadata"]["uid"]
        tname = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
        rct = self.store.find(RCT, ns, tname)
        if rct is None:
            mode = "Single" if self.host_managed else cd["spec"]["channel"]["allocationMode"]
            self.store.create(RCT, channel_template(ns, tname, uid, mode))
        elif (rct["metadata"].get("labels") or {}).get(LABEL_CD) != uid:
            if uid not in self._warned:  # the real controller retries forever; say it once
                self._warned.add(uid)
                msg = (
                    f'error creating ResourceClaimTemplate "{tname}": '
                    f'resourceclaimtemplates "{tname}" already exists'
                )
                reason = "FailedCreateResourceClaimTemplate"
                record_event(self.store, cd, "Warning", reason, msg, COMPONENT)
            return
        self._write_status(ns, name, uid)

    def _write_status(self, ns: str, name: str, uid: str) -> None:
        with self._lock:
            nodes = [
                {
                    "name": n,
                    "ipAddress": d.ip,
                    "cliqueID": d.clique,
                    "index": d.index,
                    "status": "Ready" if d.ready.is_set() else "NotReady",
                }
                for n, d in sorted(self._daemons.items())  # by node name
                if d.uid == uid
            ]

        def write(o: Obj) -> None:
            if self.host_managed:  # Ready means admitted with its template, nothing more
                o["status"] = {"status": "Ready"}
                return
            want = int(o["spec"].get("numNodes") or 0)
            ready = len(nodes) >= want and all(e["status"] == "Ready" for e in nodes)
            o["status"] = {"status": "Ready" if ready else "NotReady", "nodes": nodes}

        cd = self.store.find(CD, ns, name)
        if cd and cd["metadata"]["uid"] == uid and not cd["metadata"].get("deletionTimestamp"):
            self.store.mutate(CD, ns, name, write)

    def _teardown(self, cd: Obj) -> None:
        ns, name, uid = cd["metadata"]["namespace"], cd["metadata"]["name"], cd["metadata"]["uid"]
        tname = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
        rct = self.store.find(RCT, ns, tname)
        if rct is not None and (rct["metadata"].get("labels") or {}).get(LABEL_CD) == uid:
            self.store.delete(RCT, ns, tname)
            self.store.mutate(RCT, ns, tname, _drop_finalizer)
        with self._lock:
            lost = {node for node, d in self._daemons.items() if d.uid == uid}
            for node in lost:
                self._daemons.pop(node).stop()
        if lost:
            self.on_imex_lost(
                uid,
                lost,
                f"IMEX domain of ComputeDomain {ns}/{name} (uid {uid}) was torn down under the "
                "running container: the ComputeDomain was deleted before its workload",
            )
        for n in self.store.list("nodes")[0]:
            self._unlabel(n["metadata"]["name"], uid)
        left = self.store.mutate(CD, ns, name, _drop_finalizer)
        if left is not None and FINALIZER in (left["metadata"].get("finalizers") or []):
            self.requeue(0.5, CD, ns, name)  # the real controller retries with back-off

    def node_lost(self, node: str) -> None:
        """A node left the cluster: its IMEX daemon is gone from the domain's status. Its pods
        are not failed here: their kubelet is unreachable and reports nothing (the taint-eviction
        controller and pod GC deal with them)."""
        with self._lock:
            daemon = self._daemons.pop(node, None)
            if daemon is None:
                return
            daemon.stop()
        self._write_status(daemon.namespace, daemon.name, daemon.uid)

    def prepare(self, node: str, claim: Obj, cancel: threading.Event) -> list[str]:
        """NodePrepareResources for a channel claim; returns, once the node's IMEX daemon (or
        host service) is Ready, the channel devices injected (``channel0``; none on a node
        without a clique ID). Raises PrepareError (retryable) otherwise."""
        uid = channel_domain(claim)
        if uid is None:
            return []
        ns, claim_uid = claim["metadata"]["namespace"], claim["metadata"]["uid"]
        with self._lock:
            domains, _ = self.store.list(CD, None, lambda o: o["metadata"]["uid"] == uid)
            if not domains or domains[0]["metadata"].get("deletionTimestamp"):
                raise PrepareError(
                    f"error asserting ComputeDomain's namespace: ComputeDomain not found: {uid}"
                )
            if domains[0]["metadata"]["namespace"] != ns:
                raise PrepareError(
                    "error asserting ComputeDomain's namespace: the ResourceClaim's namespace "
                    "is different than the ComputeDomain's namespace"
                )
            if self._channels.get(node) not in (None, claim_uid):
                raise PrepareError(f"channel 0 on node {node} already prepared for another claim")
            labels = self.store.get("nodes", "", node)["metadata"].get("labels") or {}
            # The GPUs' clique ID (NVML), which the label only mirrors: none, no channel.
            clique = self.cliques.get(node, labels.get(LABEL_CLIQUE, ""))
            channels = ["channel0"] if clique else []
            if self.host_managed:
                if channels and node in self.faults.host_imex_down:
                    raise PrepareError(
                        "host nvidia-imex daemon readiness check failed: host nvidia-imex "
                        "daemon not ready: (simulated: the host's service is down)"
                    )
                self._channels[node] = claim_uid
                return channels
            if labels.get(LABEL_CD) not in (None, uid):
                raise PrepareError(
                    "error adding Node label for ComputeDomain: "
                    "label already exists for a different ComputeDomain"
                )
            self.store.mutate(
                "nodes",
                "",
                node,
                lambda o: o["metadata"].setdefault("labels", {}).__setitem__(LABEL_CD, uid),
            )
            self._channels[node] = claim_uid
            daemon = self._daemons.get(node)
            if daemon is None or daemon.uid != uid:
                daemon = self._start_daemon(node, domains[0], clique)
        while not daemon.ready.wait(0.05):
            if cancel.is_set() or daemon.stopped.is_set():
                raise PrepareError(
                    "error asserting ComputeDomain Ready: current node not ready in ComputeDomain"
                )
        return channels

    def unprepare(self, node: str, claim: Obj) -> None:
        uid = channel_domain(claim)
        with self._lock:
            if uid is None or self._channels.get(node) != claim["metadata"]["uid"]:
                return
            del self._channels[node]
            self._unlabel(node, uid)
            self.node_lost(node)  # its daemon stops and leaves the status, as a lost node's

    def _unlabel(self, node: str, uid: str) -> None:
        """Drop the node's ComputeDomain label if it names ``uid`` (a write returning False
        is discarded, so another domain's label stays)."""
        self.store.mutate(
            "nodes",
            "",
            node,
            lambda o: (o["metadata"].get("labels") or {}).pop(LABEL_CD, None) == uid,
        )

    def _start_daemon(self, node: str, cd: Obj, clique: str) -> Daemon:
        meta = cd["metadata"]
        used = {
            d.index for d in self._daemons.values() if d.uid == meta["uid"] and d.clique == clique
        }
        index = min(set(range(len(used) + 1)) - used)
        node_no = int(node.rsplit("-", 1)[-1]) if node.rsplit("-", 1)[-1].isdigit() else 0
        ip = f"10.128.{node_no // 250}.{node_no % 250 + 2}"
        daemon = Daemon(meta["uid"], meta["namespace"], meta["name"], clique, index, ip)
        self._daemons[node] = daemon
        daemon.timer = threading.Timer(
            max(self.faults.imex_delay_s, 0.0), self._daemon_ready, (daemon,)
        )
        daemon.timer.daemon = True
        daemon.timer.start()
        self._write_status(daemon.namespace, daemon.name, daemon.uid)
        return daemon

    def _daemon_ready(self, daemon: Daemon) -> None:
        with self._lock:
            if daemon.stopped.is_set():
                return
            daemon.ready.set()
        self._write_status(daemon.namespace, daemon.name, daemon.uid)


def _drop_finalizer(obj: Obj) -> None:
    obj["metadata"]["finalizers"] = [
        f for f in obj["metadata"].get("finalizers") or [] if f != FINALIZER
    ]
