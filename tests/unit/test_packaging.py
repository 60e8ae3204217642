"""What `pip install mnnvl-pipelines` gets: clean build, metadata an index shows, a version."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import mnnvl
from mnnvl.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
         str(REPO), "-w", str(out)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("mnnvl_pipelines-*.whl")
    return wheel, proc.stdout + proc.stderr


def test_wheel_builds_without_setuptools_deprecation_warnings(built_wheel):
    _, log = built_wheel
    assert "SetuptoolsDeprecationWarning" not in log
    assert "License classifiers are deprecated" not in log


def test_wheel_metadata_has_license_classifiers_urls_and_the_package_version(built_wheel):
    wheel, _ = built_wheel
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    assert meta["Version"] == mnnvl.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.12" in classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Source", "Issues"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    kube = next(r for r in meta.get_all("Requires-Dist") or [] if r.startswith("kubernetes"))
    assert ">=30" in kube  # kfp's pin (30.x) must stay installable


def test_version_flag_prints_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mnnvl {mnnvl.__version__}"


def test_wheel_carries_the_contract_package_and_the_generated_components(built_wheel):
    wheel, _ = built_wheel
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for path in (
        "mnnvl/contract/result.py",
        "mnnvl/contract/nccl.py",
        "mnnvl/contract/exit_codes.py",
        "mnnvl/surface.py",
        "mnnvl/components/kfp_components.py",
        "mnnvl/components/launch_workload.yaml",
        "mnnvl/pipelines/compiled/mnnvl-custom.kfp.yaml",
    ):
        assert path in names, path
