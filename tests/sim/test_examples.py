"""Every example a person copies runs as written: the ``mnnvl <command> --help`` examples, the
``mnnvl sim up`` banner, and the shell blocks of the README and docs.

One ``mnnvl sim up`` (itself the documented example) serves the module; each ``mnnvl`` example
runs as a process against it with ``KUBECONFIG`` set, in one working directory, and must exit 0
with a judged verdict wherever it verifies. Steps that need a provisioned domain (``launch``,
``train``, ``verify``, ...) get one first and a teardown after, as the README says. ``make``
examples are dry-run (``make -n``: the target exists and expands); a pipe into
``kubectl apply --dry-run=server`` is applied with the client's ``dry_run="All"``. Only the
examples in ``NEEDS_GPUS`` are not run, each with its reason.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from mnnvl import steps
from mnnvl.cli.help import COMMANDS
from mnnvl.cli.main import RESULT_ON_STDERR
from mnnvl.cli.parser import build_parser
from mnnvl.inputs.spec import DomainSpec

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
DOCS += ("components/README.md", "pipelines/README.md", "mnnvl/sim/README.md")
STARTS = ("mnnvl ", "make ", "python -m mnnvl", "python3 -m mnnvl")
SHELL_FENCES = {"bash", "sh", "shell", "console"}
SIM_UP = "mnnvl sim up --nodes 2 --gpus-per-node 0 --kubeconfig sim.kubeconfig"
KUBECTL_DRY_RUN = ["kubectl", "apply", "--dry-run=server", "-f", "-"]
# Steps whose example needs the run's domain to exist (the README: provision first).
NEEDS_DOMAIN = {"launch", "train", "verify", "status", "teardown"}

# The only examples not run: the simulator's pods see no GPUs, so these need a GPU cluster.
NEEDS_GPUS = {
    "mnnvl run --run-id demo --namespace team-a --nodes 4 --gpus-per-node 4 "
    "--image REGISTRY/runtime:TAG": "4 GPUs per node and your published runtime image",
    "mnnvl run --run-id demo --namespace team-a --nodes 4 --gpus-per-node 4 "
    "--image registry.example.com/ml/runtime:0.1.0": "4 GPUs per node and your runtime image",
    "mnnvl launch --run-id demo --namespace team-a --nodes 4 --gpus-per-node 4 "
    "--module my_pkg.train -- --lr 3e-4": "your module in your image, on nodes with 4 GPUs",
    "mnnvl run --run-id demo --namespace team-a --nodes 36 --nodes-per-clique 18 "
    "--gpus-per-node 4 --queue-name team-a --topology-aware --admission-timeout-s 3600 "
    "--image registry.example.com/ml/runtime:0.1.0": "two GB200 racks under Kueue, your image",
}


def canonical(line: str) -> str:
    """One spelling per command: comments dropped, quoting normalised."""
    return shlex.join(shlex.split(line, comments=True))


def shell_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, command) of every example in the fenced shell blocks of a Markdown text,
    continuation lines joined."""
    fence, pending, start = None, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip() or "text"
            continue
        if fence not in SHELL_FENCES:
            continue
        if not pending:
            start = number
        pending += stripped.removeprefix("$ ")
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.startswith(STARTS):
            yield start, pending
        pending = ""


def doc_examples() -> dict[str, str]:
    """canonical command -> where it is written first."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for number, line in shell_lines((REPO / doc).read_text()):
            found.setdefault(canonical(line), f"{doc}:{number}")
    return found


def help_examples() -> dict[str, str]:
    subparsers = next(a for a in build_parser()._actions if a.choices and "sim" in a.choices)
    found: dict[str, str] = {}
    for name, parser in subparsers.choices.items():
        epilog = (parser.epilog or "").split("example:", 1)[-1]
        for line in epilog.splitlines():
            if line.strip().startswith("mnnvl "):
                found.setdefault(canonical(line.strip()), f"mnnvl {name} --help")
    return found


EXAMPLES = {**doc_examples(), **help_examples()}
RUNNABLE = sorted(line for line in EXAMPLES if line not in NEEDS_GPUS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The documented ``mnnvl sim up``, run as written; its banner; a namespace ``team-a``
    (the docs' namespace, made as ``kubectl create namespace team-a`` would)."""
    workdir = tmp_path_factory.mktemp("examples")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", *shlex.split(SIM_UP)[1:]],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        banner = []
        for line in proc.stderr:
            banner.append(line)
            if "Ctrl-C" in line:
                break
        kubeconfig = str(workdir / "sim.kubeconfig")
        api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        yield {"workdir": workdir, "kubeconfig": kubeconfig, "banner": "".join(banner), "api": api}
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and json.loads(out.splitlines()[-1])["ok"] is True
    finally:
        if proc.poll() is None:
            proc.kill()


def _option(words: list[str], flag: str, default: str) -> str:
    return words[words.index(flag) + 1] if flag in words else default


def _verdicts(value: Any) -> list[str]:
    """Every verdict in a result, however deep (run: verify_pre and verify_post)."""
    if isinstance(value, dict):
        own = [value["verdict"]] if isinstance(value.get("verdict"), str) else []
        return own + [v for item in value.values() for v in _verdicts(item)]
    if isinstance(value, list):
        return [v for item in value for v in _verdicts(item)]
    return []


def _dry_run_apply(api: Any, manifests: str) -> list[str]:
    """What ``kubectl apply --dry-run=server -f -`` does with new objects: a dry-run create."""
    dynamic = kubernetes.dynamic.DynamicClient(api)
    created = []
    for obj in yaml.safe_load_all(manifests):
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = obj["metadata"].get("namespace", "default")
        answer = resource.create(body=obj, namespace=namespace, dry_run="All")
        created.append(f"{answer.kind}/{answer.metadata.name}")
    return created


def run_mnnvl(cluster: dict[str, Any], line: str) -> subprocess.CompletedProcess[str]:
    words = shlex.split(line)
    pipe = words.index("|") if "|" in words else len(words)
    words, downstream = words[:pipe], words[pipe + 1 :]
    assert downstream in ([], KUBECTL_DRY_RUN), f"unknown pipe in {line!r}"
    command, run_id = words[1], _option(words, "--run-id", "")
    domain = DomainSpec(run_id=run_id or "none", namespace=_option(words, "--namespace", "default"))
    if command in NEEDS_DOMAIN and run_id:
        steps.provision(domain, kubeconfig=cluster["kubeconfig"])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mnnvl", *words[1:]],
            cwd=cluster["workdir"],
            env={**os.environ, "KUBECONFIG": cluster["kubeconfig"]},
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
    finally:
        if run_id and command != "render":
            steps.teardown(domain, kubeconfig=cluster["kubeconfig"])
    assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stderr[-3000:]}"
    if downstream:
        assert _dry_run_apply(cluster["api"], done.stdout)
    return done


@pytest.mark.slow
@pytest.mark.parametrize("line", RUNNABLE, ids=[EXAMPLES[line] for line in RUNNABLE])
def test_example_runs_as_written(cluster: dict[str, Any], line: str) -> None:
    words = shlex.split(line)
    if words[0] == "make":  # dry: the target exists and expands; running it is its own test
        done = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, f"{line}: {done.stderr}"
        return
    if words[0] != "mnnvl":  # python -m mnnvl.<tool>
        done = subprocess.run(
            [sys.executable, *words[1:]], cwd=cluster["workdir"], capture_output=True, text=True
        )
        assert done.returncode == 0, f"{line}: {done.stderr[-3000:]}"
        return
    if words[1:3] == ["sim", "up"]:
        assert line == SIM_UP, "the module's cluster runs this line: document that one"
        return
    done = run_mnnvl(cluster, line)
    # Commands whose stdout is data (YAML, a table) write their result line to stderr.
    on_stderr = words[1] in RESULT_ON_STDERR
    result_line = (done.stderr if on_stderr else done.stdout).strip().splitlines()[-1]
    result = json.loads(result_line)
    assert result["ok"] is True
    assert set(_verdicts(result)) <= {"PASS"}, f"{line}: verdicts {_verdicts(result)}"
    if words[1] == "run" and "--sim" in words:
        assert done.stderr.count("simulated cluster up") == 1
        assert result["sim"]["leftover"] == result["sim"]["leftover_processes"] == []


@pytest.mark.slow
def test_sim_up_banner_examples_run_as_printed(cluster: dict[str, Any]) -> None:
    banner = cluster["banner"]
    assert "export KUBECONFIG=sim.kubeconfig" in banner  # the path as given, relative
    lines = [ln.strip() for ln in banner.splitlines() if ln.strip().startswith("mnnvl ")]
    assert lines, banner
    for line in lines:
        result = json.loads(run_mnnvl(cluster, line).stdout.strip().splitlines()[-1])
        assert result["ok"] is True and _verdicts(result) and set(_verdicts(result)) == {"PASS"}


def test_every_surface_has_examples_and_only_gpu_examples_are_skipped() -> None:
    sources = set(EXAMPLES.values())
    assert {f"mnnvl {name} --help" for name in COMMANDS} <= sources  # every command's example
    assert sum(s.startswith("README.md") for s in sources) >= 10
    for line, why in NEEDS_GPUS.items():
        assert line in EXAMPLES, f"stale entry (no such example any more): {line}"
        gpus = int(_option(shlex.split(line), "--gpus-per-node", "0"))
        assert gpus > 0 and why, f"{line}: only examples that need GPUs may be skipped"


def test_shell_lines_join_continuations_and_skip_other_blocks() -> None:
    text = "```bash\nmnnvl run --a 1 \\\n  --b 2   # note\nkubectl get pods\n```\n"
    text += "```yaml\nmnnvl: not a command\n```\n```\n$ make test\n```\n"
    assert [(n, canonical(line)) for n, line in shell_lines(text)] == [(2, "mnnvl run --a 1 --b 2")]
