"""HSDP across clique groups against one-group FSDP: same seed, same data, same loss curve?

Runs ``python -m mnnvl.runtime.train`` twice under torchrun with the same ranks: once as one
group (FSDP over all ranks), once with ``MNNVL_NUM_GROUPS`` set (HSDP: replicate across
groups, shard inside each), then prints both loss curves, the largest relative difference
against the 1e-3 goal, and tokens/s of both runs (HSDP / FSDP ratio). On CPU the ranks are
gloo processes; with GPUs one process per GPU (NCCL).

    python bench/bench_hsdp.py --nproc 4 --groups 2 --steps 20
    python bench/bench_hsdp.py --nproc 2 --groups 2 --model 1b --lr 3e-4 --noise-floor  # 2 GPUs
    python bench/bench_hsdp.py --nproc 2 --groups 2 --model 1b --lr 3e-4 --noise-floor \\
        --dtype fp32 --no-compile --batch-size 2  # 2 GPUs, fp32: a tighter floor

Options it does not know go to ``mnnvl.runtime.train``. Exit code 0 when the curves agree
within ``--rel``, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from mnnvl.contract.result import parse_result
from mnnvl.runtime.local import torchrun_command


def run(nproc: int, groups: int, ns: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MNNVL_NUM_GROUPS", None)
    if groups > 1:
        env["MNNVL_NUM_GROUPS"] = str(groups)
    args = ["--model", ns.model, "--steps", str(ns.steps), "--log-every", "1"]
    args += ["--lr", str(ns.lr), "--warmup-steps", str(ns.warmup_steps), *ns.train_args]
    cmd = torchrun_command("mnnvl.runtime.train", args, nproc=nproc)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    result = parse_result(proc.stdout)
    if proc.returncode or result is None:
        sys.exit(f"train ({groups} groups) failed:\n{proc.stderr[-3000:]}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rel", type=float, default=1e-3)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument(
        "--noise-floor",
        action="store_true",
        help="run one-group FSDP twice first and print how far two identical runs drift "
        "(GPU kernels are not bit-deterministic; compare the HSDP gap against it)",
    )
    ns, ns.train_args = parser.parse_known_args()  # the rest goes to mnnvl.runtime.train
    fsdp = run(ns.nproc, 1, ns)
    if ns.noise_floor:
        again = run(ns.nproc, 1, ns)
        pairs = zip(fsdp["losses"], again["losses"], strict=True)
        floor = max(abs(b - a) / abs(a) for (_, a), (_, b) in pairs)
        print(f"noise floor: FSDP run twice, largest relative difference {floor:.2e}")
    hsdp = run(ns.nproc, ns.groups, ns)
    print(
        f"FSDP mesh {fsdp['mesh']['shape']}, HSDP mesh {hsdp['mesh']['shape']} "
        f"({' x '.join(hsdp['mesh']['dims'])}), {fsdp['device']}"
    )
    print("| step | FSDP loss | HSDP loss | rel. diff |")
    print("|---:|---:|---:|---:|")
    worst = 0.0
    for (step, a), (_, b) in zip(fsdp["losses"], hsdp["losses"], strict=True):
        rel = abs(b - a) / abs(a)
        worst = max(worst, rel)
        print(f"| {step} | {a:.6f} | {b:.6f} | {rel:.2e} |")
    print(
        f"largest relative difference {worst:.2e} (goal <= {ns.rel:g}: "
        f"{'met' if worst <= ns.rel else 'MISSED'}); ratio to goal {worst / ns.rel:.3f}"
    )
    ratio = hsdp["tokens_per_s"] / fsdp["tokens_per_s"]
    print(
        f"tokens/s: FSDP {fsdp['tokens_per_s']:.0f}, HSDP {hsdp['tokens_per_s']:.0f} "
        f"(HSDP / FSDP {ratio:.2f})"
    )
    return 0 if worst <= ns.rel else 1


if __name__ == "__main__":
    sys.exit(main())
