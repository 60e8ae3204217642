"""Every example a person copies runs as written, in the order written, as one shell script.

The shell blocks of the README and the docs (README first, then ``docs/`` and the other READMEs
in name order) and then the example of each ``mnnvl <command> --help`` (in the order of
``mnnvl --help``) are joined, in that order, into one ``bash`` script (``set -euo pipefail``).
Its first block is ``mnnvl sim up …`` alone: it runs as the README says, in a shell of its own
until it is stopped, and the script runs in "another shell" in the same directory, with the
environment the README's ``environment`` block ends in (``.venv/bin`` on the PATH) and nothing
else prepared. kubectl lines run with the machine's kubectl; without one on the PATH they are
reported as not run, and so is a block whose first command is kubectl (what follows depends on
it). Blocks that cannot run here say so in their fence: ``real-cluster``,
``gpu``, ``environment`` (``MARKERS``); the excluded blocks are listed in ``EXCLUDED``, so a new
one is a visible choice. At the end nothing of any run is left in the cluster, SIGTERM stops
``mnnvl sim up`` with exit 0, and no process the examples started is left.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from mnnvl.cli.help import COMMANDS
from mnnvl.cli.main import RESULT_ON_STDERR
from mnnvl.cli.parser import build_parser
from tests.sim.simkit import wait_for

REPO = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
    "components/README.md",
    "pipelines/README.md",
    "mnnvl/sim/README.md",
)
SHELL_FENCES = {"bash", "sh", "shell", "console"}
MARKERS = {
    "real-cluster": "a Kubernetes cluster with GPUs, the DRA driver, Argo or a registry",
    "gpu": "GPUs on this machine",
    "environment": "the make lines that build the environment the examples run in",
}
# Every block that is not run, by its document and its first command's first words (comments
# dropped): a new one is a choice made here.
EXCLUDED = {
    ("README.md", "make run"),
    ("README.md", "mnnvl run --run-id demo --namespace team-a"),
    ("docs/placement.md", "mnnvl provision --run-id racks --namespace team-a"),
    ("docs/real-cluster.md", "helm repo add nvidia https://helm.ngc.nvidia.com/nvidia &&"),
    ("docs/real-cluster.md", "make images REGISTRY=registry.example.com/ml TAG=0.1.0 PUSH=1"),
    ("docs/real-cluster.md", "docker buildx create --name mnnvl --driver"),
    ("docs/real-cluster.md", "kubectl apply -n kubeflow -k manifests/overlays/kfp"),
    ("docs/real-cluster.md", "kubectl apply -n team-a -k manifests/overlays/argo"),
    ("docs/real-cluster.md", "mnnvl render --run-id demo --namespace team-a"),
    ("docs/real-cluster.md", "mnnvl preflight --namespace team-a --nodes 4"),
    ("docs/real-cluster.md", "kubectl apply -k manifests/overlays/cluster-reader"),
    ("docs/real-cluster.md", "mnnvl run --run-id demo --namespace team-a"),
    ("docs/trainjob.md", "R=team-a-42; NS=team-a"),
    ("docs/trainjob.md", "kubectl -n $NS apply -f my-trainjob.yaml"),
    ("docs/usage.md", "kubectl apply -n argo -k manifests/overlays/argo"),
    ("docs/verification.md", "python -m pytest -q -m gpu"),
}
COMMAND_STARTS = ("mnnvl ", "kubectl ", "make ", "python ", "python3 ", "argo ", "helm ")
SIM_UP = "mnnvl sim up --nodes 2 --gpus-per-node 0 --kubeconfig sim.kubeconfig"
TAG_ENV = "MNNVL_EXAMPLES_RUN"  # marks every process the examples start, to find leftovers


def fenced_blocks(text: str) -> Iterator[tuple[int, list[str], list[str]]]:
    """(line of the fence, info string words, lines) of every fenced block of a Markdown text."""
    fence: tuple[int, list[str]] | None = None
    lines: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence, lines = (number, stripped[3:].split()), []
            else:
                yield fence[0], fence[1], lines
                fence = None
        elif fence is not None:
            lines.append(raw)
    assert fence is None, f"a fence opened at line {fence[0]} is never closed"


def doc_blocks() -> list[tuple[str, list[str], str]]:
    """(where, marker words, script text) of every shell block, in the documented order."""
    found = []
    for doc in DOCS:
        for number, info, lines in fenced_blocks((REPO / doc).read_text()):
            if not info:  # a plain block is text: it must not hide a command
                commands = [ln for ln in lines if ln.strip().startswith(COMMAND_STARTS)]
                assert not commands, f"{doc}:{number}: commands in a block without a language"
            if info and info[0] in SHELL_FENCES:
                found.append((f"{doc}:{number}", info[1:], "\n".join(lines) + "\n"))
    return found


def help_examples() -> list[tuple[str, str]]:
    """(command, example) of every subcommand's --help, in the order ``mnnvl --help`` lists."""
    subparsers = next(a for a in build_parser()._actions if a.choices and "sim" in a.choices)
    found = []
    for name, parser in subparsers.choices.items():
        epilog = (parser.epilog or "").split("example:", 1)[-1]
        found += [
            (name, ln.strip()) for ln in epilog.splitlines() if ln.strip().startswith("mnnvl ")
        ]
    return found


def sim_up_line() -> str:
    """The first runnable block: ``mnnvl sim up …`` alone, the server the rest runs against."""
    where, _, first = next(b for b in doc_blocks() if not b[1])
    assert first.split("#")[0].strip() == SIM_UP, f"{where}: the first runnable block is {SIM_UP}"
    return first


def build_script(banner: str, kubectl_stub: str | None) -> str:
    """The script "another shell" runs: the docs' blocks after the first, the --help examples
    the docs do not hold, and the lines the ``mnnvl sim up`` banner says to run."""
    blocks = [(where, text) for where, markers, text in doc_blocks() if not markers]
    parts = ["set -euo pipefail", "PS4='+ line $LINENO: '", "set -x"]
    if kubectl_stub:  # no kubectl here: kubectl lines are recorded as not run
        record = f'echo "kubectl $*" >> {shlex.quote(kubectl_stub)}'
        parts.append(f"kubectl() {{ {record}; cat > /dev/null; }}")
    for where, text in blocks[1:]:
        first = next(ln for ln in text.splitlines() if ln.split("#")[0].strip())
        if kubectl_stub and first.startswith("kubectl "):  # a block about kubectl: not run
            parts += [f"# {where}: not run (no kubectl)", f"kubectl {shlex.quote(where)} block"]
        else:
            parts += [f"# {where}", text]
    written = {_canonical(line) for _, text in blocks for line in text.splitlines()}
    for name, line in help_examples():
        if name == "sim":
            assert line == SIM_UP, "sim up's example is the server the script runs against"
        elif _canonical(line) not in written:  # the same line in the docs has run already
            parts += [f"# mnnvl {name} --help", line]
    told = banner.split("in another shell:\n", 1)[1].split("Ctrl-C")[0]
    parts += ["# the mnnvl sim up banner", *(ln.strip() for ln in told.splitlines())]
    return "\n".join(parts) + "\n"


def _canonical(line: str) -> str:
    """One spelling per command: comments dropped, quoting normalised."""
    return shlex.join(shlex.split(line, comments=True))


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith('{"ok": ')]


def _verdicts(value: Any) -> list[str]:
    """Every verdict in a result, however deep (run: verify_pre and verify_post)."""
    if isinstance(value, dict):
        own = [value["verdict"]] if isinstance(value.get("verdict"), str) else []
        return own + [v for item in value.values() for v in _verdicts(item)]
    if isinstance(value, list):
        return [v for item in value for v in _verdicts(item)]
    return []


def _tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries ``TAG_ENV=tag``."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return found


def _left_in_cluster(admin_kubeconfig: str) -> list[str]:
    """Every pod, Service, Job, ComputeDomain and claim template, in any namespace."""
    api = kubernetes.config.new_client_from_config(config_file=admin_kubeconfig)
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    items = [
        *(o.metadata for o in core.list_pod_for_all_namespaces().items),
        *(o.metadata for o in core.list_service_for_all_namespaces().items),
    ]
    left = [f"{m.namespace}/{m.name}" for m in items]
    for group, version, plural in (
        ("batch", "v1", "jobs"),
        ("resource.nvidia.com", "v1beta1", "computedomains"),
        ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    ):
        listed = custom.list_cluster_custom_object(group, version, plural)["items"]
        left += [f"{plural} {o['metadata']['namespace']}/{o['metadata']['name']}" for o in listed]
    return left


@pytest.mark.slow(140)
def test_the_documented_examples_run_in_order_as_one_script(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    not_run = tmp_path / "kubectl-not-run.txt"
    tag = uuid.uuid4().hex
    # `mnnvl` on the PATH is this interpreter's (also under a venv without the entry point).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "mnnvl"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m mnnvl "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": os.pathsep.join(
            (str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"])
        ),
        "KUBECACHEDIR": str(tmp_path / "kube-cache"),  # kubectl's discovery cache, not ~/.kube
        TAG_ENV: tag,
    }
    env.pop("KUBECONFIG", None)
    work = tmp_path / "work"
    work.mkdir()
    server_log = tmp_path / "sim-up.log"
    with server_log.open("w") as log:  # a file: a pipe nobody reads would fill and block it
        server = subprocess.Popen(
            shlex.split(sim_up_line(), comments=True), cwd=work, env=env, text=True,
            stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip
    try:
        banner = wait_for(
            lambda: "Ctrl-C" in (text := server_log.read_text()) and text, 60, "the banner"
        )
        assert "export KUBECONFIG=sim.kubeconfig" in banner, banner
        script = build_script(banner, None if kubectl else str(not_run))
        (tmp_path / "examples.sh").write_text(script)
        started = time.monotonic()
        done = subprocess.run(
            ["bash", str(tmp_path / "examples.sh")], cwd=work, env=env, text=True,
            stdin=subprocess.DEVNULL, capture_output=True, timeout=480,
        )  # fmt: skip
        took = time.monotonic() - started
        failed_at = [ln for ln in done.stderr.splitlines() if ln.startswith("+ line ")][-1:]
        assert done.returncode == 0, (
            f"exit {done.returncode} at {failed_at} of\n{script}\n"
            f"--- stderr ---\n{done.stderr[-6000:]}"
        )
        results = _json_lines(done.stdout)  # one per command, in order, each ok
        commands = [ln.split()[1] for ln in script.splitlines() if ln.startswith("mnnvl ")]
        on_stdout = [c for c in commands if c not in RESULT_ON_STDERR]
        assert [r["command"] for r in results] == on_stdout
        assert all(r["ok"] for r in results)
        assert set(_verdicts(results)) == {"PASS"}, _verdicts(results)
        embedded = [r["sim"] for r in results if "sim" in r]  # each `mnnvl run --sim`
        assert embedded and all(s["leftover"] == s["leftover_processes"] == [] for s in embedded)
        assert _left_in_cluster(str(work / "sim.kubeconfig.admin")) == []
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
        assert server.returncode == 0 and json.loads(out.splitlines()[-1])["ok"] is True
        assert _tagged_processes(tag) == [], "processes the examples started are still alive"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for pid in _tagged_processes(tag):  # after a failure: what the examples started
            os.kill(pid, signal.SIGKILL)
    if not kubectl:
        lines = not_run.read_text().splitlines() if not_run.exists() else []
        warnings.warn(f"no kubectl on the PATH: {len(lines)} kubectl lines not run", stacklevel=1)
    print(f"examples script: {len(results)} commands in {took:.0f} s")


def test_blocks_that_do_not_run_are_marked_and_listed() -> None:
    marked = set()
    for where, markers, text in doc_blocks():
        if markers:
            assert markers[0] in MARKERS and len(markers) == 1, f"{where}: unknown marker {markers}"
            first = next(ln for ln in text.splitlines() if ln.split("#")[0].strip())
            marked.add((where.split(":")[0], " ".join(first.split("#")[0].split()[:6])))
    assert marked == EXCLUDED


def test_every_command_has_a_help_example_and_the_docs_have_runnable_blocks() -> None:
    assert {name for name, _ in help_examples()} == set(COMMANDS)
    runnable = [w for w, markers, _ in doc_blocks() if not markers]
    assert sum(w.startswith("README.md") for w in runnable) == 2, runnable
    assert any(w.startswith("docs/usage.md") for w in runnable)


def test_fenced_blocks_keep_their_info_string_and_lines() -> None:
    text = "```bash real-cluster\nmnnvl run \\\n  --b 2\n```\ntext\n```\nplain\n```\n"
    assert list(fenced_blocks(text)) == [
        (1, ["bash", "real-cluster"], ["mnnvl run \\", "  --b 2"]),
        (6, [], ["plain"]),
    ]
