"""The launcher pod: the settings every step's pod carries, on KFP and on Argo alike (small,
non-root, unprivileged: it only talks to the API server). Imports neither kfp nor hera.

kfp-kubernetes 2.17 sets only ``runAsUser``, ``runAsGroup`` and ``runAsNonRoot``, so the
container hardening and the ``/tmp`` volume apply to the Argo pods only.
"""

from __future__ import annotations

from typing import Any

from mnnvl.inputs.names import LABEL_PART_OF, PART_OF

UID = 65532  # the launcher image's USER (images/launcher.Dockerfile)
GID = 65532
RUN_AS_NON_ROOT = True
# The launcher mostly waits on the API server, so it asks for little.
CPU_REQUEST = "100m"
MEMORY_REQUEST = "256Mi"
MEMORY_LIMIT = "1Gi"
SERVICE_ACCOUNT = "mnnvl-runner"  # manifests/base/rbac.yaml
STEP_LABEL = "mnnvl.io/step"
# With a read-only root file system, /tmp is where the result file and matplotlib's cache go.
TMP_VOLUME = "tmp"
TMP_PATH = "/tmp"
TMP_SIZE_LIMIT = "256Mi"
SECCOMP_PROFILE = "RuntimeDefault"


def labels(step: str) -> dict[str, str]:
    """The launcher pod's labels: the suite's part-of label and its step."""
    return {LABEL_PART_OF: PART_OF, STEP_LABEL: step}


def pod_security_context() -> dict[str, Any]:
    """The pod-level securityContext (Kubernetes field names)."""
    return {
        "runAsNonRoot": RUN_AS_NON_ROOT,
        "runAsUser": UID,
        "runAsGroup": GID,
        "seccompProfile": {"type": SECCOMP_PROFILE},
    }


def container_security_context() -> dict[str, Any]:
    """The container-level securityContext (Kubernetes field names)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def resources() -> dict[str, Any]:
    """The container's requests and limits (Kubernetes field names)."""
    return {
        "requests": {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST},
        "limits": {"memory": MEMORY_LIMIT},
    }
