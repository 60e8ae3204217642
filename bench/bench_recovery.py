"""Recovery from a lost or hung worker, through the pod's launcher (``mnnvl.runtime.launch``).

Three kinds of run of the same training (same seed, checkpoints every ``--every`` steps):

* uninterrupted, twice: the run-to-run noise floor of the final loss;
* rank 1 SIGKILLed after step ``--fail-at`` (a lost worker), then the same command started
  again at once, as the Job's restart of every pod does: the time from the kill to the first
  step the restarted run finished, the steps lost, and its final loss against the
  uninterrupted one;
* rank 1 SIGSTOPped after step ``--fail-at`` (a hung worker): the time until the pod's
  launcher exits (a collective timeout, 11, or the stall watchdog, 12) with
  ``--collective-timeout-s``.

CPU (2 gloo workers) by default; ``--gpus 2`` runs NCCL on two GPUs. Prints a table and one
JSON line.

    python bench/bench_recovery.py [--gpus 2 --model 1b --steps 60 --every 20 --fail-at 30]

Cluster time (pod deletion, scheduling, image start) comes on top; the simulator's end-to-end
figure is printed by ``tests/sim/test_fault_matrix.py -k restart`` in its result.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mnnvl.contract.result import parse_result
from mnnvl.runtime.train import SIGNAL_AT_ENV

STEP_LINE = re.compile(r"step (\d+) loss ([0-9.]+)")


def command(args: argparse.Namespace, ckpt: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "mnnvl.runtime.launch", f"--nproc-per-node={args.gpus or 2}",
        "-m", "mnnvl.runtime.train", "--model", args.model, "--steps", str(args.steps),
        "--checkpoint-dir", ckpt, "--checkpoint-every", str(args.every), "--log-every", "1",
        "--collective-timeout-s", str(args.collective_timeout_s), *extra,
    ]  # fmt: skip


def run(cmd: list[str], signal_at: str = "") -> tuple[int, dict[str, Any] | None, list[tuple]]:
    """Exit code, RESULT and (monotonic time, step) of every logged step."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(SIGNAL_AT_ENV, None)
    if signal_at:
        env[SIGNAL_AT_ENV] = signal_at
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    steps = []
    for line in proc.stderr or ():
        m = STEP_LINE.search(line)
        if m:
            steps.append((time.monotonic(), int(m.group(1))))
        if "test hook" in line:
            steps.append((time.monotonic(), -1))  # the moment of the failure
    out = proc.stdout.read() if proc.stdout else ""
    code = proc.wait()
    return code, parse_result(out), steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--fail-at", type=int, default=25)
    parser.add_argument("--collective-timeout-s", type=float, default=10)
    args = parser.parse_args()
    if not args.gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    plain = [run(command(args, str(tmp / f"plain-{i}")))[1] or {} for i in (0, 1)]
    noise = abs(plain[0]["final_loss"] - plain[1]["final_loss"])
    ckpt = str(tmp / "killed")
    code, _, before = run(command(args, ckpt), signal_at=f"{args.fail_at}:1:SIGKILL")
    failed_at = next(t for t, s in before if s == -1)
    last_step = max(s for _, s in before)
    _, resumed, after = run(command(args, ckpt))
    resumed = resumed or {}
    recovery_s = after[0][0] - failed_at
    stop_code, _, stopped = run(
        command(args, str(tmp / "stopped")), signal_at=f"{args.fail_at}:1:SIGSTOP"
    )
    stop_s = time.monotonic() - next(t for t, s in stopped if s == -1)
    figures = {
        "device": f"{args.gpus} GPU" if args.gpus else "cpu (2 gloo workers)",
        "model": args.model,
        "killed_exit_code": code,
        "resumed_from_step": resumed.get("start_step"),
        "steps_lost": last_step - int(resumed.get("start_step") or 0),
        "failure_to_resumed_step_s": round(recovery_s, 2),
        "final_loss_uninterrupted": plain[0]["final_loss"],
        "final_loss_resumed": resumed.get("final_loss"),
        "noise_floor": noise,
        "resumed_minus_uninterrupted": (resumed.get("final_loss") or 0) - plain[0]["final_loss"],
        "stopped_exit_code": stop_code,
        "stop_to_pod_exit_s": round(stop_s, 2),
        "collective_timeout_s": args.collective_timeout_s,
    }
    for key, value in figures.items():
        print(f"{key:28} {value}")
    print(json.dumps(figures))
    return 0 if resumed.get("start_step") else 1


if __name__ == "__main__":
    sys.exit(main())
