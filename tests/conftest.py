"""Shared fixtures: where the upstream schemas live.

The schemas (NVIDIA DRA driver CRDs, Argo Workflows JSON schema) are read from
``MNNVL_SCHEMA_DIR``, else from ``./schemas``; ``make schemas`` (``scripts/fetch-schemas.sh``)
fetches them from the upstream repositories, and ``make test`` does so when they are absent.

``make test`` spreads the test modules over pytest-xdist workers (``--dist loadscope``): a
module runs on one worker, so its module fixtures (a simulated cluster, a costly shared run)
are set up once. Under xdist the modules holding tests marked ``slow`` start first, so that no
worker is left with a long module at the end while the others idle (the modules with the most
slow tests first).
"""

from __future__ import annotations

import os
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts the same way (stable)
        slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
        items.sort(key=lambda item: -slow[item.path])
