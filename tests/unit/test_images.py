"""The images hold what their code needs at run time (no container engine: rebuilt as venvs).

The launcher test installs the Python environment exactly as ``images/launcher.Dockerfile``
does (its COPY lines and its pip command, read from the file) into a fresh venv, then runs
what a KFP task pod runs: ``mnnvl --help`` and each compiled component's own command with a
real executor input. Provision, verify and teardown run for real against a simulated cluster,
whose workers stand in for the runtime image; the verify report must come with its plot.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest
import yaml

from mnnvl.manifests import RUNTIME_UID
from mnnvl.sim import SimCluster

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "images" / "launcher.Dockerfile"
RUNTIME = REPO / "images" / "runtime.Dockerfile"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copy_as_dockerfile(path: Path, dest: Path) -> None:
    """Lay out ``dest`` as the Dockerfile's COPY lines do (relative to its last WORKDIR)."""
    workdir = Path("/")
    for word, rest in dockerfile_instructions(path):
        if word == "WORKDIR":
            workdir = Path(rest)
        if word != "COPY":
            continue
        *sources, target = [a for a in shlex.split(rest) if not a.startswith("--")]
        target_dir = dest / (workdir / target).relative_to("/")
        for source in sources:
            src = REPO / source
            if src.is_dir():
                shutil.copytree(src, target_dir, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                into_dir = target.endswith("/") or len(sources) > 1
                target_path = target_dir / src.name if into_dir else target_dir
                target_path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target_path)


def pip_install_args(path: Path) -> list[str]:
    """The arguments of the Dockerfile's ``pip install`` (first command of its RUN line)."""
    (run,) = [rest for word, rest in dockerfile_instructions(path) if word == "RUN"]
    first = run.split("&&")[0]
    args = shlex.split(first)
    assert args[:2] == ["pip", "install"], first
    return args[2:]


def test_launcher_dockerfile_installs_the_package_with_kfp_argo_and_the_report_plots():
    args = pip_install_args(LAUNCHER)
    (target,) = [a for a in args if not a.startswith("-")]
    assert re.fullmatch(r"\.\[(.*)\]", target)
    extras = set(target[2:-1].split(","))
    assert extras == {"kfp", "argo", "report"}, "torch stays out of the launcher"


def test_runtime_image_files_alone_import_the_worker_entry_points(tmp_path):
    copy_as_dockerfile(RUNTIME, tmp_path)
    root = tmp_path / "opt" / "mnnvl"
    code = (
        "import json, sys; import mnnvl.runtime.train, mnnvl.runtime.verify, "
        "mnnvl.runtime.launch, mnnvl;"
        "print(json.dumps([mnnvl.__file__, sorted(m for m in ('kubernetes', 'kfp', 'hera', "
        "'yaml') if m in sys.modules), sorted(n for n, m in sys.modules.items() "
        "if n.startswith('mnnvl') and getattr(m, '__file__', None))]))"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, clients, modules = json.loads(proc.stdout.splitlines()[-1])
    assert where.startswith(str(root)) and clients == []
    # Each module the workers import is in the image, not found through the checkout's install.
    missing = [
        m
        for m in modules
        if not (root / (m.replace(".", "/") + ".py")).exists()
        and not (root / m.replace(".", "/") / "__init__.py").exists()
    ]
    assert missing == [], f"add to images/runtime.Dockerfile's COPY: {missing}"


@pytest.fixture(scope="module")
def launcher_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the launcher image's Python environment; returns its bin directory."""
    root = tmp_path_factory.mktemp("launcher-image")
    copy_as_dockerfile(LAUNCHER, root)
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    # Same command and extras as the image; only --no-cache-dir goes, so the pip cache is reused,
    # and no bytecode is compiled (that changes how fast it starts, not what is installed).
    args = [a for a in pip_install_args(LAUNCHER) if a != "--no-cache-dir"]
    proc = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", *args],
        cwd=root / "src", capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return env_dir / "bin"


def executors() -> dict[str, tuple[list[str], str]]:
    """Component name -> (its container command, the function it executes)."""
    out = {}
    for path in sorted((REPO / "components").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        (container,) = [e["container"] for e in spec["deploymentSpec"]["executors"].values()]
        args = container["args"]
        out[path.stem] = (container["command"], args[args.index("--function_to_execute") + 1])
    return out


def run_component(
    bin_dir: Path, name: str, params: dict[str, Any], outdir: Path, kubeconfig: str
) -> subprocess.CompletedProcess[str]:
    """Run one compiled component's command as its KFP task pod would, in the launcher env."""
    command, function = executors()[name]
    spec = yaml.safe_load((REPO / "components" / f"{name}.yaml").read_text())
    artifacts = spec["components"][f"comp-{name.replace('_', '-')}"].get("outputDefinitions", {})
    outputs = {
        key: {"artifacts": [{"name": key, "type": d["artifactType"], "uri": str(outdir / key),
                             "metadata": {}}]}
        for key, d in artifacts.get("artifacts", {}).items()
    }  # fmt: skip
    executor_input = {
        "inputs": {"parameterValues": params},
        "outputs": {"artifacts": outputs, "outputFile": str(outdir / "executor_output.json")},
    }
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "KUBECONFIG": kubeconfig, "MPLCONFIGDIR": str(outdir / "mpl")}  # fmt: skip
    env.pop("PYTHONPATH", None)
    argv = [*command, "--executor_input", json.dumps(executor_input)]
    argv += ["--function_to_execute", function]
    outdir.mkdir(parents=True, exist_ok=True)
    # The image's WORKDIR is /tmp: never the checkout, whose ./mnnvl would shadow the install.
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=outdir)


@pytest.mark.slow
def test_launcher_image_env_runs_help_every_component_and_a_report_with_a_plot(
    launcher_env: Path, tmp_path: Path
) -> None:
    help_proc = subprocess.run(
        [str(launcher_env / "mnnvl"), "--help"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert help_proc.returncode == 0 and "provision" in help_proc.stdout
    assert set(executors()) == {"provision_domain", "train_sharded", "verify_nvlink",
                                "teardown_domain", "launch_workload",
                                "preflight_cluster"}  # fmt: skip
    run_id = "image-check"
    with SimCluster(nodes=2) as sim:
        kube = sim.kubeconfig_path
        checks = {"run_id": run_id, "gpus_per_node": 0}
        done = run_component(launcher_env, "preflight_cluster", checks, tmp_path / "f", kube)
        assert done.returncode == 0, done.stderr[-3000:]
        ctrf = json.loads((tmp_path / "f" / "ctrf").read_text())
        assert ctrf["results"]["tool"]["name"] == "mnnvl-preflight"
        assert ctrf["results"]["summary"]["failed"] == 0
        done = run_component(launcher_env, "provision_domain", {"run_id": run_id},
                             tmp_path / "p", kube)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        # train's body imports everything it needs, then refuses the bad input before any call
        bad = run_component(launcher_env, "train_sharded", {"run_id": run_id, "nodes": 0},
                            tmp_path / "t", kube)  # fmt: skip
        # One line in the task log (KFP's executor logs to stdout), exit 2, no traceback.
        log = bad.stdout + bad.stderr
        assert bad.returncode == 2, log[-3000:]
        assert "ERROR]: train failed: nodes: 0 is out of range" in log and "Traceback" not in log
        verify_params = {"run_id": run_id, "nodes": 2, "gpus_per_node": 0,
                         "verify": {"max_bytes": 64 << 10, "min_busbw_gbps": 1e-6}}  # fmt: skip
        done = run_component(launcher_env, "verify_nvlink", verify_params, tmp_path / "v", kube)
        assert done.returncode == 0, done.stderr[-3000:]
        done = run_component(launcher_env, "teardown_domain", {"run_id": run_id},
                             tmp_path / "d", kube)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    html = (tmp_path / "v" / "report").read_text()
    match = re.search(r'src="data:image/png;base64,([^"]+)"', html)
    assert match, "the verify report has no plot"
    assert base64.b64decode(match.group(1)).startswith(PNG_MAGIC)


FAKE_DOCKER = """#!/usr/bin/env bash
echo "$*" >> "$DOCKER_LOG"
case "$1 $2" in
  "buildx version") [ "$FAKE_BUILDX" = 1 ] || exit 1 ;;
  "buildx imagetools") echo '"sha256:'"$(printf '1%.0s' {1..64})"'"' ;;
  "image inspect") echo "$3@sha256:$(printf '2%.0s' {1..64})" ;;
esac
"""


def test_make_images_without_an_engine_says_so_once_and_where_to_build(tmp_path):
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    daemon = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    script = ["#!/usr/bin/env bash", '[ "$1 $2" = "buildx version" ] && exit 0']
    fake.write_text("\n".join([*script, f'echo "{daemon}" >&2', "exit 1", ""]))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "scripts/build-images.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and daemon not in proc.stderr, proc.stderr
    assert "no docker engine answers" in proc.stderr and "PUSH=1" in proc.stderr


@pytest.mark.parametrize("buildx", [True, False])
def test_make_images_tags_both_images_and_pins_each_base_by_digest(tmp_path, buildx):
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(FAKE_DOCKER)
    fake.chmod(0o755)
    log = tmp_path / "docker.log"
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "DOCKER_LOG": str(log), "FAKE_BUILDX": "1" if buildx else "0"}  # fmt: skip
    proc = subprocess.run(
        ["make", "-s", "images", "REGISTRY=registry.example.com/ml", "TAG=9.9.9", "PUSH=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    builds = [line for line in log.read_text().splitlines() if " build " in f" {line} "]
    assert len(builds) == 2
    digest = "sha256:" + ("1" if buildx else "2") * 64
    for name, line in zip(("launcher", "runtime"), builds, strict=True):
        assert f"-f images/{name}.Dockerfile -t registry.example.com/ml/{name}:9.9.9" in line
        assert f"BASE_DIGEST={digest}" in line and "VERSION=" in line
        assert line.startswith("buildx build") == buildx
        assert ("--push" in line) == buildx
    if not buildx:
        pushes = [line for line in log.read_text().splitlines() if line.startswith("push ")]
        assert pushes == [
            f"push registry.example.com/ml/{n}:9.9.9" for n in ("launcher", "runtime")
        ]


def test_worker_pods_run_as_the_runtime_images_user():
    (user,) = [rest for word, rest in dockerfile_instructions(RUNTIME) if word == "USER"][-1:]
    assert user == f"{RUNTIME_UID}:{RUNTIME_UID}"


def test_dockerfiles_pin_their_base_by_tag_and_digest_argument_and_carry_oci_labels():
    for path in (LAUNCHER, RUNTIME):
        steps = dockerfile_instructions(path)
        args = {rest.split("=")[0] for word, rest in steps if word == "ARG"}
        assert {"BASE_IMAGE", "BASE_TAG", "BASE_DIGEST"} <= args, path.name
        (base,) = [rest for word, rest in steps if word == "FROM"]
        assert base == "${BASE_IMAGE}:${BASE_TAG}${BASE_DIGEST:+@${BASE_DIGEST}}"
        labels = " ".join(rest for word, rest in steps if word == "LABEL")
        for key in ("source", "licenses", "version", "revision", "base.digest"):
            assert f"org.opencontainers.image.{key}=" in labels, (path.name, key)
        user = [rest for word, rest in steps if word == "USER"]
        assert user and not user[-1].startswith("0"), f"{path.name} must not run as root"
