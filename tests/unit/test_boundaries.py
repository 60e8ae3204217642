"""Module boundaries (docs/DESIGN.md): which heavy libraries each part may pull in.

Each case imports the modules in a fresh interpreter and looks at what ended up loaded, so
a stray top-level import anywhere below them fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "kfp", "hera", "kubernetes", "pynvml", "matplotlib")

CASES = {
    # modules: libraries that must NOT be loaded
    "mnnvl.errors mnnvl.spec mnnvl.flags mnnvl.names mnnvl.manifests": HEAVY,
    "mnnvl.checks mnnvl.surface mnnvl.cli_parser mnnvl.components.kfp_codegen": HEAVY,
    # The contract both sides import: standard library only, nothing from either side.
    "mnnvl.contract mnnvl.contract.result mnnvl.contract.nccl mnnvl.contract.exit_codes "
    "mnnvl.contract.env mnnvl.contract.errors": HEAVY,
    "mnnvl.runtime.local": HEAVY,
    "mnnvl.sim": HEAVY,
    "mnnvl.report": ("torch", "kfp", "hera", "kubernetes"),
    "mnnvl.driver mnnvl.steps mnnvl.run mnnvl.cli": ("torch", "kfp", "hera", "pynvml"),
    "mnnvl.runtime.train mnnvl.runtime.verify": ("kfp", "hera", "kubernetes"),
    "mnnvl.components.artifacts mnnvl.components": ("torch", "kubernetes"),
    "mnnvl.components.bodies": ("torch", "kfp", "hera"),
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
