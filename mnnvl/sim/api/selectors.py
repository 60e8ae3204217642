"""Label and field selectors, JSON merge patch and JSON patch, as the API server applies them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mnnvl.sim.api.store import ApiError, Obj, clone

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses (``a in (x,y)``)."""
    return [t.strip() for t in re.split(r",(?![^(]*\))", text) if t.strip()]


Labels = dict[str, str]


def _label_check(term: str) -> Callable[[Labels], bool]:
    m = _SET_RE.match(term)
    if m:
        key, vals = m.group(1), {v.strip() for v in m.group(3).split(",")}
        positive = m.group(2) == "in"
        return lambda lb: (lb.get(key) in vals) == positive
    if "!=" in term:
        key, val = (x.strip() for x in term.split("!=", 1))
        return lambda lb: lb.get(key) != val
    if "=" in term:
        key, val = (x.strip() for x in term.replace("==", "=").split("=", 1))
        return lambda lb: lb.get(key) == val
    if term.startswith("!"):
        absent = term[1:].strip()
        return lambda lb: absent not in lb
    if re.fullmatch(r"[A-Za-z0-9./_-]+", term):
        return lambda lb: term in lb
    raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")


def label_matcher(selector: str | None) -> Callable[[Labels], bool]:
    """Parse ``a=b,c!=d,e in (x,y),f notin (z),g,!h`` into a predicate over a label dict."""
    checks = [_label_check(t) for t in _split_terms(selector or "")]
    return lambda labels: all(c(labels) for c in checks)


def _field(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


# Field selectors a real API server accepts per resource (besides metadata.name and, for
# namespaced kinds, metadata.namespace); each reads the object path of its name, except those
# in FIELD_PATHS.
FIELD_LABELS: dict[str, set[str]] = {
    "pods": {f"spec.{k}" for k in ("nodeName", "restartPolicy", "schedulerName", "hostNetwork")}
    | {"spec.serviceAccountName", "status.phase", "status.podIP", "status.nominatedNodeName"},
    "events": {
        f"involvedObject.{k}"
        for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    }
    | {"reason", "reportingComponent", "source", "type"},
    "nodes": {"spec.unschedulable"},
    "namespaces": {"status.phase"},
    "services": {"spec.clusterIP", "spec.type"},
    "jobs": {"status.successful"},
}
FIELD_PATHS = {"source": "source.component", "status.successful": "status.succeeded"}


def field_matcher(selector: str | None, resource: str | None = None) -> Callable[[Obj], bool]:
    """``metadata.name=x,status.phase!=Running`` (= / == / !=). With ``resource``, only the
    field labels the real API server supports for it; others are a 400."""
    checks = [_field_check(t, resource) for t in _split_terms(selector or "")]
    return lambda obj: all(c(obj) for c in checks)


def _field_check(term: str, resource: str | None) -> Callable[[Obj], bool]:
    neg = "!=" in term
    path, sep, val = term.replace("!=", "=").replace("==", "=").partition("=")
    if not sep:
        raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
    p, v = path.strip(), val.strip()
    if resource is not None:
        if p not in {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(resource, set()):
            raise ApiError(400, "BadRequest", f"field label not supported: {p}")
        p = FIELD_PATHS.get(p, p)
    if p == "spec.hostNetwork" or p == "spec.unschedulable":
        return lambda o: ((_field(o, p).lower() == "true") == (v == "true")) != neg
    return lambda o: (_field(o, p) == v) != neg


def object_matcher(
    label_selector: str | None, field_selector: str | None, resource: str | None = None
) -> Callable[[Obj], bool]:
    lm, fm = label_matcher(label_selector), field_matcher(field_selector, resource)
    return lambda o: lm(o.get("metadata", {}).get("labels") or {}) and fm(o)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic merge patches: lists replace)."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    """core/v1 ``Toleration.ToleratesTaint``: empty effect or key (with Exists) match any."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if t.get("key") and t["key"] != taint.get("key"):
            continue
        if not t.get("key") and op != "Exists":
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
