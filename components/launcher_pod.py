"""The launcher pod: the settings every step's pod carries, on KFP and on Argo alike (small,
non-root, unprivileged: it only talks to the API server). Imports neither kfp nor hera.

kfp-kubernetes 2.17 sets only ``runAsUser``, ``runAsGroup`` and ``runAsNonRoot``, so the
container hardening and the ``/tmp`` volume apply to the Argo pods only.
"""

from __future__ import annotations

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


def labels(step: str) -> dict[str, str]:
    """The launcher pod's labels: the suite's part-of label and its step."""
    return {LABEL_PART_OF: PART_OF, STEP_LABEL: step}


# The pod's and the container's securityContext, the container's resources (Kubernetes names).
POD_SECURITY_CONTEXT = {
    "runAsNonRoot": RUN_AS_NON_ROOT,
    "runAsUser": UID,
    "runAsGroup": GID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
RESOURCES = {
    "requests": {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST},
    "limits": {"memory": MEMORY_LIMIT},
}
