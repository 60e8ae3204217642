"""The one retry helper: what it retries, how long it waits, what it maps errors to."""

from __future__ import annotations

import types

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mnnvl.driver import api as api_module
from mnnvl.driver import retry
from mnnvl.driver.api import MAX_ATTEMPTS, Api, RetryPolicy
from mnnvl.errors import AlreadyExists, ApiError, ClusterUnavailable, NotFound

# The kubernetes client's own code paths: make test-client-newest runs them with its newest.
pytestmark = pytest.mark.client


def make_api(monkeypatch, outage_s: float) -> Api:
    """An Api whose sleeps only advance a fake clock (recorded in ``api.slept``)."""
    slept: list[float] = []
    now = [1000.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    # The driver's modules only: another thread of this process keeps the real clock.
    fake = types.SimpleNamespace(sleep=sleep, monotonic=lambda: now[0])
    monkeypatch.setattr(api_module, "time", fake)
    monkeypatch.setattr(retry, "time", fake)
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"
    instance = Api(client.ApiClient(configuration=cfg), RetryPolicy(outage_s=outage_s))
    instance.slept = slept  # type: ignore[attr-defined]
    return instance


@pytest.fixture
def api(monkeypatch):
    """No outage tolerance: only the quick retries."""
    return make_api(monkeypatch, outage_s=0)


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
    assert all(0 < s <= retry.BACKOFF_MAX_S for s in api.slept)


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


def test_an_outage_within_the_tolerance_is_ridden_out_with_progress_lines(monkeypatch, caplog):
    api = make_api(monkeypatch, outage_s=60)
    fn = failing([503] * 20)  # 20 answers of 503 over about 30-50 s of backoff
    with caplog.at_level("INFO", logger="mnnvl.driver"):
        assert api.call(fn, what="jobs default/x", verb="get") == "ok"
    lines = [r.getMessage() for r in caplog.records if "API unreachable for" in r.getMessage()]
    assert lines and all("(tolerating up to 60 s)" in line for line in lines)
    assert all(s <= retry.BACKOFF_MAX_S for s in api.slept)
    # a line at least every 15 s of the outage
    assert len(lines) >= int(sum(api.slept) // retry.OUTAGE_REPORT_EVERY_S) - 1


def test_an_outage_longer_than_the_tolerance_is_exit_5_saying_how_long(monkeypatch):
    api = make_api(monkeypatch, outage_s=30)
    with pytest.raises(ClusterUnavailable) as info:
        api.call(failing([503] * 1000), what="jobs default/x", verb="get")
    assert info.value.exit_code == 5
    assert "longer than --api-outage-s 30 tolerates" in str(info.value)
    assert "503" in str(info.value) and "check the API server" in str(info.value)
    assert 29.9 <= sum(api.slept) <= 30 + retry.BACKOFF_MAX_S


def test_auth_errors_on_a_healthy_connection_are_never_retried_even_with_a_tolerance(monkeypatch):
    api = make_api(monkeypatch, outage_s=300)
    for status in (401, 403):
        with pytest.raises(ClusterUnavailable, match="refused"):
            api.call(failing([status]), what="jobs default/x", verb="get")
    assert api.slept == []


def test_auth_errors_right_after_an_outage_are_part_of_it(monkeypatch, caplog):
    """A restarted API server refuses requests until its RBAC caches have synced."""
    api = make_api(monkeypatch, outage_s=300)
    fn = failing([503, 503, 401, 403, 403])
    with caplog.at_level("INFO", logger="mnnvl.driver"):
        assert api.call(fn, what="jobs default/x", verb="get") == "ok"
    assert fn.calls["n"] == 6
    assert any("get jobs default/x answered 401" in m for m in caplog.messages)


def test_auth_errors_after_an_outage_are_fatal_past_their_bound(monkeypatch):
    api = make_api(monkeypatch, outage_s=300)
    with pytest.raises(ClusterUnavailable) as info:
        api.call(failing([503] + [403] * 1000), what="jobs default/x", verb="watch")
    assert info.value.exit_code == 5
    assert str(info.value).startswith("watch jobs default/x was refused (403")
    refusing_s = sum(api.slept[1:])  # from the first refusal
    assert retry.REFUSED_AFTER_OUTAGE_S <= refusing_s <= retry.REFUSED_AFTER_OUTAGE_S + 5


def test_auth_errors_after_an_outage_are_never_retried_past_the_outage_tolerance(monkeypatch):
    api = make_api(monkeypatch, outage_s=2)
    with pytest.raises(ClusterUnavailable) as info:
        api.call(failing([503] + [403] * 1000), what="jobs default/x", verb="get")
    assert "was refused (403" in str(info.value)
    assert "longer than --api-outage-s 2 tolerates" in str(info.value)
    assert sum(api.slept) < 2 + retry.BACKOFF_MAX_S


def test_an_auth_error_once_the_api_answered_again_is_fatal(monkeypatch):
    api = make_api(monkeypatch, outage_s=300)
    assert api.call(failing([503, 503]), what="jobs default/x", verb="get") == "ok"
    slept = len(api.slept)
    with pytest.raises(ClusterUnavailable, match="refused"):
        api.call(failing([403]), what="jobs default/x", verb="get")
    assert len(api.slept) == slept


def test_connection_refused_is_cluster_unavailable_after_retries(api):
    from mnnvl.driver.api import JOB

    with pytest.raises(ClusterUnavailable, match="cannot reach the Kubernetes API"):
        api.list(JOB, "default")
    assert len(api.slept) == MAX_ATTEMPTS - 1
