"""Verification vs nccl-tests, measured side by side on the same GPUs, minutes apart.

Builds ``all_reduce_perf`` from an nccl-tests checkout (``--nccl-tests-src``; fetch
github.com/NVIDIA/nccl-tests yourself, it is not part of this repository) against the NCCL
library torch loads, so both sides use one library; then runs ``python -m
mnnvl.runtime.verify`` (one process per GPU, started by the worker pods' own command: the
Job's container command with its ``$(VAR)``s filled in for one node, i.e. ``python -m
mnnvl.runtime.launch``; and, for comparison, by plain torchrun) and ``all_reduce_perf -g N``
one after the other, ``--runs``
times each, and prints per size the median busbw of each side and their ratio, plus time
to verdict (process start to the RESULT line) per launcher against the whole nccl-tests
process, verify's own phase breakdown and each size's share of the sweep. Both sides:
float32 sum, in place, the same sizes (1 MiB..4 GiB, factor 2).

    python bench/bench_anchor.py --nccl-tests-src ../nccl-tests [--runs 2] [--json-out F]
        [--launchers launch,torchrun]

On one GPU both sides run (proving the build and the parsing) but busbw is 0 by
definition and the ratios mean nothing; the table says so. Exit code 0 when every run
produced its numbers.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from mnnvl.contract.result import RESULT_PREFIX, parse_result
from mnnvl.manifests.workload import VERIFY_MODULE
from mnnvl.manifests.workload import command as workload_command
from mnnvl.runtime.local import free_port, torchrun_command

GOAL_VERDICT_RATIO = 2.0  # time to verdict <= 2 x the nccl-tests sweep
ACCURACY_FROM = 64 << 20  # sizes judged for the +-2 % accuracy goal


def nccl_home(work: str) -> tuple[str, str]:
    """(a directory with include/nccl.h and lib/libnccl.so, the libnccl.so.2 torch loads)."""
    import torch

    torch.cuda.nccl.version()  # makes sure libnccl.so.2 is loaded into this process
    with open("/proc/self/maps", encoding="utf-8") as f:
        maps = f.read()
    libs = sorted({ln.split()[-1] for ln in maps.splitlines() if "libnccl.so" in ln})
    if not libs:
        raise SystemExit("torch did not load a libnccl.so: is this a CUDA build of torch?")
    lib = libs[0]
    base = os.path.dirname(os.path.dirname(lib))
    headers = glob.glob(os.path.join(base, "include", "nccl.h")) + glob.glob("/usr/include/nccl.h")
    if not headers:
        raise SystemExit(f"no nccl.h next to {lib} nor in /usr/include")
    home = os.path.join(work, "nccl-home")
    os.makedirs(os.path.join(home, "lib"), exist_ok=True)
    link = os.path.join(home, "lib", "libnccl.so")
    if not os.path.exists(link):
        os.symlink(lib, link)
    include = os.path.join(home, "include")
    if not os.path.exists(include):
        os.symlink(os.path.dirname(headers[0]), include)
    return home, lib


def build(src: str, work: str) -> tuple[str, str, float]:
    """Build all_reduce_perf for sm_90; return (binary, libnccl path, build seconds)."""
    home, lib = nccl_home(work)
    out = os.path.join(work, "build")
    binary = os.path.join(out, "all_reduce_perf")
    started = time.monotonic()
    cmd = [
        "make", "-C", os.path.join(src, "src"), f"-j{os.cpu_count() or 4}", binary,
        "MPI=0", f"NCCL_HOME={home}", f"BUILDDIR={out}",
        "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit("building all_reduce_perf failed")
    return binary, lib, round(time.monotonic() - started, 1)


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+float\s+sum\s+-?\d+\s+(.+)$")


def parse_nccl_tests(text: str) -> dict[int, dict[str, float]]:
    """bytes -> {time_us, busbw_gbps} of the in-place columns (verify sums in place)."""
    rows: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        cols = m.group(3).split()
        # out-of-place: time algbw busbw #wrong; in-place: time algbw busbw #wrong
        in_place = cols[4:8]
        rows[int(m.group(1))] = {"time_us": float(in_place[0]), "busbw_gbps": float(in_place[2])}
    return rows


def run_nccl_tests(binary: str, lib: str, gpus: int, max_bytes: str) -> dict[str, Any]:
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(lib), NCCL_DEBUG="VERSION")
    cmd = [binary, "-b", "1M", "-e", max_bytes, "-f", "2", "-g", str(gpus), "-d", "float",
           "-o", "sum", "-c", "1"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    text = proc.stdout + proc.stderr
    version = re.search(r"NCCL version (\S+)", text)
    if proc.returncode != 0:
        sys.stderr.write(text[-4000:])
        raise SystemExit(f"all_reduce_perf exited {proc.returncode}")
    return {
        "wall_s": round(wall, 2),
        "rows": parse_nccl_tests(proc.stdout),
        "nccl": version.group(1) if version else "unknown",
    }


def launch_command(launcher: str, args: list[str], gpus: int) -> list[str]:
    """``launch``: what a worker pod runs, the Job's container command for node 0 of one
    with its ``$(VAR)``s expanded as the kubelet would; ``torchrun``: plain torchrun."""
    if launcher == "torchrun":
        return torchrun_command(VERIFY_MODULE, args, gpus)
    if launcher != "launch":
        raise SystemExit(f"unknown launcher {launcher!r}: launch or torchrun")
    env = {"NNODES": "1", "NPROC_PER_NODE": str(gpus), "JOB_COMPLETION_INDEX": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    pod = workload_command(VERIFY_MODULE, args)
    expanded = [re.sub(r"(?<!\$)\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], a) for a in pod]
    expanded = [a.replace("$$", "$") for a in expanded]
    return [sys.executable if expanded[0] == "python3" else expanded[0], *expanded[1:]]


def run_verify(gpus: int, max_bytes: str, extra: list[str], launcher: str) -> dict[str, Any]:
    """Run the verification; time to the RESULT line and to process exit."""
    args = ["--max-bytes", max_bytes, "--min-busbw-gbps", "1", *extra]
    with tempfile.TemporaryDirectory() as out:
        cmd = launch_command(launcher, [*args, "--output-dir", out], gpus)
        launched_unix, started = time.time(), time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen: dict[str, float] = {}
        err: list[str] = []
        drain = threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True)
        drain.start()
        lines = []
        for line in proc.stdout or []:
            lines.append(line)
            if line.startswith(RESULT_PREFIX):
                seen["verdict"] = time.monotonic() - started
        proc.wait()
        drain.join(10)
        wall = time.monotonic() - started
    result = parse_result("".join(lines))
    if result is None:
        sys.stderr.write("".join(err)[-6000:])
        raise SystemExit(f"verify printed no RESULT (exit code {proc.returncode})")
    worker_start = result.get("started_unix")
    result.setdefault("timings_s", {})["launcher_start"] = (
        round(worker_start - launched_unix, 3) if worker_start else 0.0
    )
    return {
        "launcher": launcher,
        "wall_s": round(wall, 2),
        "to_verdict_s": round(seen.get("verdict", wall), 2),
        "result": result,
        "nccl_log_version": next(
            (m.group(1) for ln in err if (m := re.search(r"NCCL version (\S+)", ln))), None
        ),
    }


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else 0.0


def size_table(verifies: list[dict[str, Any]], anchors: list[dict[str, Any]]) -> list[dict]:
    rows = []
    for row in verifies[0]["result"]["sizes"]:
        size = row["bytes"]
        ours = [next(r for r in v["result"]["sizes"] if r["bytes"] == size) for v in verifies]
        theirs = [a["rows"][size]["busbw_gbps"] for a in anchors if size in a["rows"]]
        mine = _median([r["busbw_gbps"] for r in ours])
        ref = _median(theirs)
        rows.append(
            {
                "bytes": size,
                "verify_busbw": [r["busbw_gbps"] for r in ours],
                "nccl_tests_busbw": theirs,
                "paths": sorted({r.get("path", "?") for r in ours}),
                "ratio": round(mine / ref, 3) if ref else None,
            }
        )
    return rows


def print_report(summary: dict[str, Any]) -> None:
    w = sys.stdout.write
    w(f"GPUs {summary['gpus']}; verify NCCL {summary['verify_nccl']} "
      f"(transport {summary['transport']}); all_reduce_perf NCCL {summary['anchor_nccl']} "
      f"({summary['libnccl']}); nccl-tests build {summary['build_s']} s\n")  # fmt: skip
    if summary["gpus"] < 2:
        w("ONE GPU: busbw is 0 by definition; the ratios below mean nothing (path check only)\n")
    w(f"{'size':>12} {'verify GB/s (runs)':>26} {'nccl-tests GB/s (runs)':>26} {'ratio':>6}\n")
    for r in summary["sizes"]:
        ours = "/".join(f"{v:.1f}" for v in r["verify_busbw"])
        theirs = "/".join(f"{v:.1f}" for v in r["nccl_tests_busbw"])
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        w(f"{r['bytes']:>12} {ours:>26} {theirs:>26} {ratio:>6}  {','.join(r['paths'])}\n")
    anchor = summary["nccl_tests_wall_s"]
    w(f"nccl-tests sweep, whole process (runs): {anchor} s\n")
    for name, t in summary["time"].items():
        w(f"verify via {name}: time to verdict (runs) {t['to_verdict_s']} s, whole process "
          f"{t['wall_s']} s; ratio to nccl-tests {t['ratio']} (goal <= {GOAL_VERDICT_RATIO})\n"
          f"  phases (s, median): {json.dumps(t['phases'])}\n")  # fmt: skip
    w(f"sweep per size (ms, median): {json.dumps(summary['size_wall_ms'])}\n")


def size_walls(verifies: list[dict[str, Any]]) -> dict[str, float]:
    walls: dict[str, list[float]] = {}
    for v in verifies:
        for row in v["result"]["sizes"]:
            walls.setdefault(str(row["bytes"]), []).append(row["wall_ms"])
    return {size: _median(values) for size, values in walls.items()}


def timing(verifies: list[dict[str, Any]], launcher: str, anchor_wall: list[float]) -> dict:
    mine = [v for v in verifies if v["launcher"] == launcher]
    to_verdict = [v["to_verdict_s"] for v in mine]
    names = mine[0]["result"].get("timings_s", {})
    return {
        "to_verdict_s": to_verdict,
        "wall_s": [v["wall_s"] for v in mine],
        "ratio": round(_median(to_verdict) / _median(anchor_wall), 2),
        "phases": {k: _median([v["result"]["timings_s"].get(k, 0.0) for v in mine]) for k in names},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nccl-tests-src", required=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-bytes", default="4G")
    parser.add_argument("--gpus", type=int, default=0, help="0 = every local GPU")
    parser.add_argument("--json-out", default="")
    parser.add_argument(
        "--launchers", default="launch,torchrun", help="launch (the pods' command), torchrun"
    )
    parser.add_argument("--verify-args", default="", help="extra verify flags, space-separated")
    args = parser.parse_args()
    import torch

    gpus = args.gpus or torch.cuda.device_count()
    launchers = args.launchers.split(",")
    with tempfile.TemporaryDirectory() as work:
        binary, lib, build_s = build(os.path.abspath(args.nccl_tests_src), work)
        verifies, anchors = [], []
        for _ in range(args.runs):  # alternately, so drift hits both sides alike
            for launcher in launchers:
                verifies.append(
                    run_verify(gpus, args.max_bytes, args.verify_args.split(), launcher)
                )
            anchors.append(run_nccl_tests(binary, lib, gpus, args.max_bytes))
    anchor_wall = [a["wall_s"] for a in anchors]
    first = verifies[0]["result"]
    summary = {
        "bench": "anchor",
        "gpus": gpus,
        "libnccl": lib,
        "build_s": build_s,
        "verify_nccl": (first.get("nccl") or {}).get("version"),
        "transport": (first.get("nccl") or {}).get("transport"),
        "anchor_nccl": anchors[0]["nccl"],
        "sizes": size_table(verifies, anchors),
        "nccl_tests_wall_s": anchor_wall,
        "time": {name: timing(verifies, name, anchor_wall) for name in launchers},
        "size_wall_ms": size_walls(verifies),
        "verdicts": [v["result"]["verdict"] for v in verifies],
    }
    print_report(summary)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
