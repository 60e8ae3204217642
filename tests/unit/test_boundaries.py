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
    "mnnvl.inputs.checks mnnvl.inputs.surface mnnvl.cli.parser mnnvl.components.kfp_codegen": HEAVY,
    # The contract both sides import: standard library only, nothing from either side.
    "mnnvl.contract mnnvl.contract.result mnnvl.contract.nccl mnnvl.contract.exit_codes "
    "mnnvl.contract.env mnnvl.contract.errors": HEAVY,
    "mnnvl.runtime.local": HEAVY,
    "mnnvl.sim": HEAVY,
    "mnnvl.report": ("torch", "kfp", "hera", "kubernetes"),
    "mnnvl.driver mnnvl.steps mnnvl.run mnnvl.cli.main": ("torch", "kfp", "hera", "pynvml"),
    "mnnvl.runtime.train mnnvl.runtime.verify": ("kfp", "hera", "kubernetes"),
    "mnnvl.components.artifacts mnnvl.components": ("torch", "kubernetes"),
    "mnnvl.components.bodies": ("torch", "kfp", "hera"),
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

PACKAGE = Path(__file__).resolve().parents[2] / "mnnvl"
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
    "mnnvl.manifests": "manifests",
    "mnnvl.runtime": "runtime",
    "mnnvl.sim": "sim",
    "mnnvl.driver": "driver",
    "mnnvl.steps": "steps",
    "mnnvl.run": "steps",
    "mnnvl.cli": "cli",
    "mnnvl.__main__": "cli",
}
MAY_IMPORT = {
    "contract": {"contract"},
    "base": {"base", "contract"},
    "inputs": {"inputs", "base", "contract"},
    "report": {"report", "inputs", "base", "contract"},
    "manifests": {"manifests", "inputs", "base", "contract"},
    "runtime": {"runtime", "report", "inputs", "base", "contract"},
    "sim": {"sim", "inputs", "base", "contract"},
    "driver": {"driver", "manifests", "inputs", "base", "contract"},
    "steps": {"steps", "driver", "manifests", "report", "inputs", "base", "contract"},
    "cli": {"cli", "steps", "sim", "driver", "manifests", "report", "inputs", "base", "contract"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the mnnvl modules it imports (also under ``if TYPE_CHECKING``)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
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


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ---- the input layer: pure validators, each name imported from the module that defines it ----

ROOT = PACKAGE.parent
SOURCES = ("mnnvl", "components", "pipelines", "tests", "bench", "examples", "scripts")


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (not the ones it imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def test_checks_holds_pure_validators_only() -> None:
    """Defaults, presets and choice tables live in ``defaults``; the checks read no file or
    environment: every top-level value of the module is a pattern or a message."""
    tree = ast.parse((PACKAGE / "inputs" / "checks.py").read_text())

    def pattern_or_text(value: ast.expr) -> bool:
        text = isinstance(value, ast.Constant) and isinstance(value.value, str)
        compiled = isinstance(value, ast.Call) and ast.unparse(value.func) == "re.compile"
        return text or compiled or isinstance(value, ast.JoinedStr)

    tables = [
        ast.unparse(t)
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and node.value is not None
        and not pattern_or_text(node.value)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ]
    io = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id in {"open", "environ", "getenv"})
        or (isinstance(node, ast.Import) and {a.name for a in node.names} & {"os", "pathlib", "io"})
    ]
    assert tables == [] and io == []


def test_input_names_are_imported_from_the_module_that_defines_them() -> None:
    """No re-exports in the input layer: ``from mnnvl.inputs.spec import X`` only for what spec
    defines, so each name has one home to read and to change."""
    defined = {
        module_name(p): defined_names(p)
        for p in (PACKAGE / "inputs").glob("*.py")
        if p.name != "__init__.py"
    }
    wrong = []
    for path in (p for top in SOURCES for p in (ROOT / top).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in defined:
                wrong += [
                    f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name not in defined[node.module]
                ]
    assert wrong == []


def layout_paths() -> set[str]:
    """The folders and modules docs/DESIGN.md's Layout names under ``mnnvl/``, as paths."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        entry = line.split()[0] if line.strip() else ""
        if not (entry.endswith("/") or entry.endswith(".py")):
            continue  # a description's second line
        indent = len(line) - len(line.lstrip())
        stack = [(i, p) for i, p in stack if i < indent]
        path = "".join(p for _, p in stack) + entry
        stack.append((indent, entry))
        paths.add(path.rstrip("/"))
    return {p for p in paths if p == "mnnvl" or p.startswith("mnnvl/")}


def test_the_layout_in_design_names_every_folder_and_module() -> None:
    actual = {"mnnvl"} | {
        str(p.relative_to(ROOT)).removesuffix("/__init__.py")
        for p in PACKAGE.rglob("*.py")
        if "sim" not in p.relative_to(PACKAGE).parts[:-1] and p.name != "__init__.py"
    }
    actual |= {str(p.relative_to(ROOT)) for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    actual.add("mnnvl/__init__.py")
    assert sorted(layout_paths() ^ actual) == []
