"""Kill-and-resume check for ``python -m mnnvl.runtime.train``.

Starts a training run with periodic checkpoints, SIGKILLs the whole torchrun process group
(what losing a pod does) once a step past a checkpoint has been logged, starts the same
command again and checks that the second run resumes from the checkpoint and that its loss
continues where the first run was, instead of starting over.

    python bench/bench_resume.py [--preset 1b --batch 8 --steps 40 --every 10 --kill-after 25]

Prints a table and one JSON line; exit code 0 when the run resumed from the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mnnvl.contract.result import parse_result
from mnnvl.runtime.local import torchrun_command
from mnnvl.sim.core.procs import descendants

STEP_LINE = re.compile(r"step (\d+) loss ([0-9.]+)")


def _command(args: argparse.Namespace, ckpt: str) -> list[str]:
    return torchrun_command("mnnvl.runtime.train", [
        "--model", args.preset, "--steps", str(args.steps), "--batch-size", str(args.batch),
        "--checkpoint-dir", ckpt, "--checkpoint-every", str(args.every),
        "--log-every", str(args.log_every), "--compile" if args.compile else "--no-compile",
    ], args.nproc)  # fmt: skip


def run_and_kill(cmd: list[str], kill_after: int) -> dict[int, float]:
    """Run until step ``kill_after`` is logged, then SIGKILL the process group."""
    losses: dict[int, float] = {}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    for line in proc.stderr or ():
        sys.stderr.write("run1| " + line)
        m = STEP_LINE.search(line)
        if m:
            losses[int(m.group(1))] = float(m.group(2))
            if int(m.group(1)) >= kill_after:
                kill_tree(proc.pid)
                break
    proc.wait()
    return losses


def kill_tree(pid: int) -> None:
    """SIGKILL torchrun and every worker (workers may run in sessions of their own)."""
    for victim in [pid, *descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            continue


def run_to_end(cmd: list[str]) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    sys.stderr.write("".join("run2| " + ln + "\n" for ln in proc.stderr.splitlines()))
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise SystemExit(f"resumed run failed with exit code {proc.returncode}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--kill-after", type=int, default=25)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mnnvl-resume-") as ckpt:
        first = run_and_kill(_command(args, ckpt), args.kill_after)
        # The run may have gone a little past the line we read before the kill landed:
        # the checkpoint to resume from is whatever the "latest" marker names now.
        marker = Path(ckpt, "latest")
        latest = marker.read_text().strip() if marker.exists() else "step-0"
        expected_start = int(latest.rsplit("-", 1)[-1])
        second = run_to_end(_command(args, ckpt))
    resumed = dict((int(s), float(v)) for s, v in second["losses"])
    common = sorted(set(first) & set(resumed) - {second["start_step"]})
    initial = first[min(first)]
    print(f"killed after step {max(first)}; resumed at step {second['start_step']}"
          f" (expected {expected_start}); first logged loss {initial:.4f}")  # fmt: skip
    for step in common:
        print(f"  step {step:4d}: before kill {first[step]:.4f}  after resume {resumed[step]:.4f}")
    worst = max((abs(first[s] - resumed[s]) for s in common), default=float("nan"))
    ok = 0 < expected_start == second["start_step"] and second["steps"] == args.steps
    ok = ok and bool(common) and worst < 0.1 * abs(initial - first[max(first)]) + 0.05
    summary = {
        "bench": "resume", "preset": args.preset, "killed_after": max(first),
        "start_step": second["start_step"], "expected_start": expected_start,
        "steps": second["steps"], "initial_loss": initial, "final_loss": second["final_loss"],
        "max_loss_gap_on_replayed_steps": worst, "ok": ok,
    }  # fmt: skip
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
