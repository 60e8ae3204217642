"""Shared fixtures: where the upstream schemas live.

The schemas (NVIDIA DRA driver CRDs, Argo Workflows JSON schema) are read from
``MNNVL_SCHEMA_DIR``, else from ``./schemas``; ``make schemas`` (``scripts/fetch-schemas.sh``)
fetches them from the upstream repositories, and ``make test`` does so when they are absent.
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
