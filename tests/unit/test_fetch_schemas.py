"""`make schemas` (scripts/fetch-schemas.sh) offline: it fails and leaves no schemas/ behind,
so the next `make test` tries again instead of reading an empty directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT


def test_a_failed_fetch_leaves_no_schema_directory(tmp_path: Path) -> None:
    target = tmp_path / "schemas"
    unreachable = "http://127.0.0.1:9"  # the discard port: connection refused, no network used
    env = {**os.environ, "https_proxy": unreachable, "HTTPS_PROXY": unreachable}
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "fetch-schemas.sh"), str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert not target.exists(), sorted(p.name for p in target.rglob("*"))
    # Where it fails, it says how to go on offline.
    last = done.stderr.strip().splitlines()[-1]
    assert "scripts/fetch-schemas.sh DIR" in last and "MNNVL_SCHEMA_DIR" in last
