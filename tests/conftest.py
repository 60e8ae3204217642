"""Shared fixtures: where the upstream schemas live.

The schemas (NVIDIA DRA driver CRDs, Argo Workflows JSON schema) are read from
``MNNVL_SCHEMA_DIR``, else from ``./schemas``; ``make schemas`` (``scripts/fetch-schemas.sh``)
fetches them from the upstream repositories, and ``make test`` does so when they are absent.

``make test`` spreads the tests over pytest-xdist workers (``--dist loadgroup``): each test is
a unit of work, except the modules marked ``xdist_group`` whose module fixtures are costly
runs (they stay on one worker). Under xdist the tests marked ``slow`` start first, so that no
worker is left with a long test at the end while the others idle.
"""

from __future__ import annotations

import os
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
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
