"""Report files for verify and train RESULT dicts: JSON, Markdown, a PNG plot and an HTML page.

Standard library only, plus matplotlib when installed (imported lazily, Agg backend, so it
works without a display). Without matplotlib the PNG is skipped and the HTML has no plot.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from mnnvl import report_doc as doc
from mnnvl.contract.result import FAIL, NOT_JUDGED, ONE_RANK, PASS
from mnnvl.units import human_bytes

logger = logging.getLogger(__name__)


def num(value: Any, digits: int = 1) -> str:
    """A number for logs and messages: ``2653.52236`` -> ``2653.5``; ``None`` -> ``n/a``."""
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def gbps(value: Any) -> str:
    """Bandwidth for messages: one decimal for NVLink figures, three significant digits
    below 10 GB/s (a CPU sweep's 0.0004 must not print as 0.0), "none" when missing."""
    if not isinstance(value, (int, float)):
        return "none"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def verdict_numbers(result: dict[str, Any]) -> str:
    """Judged and peak bus bandwidth against the threshold, or that there was none."""
    threshold = result.get("threshold_gbps")
    against = (
        "no threshold (bandwidth not judged)"
        if threshold is None
        else f"threshold {gbps(threshold)} GB/s ({result.get('threshold_source') or 'user'})"
    )
    return (
        f"judged busbw {gbps(result.get('judged_busbw_gbps'))} GB/s vs {against}, "
        f"peak {gbps(result.get('peak_busbw_gbps'))} GB/s"
    )


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else num(value, digits)


def bandwidth(row: dict[str, Any], key: str, digits: int = 2) -> str:
    """A row's algbw or busbw in GB/s; "n/a: one rank" where no data moved."""
    if row.get("algbw_gbps") is None:
        return ONE_RANK
    return _fmt(float(row[key]), digits)


def _size_rows(result: dict[str, Any]) -> list[list[str]]:
    return [
        [
            human_bytes(int(row["bytes"])),
            _fmt(float(row["time_us"]), 2),
            bandwidth(row, "algbw_gbps"),
            bandwidth(row, "busbw_gbps"),
            "yes" if row["correct"] else "NO",
        ]
        for row in result.get("sizes", [])
    ]


_SIZE_HEADER = ["size", "time µs", "algbw GB/s", "busbw GB/s", "correct"]


def _threshold_line(result: dict[str, Any]) -> str:
    threshold = result.get("threshold_gbps")
    source = result.get("threshold_source", "none")
    if threshold is None:
        return "threshold: none (bandwidth not judged)"
    return f"threshold: {gbps(threshold)} GB/s ({source})"


_SOURCES = {
    "user": "given by --min-busbw-gbps",
    "derived": "active links x link speed x efficiency",
}


def headline(result: dict[str, Any]) -> list[str]:
    """The report's first lines: verdict, failed checks, busbw vs threshold and its source
    with the margin, transport and NCCL version."""
    failed = [c["name"] for c in result.get("checks") or [] if c["status"] == FAIL]
    if not result.get("checks") and result.get("verdict") == FAIL:
        failed = [r for r in result.get("reasons", []) if not r.startswith(("note:", "WARN:"))][:1]
    threshold = result.get("threshold_gbps")
    busbw = f"busbw {gbps(result.get('judged_busbw_gbps'))} GB/s"
    if threshold is None:
        against = f"{busbw}, not judged (no threshold)"
    else:
        baseline = result.get("baseline") or {}
        source = result.get("threshold_source", "none")
        origin = (
            f"{baseline.get('key')}, {baseline.get('busbw_gbps')} GB/s x "
            f"(1 - {baseline.get('tolerance')}), {baseline.get('citation')}"
            if source == "baseline" and baseline
            else _SOURCES.get(source, source)
        )
        margin = result.get("threshold_margin")
        against = f"{busbw} vs threshold {gbps(threshold)} GB/s ({source}: {origin})" + (
            f", margin {margin:+.1%}" if margin is not None else ""
        )
    return [
        f"verdict: {result.get('verdict')}",
        f"failed checks: {', '.join(failed) or 'none'}",
        against,
        nccl_line(result),
    ]


def nccl_line(result: dict[str, Any]) -> str:
    """Which NCCL carried the measured communicator, and over which transport."""
    nccl = result.get("nccl") or {}
    if result.get("backend") == "gloo":
        return "transport: gloo on CPU (no NCCL, no NVLink)"
    version = nccl.get("version") or "unknown"
    return f"transport: NCCL {version} over {nccl.get('transport') or 'unknown'}"


def _text_table(result: dict[str, Any]) -> list[str]:
    rows = [_SIZE_HEADER, *_size_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_SIZE_HEADER))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _part_title(name: str, part: dict[str, Any]) -> str:
    threshold = part.get("threshold_gbps")
    judged = f"judged busbw {_fmt(part.get('judged_busbw_gbps'), 3)} GB/s"
    against = f" (threshold {_fmt(threshold, 3)} GB/s)" if threshold is not None else ""
    return f"{name}: {part.get('verdict')}, {judged}{against}"


def clique_parts(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(title, part) for every clique and every cross-clique sweep of a grouped run."""
    parts = [
        (_part_title(f"clique {c['group']} ({', '.join(c['nodes'])})", c), c)
        for c in result.get("cliques") or []
    ]
    for key, part in (result.get("inter_clique") or {}).items():
        parts.append((_part_title(f"across cliques, {key}", part), part))
    return parts


def worst_lines(result: dict[str, Any]) -> list[str]:
    """Which clique and which node to look at first (grouped runs only)."""
    worst = result.get("worst_clique")
    if not worst:
        return []
    node = result.get("worst_node")
    return [
        f"worst clique: {worst['group']} ({', '.join(worst['nodes'])}), {worst['verdict']}, "
        f"judged busbw {_fmt(worst['judged_busbw_gbps'], 3)} GB/s",
        f"worst node: {node['pod']} (rank {node['rank']}): {node['why']}"
        if node
        else "worst node: none stands out (no NVML problem, no straggler)",
    ]


def verify_table(result: dict[str, Any]) -> str:
    """A plain-text table of the sweep and the verdict, for terminals and logs."""
    lines = _text_table(result)
    for title, part in clique_parts(result):
        lines += ["", title, *_text_table(part)]
    lines += ["", *worst_lines(result)] if result.get("worst_clique") else []
    lines[:0] = [*headline(result), ""]
    lines += [
        "",
        _threshold_line(result),
        f"judged busbw: {gbps(result.get('judged_busbw_gbps'))} GB/s, "
        f"peak {gbps(result.get('peak_busbw_gbps'))} GB/s, "
        f"world size {result.get('world_size')}, backend {result.get('backend')}",
        f"verdict: {result.get('verdict')}",
        *(f"  - {reason}" for reason in result.get("reasons", [])),
    ]
    return "\n".join(lines)


def _fabric(fabric: Any) -> str:
    if not fabric:
        return "fabric: not reported (no NVLink fabric seen)"
    if isinstance(fabric, dict):
        return "fabric: " + ", ".join(f"{k} {v}" for k, v in fabric.items())
    return f"fabric: {fabric}"


def check_rows(result: dict[str, Any]) -> list[list[str]]:
    """(check, status, what it said) for each check of the verdict."""
    return [
        [c["name"], c["status"], "; ".join(c.get("messages") or [])]
        for c in result.get("checks") or []
    ]


def verdict_lines(result: dict[str, Any]) -> list[str]:
    """The verdict as a short table for logs: each judged check with its status, the ones
    not judged on one line."""
    rows = [r for r in check_rows(result) if r[1] != NOT_JUDGED]
    width = max((len(r[0]) for r in rows), default=0)
    lines = [f"{name.ljust(width)}  {status}  {said}".rstrip() for name, status, said in rows]
    skipped = [r[0] for r in check_rows(result) if r[1] == NOT_JUDGED]
    return lines + ([f"not judged: {', '.join(skipped)}"] if skipped else [])


def verify_blocks(result: dict[str, Any], png: str | None = None) -> list[doc.Block]:
    """The verification report: the verdict first, then the figures, the plot, the tables."""
    topo = result.get("topology") or {}
    head = headline(result)
    return [
        doc.Heading(f"NVLink verification: {result.get('verdict')}"),
        doc.Verdict(f"{head[0]}; {head[1]}", good=result.get("verdict") == PASS),
        doc.Items(
            [
                head[2],
                nccl_line(result),
                f"world size {result.get('world_size')}, backend {result.get('backend')}, "
                f"wall {_fmt(result.get('wall_s'))} s",
                _threshold_line(result),
                f"judged busbw {gbps(result.get('judged_busbw_gbps'))} GB/s, "
                f"peak {gbps(result.get('peak_busbw_gbps'))} GB/s",
                f"NVLink: {topo.get('active_links', 0)} active links x "
                f"{_fmt(topo.get('link_speed_gbps'), 3)} GB/s "
                f"(NVLink {_fmt(topo.get('nvlink_version'))}), "
                f"link limit {_fmt(topo.get('link_limit_gbps'))} GB/s",
                _fabric(topo.get("fabric")),
                *worst_lines(result),
            ],
            strong=1,
        ),
        doc.Plot(png, "all-reduce bus bandwidth by message size"),
        doc.Heading("Checks", 2),
        doc.Table(["check", "status", "said"], check_rows(result)),
        doc.Heading("Bus bandwidth by message size", 2),
        doc.Table(_SIZE_HEADER, _size_rows(result)),
        *(
            block
            for title, part in clique_parts(result)
            for block in (doc.Heading(title, 2), doc.Table(_SIZE_HEADER, _size_rows(part)))
        ),
        doc.Heading("Reasons", 2),
        doc.Items(result.get("reasons") or ["none"]),
    ]


def verify_markdown(result: dict[str, Any]) -> str:
    return doc.markdown(verify_blocks(result))


def draw_plot(
    path: str,
    title: str,
    series: Sequence[tuple[str, list[float], list[float]]],
    *,
    xlabel: str,
    ylabel: str,
    log2_x: bool = False,
    hline: float | None = None,
    note: str = "",
    xlim: tuple[float, float] | None = None,
) -> bool:
    """Draw line series to a PNG (``note`` written across it); False without matplotlib."""
    plt = _pyplot()
    if plt is None:
        logger.warning("matplotlib not installed: %s not drawn", os.path.basename(path))
        return False
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, xs, ys in series:
        ax.plot(xs, ys, marker="o", label=label)
    if log2_x:
        ax.set_xscale("log", base=2)
        # Message sizes read better as 1 MiB, 64 MiB, 4 GiB than as powers of two.
        ax.xaxis.set_major_formatter(lambda x, _pos: human_bytes(int(x)) if x >= 1 else "")
    if xlim is not None and xlim[0] < xlim[1]:
        ax.set_xlim(*xlim)  # the swept sizes, also when no line is drawn
    if hline is not None:
        ax.axhline(hline, color="red", linestyle="--", label=f"threshold {gbps(hline)}")
    if note:
        text = note.replace("; ", ";\n")
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", wrap=True)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    if series or hline is not None:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return True


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def preload_plotting() -> None:
    """Import matplotlib in a background thread. A step calls this before it waits for its
    Job, so the import (most of a report's time) overlaps the wait instead of following
    the verdict; the report itself is drawn as before, after the Job."""
    threading.Thread(target=_pyplot, name="mnnvl-preload-plotting", daemon=True).start()


def write_file(out_dir: str, name: str, content: Any) -> str:
    """Write ``content`` (text, else JSON) to ``out_dir/name``; return the path."""
    path = os.path.join(out_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(content if isinstance(content, str) else json.dumps(content, indent=2) + "\n")
    return path


CTRF_FILE = "verify.ctrf.json"
# RESULT key -> (file, description): one value per file, for Argo output parameters.
KEY_FIGURES = {
    "verdict": ("verdict.txt", "PASS, FAIL or NOT_JUDGED"),
    "judged_busbw_gbps": ("judged_busbw_gbps.txt", "judged all-reduce busbw, GB/s"),
    "threshold_gbps": ("threshold_gbps.txt", "threshold applied, GB/s ('' when not judged)"),
    "threshold_source": ("threshold_source.txt", "user, baseline, derived or none"),
}


def busbw_plot(result: dict[str, Any]) -> tuple[list[tuple[str, list[float], list[float]]], str]:
    """(series, note) of the busbw plot. A sweep with nothing to show (one rank: busbw is 0
    by definition) draws no line at zero but says why it was not judged."""
    sizes = result.get("sizes", [])
    series = [("busbw", [r["bytes"] for r in sizes], [r["busbw_gbps"] for r in sizes])]
    if result.get("verdict") != NOT_JUDGED:
        return series, ""
    why = next((r for r in result.get("reasons", []) if r.startswith(NOT_JUDGED)), NOT_JUDGED)
    return (series if any(r["busbw_gbps"] for r in sizes) else []), why


def write_preflight_report(
    rows: list[dict[str, str]], out_dir: str, start_s: float, wall_s: float
) -> dict[str, str]:
    """Write preflight.json (the rows) and preflight.ctrf.json (CTRF); return their paths."""
    from mnnvl import ctrf

    os.makedirs(out_dir, exist_ok=True)
    report = ctrf.preflight_report(rows, start_s, wall_s)
    return {
        "json": write_file(out_dir, "preflight.json", rows),
        "ctrf": write_file(out_dir, "preflight.ctrf.json", report),
    }


def write_verify_report(result: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Write verify.json, verify.md, verify.ctrf.json (CTRF), busbw.png and verify.html,
    and the key figures one per file (``KEY_FIGURES``); return the reports' paths."""
    from mnnvl import ctrf

    os.makedirs(out_dir, exist_ok=True)
    files = {"json": write_file(out_dir, "verify.json", result)}
    files["ctrf"] = write_file(out_dir, CTRF_FILE, ctrf.verify_report(result))
    for key, (name, _) in KEY_FIGURES.items():
        # One line each (Argo trims the newline off an output parameter read from a file).
        write_file(out_dir, name, ("" if result.get(key) is None else str(result[key])) + "\n")
    png = os.path.join(out_dir, "busbw.png")
    series, note = busbw_plot(result)
    swept = [r["bytes"] for r in result.get("sizes", [])]
    ranks = result.get("world_size")
    if draw_plot(
        png,
        f"all_reduce busbw ({ranks} rank{'' if ranks == 1 else 's'}): {result.get('verdict')}",
        series,
        xlabel="bytes per rank",
        ylabel="GB/s",
        log2_x=True,
        hline=result.get("threshold_gbps"),
        note=note,
        xlim=(min(swept), max(swept)) if swept else None,
    ):
        files["png"] = png
    blocks = verify_blocks(result, files.get("png"))
    files["markdown"] = write_file(out_dir, "verify.md", doc.markdown(blocks))
    title = f"NVLink verification: {result.get('verdict')}"
    files["html"] = write_file(out_dir, "verify.html", doc.page(title, blocks))
    return files
