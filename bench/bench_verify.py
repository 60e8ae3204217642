"""Benchmark ``python -m mnnvl.runtime.verify`` on this machine's GPUs against nccl-tests.

Runs the verification through the pods' entry (``python -m mnnvl.runtime.launch``, one
process per GPU, exit codes kept) on all local GPUs with a 1 MiB..4 GiB sweep and prints
busbw per size, the transport NCCL used and the whole wall time from process start to
verdict. ``--degraded`` runs with ``NCCL_P2P_DISABLE=1`` (traffic through shared memory)
and expects FAIL with the transport named in the first reason. ``--nproc 1`` expects
NOT_JUDGED with exit code 4, and a plot that says so instead of a line at zero.
``--output-dir`` keeps the report files (JSON, Markdown, CTRF, PNG, HTML) for the record.
Ratios against nccl-tests come from ``bench/bench_anchor.py``, which runs ``all_reduce_perf``
beside the verification on the
same machine; no typed-in anchor figures here. The last stdout line is one JSON object.

    python bench/bench_verify.py [--degraded] [--nproc N] [--max-bytes 4G] [--json-out F]
        [--output-dir DIR]

e.g. on the GPU machine, results under $OUT:
    python bench/bench_verify.py --degraded --output-dir $OUT/p2p-off --json-out $OUT/p2p-off.json
    python bench/bench_verify.py --nproc 1 --max-bytes 64M --output-dir $OUT/one-gpu \
        --json-out $OUT/one-gpu.json

Exit code 0 when the verdict is the expected one, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from mnnvl.contract.result import parse_result
from mnnvl.runtime.local import pod_entry_command

WALL_GOAL_S = 20.0


def run_verify(nproc: int, max_bytes: str, degraded: bool, out_dir: str) -> dict[str, Any]:
    env = dict(os.environ)
    if degraded:
        env["NCCL_P2P_DISABLE"] = "1"
    cmd = pod_entry_command(
        "mnnvl.runtime.verify", ["--max-bytes", max_bytes, "--output-dir", out_dir], nproc
    )
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    result = parse_result(proc.stdout)
    if result is None:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"no RESULT line (exit code {proc.returncode})")
    return {"result": result, "wall_s": round(wall, 2), "returncode": proc.returncode}


def compare(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {k: row[k] for k in ("bytes", "time_us", "busbw_gbps", "correct", "path") if k in row}
        for row in result["sizes"]
    ]


def expectation(
    result: dict[str, Any], returncode: int, nproc: int, degraded: bool
) -> tuple[str, bool]:
    """(expected verdict, whether the run met it): P2P off must FAIL on the transport
    first; one GPU must be NOT_JUDGED with exit 4 and no zero line in its plot."""
    if degraded:
        first = (result.get("reasons") or [""])[0]
        return "FAIL", result["verdict"] == "FAIL" and first.startswith("transport: ")
    if nproc == 1:
        from mnnvl.report import busbw_plot

        series, note = busbw_plot(result)
        ok = result["verdict"] == "NOT_JUDGED" and returncode == 4
        return "NOT_JUDGED", ok and not series and note.startswith("NOT_JUDGED")
    return "PASS", result["verdict"] == "PASS" and returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=0, help="GPUs to use (0 = all local)")
    parser.add_argument("--max-bytes", default="4G")
    parser.add_argument("--degraded", action="store_true", help="NCCL_P2P_DISABLE=1; expect FAIL")
    parser.add_argument("--json-out", default="", help="also write the JSON summary here")
    parser.add_argument("--output-dir", default="", help="keep the report files here")
    args = parser.parse_args()
    import torch

    nproc = args.nproc or torch.cuda.device_count()
    if nproc < 1 or (nproc < 2 and args.degraded):
        raise SystemExit("needs a CUDA GPU (--degraded: at least 2)")
    with tempfile.TemporaryDirectory() as tmp:
        run = run_verify(nproc, args.max_bytes, args.degraded, args.output_dir or tmp)
    result = run["result"]
    rows = compare(result)
    nccl = result.get("nccl") or {}
    sys.stderr.write(f"NCCL {nccl.get('version')} over {nccl.get('transport')}\n")
    sys.stderr.write(f"{'bytes':>12} {'time_us':>10} {'busbw':>8} {'path':>7}\n")
    for r in rows:
        sys.stderr.write(
            f"{r['bytes']:>12} {r['time_us']:>10.1f} {r['busbw_gbps']:>8.1f} "
            f"{r.get('path', '-'):>7}\n"
        )
    expected, met = expectation(result, run["returncode"], nproc, args.degraded)
    summary = {
        "mode": "degraded" if args.degraded else "healthy",
        "nproc": nproc,
        "verdict": result["verdict"],
        "expected": expected,
        **{k: result[k] for k in ("reasons", "threshold_gbps", "threshold_source")},
        "judged_busbw_gbps": result["judged_busbw_gbps"],
        "wall_s": run["wall_s"],
        "wall_goal_s": WALL_GOAL_S,
        "in_process_wall_s": result["wall_s"],
        "returncode": run["returncode"],
        "expectation_met": met,
        **{k: result.get(k) for k in ("checks", "baseline", "threshold_margin", "nccl")},
        "timings_s": result.get("timings_s"),
        "sizes": rows,
        "topology": result["topology"],
    }
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    print(json.dumps(summary))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
