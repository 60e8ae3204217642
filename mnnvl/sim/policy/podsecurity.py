"""Pod Security admission of the simulated API server (the ``enforce`` namespace label).

The checks that concern the pods this project creates, with the wording, order and
aggregation of the upstream ``k8s.io/pod-security-admission`` library (``policy/check_*.go``,
``policy/checks.go``, ``policy/registry.go``): baseline checks first, then restricted ones,
each group sorted by check ID; the restricted level replaces the baseline capability check
with its own. A refusal reads ``violates PodSecurity "restricted:latest": reason (detail), …``.
Not modelled: hostPorts, AppArmor, SELinux, sysctls, procMount, Windows and user-namespace
(``hostUsers: false``) relaxations, the ``audit``/``warn`` modes and exemptions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from mnnvl.sim.api.model import Obj

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
# Capabilities the baseline level lets a container add (check_capabilities_baseline.go).
BASELINE_CAPABILITIES = frozenset(
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
)
# Volume types the restricted level allows (check_restrictedVolumes.go).
ALLOWED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
Check = Callable[[Obj], tuple[str, str] | None]


def _containers(spec: Obj) -> Iterator[Obj]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(obj: Obj) -> dict[str, Any]:
    return obj.get("securityContext") or {}


def _quote(items: list[str]) -> str:
    return '"' + '", "'.join(items) + '"'


def _who(noun: str, items: list[str]) -> str:
    """``container "a"`` or ``containers "a", "b"``."""
    return f"{noun if len(items) == 1 else noun + 's'} {_quote(items)}"


def _containers_that(spec: Obj, bad: Callable[[dict[str, Any]], bool]) -> list[str]:
    return [c.get("name", "") for c in _containers(spec) if bad(_sc(c))]


def _adding(spec: Obj, allowed: frozenset[str]) -> str:
    """Which containers add capabilities outside ``allowed``, and which ones ("" if none)."""
    bad, extra = [], set()
    for c in _containers(spec):
        added = set((_sc(c).get("capabilities") or {}).get("add") or []) - allowed
        if added:
            bad.append(c.get("name", ""))
            extra |= added
    if not bad:
        return ""
    return (
        f"{_who('container', bad)} must not include {_quote(sorted(extra))} in "
        "securityContext.capabilities.add"
    )


def _capabilities_baseline(spec: Obj) -> tuple[str, str] | None:
    detail = _adding(spec, BASELINE_CAPABILITIES)
    return ("non-default capabilities", detail) if detail else None


def _host_namespaces(spec: Obj) -> tuple[str, str] | None:
    used = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    return ("host namespaces", ", ".join(used)) if used else None


def _host_path_volumes(spec: Obj) -> tuple[str, str] | None:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    return ("hostPath volumes", _who("volume", bad)) if bad else None


def _privileged(spec: Obj) -> tuple[str, str] | None:
    bad = _containers_that(spec, lambda sc: sc.get("privileged") is True)
    detail = f"{_who('container', bad)} must not set securityContext.privileged=true"
    return ("privileged", detail) if bad else None


def _allow_privilege_escalation(spec: Obj) -> tuple[str, str] | None:
    bad = _containers_that(spec, lambda sc: sc.get("allowPrivilegeEscalation") is not False)
    detail = f"{_who('container', bad)} must set securityContext.allowPrivilegeEscalation=false"
    return ("allowPrivilegeEscalation != false", detail) if bad else None


def _capabilities_restricted(spec: Obj) -> tuple[str, str] | None:
    missing = _containers_that(
        spec, lambda sc: "ALL" not in ((sc.get("capabilities") or {}).get("drop") or [])
    )
    details = []
    if missing:
        details.append(
            f'{_who("container", missing)} must set securityContext.capabilities.drop=["ALL"]'
        )
    if adding := _adding(spec, frozenset(["NET_BIND_SERVICE"])):
        details.append(adding)
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec: Obj) -> tuple[str, str] | None:
    bad, kinds = [], set()
    for v in spec.get("volumes") or []:
        if not any(k in v for k in ALLOWED_VOLUMES):
            bad.append(v.get("name", ""))
            kinds.add("hostPath" if "hostPath" in v else "unknown")
    if not bad:
        return None
    uses = "uses" if len(bad) == 1 else "use"
    detail = f"{_who('volume', bad)} {uses} {_who('restricted volume type', sorted(kinds))}"
    return "restricted volume types", detail


def _explicit_or_implicit(spec: Obj, field: str, ok: Callable[[Any], bool]) -> tuple[str, str]:
    """Who sets ``field`` to a bad value (``pod and container "a"``), and who leaves it unset
    without a good pod-level value (``pod or container "b"``); "" for nobody."""
    pod_value = _sc(spec).get(field)
    pod_ok = pod_value is not None and ok(pod_value)
    setters = ["pod"] if pod_value is not None and not pod_ok else []
    explicit, implicit = [], []
    for c in _containers(spec):
        value = _sc(c).get(field)
        if value is not None and not ok(value):
            explicit.append(c.get("name", ""))
        elif value is None and not pod_ok:
            implicit.append(c.get("name", ""))
    if explicit:
        setters.append(_who("container", explicit))
    return " and ".join(setters), f"pod or {_who('container', implicit)}" if implicit else ""


def _run_as_non_root(spec: Obj) -> tuple[str, str] | None:
    setters, unset = _explicit_or_implicit(spec, "runAsNonRoot", lambda v: v is True)
    if setters:
        return "runAsNonRoot != true", f"{setters} must not set securityContext.runAsNonRoot=false"
    if unset:
        return "runAsNonRoot != true", f"{unset} must set securityContext.runAsNonRoot=true"
    return None


def _run_as_user(spec: Obj) -> tuple[str, str] | None:
    setters, _ = _explicit_or_implicit(spec, "runAsUser", lambda v: v != 0)
    return ("runAsUser=0", f"{setters} must not set runAsUser=0") if setters else None


def _seccomp_restricted(spec: Obj) -> tuple[str, str] | None:
    def ok(profile: Any) -> bool:
        return (profile or {}).get("type") in ("RuntimeDefault", "Localhost")

    setters, unset = _explicit_or_implicit(spec, "seccompProfile", ok)
    field = "securityContext.seccompProfile.type"
    if setters:
        profiles = (_sc(o).get("seccompProfile") for o in [spec, *_containers(spec)])
        values = sorted({str(p.get("type")) for p in profiles if p is not None and not ok(p)})
        return "seccompProfile", f"{setters} must not set {field} to {_quote(values)}"
    if unset:
        return "seccompProfile", f'{unset} must set {field} to "RuntimeDefault" or "Localhost"'
    return None


# In upstream order: baseline IDs sorted, then restricted IDs sorted.
BASELINE: tuple[Check, ...] = (
    _capabilities_baseline,
    _host_namespaces,
    _host_path_volumes,
    _privileged,
)
RESTRICTED: tuple[Check, ...] = (
    _host_namespaces,
    _host_path_volumes,
    _privileged,
    _allow_privilege_escalation,
    _capabilities_restricted,
    _restricted_volumes,
    _run_as_non_root,
    _run_as_user,
    _seccomp_restricted,
)
CHECKS = {"privileged": (), "baseline": BASELINE, "restricted": RESTRICTED}


def violation(namespace: Obj, pod: Obj) -> str | None:
    """``violates PodSecurity "<level>:<version>": …`` when the namespace's ``enforce`` level
    refuses the pod, else None (no label, ``privileged``, or the pod passes)."""
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    if level not in CHECKS:
        level = "restricted"  # an unparsable label fails closed, as upstream does
    spec = pod.get("spec") or {}
    failed = [found for check in CHECKS[level] if (found := check(spec)) is not None]
    if not failed:
        return None
    version = labels.get(ENFORCE_VERSION_LABEL, "latest")
    details = ", ".join(f"{reason} ({detail})" for reason, detail in failed)
    return f'violates PodSecurity "{level}:{version}": {details}'
