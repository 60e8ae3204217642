"""``SimCluster``: the store, API server, controllers and kubelet wired together, plus ``serve``."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import random
import signal
import ssl
import sys
import tempfile
import threading
import uuid
from collections import Counter
from typing import Any

from mnnvl.contract import rbac
from mnnvl.sim.api.apiserver import ApiServer
from mnnvl.sim.api.faults import Faults
from mnnvl.sim.api.rbac import (
    ADMIN_USER,
    grant_cluster_reader,
    grant_runner,
    grant_trainer,
    service_account_user,
)
from mnnvl.sim.api.resources import ensure_default_service_account, scheduling_gated
from mnnvl.sim.api.schemas import SchemaAdmission, crd_object
from mnnvl.sim.api.selectors import object_matcher
from mnnvl.sim.api.store import Obj, Store
from mnnvl.sim.api.tls import self_signed
from mnnvl.sim.core.jobs import JobController
from mnnvl.sim.core.kubelet import Kubelet
from mnnvl.sim.core.podenv import ProcessEnv, local_gpu_ids
from mnnvl.sim.core.scheduler import Scheduler
from mnnvl.sim.nvidia.dra import LABEL_CLIQUE, ComputeDomainDriver
from mnnvl.sim.nvidia.stacks import check_stack, node_gpus
from mnnvl.sim.nvidia.stacks import seed as seed_stack
from mnnvl.sim.policy.admission import PodAdmission
from mnnvl.sim.policy.kueue import KueueConfig, KueueStandIn
from mnnvl.sim.policy.nodelifecycle import (
    DEFAULT_TOLERATION_S,
    POD_GC_QUARANTINE_S,
    NodeLifecycle,
    default_tolerations,
    node_unreachable,
)
from mnnvl.sim.policy.trainer import TrainerStandIn
from mnnvl.sim.policy.trainer import install as install_trainer

log = logging.getLogger(__name__)
SEED_ENV = "MNNVL_SIM_SEED"
# What ``serve`` prints of the cluster's shape (besides where to reach it).
SHAPE = ("nodes", "gpus_per_node", "cliques", "gpu_stack", "imex_mode", "cluster_reader")
OUR_KINDS = (
    "computedomains",
    "resourceclaimtemplates",
    "resourceclaims",
    "jobs",
    "pods",
    "services",
    "workloads",  # the Kueue stand-in's, owned by their Jobs
    "trainjobs",
)


def scheduler_seed_from(seed: int | None) -> int:
    if seed is not None:
        return int(seed)
    text = os.environ.get(SEED_ENV, "")
    if text:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{SEED_ENV}={text!r} is not a whole number") from None
    return random.SystemRandom().randrange(2**31)


class SimCluster:
    """A simulated Kubernetes cluster on 127.0.0.1 for the official ``kubernetes`` client."""

    def __init__(
        self,
        nodes: int = 2,
        gpus_per_node: int = 0,
        cliques: int = 1,
        imex_delay_s: float = 0.2,
        local_gpus: list[Any] | None = None,
        crd_installed: bool = True,
        namespaces: tuple[str, ...] | list[str] = ("default",),
        kubeconfig_path: str | None = None,
        *,
        schedule_delay_s: float = 0.25,
        driver_version: str = "v25.12.0",
        schema_dir: str | None = None,
        watch_history: int = 10000,
        kueue: bool = False,
        kueue_admission_delay_s: float = 0.5,
        scheduler_seed: int | None = None,
        kueue_config: KueueConfig | None = None,
        default_toleration_s: float = DEFAULT_TOLERATION_S,
        pod_gc_quarantine_s: float = POD_GC_QUARANTINE_S,
        admin_kubeconfig_path: str | None = None,
        gpu_stack: str = "device-plugin",
        imex_mode: str = "daemons",
        cluster_reader: bool = False,
        tls: bool = False,
        clique_label: str = LABEL_CLIQUE,
        kubernetes_minor: int = 36,
        trainer: bool = False,
        trainer_claims_per_node: bool = True,
    ) -> None:
        """The settings are those of ``mnnvl/sim/README.md``'s table. ``kubeconfig_path``
        authenticates as the ``mnnvl-runner`` service account of the first namespace (with
        ``manifests/base`` applied and bound to it in every namespace), ``admin_kubeconfig_path``
        as a cluster administrator, for what a platform team sets up (namespaces, PVCs,
        quotas). ``default_toleration_s`` is kube-apiserver's
        ``--default-unreachable-toleration-seconds`` (and not-ready): how long a pod stays on a
        lost node before the taint-eviction controller deletes it; ``pod_gc_quarantine_s`` how
        long a deleted node's pods are left before pod GC fails and force-deletes them
        (upstream: 300 s and 40 s)."""
        check_stack(gpu_stack, imex_mode)
        if nodes < 1 or cliques < 1 or gpus_per_node < 0 or cliques > nodes:
            raise ValueError("need nodes >= 1, 1 <= cliques <= nodes, gpus_per_node >= 0")
        self.nodes, self.gpus_per_node, self.cliques = nodes, gpus_per_node, cliques
        self.crd_installed = crd_installed
        self.gpu_stack, self.imex_mode, self.cluster_reader = gpu_stack, imex_mode, cluster_reader
        self.scheduler_seed = scheduler_seed_from(scheduler_seed)
        self.namespaces = tuple(namespaces)
        self.cluster_uuid = str(uuid.uuid4())
        self.clique_label = clique_label
        self.node_cliques = {
            f"sim-node-{i}": f"{self.cluster_uuid}.{i * cliques // nodes}" for i in range(nodes)
        }
        self.local_gpus = [str(g) for g in (local_gpu_ids() if local_gpus is None else local_gpus)]
        self._own_kubeconfig = kubeconfig_path is None
        self.kubeconfig_path = kubeconfig_path or os.path.join(
            tempfile.mkdtemp(prefix="mnnvl-sim-"), "kubeconfig"
        )
        # The runner's kubeconfig is what the product uses; this one is for fixtures.
        self.admin_kubeconfig_path = admin_kubeconfig_path or self.kubeconfig_path + ".admin"
        self.store = Store(history=watch_history)
        self.faults = Faults(imex_delay_s, schedule_delay_s)
        self.schemas = SchemaAdmission(schema_dir, driver_version)
        self.kueue = (
            KueueStandIn(self.store, kueue_admission_delay_s, kueue_config) if kueue else None
        )
        self.schemas.claims_per_node = trainer_claims_per_node
        self.trainer = TrainerStandIn(self.store) if trainer else None
        self.trainer_claims_per_node = trainer_claims_per_node
        # Pod admission (PodSecurity, quota; ``admission.deny`` plays a refusing webhook).
        self.admission = PodAdmission(self.store)
        self.store.sticky = self.faults.is_sticky
        self.default_toleration_s = default_toleration_s
        self.pod_gc_quarantine_s = pod_gc_quarantine_s
        self.kubernetes_minor = kubernetes_minor  # whose Job update rules apply
        self._server: ApiServer | None = None
        self._ca_pem = ""
        self._tls = tls
        self._parts: list[Any] = []
        self._started = self._stopped = False

    def start(self) -> SimCluster:
        if self._started:
            return self
        self._started = True
        self._seed()
        driver = ComputeDomainDriver(self.store, self.faults, self.node_cliques, self.imex_mode)
        env = ProcessEnv(self.store, self.gpus_per_node, self.local_gpus)
        kubelet = Kubelet(self.store, self.faults, driver, env)
        driver.on_imex_lost = kubelet.imex_lost
        self._driver, self._kubelet = driver, kubelet
        self._parts = [
            driver,
            Scheduler(self.store, self.faults, self.scheduler_seed),
            JobController(self.store, self._admit_pod, self.kubernetes_minor),
            kubelet,
            NodeLifecycle(self.store, self.pod_gc_quarantine_s),
            *([self.kueue] if self.kueue else []),
            *([self.trainer] if self.trainer else []),
        ]
        for part in self._parts:
            part.start()
        self._server = ApiServer(
            self.store, self.faults, kubelet.log_stream, self.crd_installed, self._tls_context()
        )
        self._server.schemas = self.schemas
        self._server.minor = self.kubernetes_minor
        self._server.validators.append(self.admission.admit)
        self._server.mutators.append(self._default_tolerations)
        if self.kueue is not None:
            self._server.mutators.append(self.kueue.mutate)
            self._server.kueue_served = True
        self._server.trainer_served = self.trainer is not None
        self.faults.outage_hook = self._server.outage
        self._server.start_serving()
        runner = service_account_user(self.namespaces[0], rbac.RUNNER)
        auth = self._server.authenticator
        # The admin's first: whoever waits for the kubeconfig then finds both.
        self._write_kubeconfig(self.admin_kubeconfig_path, "admin", auth.issue(ADMIN_USER))
        self._write_kubeconfig(self.kubeconfig_path, rbac.RUNNER, auth.issue(runner))
        log.info(
            "simulated cluster up at %s (%d nodes, kubeconfig %s, %s=%d reproduces its placements)",
            self.url,
            self.nodes,
            self.kubeconfig_path,
            SEED_ENV,
            self.scheduler_seed,
        )
        return self

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self._tls:
            return None
        self._ca_pem, key = self_signed()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # ssl loads a key only from a file: one only we can read (mkstemp), removed at once.
        fd, path = tempfile.mkstemp(prefix="mnnvl-sim-tls-", suffix=".pem")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self._ca_pem + key)
            context.load_cert_chain(path)
        finally:
            os.remove(path)
        return context

    def _default_tolerations(self, resource: str, obj: Obj) -> None:
        """The DefaultTolerationSeconds admission plugin (pods only)."""
        if resource == "pods":
            default_tolerations(obj, self.default_toleration_s)

    def _admit_pod(self, resource: str, pod: Obj) -> None:
        """What a pod the Job controller creates goes through: defaulting, then admission."""
        self._default_tolerations(resource, pod)
        scheduling_gated(pod)
        self.admission.admit(resource, pod)

    def stop(self) -> None:
        """Kill pod processes, stop controllers and the server; safe to call twice."""
        if not self._started or self._stopped:
            return
        self._stopped = True
        if self._server is not None:
            self._server.stop_serving()
        for part in reversed(self._parts):
            part.stop()
        self.store.close()
        for path in (self.kubeconfig_path, self.admin_kubeconfig_path):
            with contextlib.suppress(OSError):
                os.remove(path)
        if self._own_kubeconfig:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.kubeconfig_path))

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _seed(self) -> None:
        for ns in dict.fromkeys((*self.namespaces, "kube-system")):
            self.store.create(
                "namespaces", {"metadata": {"name": ns}, "status": {"phase": "Active"}}
            )
            ensure_default_service_account(self.store, ns)
            grant_runner(self.store, ns, self.namespaces[0], kueue=self.kueue is not None)
        if self.cluster_reader:
            grant_cluster_reader(self.store, self.namespaces[0])
        if self.trainer is not None:
            install_trainer(self.store, self.trainer_claims_per_node)
            grant_trainer(self.store, self.namespaces[0])
        resources = node_gpus(self.gpu_stack, self.gpus_per_node)
        resources |= {"cpu": "64", "memory": "512Gi", "pods": "110"}
        for name, clique in self.node_cliques.items():
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
            labels |= {self.clique_label: clique} if self.clique_label else {}
            labels["nvidia.com/gpu.present"] = "true"
            addresses = [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ]
            status = {"capacity": resources, "allocatable": resources, "addresses": addresses}
            status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            node = {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": status}
            self.store.create("nodes", node)
        seed_stack(
            self.store, self.gpu_stack, self.imex_mode, list(self.node_cliques), self.gpus_per_node
        )
        if self.crd_installed:
            self.store.create("customresourcedefinitions", crd_object())

    def _write_kubeconfig(self, path: str, user: str, token: str) -> None:
        cluster = {"server": self.url}
        if self._ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(self._ca_pem.encode()).decode()
        context = {"cluster": "mnnvl-sim", "user": user, "namespace": self.namespaces[0]}
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "mnnvl-sim",
            "clusters": [{"name": "mnnvl-sim", "cluster": cluster}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "mnnvl-sim", "context": context}],
        }
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=1)  # JSON is valid YAML
        os.replace(tmp, path)

    def lose_node(self, name: str, deleted_after_s: float | None = None) -> None:
        """The node drops off the network, as a crashed or powered-off machine does (the
        README's "node lost" row); ``deleted_after_s`` then deletes the Node object, as a cloud
        provider's node controller does once the instance is gone."""
        node_unreachable(self.store, name, deleted_after_s)
        self._kubelet.node_unreachable(name)
        self._driver.node_lost(name)

    def signal_pod(self, namespace: str, name: str, sig: int) -> None:
        """Send a signal to every process of a running pod's container: ``SIGSTOP`` is a
        hung worker (nothing fails, its peers wait in a collective), ``SIGKILL`` a lost one
        (the container exits 137 and the pod fails, as under a real kubelet)."""
        self._kubelet.signal_pod(namespace, name, sig)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("SimCluster not started")
        return self._server.url

    @property
    def request_count(self) -> int:
        return self._server.request_count if self._server else 0

    @property
    def request_counts(self) -> Counter[tuple[str, str]]:
        """Requests served per (verb, resource); verbs GET LIST WATCH POST PUT PATCH DELETE."""
        return Counter(self._server.counters) if self._server else Counter()

    @property
    def rbac_requests(self) -> set[tuple[str, str, str]]:
        """Every (RBAC verb, API group, resource) requested so far, as an audit log lists them."""
        return set(self._server.rbac_requests) if self._server else set()

    def objects(self, label_selector: str | None = None) -> list[tuple[str, str, str]]:
        """(kind, namespace, name) of every workload-side object that exists now."""
        match = object_matcher(label_selector, None)
        return [
            (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
            for plural in OUR_KINDS
            for o in self.store.list(plural, None, match)[0]
        ]

    def processes(self, label_selector: str | None = None) -> list[tuple[str, str, int]]:
        """(namespace, pod, pid) of every live process that a container of a pod (matching
        ``label_selector``) started, whether or not the pod still exists."""
        return self._kubelet.processes(label_selector)

    @property
    def events(self) -> list[Obj]:
        return self.store.list("events")[0]

    def pvc_dir(self, namespace: str, claim: str) -> str:
        """The host directory the kubelet mounts for a PersistentVolumeClaim."""
        return self._kubelet.env.claim_dir(namespace, claim)

    def pod_log(self, namespace: str, name: str) -> str:
        """The captured output of a pod ("" before it started)."""
        worker = self._kubelet.workers.get((namespace, name))
        if worker is None or not os.path.exists(worker.log_path):
            return ""
        with open(worker.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def _usage(sim: SimCluster) -> str:
    kubeconfig, admin = sim.kubeconfig_path, sim.admin_kubeconfig_path
    # The example runs as printed: its pods fit in one clique (the default affinity), and
    # CPU workers have no NVLink to derive a threshold from, so it gives one (a single
    # node has no bus to measure at all).
    run_nodes = max(sim.nodes // sim.cliques, 1)
    judge = "--min-busbw-gbps 0.001" if run_nodes > 1 else "--allow-unjudged"
    # Its pods get the GPUs the nodes advertise only where this machine has one for each of
    # them (``ProcessEnv.gpus_for``); elsewhere the workers would see none and fail.
    wanted = sim.nodes * sim.gpus_per_node
    gpus = sim.gpus_per_node if len(sim.local_gpus) >= wanted else 0
    why = ""
    if gpus != sim.gpus_per_node:
        why = f"  # CPU: this machine has {len(sim.local_gpus)} of the nodes' {wanted} GPUs"
    return (
        f"simulated cluster with {sim.nodes} node(s) serving at {sim.url}\n"
        f"  {kubeconfig}: the mnnvl-runner service account (manifests/base RBAC, enforced)\n"
        f"  {admin}: a cluster admin, to set up namespaces, PVCs and quotas\n"
        "in another shell:\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        "  kubectl get pods  # the runner's Role: its namespace only; nodes need the admin:\n"
        f"  kubectl --kubeconfig {admin} get nodes\n"
        f"  mnnvl run --run-id demo --nodes {run_nodes} --gpus-per-node {gpus} {judge}{why}\n"
        "Ctrl-C (or SIGTERM) stops it and every pod process it started."
    )


def serve(**options: Any) -> str:
    """Run a SimCluster (``options``: its keyword arguments; TLS on, as kubectl sends its
    token only over TLS) until SIGINT/SIGTERM; print its kubeconfig path and one JSON line.

    Returns the kubeconfig path it served (a temporary file unless ``kubeconfig_path``).
    """
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with SimCluster(**options, tls=True) as sim:
            print(sim.kubeconfig_path, flush=True)
            info: dict[str, Any] = {"kubeconfig": sim.kubeconfig_path, "server": sim.url}
            info |= {"admin_kubeconfig": sim.admin_kubeconfig_path, "local_gpus": sim.local_gpus}
            info |= {k: getattr(sim, k) for k in SHAPE}
            print(json.dumps(info), flush=True)
            print(_usage(sim), file=sys.stderr, flush=True)
            done.wait()
            return sim.kubeconfig_path
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
