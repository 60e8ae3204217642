"""Benchmark ``python -m mnnvl.runtime.train`` on this machine's GPUs: tokens/s and MFU.

Runs torchrun with one process per local GPU on synthetic data, then prints tokens/s,
tokens/s per GPU, MFU, and MFU as a ratio to the 45 % goal and to torchtitan's published
33-39 % bf16 anchor (Llama 3.1 8B, FSDP, H100). The last stdout line is one JSON object;
``--json-out F`` also appends it to F.

    python bench/bench_train.py --preset 1b --batch 4 --seq 2048 --compile --steps 30

Exit code 0 when the run produced a RESULT line, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from mnnvl.runtime.result import parse_result, torchrun_command

MFU_GOAL = 0.45
TORCHTITAN_MFU = (0.33, 0.39)


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def run_train(args: argparse.Namespace, nproc: int) -> dict[str, Any]:
    cmd = torchrun_command("mnnvl.runtime.train", [
        "--model", args.preset, "--batch-size", str(args.batch), "--seq-len", str(args.seq),
        "--steps", str(args.steps), "--log-every", str(args.log_every),
        "--warmup-steps", "2", "--compile" if args.compile else "--no-compile",
        "--activation-checkpointing" if args.ac else "--no-activation-checkpointing",
    ], nproc)  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=dict(os.environ))
    wall = time.monotonic() - started
    result = parse_result(proc.stdout)
    if result is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-8000:])
        raise SystemExit(f"no RESULT line (exit code {proc.returncode})")
    sys.stderr.write("".join(ln + "\n" for ln in proc.stderr.splitlines() if " step " in ln))
    return {"result": result, "wall_s": round(wall, 1)}


def summarize(args: argparse.Namespace, nproc: int, run: dict[str, Any]) -> dict[str, Any]:
    res = run["result"]
    mfu = res.get("mfu")
    return {
        "bench": "train",
        "preset": args.preset,
        "gpus": nproc,
        "batch_per_gpu": args.batch,
        "seq_len": args.seq,
        "compile": args.compile,
        "activation_checkpointing": args.ac,
        "steps": args.steps,
        "tokens_per_s": round(res["tokens_per_s"], 1),
        "tokens_per_s_per_gpu": round(res["tokens_per_s_per_gpu"], 1),
        "mfu": None if mfu is None else round(mfu, 4),
        "mfu_vs_goal": None if mfu is None else round(mfu / MFU_GOAL, 3),
        "mfu_vs_torchtitan": None
        if mfu is None
        else [round(mfu / TORCHTITAN_MFU[1], 3), round(mfu / TORCHTITAN_MFU[0], 3)],
        "final_loss": res["final_loss"],
        "peak_mem_gib": round(res["peak_mem_gib"], 2),
        "params": res["params"],
        "wall_s": run["wall_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--batch", type=int, default=4, help="sequences per GPU per step")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--ac", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--nproc", type=int, default=0, help="GPUs to use (0 = all)")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    nproc = args.nproc or _gpu_count()
    if nproc < 1:
        print("no CUDA GPUs found", file=sys.stderr)
        return 1
    summary = summarize(args, nproc, run_train(args, nproc))
    mfu = summary["mfu"]
    print(
        f"{args.preset} on {nproc} GPU(s): {summary['tokens_per_s']:.0f} tok/s, "
        f"{summary['tokens_per_s_per_gpu']:.0f} tok/s/GPU, MFU "
        + ("n/a" if mfu is None else f"{mfu:.1%} ({summary['mfu_vs_goal']:.2f}x the 45% goal)"),
        file=sys.stderr,
    )
    line = json.dumps(summary)
    if args.json_out:
        with open(args.json_out, "a") as fh:
            fh.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
