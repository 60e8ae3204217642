"""The one retry helper: what it retries, how long it waits, what it maps errors to."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mnnvl.driver import api as api_module
from mnnvl.driver.api import MAX_ATTEMPTS, Api
from mnnvl.driver.errors import AlreadyExists, ApiError, ClusterUnavailable, NotFound


@pytest.fixture
def api(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(api_module.time, "sleep", slept.append)
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"
    instance = Api(client.ApiClient(configuration=cfg))
    instance.slept = slept  # type: ignore[attr-defined]
    return instance


def failing(statuses: list[int], headers: dict[str, str] | None = None):
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if statuses:
            e = ApiException(status=statuses.pop(0), reason="x")
            e.headers = headers or {}
            e.body = None
            raise e
        return "ok"

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def test_transient_statuses_are_retried_honouring_retry_after(api):
    fn = failing([429, 503], headers={"Retry-After": "2"})
    assert api.call(fn, what="jobs default/x", verb="create") == "ok"
    assert fn.calls["n"] == 3
    assert api.slept == [2.0, 2.0]


def test_backoff_is_jittered_and_bounded(api):
    fn = failing([500] * MAX_ATTEMPTS)
    with pytest.raises(ClusterUnavailable, match="kept answering 500"):
        api.call(fn, what="jobs default/x", verb="create")
    assert fn.calls["n"] == MAX_ATTEMPTS
    assert len(api.slept) == MAX_ATTEMPTS - 1
    assert all(0 < s <= api_module.BACKOFF_MAX_S for s in api.slept)


@pytest.mark.parametrize(
    ("status", "error"), [(404, NotFound), (409, AlreadyExists), (422, ApiError), (400, ApiError)]
)
def test_non_transient_statuses_are_not_retried(api, status, error):
    fn = failing([status])
    with pytest.raises(error):
        api.call(fn, what="jobs default/x", verb="create")
    assert fn.calls["n"] == 1 and api.slept == []


def test_forbidden_names_verb_resource_and_rbac(api):
    with pytest.raises(ClusterUnavailable) as info:
        api.call(failing([403]), what="computedomains default/x", verb="delete")
    assert "delete computedomains default/x" in str(info.value)
    assert "rbac.yaml" in str(info.value)


def test_connection_refused_is_cluster_unavailable_after_retries(api):
    from mnnvl.driver.api import JOB

    with pytest.raises(ClusterUnavailable, match="cannot reach the Kubernetes API"):
        api.list(JOB, "default")
    assert len(api.slept) == MAX_ATTEMPTS - 1
