"""The validating admission plugins of the simulated API server that refuse pods (PodSecurity,
webhooks, ResourceQuota)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from mnnvl.sim.api.model import ApiError, Obj
from mnnvl.sim.api.resources import DEFAULT_SERVICE_ACCOUNT
from mnnvl.sim.api.store import Store
from mnnvl.sim.policy.podsecurity import violation


@dataclass(frozen=True)
class Denial:
    """A validating webhook (for tests) that refuses pods of one Job, or every pod."""

    webhook: str
    message: str
    job: str | None


class PodAdmission:
    """The validating admission plugins that can refuse a pod, in kube-apiserver's order:
    PodSecurity (the namespace's ``enforce`` label), validating webhooks (``deny``), then
    ResourceQuota, which runs last. A refusal is the 403 a real API server answers, to a
    client's create and to the Job controller's alike (which turns it into a FailedCreate
    Event on the Job)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._denials: list[Denial] = []
        self._lock = threading.Lock()

    def deny(self, webhook: str, message: str, job: str | None = None) -> None:
        """Make webhook ``webhook`` refuse pods (of Job ``job``, or all) with ``message``."""
        with self._lock:
            self._denials.append(Denial(webhook, message, job))

    def clear_denials(self) -> None:
        with self._lock:
            self._denials.clear()

    def admit(self, resource: str, pod: Obj) -> None:
        """Raise the API's refusal of a new pod, or return when every plugin admits it."""
        if resource != "pods":
            return
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        name = meta.get("name") or meta.get("generateName") or "Unknown"
        namespace = self.store.find("namespaces", "", ns)
        if namespace is None or namespace["metadata"].get("deletionTimestamp"):
            return  # NamespaceLifecycle, which runs first, refuses it (the store's create)
        self._service_account(ns, name, pod)
        if found := violation(namespace, pod):
            raise forbidden(name, found)
        job = (meta.get("labels") or {}).get("job-name")
        with self._lock:
            denial = next((d for d in self._denials if d.job in (None, job)), None)
        if denial is not None:
            # A webhook's refusal carries no 'pods "x" is forbidden' prefix (webhook errors'
            # ToStatusErr); the code defaults to 403.
            message = f'admission webhook "{denial.webhook}" denied the request: {denial.message}'
            raise ApiError(403, "", message, {"name": name, "kind": "pods"})
        self._quota(ns, name, pod)

    def _service_account(self, ns: str, name: str, pod: Obj) -> None:
        """The ServiceAccount plugin (a mutating one, so it runs before the validating plugins):
        an unset ``serviceAccountName`` becomes ``default``, and the account must exist
        (plugin/pkg/admission/serviceaccount, ``Admit``)."""
        spec = pod.setdefault("spec", {})
        account = spec.setdefault("serviceAccountName", DEFAULT_SERVICE_ACCOUNT)
        if self.store.find("serviceaccounts", ns, account) is None:
            raise forbidden(
                name,
                f"error looking up service account {ns}/{account}: "
                f'serviceaccount "{account}" not found',
            )

    def _quota(self, ns: str, name: str, pod: Obj) -> None:
        quotas = self.store.list("resourcequotas", ns)[0]  # sorted by name, as the API lists
        if not quotas:
            return
        delta = _pod_usage(pod)
        used: Counter[str] = Counter()
        for other in self.store.list("pods", ns)[0]:
            # Terminal pods no longer count (QuotaV1Pod); terminating ones still do.
            if (other.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used.update(_pod_usage(other))
        for quota in quotas:
            hard = {
                k: q
                for k, v in ((quota.get("spec") or {}).get("hard") or {}).items()
                if (q := _quantity(v)) is not None
            }
            exceeded = sorted(k for k in hard if k in delta and used[k] + delta[k] > hard[k])
            if exceeded:
                raise forbidden(
                    name,
                    f"exceeded quota: {quota['metadata']['name']}, "
                    f"requested: {_pretty(delta, exceeded)}, used: {_pretty(used, exceeded)}, "
                    f"limited: {_pretty(hard, exceeded)}",
                )


def _pod_usage(pod: Obj) -> Counter[str]:
    """What a pod charges to a quota: ``pods`` and ``count/pods``, and its integer requests
    and limits (``requests.nvidia.com/gpu``; an extended resource's request defaults to its
    limit)."""
    usage = Counter({"pods": 1, "count/pods": 1})
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for resource in {*limits, *requests}:
            for kind, amount in (
                ("requests", requests.get(resource, limits.get(resource))),
                ("limits", limits.get(resource)),
            ):
                value = _quantity(amount)
                if value is not None:
                    usage[f"{kind}.{resource}"] += value
    return usage


def _quantity(value: object) -> int | None:
    """A whole-number quantity ("2", "1Gi"); None for a fraction (CPU: not modelled)."""
    from kubernetes.utils import parse_quantity

    try:
        number = parse_quantity(value)
    except (ValueError, TypeError):
        return None
    return int(number) if number == int(number) else None


def _pretty(usage: dict[str, int], keys: list[str]) -> str:
    return ",".join(f"{k}={usage.get(k, 0)}" for k in keys)


def forbidden(name: str, reason: str) -> ApiError:
    """``pods "<name>" is forbidden: <reason>`` (admission.NewForbidden)."""
    return ApiError(
        403, "Forbidden", f'pods "{name}" is forbidden: {reason}', {"name": name, "kind": "pods"}
    )
