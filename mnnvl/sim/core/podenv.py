"""Container environment rules of the simulated kubelet: $(VAR) expansion, fieldRefs, GPUs,
PersistentVolumeClaim mount paths, the IMEX channel directory and ``/dev/shm`` (the pod's own
``/dev``)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping

from mnnvl.contract.env import (
    IMEX_CHANNEL_DIR,
    MASTER_ADDR,
    MASTER_PORT,
    PINNED,
    SHM_DIR,
    SHM_SIZE,
)
from mnnvl.contract.termination import TERMINATION_PATH, TERMINATION_PATH_ENV
from mnnvl.ports import free_port
from mnnvl.sim.api.model import Obj
from mnnvl.sim.api.store import Store
from mnnvl.sim.core.placement import claim_gpus, pod_gpus

log = logging.getLogger(__name__)
# A pod or Service name under ``.svc``, completed by the search list or written out with the
# simulated cluster's domain (cluster.local), as a pod's resolver would resolve it.
DNS_RE = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.svc(?:\.cluster\.local)?(?![A-Za-z0-9.-])")
# What the container image itself provides, the image being this Python environment: the
# search path for executables and what the interpreter needs to import the product and its
# libraries (torch's CUDA libraries among them).
IMAGE_ENV = ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
# What an image built for this host carries of the host's settings: its NCCL, NVSHMEM and torch
# symmetric-memory variables (a shared multi-GPU host pins NVLink multicast off through them,
# contract ``PINNED``). A pod spec's own value wins, except for a pinned one the host sets.
# Nothing else of the simulator's environment reaches a pod.
HOST_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")
SHM = "/dev/shm"
# The container runtime's /dev/shm where a pod mounts nothing there (containerd and Docker).
RUNTIME_SHM_BYTES = 64 * 1024**2
VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: unknown variables stay as written, ``$$`` -> ``$``."""
    return VAR_RE.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RE = re.compile(
    rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_NAME}(?:/{_NAME})*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)


def image_problem(image: str) -> tuple[str, str] | None:
    """("InvalidImageName", message) for a reference the kubelet cannot parse, else None."""
    if IMAGE_RE.match(image):
        return None
    return (
        "InvalidImageName",
        f'Failed to apply default image tag "{image}": couldn\'t parse image name '
        f'"{image}": invalid reference format',
    )


def field_ref(pod: Obj, path: str) -> str:
    meta = pod["metadata"]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": pod["spec"].get("nodeName"),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    return str(simple.get(path) or "")


def local_gpu_ids() -> list[str]:
    """Indices of the GPUs on this machine, from ``nvidia-smi -L`` ([] without it)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("nvidia-smi -L failed: %s", e)
        return []
    return [m.group(1) for m in re.finditer(r"^GPU (\d+):", out, re.M)]


def gpus_problem(nodes: int, gpus_per_node: int, local: int) -> str:
    """Why this machine, with ``local`` GPUs, cannot give ``nodes`` simulated nodes
    ``gpus_per_node`` GPUs each ("" when it can): their pods run here, on its GPUs."""
    wanted = nodes * gpus_per_node
    if wanted <= local:
        return ""
    return (
        f"{gpus_per_node} on {nodes} simulated nodes needs {wanted} GPUs on this machine, which "
        f"has {local} (the simulator's pods run here); pass --gpus-per-node "
        f"{local // max(1, nodes)} or fewer nodes (0: CPU workers, judged only against "
        "--min-busbw-gbps or with --allow-unjudged)"
    )


class ProcessEnv:
    """Command line and environment of a pod's container process on this machine."""

    def __init__(self, store: Store, gpus_per_node: int, local_gpus: list[str]) -> None:
        self.store, self.gpus_per_node, self.local_gpus = store, gpus_per_node, local_gpus
        self._ports: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.volumes_root = tempfile.mkdtemp(prefix="sim-volumes-")
        # The pods' memory emptyDirs at /dev/shm, in this machine's memory where it has one.
        self.shm_root = tempfile.mkdtemp(prefix="sim-shm-", dir=SHM if os.path.isdir(SHM) else None)

    def close(self) -> None:
        shutil.rmtree(self.volumes_root, ignore_errors=True)
        shutil.rmtree(self.shm_root, ignore_errors=True)

    def claim_dir(self, ns: str, claim: str) -> str:
        """The host directory standing in for a PersistentVolumeClaim (one per claim; it
        outlives pods and Jobs, like the volume would)."""
        path = os.path.join(self.volumes_root, ns, claim)
        os.makedirs(path, exist_ok=True)
        return path

    def service_port(self, ns: str, service: str) -> int:
        """A free local port, allocated once per Service (rendezvous of all its pods)."""
        with self._lock:
            if (ns, service) not in self._ports:
                self._ports[(ns, service)] = free_port()
            return self._ports[(ns, service)]

    def gpus_for(self, pod: Obj) -> str:
        node = pod["spec"]["nodeName"]
        suffix = node.rsplit("-", 1)[-1]
        i, g = (int(suffix) if suffix.isdigit() else 0), self.gpus_per_node
        want = pod_gpus(pod)
        for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            claim = self.store.find(
                "resourceclaims", pod["metadata"]["namespace"], entry.get("resourceClaimName") or ""
            )
            want += claim_gpus(claim) if claim else 0
        if g <= 0 or want <= 0 or len(self.local_gpus) < (i + 1) * g:
            return ""
        return ",".join(self.local_gpus[i * g : (i + 1) * g][:want])

    def config_problem(self, pod: Obj, container: Obj) -> str:
        """Why the kubelet cannot build the container's config (its CreateContainerConfigError
        message, as ``makeEnvironmentVariables`` words it), or "": a Secret or ConfigMap the
        env refers to (``valueFrom``, ``envFrom``) that does not exist and is not optional."""
        ns, refs = pod["metadata"]["namespace"], []
        for e in container.get("env") or []:
            source = e.get("valueFrom") or {}
            refs += [
                ("secret", source.get("secretKeyRef")),
                ("configmap", source.get("configMapKeyRef")),
            ]
        for e in container.get("envFrom") or []:
            refs += [("secret", e.get("secretRef")), ("configmap", e.get("configMapRef"))]
        for kind, ref in refs:
            if (
                ref
                and not ref.get("optional")
                and self.store.find(f"{kind}s", ns, ref["name"]) is None
            ):
                return f'{kind} "{ref["name"]}" not found'
        return ""

    @staticmethod
    def devices_dir(workdir: str) -> str:
        """The host directory standing in for a pod's ``/dev`` (its injected devices)."""
        return os.path.join(workdir, "dev")

    def shm_dir(self, workdir: str) -> str:
        """The host directory standing in for the ``/dev/shm`` of the pod whose directory is
        ``workdir``: it lives through restarts of the pod's container, and the kubelet removes
        it with the pod, as a memory emptyDir."""
        return os.path.join(self.shm_root, os.path.basename(workdir))

    def command_and_env(
        self, pod: Obj, container: Obj, workdir: str = ""
    ) -> tuple[list[str], dict[str, str]]:
        pod_env: dict[str, str] = {}
        for e in container.get("env") or []:
            if "value" not in e and e.get("valueFrom") and "fieldRef" not in e["valueFrom"]:
                continue  # Secret and ConfigMap values: only their presence is modelled
            ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            pod_env[e["name"]] = (
                field_ref(pod, ref) if ref else expand(str(e.get("value", "")), pod_env)
            )
        service = self.service_of(pod_env.get(MASTER_ADDR, ""))
        if service and len(pod_env[MASTER_ADDR].removesuffix(".cluster.local").split(".")) >= 4:
            pod_env[MASTER_PORT] = str(self.service_port(*service))  # <pod-host>.<service>.<ns>.svc
        mounts = claim_mounts(pod, container, self.claim_dir)
        if workdir:  # values naming a device directory point into the pod's own /dev
            mounts[IMEX_CHANNEL_DIR] = os.path.join(
                self.devices_dir(workdir), os.path.basename(IMEX_CHANNEL_DIR)
            )
            # The container's termination message file is the pod's own, named in the env.
            mounts[message_path(container)] = termination_file(workdir)
            pod_env[TERMINATION_PATH_ENV] = message_path(container)
            mounts[SHM] = self.shm_dir(workdir)
            os.makedirs(mounts[SHM], exist_ok=True)
        pod_env = {k: at_host(DNS_RE.sub(self._resolve, v), mounts) for k, v in pod_env.items()}
        if workdir:  # after the rewrite: these name this machine's paths already
            pod_env.update(shm_env(pod, container, mounts[SHM]))
        pod_env["CUDA_VISIBLE_DEVICES"] = self.gpus_for(pod)
        pod_env.setdefault("HOSTNAME", pod["spec"].get("hostname") or pod["metadata"]["name"])
        cmd = [
            at_host(expand(str(a), pod_env), mounts)
            for a in (container.get("command") or []) + (container.get("args") or [])
        ]
        if cmd and re.fullmatch(r"python(3(\.\d+)?)?", os.path.basename(cmd[0])):
            cmd[0] = sys.executable
        if not cmd:
            raise OSError("container has no command (the simulator has no images)")
        return cmd, with_image_env(pod_env, os.environ)

    def service_of(self, name: str) -> tuple[str, str] | None:
        """(namespace, Service) of a ``….<service>.<namespace>.svc`` name when that Service
        exists: cluster DNS has records only for the Services there are."""
        parts = name.removesuffix(".cluster.local").split(".")
        if len(parts) < 3 or parts[-1] != "svc":
            return None
        found = self.store.find("services", parts[-2], parts[-3])
        return (parts[-2], parts[-3]) if found is not None else None

    def _resolve(self, m: re.Match[str]) -> str:
        """A ``.svc`` name as the pod's resolver answers it: this machine for a Service that
        exists; as written otherwise, so that resolving it fails (no such name) as on a cluster."""
        return "127.0.0.1" if self.service_of(m.group(0)) else m.group(0)


def with_image_env(pod_env: dict[str, str], host: Mapping[str, str]) -> dict[str, str]:
    """A container's environment: the image's (``IMAGE_ENV`` and the host's ``HOST_PREFIXES``
    variables), then the pod spec's ``pod_env``, then the host's pinned variables again, so
    that no pod turns NVLink multicast back on where its host keeps it off."""
    image = {k: v for k, v in host.items() if k in IMAGE_ENV or k.startswith(HOST_PREFIXES)}
    pinned = {k: host[k] for k in PINNED if k in host}
    for name in sorted(k for k in pinned if pod_env.get(k, pinned[k]) != pinned[k]):
        log.warning("pod env %s=%s ignored: this host pins %s", name, pod_env[name], pinned[name])
    return {**image, **pod_env, **pinned}


def claim_mounts(pod: Obj, container: Obj, claim_dir: Callable[[str, str], str]) -> dict[str, str]:
    """The container's PVC mount paths -> their claims' host directories (``claim_dir``)."""
    ns = pod["metadata"]["namespace"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if v.get("persistentVolumeClaim")
    }
    return {
        str(m["mountPath"]).rstrip("/"): claim_dir(ns, claims[m["name"]])
        for m in container.get("volumeMounts") or []
        if m.get("name") in claims
    }


def shm_env(pod: Obj, container: Obj, host_dir: str) -> dict[str, str]:
    """What tells the pod's processes that their ``/dev/shm`` is ``host_dir`` and its size: the
    sizeLimit of the memory emptyDir the container mounts there (none: no limit here, half the
    node's memory on a node), else the container runtime's own ``/dev/shm`` of 64 MiB."""
    mounts = container.get("volumeMounts") or []
    names = {m.get("name") for m in mounts if str(m.get("mountPath")).rstrip("/") == SHM}
    found = [v for v in pod["spec"].get("volumes") or [] if v.get("name") in names]
    if not found:
        return {SHM_DIR: host_dir, SHM_SIZE: str(RUNTIME_SHM_BYTES)}
    limit = (found[0].get("emptyDir") or {}).get("sizeLimit")
    if limit is None:
        return {SHM_DIR: host_dir}
    from kubernetes.utils import parse_quantity

    return {SHM_DIR: host_dir, SHM_SIZE: str(int(parse_quantity(limit)))}


def message_path(container: Obj) -> str:
    """The container's ``terminationMessagePath`` (the API server defaults it)."""
    return str(container.get("terminationMessagePath") or TERMINATION_PATH)


def termination_file(workdir: str) -> str:
    """Where a pod's termination message file is on this machine."""
    return os.path.join(workdir, "termination-log")


def at_host(value: str, mounts: dict[str, str]) -> str:
    """A value naming a path under a PVC mount (alone or after ``=``), moved to the claim's
    host directory: processes share this machine's filesystem, not the pod's."""
    for mount in sorted(mounts, key=len, reverse=True):
        host = mounts[mount].replace("\\", "\\\\")
        value = re.sub(rf"(^|=){re.escape(mount)}(?=/|$)", rf"\g<1>{host}", value)
    return value
