"""Wall time of ``make run`` (the local end-to-end pipeline run); goal <= 60 s.

Anchor: running the same four-task pipeline through kfp.local with a fresh virtualenv per
task (``SubprocessRunner(use_venv=True)``, the default) took about 83 s. This runs
``python -m mnnvl.pipelines.local_run`` in a fresh process (as ``make run`` does) and prints
the wall time and its ratio to the anchor and to the goal.

Usage: python bench/bench_make_run.py [--repeat N] [-- extra local_run flags]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

ANCHOR_S = 83.0
GOAL_S = 60.0


def run_once(extra: list[str]) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="mnnvl-bench-run-") as out:
        cmd = [sys.executable, "-m", "mnnvl.pipelines.local_run", "--out", out, *extra]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return time.monotonic() - start, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("extra", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    extra = [a for a in args.extra if a != "--"]
    walls: list[float] = []
    for i in range(args.repeat):
        wall, rc = run_once(extra)
        sys.stderr.write(f"run {i + 1}: {wall:.1f} s (exit {rc})\n")
        if rc != 0:
            sys.stderr.write("local run failed; see its --out log\n")
            return rc
        walls.append(wall)
    best, median = min(walls), statistics.median(walls)
    sys.stdout.write(
        f"make run: best {best:.1f} s, median {median:.1f} s over {len(walls)} run(s); "
        f"anchor {ANCHOR_S:.0f} s -> {ANCHOR_S / best:.2f}x faster; "
        f"goal {GOAL_S:.0f} s -> {'met' if best <= GOAL_S else 'MISSED'}\n"
    )
    result = {
        "bench": "make_run",
        "best_s": round(best, 2),
        "median_s": round(median, 2),
        "anchor_s": ANCHOR_S,
        "speedup_vs_anchor": round(ANCHOR_S / best, 2),
        "goal_s": GOAL_S,
        "goal_met": best <= GOAL_S,
    }
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
