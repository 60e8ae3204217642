"""Who sends a request, and whether RBAC lets them: kube-apiserver's bearer-token
authentication and RBAC authorizer, for the objects the simulated cluster stores.

Tokens are issued by the cluster (``Authenticator.issue``): one for an administrator (group
``system:masters``, which kube-apiserver lets do anything) and one per service account the
kubeconfigs name. A request with an unknown token is 401; a request RBAC does not allow is the
real 403 Status. The rules are evaluated as upstream's ``plugin/pkg/auth/authorizer/rbac``
does: ClusterRoleBindings, then the RoleBindings of the request's namespace; a rule matches on
verb, API group, resource (``resource/subresource``, ``*``, ``*/subresource``) and, when it lists
any, resourceNames. Discovery and health paths are open to every authenticated user, which is
what the bootstrap ``system:discovery`` and ``system:public-info-viewer`` bindings grant.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from mnnvl.contract import rbac
from mnnvl.sim.api.model import ApiError, Obj, resolve_kind
from mnnvl.sim.api.store import Store

MASTERS = "system:masters"
ADMIN = "mnnvl-sim-admin"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]


def service_account_user(namespace: str, name: str) -> User:
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


ADMIN_USER = User(ADMIN, (MASTERS, "system:authenticated"))
ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


class Authenticator:
    """Bearer tokens the cluster issued, and the user each one stands for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[str, User] = {}

    def issue(self, user: User) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._users[token] = user
        return token

    def user(self, authorization: str | None) -> User:
        """The user of an ``Authorization: Bearer`` header, ``system:anonymous`` without one
        (kube-apiserver's default ``--anonymous-auth``); 401 for a token it never issued."""
        if not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        with self._lock:
            user = self._users.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user


@dataclass(frozen=True)
class Request:
    verb: str  # RBAC verb: get list watch create update patch delete deletecollection
    group: str
    resource: str
    sub: str
    namespace: str
    name: str


def _applies(subject: Obj, user: User, binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user.name == f"system:serviceaccount:{ns}:{name}"
    return False


def _rule_allows(rule: Obj, req: Request) -> bool:
    if not {req.verb, "*"} & set(rule.get("verbs") or ()):
        return False
    if not {req.group, "*"} & set(rule.get("apiGroups") or ()):
        return False
    combined = f"{req.resource}/{req.sub}" if req.sub else req.resource
    wanted = {"*", combined} | ({f"*/{req.sub}"} if req.sub else set())
    if not wanted & set(rule.get("resources") or ()):
        return False
    names = rule.get("resourceNames") or ()
    return not names or req.name in names


def bound_rules(store: Store, user: User, namespace: str) -> Iterator[Obj]:
    """The rules of every ClusterRoleBinding and (in ``namespace``) RoleBinding naming the
    user, as ``RulesFor`` in kubernetes' ``pkg/registry/rbac/validation/rule.go`` collects
    them; everything for ``system:masters``."""
    if MASTERS in user.groups:
        yield {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
        return
    scopes = [("clusterrolebindings", "")] + ([("rolebindings", namespace)] if namespace else [])
    for plural, ns in scopes:
        for binding in store.list(plural, ns or None)[0]:
            if not any(_applies(s, user, ns) for s in binding.get("subjects") or ()):
                continue
            ref = binding.get("roleRef") or {}
            role_ns = ns if ref.get("kind") == "Role" else ""
            role = store.find("roles" if role_ns else "clusterroles", role_ns, ref.get("name", ""))
            yield from (role or {}).get("rules") or ()


def allowed(store: Store, user: User, req: Request) -> bool:
    return any(_rule_allows(r, req) for r in bound_rules(store, user, req.namespace))


def rules_review(store: Store, user: User, namespace: str) -> Obj:
    """The ``SelfSubjectRulesReview`` kube-apiserver answers any authenticated user."""
    rules = list(bound_rules(store, user, namespace))
    review = [
        {k: r[k] for k in ("verbs", "apiGroups", "resources", "resourceNames") if k in r}
        for r in rules
    ]
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
        "status": {"resourceRules": review, "nonResourceRules": [], "incomplete": False},
    }


def forbidden(user: User, req: Request) -> ApiError:
    """The 403 kube-apiserver answers (``responsewriters.Forbidden`` and ``NewForbidden``)."""
    resource = f"{req.resource}/{req.sub}" if req.sub else req.resource
    where = f'in the namespace "{req.namespace}"' if req.namespace else "at the cluster scope"
    why = (
        f'User "{user.name}" cannot {req.verb} resource "{resource}" in API group '
        f'"{req.group}" {where}'
    )
    qualified = f"{req.resource}.{req.group}" if req.group else req.resource
    named = f'{qualified} "{req.name}"' if req.name else qualified
    details = {"name": req.name, "group": req.group, "kind": req.resource}
    return ApiError(403, "Forbidden", f"{named} is forbidden: {why}", details)


def grant_runner(store: Store, ns: str, home: str, *, kueue: bool) -> None:
    """``kubectl apply -k manifests/base -n <ns>`` (plus the Kueue overlay's reader with
    Kueue), and in namespaces other than ``home`` a RoleBinding for ``home``'s runner account,
    as a platform team grants one launcher several team namespaces."""
    objects = rbac.runner_objects() + (rbac.kueue_reader_objects() if kueue else [])
    if ns != home:
        objects.append(
            {
                "kind": "RoleBinding",
                "metadata": {"name": f"{rbac.RUNNER}-{home}"},
                "roleRef": {"kind": "Role", "name": rbac.RUNNER},
                "subjects": [{"kind": "ServiceAccount", "name": rbac.RUNNER, "namespace": home}],
            }
        )
    for obj in objects:
        obj["metadata"]["namespace"] = ns
        store.create(resolve_kind(obj["kind"]), obj)


def grant_cluster_reader(store: Store, namespace: str) -> None:
    """``kubectl apply -k manifests/overlays/cluster-reader`` for ``namespace``'s runner."""
    for obj in rbac.cluster_reader_objects(namespace):
        store.create(resolve_kind(obj["kind"]), obj)


def grant_trainer(store: Store, namespace: str) -> None:
    """``kubectl apply -n <namespace> -k manifests/overlays/trainer`` for ``namespace``'s runner."""
    for obj in rbac.trainer_objects(namespace):
        obj["metadata"]["namespace"] = namespace
        store.create(resolve_kind(obj["kind"]), obj)
