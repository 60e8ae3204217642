"""Shared fixtures: where the upstream schemas live.

The schemas (NVIDIA DRA driver CRDs, Argo Workflows JSON schema) are read from
``MNNVL_SCHEMA_DIR``, else from ``./schemas``; ``make schemas`` (``scripts/fetch-schemas.sh``)
fetches them from the upstream repositories, and ``make test`` does so when they are absent.

``make test`` spreads the tests over pytest-xdist workers (``--dist loadscope``, with the
scheduler made here): a module runs on one worker, so its module fixtures (a costly shared
run, a built wheel) are set up once, except the modules in ``SPREAD`` (long tests whose module
fixtures are cheap, such as a simulated cluster), whose tests are scheduled one by one, so
that no worker is left with one long module while the others idle. The work units (a module,
or a test of a ``SPREAD`` module) start longest first, by the seconds their ``slow`` marks
estimate (``pytest.mark.slow(120)``: about 120 s in ``make test`` on a 2-core machine; a
bare ``slow``: ``SLOW_S``), then those without a slow test, the most tests first.

The simulated scheduler breaks ties and orders its queue from a seed: one per session, from
``MNNVL_SIM_SEED`` or drawn here, shown in the report header and beside every failure, so a
placement race a test ran into can be replayed with ``MNNVL_SIM_SEED=<seed>``.

``clock``: fake monotonic seconds for what takes a clock (``Grace``, ``Deadline``); they move
only when the test calls ``clock.sleep``.
"""

from __future__ import annotations

import os
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def find_schema_dir() -> Path:
    configured = os.environ.get("MNNVL_SCHEMA_DIR")
    candidates = [Path(configured)] if configured else []
    candidates.append(REPO_ROOT / "schemas")
    for path in candidates:
        if (path / "nvidia-dra-driver" / "crds").is_dir():
            return path
    raise FileNotFoundError(
        "upstream schemas not found: run `make schemas` or set MNNVL_SCHEMA_DIR "
        "(README, 'Schemas used by the tests')"
    )


@pytest.fixture(scope="session")
def schema_dir() -> Path:
    return find_schema_dir()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# Modules of long tests on a cheap cluster each: their tests are scheduled one by one.
SPREAD = frozenset(
    {
        "tests/e2e/test_kfp_local.py",
        "tests/sim/test_api_outage.py",
        "tests/sim/test_fault_matrix.py",
        "tests/sim/test_inplace_restart.py",
        "tests/sim/test_step_adoption.py",
    }
)
SLOW_S = 20.0  # what a test marked plain ``slow`` is taken to last, for the start order


def unit_of(nodeid: str) -> str:
    """The work unit a test is scheduled in: itself in a ``SPREAD`` module, else its module
    (or class), as ``--dist loadscope`` has it."""
    return nodeid if nodeid.split("::", 1)[0] in SPREAD else nodeid.rsplit("::", 1)[0]


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with the scopes of :func:`unit_of`."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


def estimate_s(item: pytest.Item) -> float:
    """About how long ``item`` runs when it is slow: its ``slow`` mark's seconds, ``SLOW_S``
    for a bare ``slow``; 0 for any other test (a few seconds at most)."""
    mark = item.get_closest_marker("slow")
    if mark is None:
        return 0.0
    return float(mark.args[0]) if mark.args else SLOW_S


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    length: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for item in items:
        length[unit_of(item.nodeid)] += estimate_s(item)
        count[unit_of(item.nodeid)] += 1
    # Every worker sorts the same way (stable), as xdist requires of their collections.
    items.sort(key=lambda item: (-length[unit_of(item.nodeid)], -count[unit_of(item.nodeid)]))


SIM_SEED = os.environ.setdefault("MNNVL_SIM_SEED", str(random.SystemRandom().randrange(2**31)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"simulated scheduler: MNNVL_SIM_SEED={SIM_SEED}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    if report.failed:
        report.sections.append(("simulated scheduler", f"replay with MNNVL_SIM_SEED={SIM_SEED}"))
    return report
