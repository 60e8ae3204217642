"""Kubernetes objects as a multi-document YAML stream, the way ``kubectl apply -f`` reads them.

Kept out of :mod:`mnnvl.manifests`, whose builders need nothing but the standard library.
"""

from __future__ import annotations

from typing import Any

import yaml


def to_yaml(objs: list[dict[str, Any]]) -> str:
    """``---`` before each object, block style, keys in builder order, no line folding
    (commands and env stay on one line)."""
    return yaml.safe_dump_all(
        objs,
        explicit_start=True,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=2**16,
    )
