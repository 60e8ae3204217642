"""Every agreement between the launcher side and the workers is spelled in one place: the
environment variable names and rules, the verdicts and the exit codes (``mnnvl.contract``)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import yaml

from mnnvl.contract import env as contract_env
from mnnvl.contract import exit_codes
from mnnvl.contract.result import VERDICTS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("mnnvl", "components", "pipelines") for p in (ROOT / d).rglob("*.py")]
ENV_MODULE = "mnnvl/contract/env.py"
RESULT_MODULE = "mnnvl/contract/result.py"
EXIT_CODES_MODULE = "mnnvl/contract/exit_codes.py"


def _trees() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in SOURCES}


TREES = _trees()


def modules_spelling() -> dict[str, set[str]]:
    """Every string literal of the tree -> the modules that spell it."""
    found: dict[str, set[str]] = defaultdict(set)
    for path, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found[node.value].add(path)
    return found


def test_each_contract_environment_name_is_spelled_only_in_the_contract() -> None:
    spelled = modules_spelling()
    names = {*contract_env.JOB_OWNED, *contract_env.PINNED, *contract_env.FORBIDDEN}
    elsewhere = {n: sorted(spelled[n] - {ENV_MODULE}) for n in names if spelled[n] - {ENV_MODULE}}
    assert elsewhere == {}
    assert all(spelled[n] == {ENV_MODULE} for n in names)


def test_each_product_environment_name_is_spelled_in_one_module() -> None:
    spelled = modules_spelling()
    ours = {k: sorted(v) for k, v in spelled.items() if re.fullmatch(r"MNNVL_[A-Z0-9_]+", k)}
    assert {k: v for k, v in ours.items() if len(v) > 1} == {}


def test_verdicts_are_spelled_only_in_the_result_contract() -> None:
    spelled = modules_spelling()
    assert {v: sorted(spelled[v]) for v in VERDICTS} == {v: [RESULT_MODULE] for v in VERDICTS}


def _int_exit_codes(tree: ast.Module) -> list[int]:
    """Exit codes written as numbers: ``exit_code = 4`` and ``{"exit_code": 2}``."""
    found = []
    for node in ast.walk(tree):
        pairs: list[tuple[ast.expr, ast.expr | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, ast.Dict):
            pairs = [(k, v) for k, v in zip(node.keys, node.values, strict=True) if k]
        for key, value in pairs:
            name = key.id if isinstance(key, ast.Name) else getattr(key, "value", None)
            if name == "exit_code" and isinstance(value, ast.Constant) and type(value.value) is int:
                found.append(value.value)
    return found


def test_exit_codes_are_written_as_numbers_only_in_the_exit_code_table() -> None:
    numbers = {p: _int_exit_codes(t) for p, t in TREES.items() if p != EXIT_CODES_MODULE}
    assert {p: n for p, n in numbers.items() if n} == {}


def test_argo_retry_expression_is_generated_from_the_exit_code_table() -> None:
    expression = exit_codes.argo_retry_expression()
    assert expression == "!(lastRetry.exitCode in ['2', '4'])"
    written = modules_spelling()
    elsewhere = [s for s, mods in written.items() if mods - {EXIT_CODES_MODULE}]
    assert not [s for s in elsewhere if "lastRetry" in s]
    lost = exit_codes.argo_lost_pod_retry_expression()
    assert "lastRetry.exitCode in ['137', '143', '-1']" in lost
    compiled = [
        t["retryStrategy"]["expression"]
        for path in (ROOT / "pipelines" / "compiled").glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc
        for t in (doc.get("spec") or {}).get("templates") or []
        if "expression" in (t.get("retryStrategy") or {})
    ]
    assert compiled and set(compiled) == {expression, lost}
