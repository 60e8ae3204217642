"""Module boundaries (docs/DESIGN.md): which heavy libraries each part may pull in.

Each case imports the modules in a fresh interpreter and looks at what ended up loaded, so
a stray top-level import anywhere below them fails here.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "kfp", "hera", "kubernetes", "pynvml", "matplotlib")

CASES = {
    # modules: libraries that must NOT be loaded
    "mnnvl.errors mnnvl.inputs.spec mnnvl.inputs.flags mnnvl.inputs.names mnnvl.manifests": HEAVY,
    "mnnvl.inputs.checks mnnvl.inputs.surface mnnvl.cli.parser": HEAVY,
    # The contract both sides import: standard library only, nothing from either side.
    "mnnvl.contract mnnvl.contract.result mnnvl.contract.nccl mnnvl.contract.exit_codes "
    "mnnvl.contract.env mnnvl.contract.errors": HEAVY,
    "mnnvl.runtime.local": HEAVY,
    "mnnvl.sim": HEAVY,
    "mnnvl.report": ("torch", "kfp", "hera", "kubernetes"),
    "mnnvl.driver mnnvl.steps mnnvl.run mnnvl.cli.main": ("torch", "kfp", "hera", "pynvml"),
    "mnnvl.runtime.train mnnvl.runtime.verify": ("kfp", "hera", "kubernetes"),
    "mnnvl.components": ("torch", "kubernetes"),
    "mnnvl.components.bodies": ("torch", "kfp", "hera"),
    # Building the KFP components reads declarations only; the bodies load when a pod runs one.
    "mnnvl.components.kfp_components": ("torch", "hera", "matplotlib"),
    # The launcher-pod settings both the KFP and the Argo side read.
    "mnnvl.components.launcher_pod": HEAVY,
}


def loaded_after_import(modules: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules.split()!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(h for h in {HEAVY!r} if h in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return list(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("modules", sorted(CASES))
def test_modules_do_not_load_forbidden_libraries(modules: str) -> None:
    forbidden = set(CASES[modules]) & set(loaded_after_import(modules))
    assert not forbidden, f"{modules} loads {sorted(forbidden)}"


def test_the_contract_imports_nothing_of_either_side() -> None:
    code = (
        "import json, sys\n"
        "import mnnvl.contract.result, mnnvl.contract.nccl, mnnvl.contract.exit_codes\n"
        "import mnnvl.contract.env, mnnvl.contract.errors\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('mnnvl'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert {m for m in loaded if not m.startswith("mnnvl.contract")} == {"mnnvl"}


def test_the_check_sees_a_library_that_is_loaded() -> None:
    assert "kubernetes" in loaded_after_import("mnnvl.driver")


# ---- the import graph of mnnvl: no cycles, no upward imports ----------------------------------

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mnnvl"
# Where each package's source lies (components/ and pipelines/ install as mnnvl.components
# and mnnvl.pipelines): the graph covers all three.
SOURCE_ROOTS = {
    "mnnvl": PACKAGE,
    "mnnvl.components": ROOT / "components",
    "mnnvl.pipelines": ROOT / "pipelines",
}
# Each layer of docs/DESIGN.md with the layers below it that it may import (its own included).
LAYER_OF = {
    "mnnvl": "base",
    "mnnvl.contract": "contract",
    "mnnvl.errors": "base",
    "mnnvl.ports": "base",
    "mnnvl.yaml_stream": "base",
    "mnnvl.units": "base",
    "mnnvl.inputs": "inputs",
    "mnnvl.ctrf": "report",
    "mnnvl.report": "report",
    "mnnvl.report_doc": "report",
    "mnnvl.report_train": "report",
    "mnnvl.manifests": "manifests",
    "mnnvl.runtime": "runtime",
    "mnnvl.sim": "sim",
    "mnnvl.sim.api": "sim.api",
    "mnnvl.sim.core": "sim.core",
    "mnnvl.sim.nvidia": "sim.nvidia",
    "mnnvl.sim.policy": "sim.policy",
    "mnnvl.driver": "driver",
    "mnnvl.steps": "steps",
    "mnnvl.run": "steps",
    "mnnvl.cli": "cli",
    "mnnvl.__main__": "cli",
    "mnnvl.components": "components",
    "mnnvl.pipelines": "pipelines",
}
# The simulator's parts (mnnvl/sim/README.md): the API server below all; the NVIDIA driver and
# the cluster policy on the API; the core (Jobs, scheduler, kubelet) also calls the driver;
# ``mnnvl.sim.cluster`` wires them all.
SIM_API = {"sim.api", "inputs", "base", "contract"}
SIM = {"sim", "sim.core", "sim.nvidia", "sim.policy"} | SIM_API
MAY_IMPORT = {
    "contract": {"contract"},
    "base": {"base", "contract"},
    "inputs": {"inputs", "base", "contract"},
    "report": {"report", "inputs", "base", "contract"},
    "manifests": {"manifests", "inputs", "base", "contract"},
    "runtime": {"runtime", "report", "inputs", "base", "contract"},
    "sim.api": SIM_API,
    "sim.nvidia": {"sim.nvidia"} | SIM_API,
    "sim.policy": {"sim.policy"} | SIM_API,
    "sim.core": {"sim.core", "sim.nvidia"} | SIM_API,
    "sim": SIM,
    "driver": {"driver", "manifests", "inputs", "base", "contract"},
    "steps": {"steps", "driver", "manifests", "report", "inputs", "base", "contract"},
    "cli": {"cli", "steps", "driver", "manifests", "report"} | SIM,
    # The KFP/Argo front ends: component bodies call the steps, never the driver.
    "components": {"components", "steps", "manifests", "report", "inputs", "base", "contract"},
    # `make run` starts the simulator, as `mnnvl run --sim` does.
    "pipelines": {"pipelines", "components", "report"} | SIM,
}


def module_name(path: Path) -> str:
    package, top = max(
        ((n, r) for n, r in SOURCE_ROOTS.items() if path.is_relative_to(r)),
        key=lambda item: len(item[1].parts),
    )
    parts = (*package.split("."), *path.relative_to(top).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the mnnvl modules it imports (also under ``if TYPE_CHECKING``)."""
    paths = {module_name(p): p for root in SOURCE_ROOTS.values() for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in paths else node.module)
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def layer(module: str) -> str:
    owner = max((p for p in LAYER_OF if module == p or module.startswith(p + ".")), key=len)
    return LAYER_OF[owner]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_mnnvl_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_every_module_has_a_layer() -> None:
    assert [
        m for m in import_graph() if not any(m == p or m.startswith(p + ".") for p in LAYER_OF)
    ] == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = sorted(
        f"{m} ({layer(m)}) -> {d} ({layer(d)})"
        for m, deps in import_graph().items()
        for d in deps
        if layer(d) not in MAY_IMPORT[layer(m)]
    )
    assert upward == []


def test_the_graph_covers_the_kfp_and_argo_front_ends() -> None:
    graph = import_graph()
    assert "mnnvl.steps" in graph["mnnvl.components.bodies"]  # `from mnnvl import steps`
    assert {"mnnvl.pipelines.local_run", "mnnvl.components.kfp_components"} <= set(graph)
    assert layer("mnnvl.pipelines.kfp_pipeline") == "pipelines"
    assert "driver" not in MAY_IMPORT["components"] | MAY_IMPORT["pipelines"]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
