"""Command-line flags <-> input dataclasses: one ``--flag`` per field of a spec.

The CLI, the worker entry points (``mnnvl.runtime.train``/``verify``) and the Job builder
use these, so a field added to a spec becomes a flag everywhere, with its ``--help`` line
from ``mnnvl.flag_help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

from mnnvl.flag_help import FIELD_HELP
from mnnvl.spec import OwnerRef, parse_bytes, parse_env, parse_list

T = TypeVar("T")
_SIZE_FIELDS = {"min_bytes", "max_bytes", "judge_min_bytes"}


def _field_type(cls: type, f: dataclasses.Field[Any]) -> Any:
    hint = typing.get_type_hints(cls)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0]
    return hint


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(
    parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()
) -> None:
    """Add one ``--flag`` per scalar field of ``cls`` (defaults left to the dataclass)."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint, text = _field_type(cls, f), FIELD_HELP.get(f.name)
        if hint is bool:
            parser.add_argument(
                _flag(f.name),
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=text,
            )
        elif hint in (int, float, str):
            kind = str if f.name in _SIZE_FIELDS else hint
            parser.add_argument(_flag(f.name), dest=f.name, type=kind, default=None, help=text)
        elif typing.get_origin(hint) in (dict, tuple):
            metavar = "KEY=VALUE" if typing.get_origin(hint) is dict else "ITEM"
            parser.add_argument(
                _flag(f.name),
                dest=f.name,
                action="append",
                default=None,
                metavar=metavar,
                help=text,
            )


def from_namespace(cls: type[T], ns: argparse.Namespace, **extra: Any) -> T:
    """Build ``cls`` from parsed flags; unset flags keep the dataclass default."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        val = getattr(ns, f.name, None)
        if val is None:
            continue
        if f.name in _SIZE_FIELDS:
            val = parse_bytes(f.name, val)
        elif f.default_factory is dict:
            val = parse_env(val, f.name)
        elif isinstance(val, list):
            val = parse_list(val)
        kwargs[f.name] = val
    kwargs.update(extra)
    return cls(**kwargs)


def to_args(cfg: Any) -> list[str]:
    """Flags that reproduce the non-default fields of a config dataclass (not ``owner``)."""
    args: list[str] = []
    for f in dataclasses.fields(cfg):
        val = getattr(cfg, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if val == default or isinstance(val, OwnerRef) or val is None or val in ({}, ()):
            continue
        if isinstance(val, dict):
            args += [a for k, v in val.items() for a in (_flag(f.name), f"{k}={v}")]
        elif isinstance(val, tuple):
            args += [a for item in val for a in (_flag(f.name), item)]
        elif isinstance(val, bool):
            args.append(_flag(f.name) if val else "--no-" + f.name.replace("_", "-"))
        else:
            args += [_flag(f.name), str(val)]
    return args
