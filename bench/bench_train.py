r"""Benchmark ``python -m mnnvl.runtime.train`` on this machine's GPUs: tokens/s, MFU, memory.

Runs torchrun with one process per local GPU on synthetic data, then prints tokens/s,
tokens/s per GPU, MFU (and as a ratio to the 45 % goal and to torchtitan's published
33-39 % bf16 anchor for Llama 3.1 8B on 8 x H100: not like for like, a different model
size, GPU count and GPU), peak memory and the step time split (forward, backward, optimizer,
other; each phase includes the communication its stream waited for).

``--variant`` (repeatable) runs several configurations one after the other and prints one
table: MFU and its change against the first variant, the split, peak memory, and the
largest relative loss difference against the first variant of the same preset, batch and
GPU count (same seed and data order, so a lever that changes the math shows up there). A
variant is ``label;key=value;...`` with keys ``preset``, ``batch`` (0 = the preset's),
``seq`` (0 = the preset's), ``compile`` (auto, true, false), ``ac`` (the training input
``--activation-checkpointing``: auto, none, full, every-N), ``reshard``
(``--reshard-after-forward``: auto, true, false), ``nproc`` and ``tuning`` (the
benchmark-only ``MNNVL_TRAIN_TUNING`` value, ``prefetch=N`` / ``optim=foreach``,
``,``-separated). Keys left out take the preset's training defaults, as a user's run does.
Where a 1-GPU variant of the same preset and batch ran, exposed communication is estimated
as the step time difference.

``--compare-loss`` runs the variants with the same seed and data, logs the loss at every
step, and prints each variant's loss beside the first's and the largest relative loss
difference against it (variants of another batch size see other data: their gap mixes the
data with the levers). List the first variant twice to see the run-to-run noise floor. Its
MFU column includes a host sync per step: take MFU from a run without ``--compare-loss``.

    python bench/bench_train.py --preset 1b --batch 8 --steps 20

    # the training table of bench/RESULTS.md (8b, 2 GPUs, 30 steps)
    python bench/bench_train.py --steps 30 --log-every 5 \
        --variant "base-ac;preset=8b;batch=2;ac=full;reshard=true" \
        --variant "no-ac-noreshard;preset=8b;batch=2;ac=none;reshard=false" \
        --variant "base-ac-b4;preset=8b;batch=4;ac=full;reshard=true" \
        --variant "sac-b4;preset=8b;batch=4;ac=every-2;reshard=true" \
        --variant "8b-defaults;preset=8b"

    # the 8b preset's defaults (batch 4, every-2, reshard false) against the old base
    # (full checkpointing, reshard true) at the same batch, same seed, 30 steps; the old
    # base twice for the noise floor, and the old shipped batch 2 (other data) last
    python bench/bench_train.py --steps 30 --compare-loss \
        --variant "old-base;preset=8b;batch=4;ac=full;reshard=true" \
        --variant "old-base-again;preset=8b;batch=4;ac=full;reshard=true" \
        --variant "8b-defaults;preset=8b" \
        --variant "old-base-b2;preset=8b;batch=2;ac=full;reshard=true"

Exit code 0 when every run produced a RESULT line, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from mnnvl.contract.result import parse_result
from mnnvl.runtime.local import torchrun_command

MFU_GOAL = 0.45
TORCHTITAN_MFU = (0.33, 0.39)
SAME_CONFIG = (
    "preset",
    "batch_per_gpu",
    "tuning",
    "activation_checkpointing",
    "reshard_after_forward",
)


def train_args(args: argparse.Namespace) -> list[str]:
    """The training flags of one variant; batch 0, seq 0 and auto leave it to the preset."""
    return [
        "--model", args.preset, "--batch-size", str(args.batch), "--seq-len", str(args.seq),
        "--steps", str(args.steps), "--log-every", str(args.log_every),
        "--warmup-steps", "2", "--compile", args.compile,
        "--activation-checkpointing", args.ac, "--reshard-after-forward", args.reshard,
    ]  # fmt: skip


def run_train(args: argparse.Namespace, nproc: int, tuning: str = "") -> dict[str, Any]:
    cmd = torchrun_command("mnnvl.runtime.train", train_args(args), nproc)
    env = dict(os.environ, MNNVL_TRAIN_TUNING=tuning)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.monotonic() - started
    result = parse_result(proc.stdout)
    if result is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-8000:])
        return {"error": f"no RESULT line (exit code {proc.returncode})", "wall_s": round(wall, 1)}
    sys.stderr.write("".join(ln + "\n" for ln in proc.stderr.splitlines() if " step " in ln))
    return {"result": result, "wall_s": round(wall, 1)}


def summarize(args: argparse.Namespace, nproc: int, run: dict[str, Any]) -> dict[str, Any]:
    res = run["result"]
    mfu = res.get("mfu")
    return {
        "bench": "train",
        "preset": args.preset,
        "gpus": nproc,
        "batch_per_gpu": res.get("batch_size", args.batch),
        "seq_len": res.get("seq_len", args.seq),
        "compile": res.get("compile", args.compile),
        "activation_checkpointing": res.get("activation_checkpointing", args.ac),
        "reshard_after_forward": res.get("reshard_after_forward"),
        "tuning": res.get("tuning"),
        "steps": args.steps,
        "tokens_per_s": round(res["tokens_per_s"], 1),
        "tokens_per_s_per_gpu": round(res["tokens_per_s_per_gpu"], 1),
        "mfu": None if mfu is None else round(mfu, 4),
        "mfu_vs_goal": None if mfu is None else round(mfu / MFU_GOAL, 3),
        "mfu_vs_torchtitan_not_like_for_like": None
        if mfu is None
        else [round(mfu / TORCHTITAN_MFU[1], 3), round(mfu / TORCHTITAN_MFU[0], 3)],
        "final_loss": res["final_loss"],
        "losses": res.get("losses"),
        "peak_mem_gib": round(res["peak_mem_gib"], 2),
        "step_split_ms": res.get("step_split_ms"),
        "params": res["params"],
        "wall_s": run["wall_s"],
    }


def parse_variant(text: str, base: argparse.Namespace) -> tuple[str, argparse.Namespace, str]:
    label, *items = text.split(";")
    ns = argparse.Namespace(**vars(base))
    tuning = ""
    for item in items:
        key, _, value = item.partition("=")
        if key == "tuning":
            tuning = value
        elif key in ("batch", "seq", "nproc"):
            setattr(ns, key, int(value))
        elif key == "compile":
            ns.compile = {"0": "false", "1": "true"}.get(value, value)
        elif key in ("preset", "ac", "reshard"):
            setattr(ns, key, value)
        else:
            raise SystemExit(f"--variant {text!r}: unknown key {key!r}")
    return label, ns, tuning


def loss_gap(a: list[list[float]] | None, b: list[list[float]] | None) -> float | None:
    """Largest relative difference of the losses logged at the same steps."""
    if not a or not b:
        return None
    other = {int(s): loss for s, loss in b}
    gaps = [abs(loss - other[int(s)]) / abs(loss) for s, loss in a if int(s) in other and loss]
    return round(max(gaps), 5) if gaps else None


def _split_text(split: dict[str, Any] | None) -> str:
    if not split:
        return "-"
    return "/".join(f"{split[k]:.0f}" for k in ("forward", "backward", "optimizer", "other"))


def print_table(rows: list[dict[str, Any]]) -> None:
    w = sys.stdout.write
    w(f"{'variant':<16} {'preset':>6} {'gpus':>4} {'batch':>5} {'MFU':>7} {'dMFU':>7} "
      f"{'tok/s/GPU':>10} {'peak GiB':>8} {'step ms':>8} {'fwd/bwd/opt/other ms':>22} "
      f"{'loss gap':>9} {'exposed comm ms':>15}\n")  # fmt: skip
    for r in rows:
        if "error" in r:
            w(f"{r['label']:<16} {r['error']}\n")
            continue
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        delta = "-" if r.get("dmfu") is None else f"{r['dmfu']:+.1%}"
        step = (r.get("step_split_ms") or {}).get("step", 0.0)
        gap = "-" if r.get("loss_gap") is None else f"{r['loss_gap']:.1e}"
        exposed = "-" if r.get("exposed_comm_ms") is None else f"{r['exposed_comm_ms']:.0f}"
        split = _split_text(r.get("step_split_ms"))
        w(f"{r['label']:<16} {r['preset']:>6} {r['gpus']:>4} {r['batch_per_gpu']:>5} {mfu:>7} "
          f"{delta:>7} {r['tokens_per_s_per_gpu']:>10.0f} {r['peak_mem_gib']:>8.1f} "
          f"{step:>8.0f} {split:>22} {gap:>9} {exposed:>15}\n")  # fmt: skip


def compare(rows: list[dict[str, Any]]) -> None:
    """dMFU vs the first row, loss gap vs the first row of the same preset and batch, and
    exposed communication against a 1-GPU row of the same preset and batch."""
    ok = [r for r in rows if "error" not in r]
    for r in ok:
        first = next(o for o in ok if o["preset"] == r["preset"])
        key = (r["preset"], r["batch_per_gpu"], r["gpus"])  # same data order: same seed, GPUs
        same = next(o for o in ok if (o["preset"], o["batch_per_gpu"], o["gpus"]) == key)
        if r["mfu"] is not None and first["mfu"] is not None:
            r["dmfu"] = round(r["mfu"] - first["mfu"], 4)
        r["loss_gap"] = loss_gap(same["losses"], r["losses"]) if same is not r else None
        one_gpu = [o for o in ok if o["gpus"] == 1 and all(o[k] == r[k] for k in SAME_CONFIG)]
        split = r.get("step_split_ms")
        single = one_gpu[0].get("step_split_ms") if one_gpu else None
        if r["gpus"] > 1 and split and single:
            r["exposed_comm_ms"] = round(split["step"] - single["step"], 1)


def print_loss_comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every variant's loss per logged step beside the first's; the largest relative gap."""
    ok = [r for r in rows if "error" not in r and r.get("losses")]
    if len(ok) < 2:
        sys.stdout.write("compare-loss: fewer than two variants produced losses\n")
        return []
    w, first = sys.stdout.write, ok[0]
    by_step = [{int(s): loss for s, loss in r["losses"]} for r in ok]
    w("step " + " ".join(f"{r['label'][:16]:>16}" for r in ok) + "\n")
    for step in sorted(by_step[0]):
        cells = (f"{losses.get(step, float('nan')):>16.4f}" for losses in by_step)
        w(f"{step:>4} " + " ".join(cells) + "\n")
    gaps = []
    for r in ok[1:]:
        gap = loss_gap(first["losses"], r["losses"])
        # Same seed, batch, sequence length and GPU count: the same tokens at every step.
        same = all(first[k] == r[k] for k in ("preset", "batch_per_gpu", "seq_len", "gpus"))
        data = "same data" if same else "other batch/seq/GPUs: other data"
        gaps.append({"label": r["label"], "vs": first["label"], "max_rel_loss_diff": gap})
        shown = "n/a" if gap is None else f"{gap:.2e}"
        w(f"largest relative loss difference, {r['label']} vs {first['label']} "
          f"over {len(by_step[0])} steps ({data}): {shown}\n")  # fmt: skip
    return gaps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument(
        "--batch", type=int, default=0, help="sequences per GPU per step (0 = the preset's)"
    )
    parser.add_argument("--seq", type=int, default=0, help="sequence length (0 = the preset's)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--compile", default="auto", help="auto (the input's default), true, false")
    parser.add_argument("--ac", default="auto", help="auto, none, full or every-N")
    parser.add_argument("--reshard", default="auto", help="reshard after forward: auto/true/false")
    parser.add_argument("--nproc", type=int, default=0, help="GPUs to use (0 = all)")
    parser.add_argument("--variant", action="append", default=[], help="see the docstring")
    parser.add_argument(
        "--compare-loss",
        action="store_true",
        help="log every step and print each variant's loss curve against the first's",
    )
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if args.compare_loss:
        if len(args.variant) < 2:
            parser.error("--compare-loss needs at least two --variant")
        args.log_every = 1
    import torch

    args.nproc = args.nproc or torch.cuda.device_count()
    if args.nproc < 1:
        print("no CUDA GPUs found", file=sys.stderr)
        return 1
    rows = []
    for text in args.variant or ["run"]:
        label, ns, tuning = parse_variant(text, args)
        run = run_train(ns, ns.nproc, tuning)
        row = {"label": label, "error": run["error"]} if "error" in run else {
            "label": label, **summarize(ns, ns.nproc, run)
        }  # fmt: skip
        rows.append(row)
        if args.json_out:
            with open(args.json_out, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    compare(rows)
    print_table(rows)
    if args.compare_loss:
        gaps = print_loss_comparison(rows)
        print(json.dumps({"compare_loss": gaps, "steps": args.steps}))
    print(json.dumps([{k: v for k, v in r.items() if k != "losses"} for r in rows]))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
