"""What `pip install mnnvl-pipelines` gets: clean build, metadata an index shows, a version."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import mnnvl
from mnnvl.cli.main import main

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


def test_wheel_carries_the_contract_package_and_the_kfp_components(built_wheel):
    wheel, _ = built_wheel
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for path in (
        "mnnvl/contract/result.py",
        "mnnvl/contract/nccl.py",
        "mnnvl/contract/exit_codes.py",
        "mnnvl/inputs/surface.py",
        "mnnvl/components/kfp_components.py",
        "mnnvl/components/kfp_entry.py",
        "mnnvl/components/launch_workload.yaml",
        "mnnvl/pipelines/compiled/mnnvl-custom.kfp.yaml",
    ):
        assert path in names, path


@pytest.mark.slow
def test_plain_pip_install_provisions_and_tears_down_against_sim_up(tmp_path):
    """`pip install mnnvl-pipelines` alone (newest kubernetes client, no extras) works."""
    import json
    import signal
    import venv

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("mnnvl", "components", "pipelines"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    # --no-compile: no bytecode (how fast it starts, not what is installed).
    install = [bin_dir / "python", "-m", "pip", "install", "-q", "--no-compile", str(src)]
    pip = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    kc = tmp_path / "kubeconfig"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG")}
    sim = subprocess.Popen([bin_dir / "mnnvl", "sim", "up", "--kubeconfig", str(kc)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, env=env)  # fmt: skip
    try:
        assert sim.stderr is not None
        for line in sim.stderr:
            if "Ctrl-C" in line:
                break
        results = []
        for step in ("provision", "teardown"):
            proc = subprocess.run(
                [bin_dir / "mnnvl", step, "--run-id", "plain", "--kubeconfig", str(kc)],
                capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-2000:]
            results.append(json.loads(proc.stdout.splitlines()[-1]))
        assert results[0]["ok"] and results[1]["deleted"]
        version = subprocess.run(
            [bin_dir / "python", "-c", "import kubernetes; print(kubernetes.__version__)"],
            capture_output=True, text=True, check=True, cwd=tmp_path, env=env,
        ).stdout  # fmt: skip
        assert int(version.split(".")[0]) >= 31, "pip should pick the newest client"
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(timeout=30)
