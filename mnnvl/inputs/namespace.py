"""The namespace a step works in when none is given: the pod's own, else ``default``; resolved
at the edges (CLI, KFP bodies), never while a spec is built.
"""

from __future__ import annotations

import os

SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
FALLBACK_NAMESPACE = "default"
POD_NAMESPACE_ENV = "POD_NAMESPACE"


def pod_namespace() -> str:
    """This pod's namespace ("" outside a pod): ``POD_NAMESPACE`` (downward API), else the
    service account's namespace file, read locally (an account may not GET namespaces)."""
    if os.environ.get(POD_NAMESPACE_ENV):
        return os.environ[POD_NAMESPACE_ENV].strip()
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def resolve_namespace(value: str | None) -> str:
    """``value``, or when it is empty the pod's own namespace, else ``default``."""
    return value or pod_namespace() or FALLBACK_NAMESPACE
