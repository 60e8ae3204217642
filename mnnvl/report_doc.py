"""A report as a list of blocks, written as Markdown and as an HTML page from the same list.

Standard library only: text is escaped with ``html.escape``, the plot is embedded as a data
URI, so the page is one self-contained file (a KFP or Argo artifact, a mail attachment).
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 1


@dataclass(frozen=True)
class Verdict:
    """The report's first word, shown as a coloured banner (green when ``good``)."""

    text: str
    good: bool


@dataclass(frozen=True)
class Items:
    lines: Sequence[str]
    strong: int = 0  # the first ``strong`` lines in bold


@dataclass(frozen=True)
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True)
class Plot:
    path: str | None  # a PNG; None when it was not drawn (no matplotlib)
    alt: str


Block = Heading | Verdict | Items | Table | Plot


def markdown(blocks: Sequence[Block]) -> str:
    """The blocks as Markdown (a plot as a link to its file beside the report)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out += [f"{'#' * block.level} {block.text}", ""]
        elif isinstance(block, Verdict):
            out += [f"**{block.text}**", ""]
        elif isinstance(block, Items):
            out += [
                f"- **{line}**" if i < block.strong else f"- {line}"
                for i, line in enumerate(block.lines)
            ] + [""]
        elif isinstance(block, Table):
            out += [
                "| " + " | ".join(block.header) + " |",
                "|" + "---|" * len(block.header),
                *("| " + " | ".join(row) + " |" for row in block.rows),
                "",
            ]
        elif block.path:
            out += [f"![{block.alt}]({os.path.basename(block.path)})", ""]
    return "\n".join(out)


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
    "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
    ".verdict{font-size:1.4em;font-weight:bold;padding:.4em .8em;border-radius:.3em}"
    ".good{background:#dff5e1;color:#17612a}.bad{background:#fde2e1;color:#8a1c12}"
    "img{max-width:100%}"
)


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{html.escape(block.text)}</h{block.level}>"
    if isinstance(block, Verdict):
        kind = "good" if block.good else "bad"
        return f'<p class="verdict {kind}">{html.escape(block.text)}</p>'
    if isinstance(block, Items):
        items = (
            f"<li><strong>{html.escape(line)}</strong></li>"
            if i < block.strong
            else f"<li>{html.escape(line)}</li>"
            for i, line in enumerate(block.lines)
        )
        return f"<ul>{''.join(items)}</ul>"
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in block.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    if not block.path:
        return ""
    with open(block.path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<img alt="{html.escape(block.alt)}" src="data:image/png;base64,{data}">'


def page(title: str, blocks: Sequence[Block]) -> str:
    """The blocks as one self-contained HTML page (the plot embedded)."""
    body = "\n".join(filter(None, map(_html_block, blocks)))
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}'
        f"</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
