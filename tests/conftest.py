"""Shared fixtures: where the upstream schemas live.

The schemas (NVIDIA DRA driver CRDs, Argo Workflows JSON schema) are read from
``MNNVL_SCHEMA_DIR``, else from ``./schemas``; ``make schemas`` (``scripts/fetch-schemas.sh``)
fetches them from the upstream repositories, and ``make test`` does so when they are absent.

``make test`` spreads the test modules over pytest-xdist workers (``--dist loadscope``): a
module runs on one worker, so its module fixtures (a simulated cluster, a costly shared run)
are set up once. Under xdist the modules holding tests marked ``slow`` start first, so that no
worker is left with a long module at the end while the others idle (the modules with the most
slow tests first).

The simulated scheduler breaks ties and orders its queue from a seed: one per session, from
``MNNVL_SIM_SEED`` or drawn here, shown in the report header and beside every failure, so a
placement race a test ran into can be replayed with ``MNNVL_SIM_SEED=<seed>``.

``clock``: fake monotonic seconds for what takes a clock (``Grace``, ``Deadline``); they move
only when the test calls ``clock.sleep``.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts the same way (stable)
        slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
        items.sort(key=lambda item: -slow[item.path])


SIM_SEED = os.environ.setdefault("MNNVL_SIM_SEED", str(random.SystemRandom().randrange(2**31)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"simulated scheduler: MNNVL_SIM_SEED={SIM_SEED}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    if report.failed:
        report.sections.append(("simulated scheduler", f"replay with MNNVL_SIM_SEED={SIM_SEED}"))
    return report
