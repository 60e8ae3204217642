"""Both images build for linux/amd64 and linux/arm64: GB200 and GB300 nodes are Grace (aarch64).

``make images PLATFORMS=…`` hands the platforms to ``docker buildx build`` and picks an output
that can hold them (a fake ``docker`` on the PATH records each call: no engine runs here). The
Dockerfiles have no architecture-specific step: multi-arch bases (named below with why), no
download or package pinned to one architecture, torch from the base image, and every compiled
package pip installs published as an aarch64 wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.test_images import (
    FAKE_DOCKER,
    LAUNCHER,
    REPO,
    RUNTIME,
    dockerfile_instructions,
    pip_install_args,
)

BOTH = "linux/amd64,linux/arm64"

# Each base, with why its tag is one index holding linux/amd64 and linux/arm64 images.
MULTI_ARCH_BASES = {
    "docker.io/library/python": "a Docker Official Image: every tag lists amd64 and arm64v8 "
    "(docker-library/official-images, library/python)",
    "nvcr.io/nvidia/pytorch": "NGC publishes each PyTorch release tag as one multi-arch index: "
    "linux/amd64 and linux/arm64 (Arm SBSA servers, Grace among them), torch and NCCL built "
    "for each",
}
# Compiled packages pip installs into an image, each published on PyPI as a CPython 3.12
# manylinux aarch64 wheel (checked with `pip download --only-binary=:all: --platform
# manylinux_2_28_aarch64 --python-version 3.12`). A new one is checked the same way, then named.
AARCH64_WHEELS = frozenset(
    {"cffi", "charset-normalizer", "contourpy", "cryptography", "fonttools", "google-crc32c",
     "kiwisolver", "matplotlib", "numpy", "pillow", "protobuf", "pydantic-core", "pyyaml"}
)  # fmt: skip
# A step that only works on one architecture: its name in a URL, file, package or a platform
# pinned in FROM, a torch build of one CUDA/CPU variant, a wheel file or a wheel index.
ARCH_SPECIFIC = re.compile(
    r"amd64|x86[_-]64|aarch64|arm64|armv8|sbsa|i[36]86|ppc64|s390x"
    r"|\+(cpu|cu\d+)\b|download\.pytorch\.org|\.whl\b|--(extra-)?index-url|--find-links",
    re.IGNORECASE,
)


def arch_specific_steps(steps: list[tuple[str, str]]) -> list[str]:
    """The instructions of a Dockerfile that would build for one architecture only."""
    return [f"{word} {rest}" for word, rest in steps if ARCH_SPECIFIC.search(rest)]


def base_image(path: Path) -> str:
    """The default base image (``ARG BASE_IMAGE=…``) of a Dockerfile."""
    args = dict(rest.split("=", 1) for word, rest in dockerfile_instructions(path)
                if word == "ARG" and "=" in rest)  # fmt: skip
    return args["BASE_IMAGE"]


def compiled_packages(path: Path) -> set[str]:
    """Packages with native code among what the Dockerfile pip installs, and their requirements.

    Read from this environment's installed metadata: ``.`` is this project with its extras.
    """
    todo = []
    for arg in pip_install_args(path):
        if not arg.startswith("-"):
            req = Requirement(arg.replace(".[", "mnnvl-pipelines[", 1))
            todo.append((req.name, req.extras))
    seen: dict[str, metadata.Distribution] = {}
    while todo:
        name, extras = todo.pop()
        if canonicalize_name(name) in seen:
            continue
        dist = seen[canonicalize_name(name)] = metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((req.name, req.extras))
    return {
        key
        for key, dist in seen.items()
        if not all(tag.endswith("-none-any") for tag in wheel_tags(dist))
    }


def wheel_tags(dist: metadata.Distribution) -> list[str]:
    """The ``Tag:`` lines of an installed wheel (``py3-none-any`` for pure Python)."""
    text = dist.read_text("WHEEL") or ""
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def test_no_dockerfile_step_is_tied_to_one_architecture():
    for path in (LAUNCHER, RUNTIME):
        assert arch_specific_steps(dockerfile_instructions(path)) == [], path.name


def test_the_architecture_check_finds_steps_that_build_for_one_architecture_only():
    bad = [
        ("FROM", "--platform=linux/amd64 python:3.12-slim"),
        ("RUN", "pip install torch --index-url https://download.pytorch.org/whl/cu128"),
        ("RUN", "pip install torch==2.8.0+cpu"),
        ("RUN", "curl -L https://example.com/tool-linux-x86_64.tar.gz | tar xz"),
        ("RUN", "apt-get install -y libnccl2:amd64"),
        ("ADD", "https://example.com/pkg-1.0-cp312-cp312-manylinux_2_28_aarch64.whl /tmp/"),
    ]
    good = [("RUN", 'pip install --no-cache-dir "nvidia-ml-py>=12.560" "matplotlib>=3.8"')]
    assert arch_specific_steps(bad + good) == [f"{w} {r}" for w, r in bad]


def test_every_base_image_is_multi_arch_and_torch_comes_from_the_runtime_base():
    for path in (LAUNCHER, RUNTIME):
        assert base_image(path) in MULTI_ARCH_BASES, f"{path.name}: say why it is multi-arch"
    names = {Requirement(a).name for a in pip_install_args(RUNTIME) if not a.startswith("-")}
    assert "torch" not in names, "the base image's torch is built for each architecture"


def test_every_compiled_package_pip_installs_has_an_aarch64_wheel():
    for path in (LAUNCHER, RUNTIME):
        unchecked = compiled_packages(path) - AARCH64_WHEELS
        assert not unchecked, f"{path.name}: check these have aarch64 wheels: {sorted(unchecked)}"


def make_images(tmp_path: Path, *args: str, buildx: bool = True) -> tuple[int, str, list[str]]:
    """``make images ARGS`` with a fake docker: (exit code, stderr, the build calls it made)."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_DOCKER)
    fake.chmod(0o755)
    log = tmp_path / "docker.log"
    log.write_text("")
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "DOCKER_LOG": str(log), "FAKE_BUILDX": "1" if buildx else "0"}  # fmt: skip
    env.pop("PLATFORMS", None)
    proc = subprocess.run(
        ["make", "-s", "images", "REGISTRY=registry.example.com/ml", "TAG=9.9.9", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    builds = [line for line in log.read_text().splitlines() if " build " in f" {line} "]
    return proc.returncode, proc.stderr, builds


def test_make_images_for_grace_pushes_one_image_for_both_platforms(tmp_path):
    code, stderr, builds = make_images(tmp_path, f"PLATFORMS={BOTH}", "PUSH=1")
    assert code == 0, stderr
    assert len(builds) == 2
    for line in builds:
        assert line.startswith("buildx build") and f"--platform {BOTH}" in line
        assert "--push" in line and "--load" not in line, line


def test_both_platforms_without_push_write_oci_archives_or_say_they_stay_in_the_cache(tmp_path):
    out = tmp_path / "oci"
    code, stderr, builds = make_images(tmp_path, f"PLATFORMS={BOTH}", f"OCI_DIR={out}")
    assert code == 0, stderr
    for name, line in zip(("launcher", "runtime"), builds, strict=True):
        assert f"--output type=oci,dest={out}/{name}.oci.tar" in line and "--load" not in line
    code, stderr, builds = make_images(tmp_path, f"PLATFORMS={BOTH}")
    assert code == 0 and len(builds) == 2, stderr
    assert not any("--load" in line or "--push" in line for line in builds), builds
    (note,) = [line for line in stderr.splitlines() if line.startswith("note:")]
    assert "build cache only" in note and "PUSH=1" in note and "OCI_DIR" in note


def test_make_images_by_default_builds_and_loads_the_hosts_platform_only(tmp_path):
    code, stderr, builds = make_images(tmp_path)
    assert code == 0, stderr
    assert len(builds) == 2
    assert all("--load" in line and "--platform" not in line for line in builds), builds


@pytest.mark.parametrize("platforms", [BOTH, "linux/arm64"])
def test_without_buildx_one_platform_builds_and_several_are_refused_before_any_build(
    tmp_path, platforms
):
    code, stderr, builds = make_images(tmp_path, f"PLATFORMS={platforms}", buildx=False)
    if "," in platforms:
        assert code == 2 and builds == [], stderr
        (error,) = [line for line in stderr.splitlines() if not line.startswith("make")]
        assert "docker buildx create --use" in error and "PLATFORMS=linux/arm64" in error
    else:
        assert code == 0, stderr
        assert len(builds) == 2
        assert all(line.startswith("build ") and "--platform linux/arm64" in line
                   for line in builds)  # fmt: skip
