"""Wall time of ``make run`` (the local end-to-end pipeline run); goal <= 30 s on 2 cores.

There is no anchor: the setup a speed-up could be stated against (kfp.local with a fresh
virtualenv per task) needs package downloads this benchmark does not make, and a figure
typed in from another day and machine is no anchor. This runs
``python -m mnnvl.pipelines.local_run`` in a fresh process (as ``make run`` does) ``--repeat``
times and prints the median wall time, its ratio to the goal, the median
time of each pipeline step (from the run's own stage lines: start-up before the first
step, provision, verify-pre, train, verify-post, teardown), the CPU seconds the whole run
used (every process it started: the steps, the pods, their workers; a figure a shared
machine barely changes, unlike the wall time) and the machine's load average before and
after, since a shared machine slows every step.

Usage: python bench/bench_make_run.py [--repeat N] [-- extra local_run flags]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_S = 30.0
_STAGE = re.compile(r"^\[\s*([\d.]+)s\] ([\w-]+): (started|SUCCESS|FAILED|\w+)$")


def step_split(stderr: str, wall: float) -> dict[str, float]:
    """Seconds per pipeline step from the ``[  12.3s] verify-pre: started`` stage lines."""
    started: dict[str, float] = {}
    split: dict[str, float] = {}
    first, last = None, 0.0
    for line in stderr.splitlines():
        m = _STAGE.match(line.strip())
        if not m or m.group(2) == "pipeline":
            continue
        t, step, what = float(m.group(1)), m.group(2), m.group(3)
        if what == "started":
            started[step] = t
            first = t if first is None else first
        elif step in started:
            split[step] = round(t - started[step], 2)
            last = max(last, t)
    return {"startup": round(first or 0.0, 2), **split, "after": round(max(0.0, wall - last), 2)}


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_once(extra: list[str]) -> tuple[float, int, dict[str, float]]:
    """Wall time, exit code and split of one run; the split's ``cpu`` is the CPU seconds of
    the whole process tree (each process is counted when its parent reaps it)."""
    with tempfile.TemporaryDirectory(prefix="mnnvl-bench-run-") as out:
        cmd = [sys.executable, "-m", "mnnvl.pipelines.local_run", "--out", out, *extra]
        cpu_before, start = _children_cpu_s(), time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.monotonic() - start
        split = step_split(proc.stderr, wall)
        split["cpu"] = round(_children_cpu_s() - cpu_before, 1)
        return wall, proc.returncode, split


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("extra", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    extra = [a for a in args.extra if a != "--"]
    walls: list[float] = []
    splits: list[dict[str, float]] = []
    load_before = os.getloadavg()[0]
    for i in range(args.repeat):
        wall, rc, split = run_once(extra)
        sys.stderr.write(f"run {i + 1}: {wall:.1f} s (exit {rc}) {json.dumps(split)}\n")
        if rc != 0:
            sys.stderr.write("local run failed; see its --out log\n")
            return rc
        walls.append(wall)
        splits.append(split)
    load_after = os.getloadavg()[0]
    best, median = min(walls), statistics.median(walls)
    steps = {k: round(statistics.median(s.get(k, 0.0) for s in splits), 2) for k in splits[0]}
    sys.stdout.write(
        f"make run: median {median:.1f} s over {len(walls)} run(s) (best {best:.1f} s); "
        f"goal {GOAL_S:.0f} s -> ratio {median / GOAL_S:.2f} "
        f"({'met' if median <= GOAL_S else 'MISSED'}); load average {load_before:.1f} before, "
        f"{load_after:.1f} after ({os.cpu_count()} cores)\n"
        f"per step (median s; cpu = CPU seconds of the whole run): {json.dumps(steps)}\n"
    )
    result = {
        "bench": "make_run",
        "best_s": round(best, 2),
        "median_s": round(median, 2),
        "walls_s": [round(w, 2) for w in walls],
        "steps_s": steps,
        "goal_s": GOAL_S,
        "goal_met": median <= GOAL_S,
        "cpu_s": [s["cpu"] for s in splits],
        "load_average": [round(load_before, 1), round(load_after, 1)],
        "cores": os.cpu_count(),
    }
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
