"""Time to compile every pipeline, component and Argo manifest (``make compile``).

Measures a cold compile in a fresh process (imports of kfp and hera included, what
``make compile`` pays) and warm in-process compiles into a scratch directory.

Usage: python bench/bench_compile.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cold_s() -> float:
    with tempfile.TemporaryDirectory(prefix="mnnvl-bench-compile-") as out:
        start = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "mnnvl.pipelines.compile", "--out", out],
            check=True,
            capture_output=True,
        )
        return time.monotonic() - start


def warm_s(repeat: int) -> tuple[list[float], int]:
    from mnnvl.pipelines import compile as mc

    mc.compile_all(Path(tempfile.mkdtemp(prefix="mnnvl-bench-warmup-")))
    walls: list[float] = []
    files = 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="mnnvl-bench-compile-") as out:
            start = time.monotonic()
            files = len(mc.compile_all(Path(out)))
            walls.append(time.monotonic() - start)
    return walls, files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cold = cold_s()
    warm, files = warm_s(args.repeat)
    sys.stdout.write(
        f"compile {files} files: cold (fresh process) {cold:.2f} s; warm median "
        f"{statistics.median(warm) * 1000:.0f} ms, best {min(warm) * 1000:.0f} ms "
        f"over {len(warm)} runs\n"
    )
    result = {
        "bench": "compile",
        "files": files,
        "cold_s": round(cold, 3),
        "warm_median_s": round(statistics.median(warm), 4),
        "warm_best_s": round(min(warm), 4),
    }
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
