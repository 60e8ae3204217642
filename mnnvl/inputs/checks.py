"""Checks and parsers for input values: each bad value raises ``SpecError`` naming the field.

Pure functions of their arguments (no environment, no files), standard library only.
"""

from __future__ import annotations

import json
import math
import re

from mnnvl.contract import env as contract_env
from mnnvl.errors import SpecError
from mnnvl.inputs.defaults import TAINT_EFFECTS

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_IMAGE_DOMAIN = rf"{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?"
IMAGE_REF = re.compile(
    rf"^(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)

CHECKPOINTING_HELP = "auto, none, full or every-N (every N-th block, e.g. every-2)"


def check_dns_label(field_name: str, value: str, *, max_len: int = 63) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(field_name, "must be a non-empty string")
    if len(value) > max_len:
        raise SpecError(field_name, f"{value!r} is {len(value)} characters; at most {max_len}")
    if not DNS1123_LABEL.match(value):
        raise SpecError(
            field_name,
            f"{value!r} is not a DNS-1123 label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit)",
        )


def check_subdomain(field_name: str, value: str, kind: str) -> None:
    """A name of a cluster-wide or namespaced object that is a DNS subdomain (<= 253)."""
    if len(value) > 253 or not DNS1123_SUBDOMAIN.match(value):
        raise SpecError(field_name, f"{value!r} is not a {kind} name")


def check_run_id(value: str) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(
            "run_id", "must be a non-empty string (e.g. the KFP job id or Argo workflow uid)"
        )
    check_label_value("run_id", value)


def plain(number: float) -> str:
    """A number as typed: ``18000000``, not ``1.8e+07``; ``0``, not ``0.0``; ``0.001``."""
    return str(int(number)) if float(number).is_integer() else f"{number:.6g}"


def check_range(
    field_name: str, value: float, lo: float, hi: float, *, integer: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field_name, f"must be a number, got {value!r}")
    if integer and not isinstance(value, int):
        raise SpecError(field_name, f"must be a whole number, got {value!r}")
    if math.isnan(value) or not lo <= value <= hi:
        raise SpecError(
            field_name, f"{plain(value)} is out of range; allowed {plain(lo)} to {plain(hi)}"
        )


def check_choice(field_name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(field_name, f"{value!r} is not one of {', '.join(choices)}")


def parse_checkpointing(field_name: str, value: str) -> int:
    """Blocks between checkpointed ones: ``none`` 0, ``full`` 1, ``every-N`` N (``auto`` is
    resolved by the preset before this is asked)."""
    fixed = {"none": 0, "full": 1}
    if value in fixed:
        return fixed[value]
    match = re.fullmatch(r"every-([1-9][0-9]{0,3})", value)
    if not match:
        raise SpecError(field_name, f"{value!r} is not one of {CHECKPOINTING_HELP}")
    return int(match.group(1))


def check_image(field_name: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(
            field_name, "must name a container image, e.g. registry.example.com/team/trainer:1.0"
        )
    if len(value) > 512 or not IMAGE_REF.match(value):
        raise SpecError(
            field_name,
            f"{value!r} is not a valid image reference "
            "([registry/]path[:tag][@sha256:digest], path in lowercase)",
        )


def check_env(field_name: str, env: dict[str, str]) -> None:
    for name, val in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise SpecError(f"{field_name}.{name}", "is not a valid environment variable name")
        if not isinstance(val, str):
            raise SpecError(f"{field_name}.{name}", f"value must be a string, got {val!r}")
        if name in contract_env.JOB_OWNED:
            raise SpecError(f"{field_name}.{name}", "is set by the Job itself; remove it")
        if name in contract_env.PINNED:
            raise SpecError(f"{field_name}.{name}", "is pinned by the machine and must not be set")
        problem = contract_env.forbidden_problem({name: val})
        if problem:
            raise SpecError(f"{field_name}.{name}", problem[1])


def list_items(items: list[str] | tuple[str, ...] | str, field: str) -> list[str]:
    """The items of a list input: a repeated flag, KFP's list, or Argo's one JSON list (an item
    starting with ``[`` is expanded). Nothing is split on commas (``NCCL_IB_HCA=mlx5_0,mlx5_1``)."""
    if isinstance(items, str):
        items = [items]
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise SpecError(field, f"items must be strings, got {item!r}")
        if item.lstrip().startswith("["):
            try:
                decoded = json.loads(item)
            except ValueError as e:
                raise SpecError(field, f"{item!r} is not a JSON list of strings ({e})") from e
            if not isinstance(decoded, list):
                raise SpecError(field, f"{item!r} is not a JSON list of strings")
            out += list_items([str(d) for d in decoded], field)
        elif item.strip():
            out.append(item)
    return out


def parse_env(items: list[str] | tuple[str, ...] | str, field: str = "env") -> dict[str, str]:
    """``NAME=value`` items -> a dict; the value is everything after the first ``=``."""
    env: dict[str, str] = {}
    for item in list_items(items, field):
        name, sep, val = item.partition("=")
        if not sep or not name.strip():
            raise SpecError(field, f"{item!r} must look like NAME=value")
        if name.strip() in env:  # a silent last-one-wins hides a typo in a long flag list
            raise SpecError(field, f"{name.strip()} is given twice; give each name once")
        env[name.strip()] = val
    return env


def parse_list(items: list[str] | tuple[str, ...] | str, field: str = "list") -> tuple[str, ...]:
    """A list input's items, stripped, without blanks."""
    return tuple(i.strip() for i in list_items(items, field))


def check_label_key(field_name: str, key: str) -> None:
    prefix, _, name = key.rpartition("/")
    ok = bool(name) and len(name) <= 63 and bool(LABEL_VALUE.match(name))
    if prefix:
        ok = ok and len(prefix) <= 253 and bool(DNS1123_SUBDOMAIN.match(prefix))
    if not ok:
        raise SpecError(field_name, f"{key!r} is not a label key ([prefix/]name, name <= 63 chars)")


def check_label_value(field_name: str, value: str) -> None:
    if value and (len(value) > 63 or not LABEL_VALUE.match(value)):
        raise SpecError(
            field_name,
            f"{value!r} is not a valid label value: at most 63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit",
        )


TOLERATION = re.compile(r"^(?P<key>[^=:]+)(?:=(?P<value>[^:]*))?:(?P<effect>[A-Za-z]+)$")


def parse_toleration(item: str) -> dict[str, str]:
    """``key[=value]:Effect`` -> a pod toleration (Equal with a value, else Exists)."""
    m = TOLERATION.match(item)
    if not m:
        raise SpecError("tolerations", f"{item!r} must look like key[=value]:Effect")
    check_label_key("tolerations", m["key"])
    check_choice("tolerations", m["effect"], TAINT_EFFECTS)
    if m["value"] is None:
        return {"key": m["key"], "operator": "Exists", "effect": m["effect"]}
    check_label_value("tolerations", m["value"])
    return {"key": m["key"], "operator": "Equal", "value": m["value"], "effect": m["effect"]}


def parse_bytes(field_name: str, value: str) -> int:
    """A byte count like ``1M``, ``64MiB``, ``4G`` or ``1048576`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", value, re.IGNORECASE)
    if not m:
        raise SpecError(field_name, f"{value!r} is not a size like 1M, 64MiB or 4G")
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")
