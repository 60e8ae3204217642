"""Container environment rules of the simulated kubelet: $(VAR) expansion, fieldRefs, GPUs,
PersistentVolumeClaim mount paths."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable

from mnnvl.sim.model import Obj

log = logging.getLogger(__name__)
DNS_RE = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.svc\.cluster\.local")
VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: unknown variables stay as written, ``$$`` -> ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return VAR_RE.sub(sub, text)


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


def at_host(value: str, mounts: dict[str, str]) -> str:
    """A value naming a path under a PVC mount (alone or after ``=``), moved to the claim's
    host directory: processes share this machine's filesystem, not the pod's."""
    for mount in sorted(mounts, key=len, reverse=True):
        host = mounts[mount].replace("\\", "\\\\")
        value = re.sub(rf"(^|=){re.escape(mount)}(?=/|$)", rf"\g<1>{host}", value)
    return value
