"""The training report (JSON, Markdown, a loss plot, HTML) and what each fault cost.

A fault is one gang restart's record (``TrainResult.faults``): which pod, node, rank and GPU
failed and why (``how``, ``exit_code``, ``reason``, ``evidence``), whether its node was kept out
(``excluded``), and what it cost in seconds from the fault (``detect_s``: seen by the launcher,
``restart_s``: every rank restarted, ``recovery_s``: the first resumed step) and in steps
(``steps_lost``: steps done again). A record shows whichever of these keys it has; a missing one
reads "—". ``goodput`` is productive training time over the train step's wall time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from mnnvl import report_doc as doc
from mnnvl.report import draw_plot, num, verdict_numbers, write_file

MISSING = "—"
# Figure -> (file, description): one value per file, for Argo output parameters.
TRAIN_FIGURES = {
    "goodput": ("goodput.txt", "productive training time / the train step's wall time"),
    "restarts": ("restarts.txt", "gang restarts of the train step"),
    "faults": ("faults.json", "each restart: what failed, when, what it cost (JSON list)"),
    "evictions": ("evictions.txt", "admissions Kueue took back from the train step"),
}
# Record key -> column title; the first columns name the fault, the last four its cost.
FAULT_COLUMNS = {
    "n": "#",
    "at": "when (UTC)",
    "how": "what failed",
    "pod": "pod",
    "node": "node",
    "rank": "rank",
    "gpu": "GPU",
    "exit_code": "exit code",
    "reason": "reason",
    "evidence": "evidence",
    "excluded": "node kept out",
    "detect_s": "detected after s",
    "restart_s": "gang restarted after s",
    "recovery_s": "first resumed step after s",
    "steps_lost": "steps redone",
}
# Always shown: what failed where and what it cost, also while a record lacks them.
_ALWAYS = frozenset(
    ["n", "at", "node", "gpu", "evidence", "detect_s", "restart_s", "recovery_s", "steps_lost"]
)


def cell(key: str, value: Any) -> str:
    """One value of a fault record as text; ``None`` or absent is "—"."""
    if value is None or value == "" or value == []:
        return MISSING
    if key == "at" and isinstance(value, (int, float)) and value > 1e9:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {cell(k, v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "; ".join(cell(key, v) for v in value)
    return str(value)


def fault_table(faults: list[dict[str, Any]]) -> doc.Table:
    """One row per restart: the columns always shown plus any other key a record has."""
    keys = [k for k in FAULT_COLUMNS if k in _ALWAYS or any(k in f for f in faults)]
    rows = [
        [cell(k, f.get(k, i + 1 if k == "n" else None)) for k in keys] for i, f in enumerate(faults)
    ]
    return doc.Table([FAULT_COLUMNS[k] for k in keys], rows)


def fault_line(fault: dict[str, Any], n: int) -> str:
    """A restart in one line for the run summary: what failed, where, what it cost."""
    if fault.get("runtime"):  # a TrainJob's runtime restarted it: the step sees the count alone
        where = f"by the {fault['runtime']}'s runtime"
        return f"restart {fault.get('n', n)}: {where} (its cost is in the goodput)"

    def get(key: str) -> str:
        return cell(key, fault.get(key))

    what = " ".join(
        part
        for part in (
            get("how") if "how" in fault else "",
            f"pod {get('pod')} on node {get('node')} (rank {get('rank')}, GPU {get('gpu')})",
            f"exit code {get('exit_code')}" if fault.get("exit_code") is not None else "",
            f"({get('reason')})" if fault.get("reason") else "",
        )
        if part
    )
    kept_out = "; its node kept out" if fault.get("excluded") else ""
    return (
        f"restart {fault.get('n', n)} at {get('at')}: {what}; "
        f"evidence: {get('evidence')}{kept_out}; "
        f"detected after {get('detect_s')} s, gang restarted after {get('restart_s')} s, "
        f"first resumed step after {get('recovery_s')} s; steps redone: {get('steps_lost')}"
    )


def goodput(raw: dict[str, Any], wall_s: float) -> float | None:
    """Productive training time over the train step's wall time: every step of the run at the
    rate measured while training (checkpoint stalls excluded), less the time steps lost beside
    background saves (``checkpoint_lost_s``), so start-up, compiling, checkpoints, each fault's
    detection and restart and every step done again count as lost. None when the result lacks
    the figures."""
    rate, tokens = raw.get("tokens_per_s"), 1
    for key in ("steps", "batch_size", "seq_len", "world_size"):
        part = raw.get(key)
        if not isinstance(part, int) or part <= 0:
            return None
        tokens *= part
    if not rate or wall_s <= 0:
        return None
    productive_s = tokens / rate - float(raw.get("checkpoint_lost_s") or 0.0)
    return round(min(1.0, max(0.0, productive_s) / wall_s), 4)


def goodput_line(result: dict[str, Any]) -> str:
    """The goodput, the restarts, Kueue's evictions (when there were any) and the steps
    redone, from a result's ``goodput``, ``faults`` and ``evictions``."""
    value = result.get("goodput")
    faults = result.get("faults") or []
    restarts = f"{len(faults)} restart{'' if len(faults) == 1 else 's'}"
    in_place = sum(f.get("how") == "in-place" for f in faults)
    restarts += f" ({in_place} in place)" if in_place else ""
    restarts += f", {evictions_words(result)}" if result.get("evictions") else ""
    redone = sum(f.get("steps_lost") or 0 for f in faults)
    share = MISSING if value is None else f"{value:.0%}"
    return f"goodput {share} of the train step's wall time; {restarts}, steps redone: {redone}"


def evictions_words(result: dict[str, Any]) -> str:
    """``N eviction(s) by Kueue``: admissions taken back (the pods deleted, the step queued
    again); an eviction is no restart."""
    n = int(result.get("evictions") or 0)
    return f"{n} eviction{'' if n == 1 else 's'} by Kueue"


def summary_lines(tasks: Mapping[str, dict[str, Any] | None]) -> list[str]:
    """The run in a few lines, one per task's result (by task name) and one per restart with
    its cost; the same on ``mnnvl run`` and ``make run``."""
    lines = []
    for name, task in tasks.items():
        if not task:
            continue
        if "verdict" in task:
            text = f"{task['verdict']}, {verdict_numbers(task.get('raw') or task)}"
        elif "steps" in task:
            text = (
                f"{num(task['steps'])} steps, loss {num(task['final_loss'], 4)}, "
                f"{num(task['tokens_per_s'], 0)} tokens/s; {goodput_line(task)}"
            )
        else:  # a team's own program (its TrainJob, the launch step's Job)
            text = f"{task['job']}: exit code {task.get('exit_code')}, {num(task['elapsed_s'])} s"
        lines.append(f"{name:<12} {text}")
        lines += [f"{'':<12} {fault_line(f, n)}" for n, f in enumerate(task.get("faults") or [], 1)]
    return lines


_METRICS = (
    "model",
    "steps",
    "start_step",
    "resume_source",
    "resume_load_s",
    "final_loss",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_mem_gib",
    "world_size",
    "params",
    "device",
    "wall_s",
    "checkpoint",
)


def _metric_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = [[k, "-" if result[k] is None else num(result[k], 4)] for k in _METRICS if k in result]
    if "compile" in result:
        rows.append(["compile", f"{result['compile']} (--compile {result.get('compile_input')})"])
    stall = result.get("checkpoint_stall_s")
    if stall:
        wait = result.get("checkpoint_final_wait_s")
        rows.append(
            [
                "checkpoint_stall_s",
                f"last {stall['last']:.3f}, max {stall['max']:.3f} ({stall['saves']} saves); "
                f"the last write waited for {'-' if wait is None else f'{wait:.3f}'} s",
            ]
        )
    mesh = result.get("mesh")
    if mesh:
        shape = " x ".join(f"{n} {d}" for n, d in zip(mesh["shape"], mesh["dims"], strict=True))
        rows.append(["mesh", f"{mesh['sharding']}: {shape}"])
    return rows


def train_blocks(result: dict[str, Any], png: str | None = None) -> list[doc.Block]:
    """The training report: outcome and goodput first, the loss plot, each restart, metrics."""
    faults = result.get("faults") or []
    restarts: list[doc.Block] = [fault_table(faults)] if faults else []
    if result.get("evictions"):
        words = f"{evictions_words(result)}: its pods were deleted and it queued again"
        restarts.append(doc.Items([words]))
    return [
        doc.Heading("Training run"),
        doc.Items(
            [
                f"{result.get('steps')} steps of {result.get('model')}, "
                f"final loss {num(result.get('final_loss'), 4)}, "
                f"{num(result.get('tokens_per_s'), 0)} tokens/s",
                goodput_line(result),
            ],
            strong=2,
        ),
        doc.Plot(png, "training loss by step"),
        doc.Heading("Restarts", 2),
        *(restarts or [doc.Items(["none: every rank ran start to end"])]),
        doc.Heading("Metrics", 2),
        doc.Table(["metric", "value"], _metric_rows(result)),
    ]


def train_markdown(result: dict[str, Any]) -> str:
    return doc.markdown(train_blocks(result))


def write_train_report(result: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Write train.json, train.md, loss.png and train.html, and the figures one per file
    (``TRAIN_FIGURES``); return the reports' paths. ``result``: the worker's RESULT, with the
    launcher's ``faults`` and ``goodput`` when it has them."""
    os.makedirs(out_dir, exist_ok=True)
    files = {"json": write_file(out_dir, "train.json", result)}
    losses = result.get("losses") or []
    png = os.path.join(out_dir, "loss.png")
    if losses and draw_plot(
        png,
        f"training loss ({result.get('model', '')})",
        [("loss", [float(p[0]) for p in losses], [float(p[1]) for p in losses])],
        xlabel="step",
        ylabel="loss",
    ):
        files["png"] = png
    faults = result.get("faults") or []
    figures = {
        "goodput": result.get("goodput"),
        "restarts": len(faults),
        "faults": faults,
        "evictions": int(result.get("evictions") or 0),
    }
    for key, (name, _) in TRAIN_FIGURES.items():
        value = figures[key]
        text = json.dumps(value) if key == "faults" else "" if value is None else str(value)
        write_file(out_dir, name, text + "\n")  # Argo trims the newline off a parameter
    blocks = train_blocks(result, files.get("png"))
    files["markdown"] = write_file(out_dir, "train.md", doc.markdown(blocks))
    files["html"] = write_file(out_dir, "train.html", doc.page("Training run", blocks))
    return files
