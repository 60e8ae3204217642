"""Command-line flags <-> input dataclasses: one ``--flag`` per field a spec exposes on the CLI,
for the CLI, the worker entry points and the Job builder. Repeatable flags also take one JSON
list (``--env '["A=1,2", "B=x=y"]'``), as Argo passes them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from mnnvl.inputs.defaults import SWITCHES
from mnnvl.inputs.spec import CLI, OwnerRef, leaves
from mnnvl.inputs.surface import GROUP_HELP, Input, build

T = TypeVar("T")
REMAINDER_FIELDS = frozenset({"command"})  # the words after `--` (mnnvl launch)


def _metavar(item: Input) -> str:
    """What the value looks like, as kubectl's help shows it: a choice, a number or text."""
    if item.choices:
        return "{" + "|".join(item.choices) + "}"
    if item.name.endswith("_s"):
        return "SECONDS"
    return {"int": "N", "float": "X", "list": "ITEM"}.get(item.kind, "TEXT")


def add_inputs(
    parser: argparse.ArgumentParser,
    inputs: Iterable[Input],
    *,
    group: Callable[[Input], Any] | None = None,
    required: bool = False,
) -> None:
    """Add one ``--flag`` per CLI input of ``inputs`` under the ``--help`` heading ``group``
    picks; one without a default is required if asked. An unset flag is None: the spec's
    builder gives it the input's default."""
    for item in inputs:
        if CLI not in item.surfaces or item.name in REMAINDER_FIELDS:
            continue
        text = f"{item.help} (required)" if item.required and required else item.help
        if not item.required and item.default not in ("", [], None):
            text += f" (default: {item.text()})"
        target = group(item) if group else parser
        shared: dict[str, Any] = {"dest": item.name, "default": None, "help": text}
        if item.kind == "bool":
            target.add_argument(item.flag, action=argparse.BooleanOptionalAction, **shared)
            continue
        shared["metavar"] = _metavar(item)
        if item.choices == SWITCHES:
            # auto/true/false: a bare --flag is true and --no-flag false, as for a boolean.
            target.add_argument(item.flag, nargs="?", const="true", **shared)
            no = shared | {"help": f"the same as {item.flag} false"}
            target.add_argument("--no-" + item.kebab, action="store_const", const="false", **no)
        elif item.kind == "list":
            target.add_argument(item.flag, action="append", **shared)
        else:
            target.add_argument(item.flag, required=required and item.required, **shared)


def ns_values(ns: argparse.Namespace) -> dict[str, Any]:
    """Parsed flags by input name, each ``--<group>-json`` as its group."""
    values = dict(vars(ns))
    return values | {g: values.pop(f"{g}_json", None) for g in GROUP_HELP}


def from_namespace(cls: type[T], ns: argparse.Namespace, **extra: Any) -> T:
    """Build ``cls`` from parsed flags; unset flags keep the dataclass default."""
    return build(cls, ns_values(ns), **extra)


def to_args(cfg: Any) -> list[str]:
    """Flags that reproduce the non-default fields of a config dataclass (not ``owner``)."""
    args: list[str] = []
    for f, val in leaves(cfg):
        if val == f.default or isinstance(val, OwnerRef) or val is None or val in ({}, ()):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(val, dict):
            args += [a for k, v in val.items() for a in (flag, f"{k}={v}")]
        elif isinstance(val, tuple):
            args += [a for item in val for a in (flag, item)]
        elif isinstance(val, bool):
            args.append(flag if val else "--no-" + f.name.replace("_", "-"))
        else:
            args += [flag, str(val)]
    return args
