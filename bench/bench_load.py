"""Load on one simulated cluster, through the product's driver, with random API errors.

Part 1, ``--runs`` (100) concurrent runs, each provision → launch → teardown: provision and
teardown are ``mnnvl.steps``; launch creates the product's Service and 2-pod Indexed Job, its
torchrun command swapped for a trivial one, and waits with the driver's Job lifecycle
(``wait_for_job``: Job/pod/queue-aware) (a torchrun start costs seconds and ~300 MB per pod).
Meanwhile ``--error-rate`` (5 %) of API requests fail with 500 or 429 (``Retry-After: 1``) and
the same share of watches is answered 410 Gone. Prints completed runs, leaked objects (goal 0),
p50/p99 latency per step and API requests per run.

Part 2, ``--pairs`` (1000) concurrent provision+teardown pairs without injected errors: wall time,
peak RSS of the simulator, leaked objects (goal 0).

The simulator runs in a child process, so its peak RSS (``VmHWM``) and request count are its own.
Asserts nothing; prints one ``key=value`` line per part.

    python bench/bench_load.py [--runs 100] [--pairs 1000] [--error-rate 0.05]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from mnnvl import steps
from mnnvl.driver.api import JOB, SERVICE, Api
from mnnvl.driver.lifecycle import wait_for_job
from mnnvl.driver.ownership import create_or_adopt
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.manifests import headless_service, indexed_job

TRIVIAL = ["python3", "-c", "print('RESULT {\"ok\": true}')"]
MODULE = "mnnvl.runtime.train"


def simulator(conn: Connection, nodes: int, error_rate: float) -> None:
    """Child process: one SimCluster until told to stop; then its counts and peak RSS."""
    from mnnvl.sim import SimCluster

    logging.basicConfig(level=logging.ERROR)
    with SimCluster(nodes=nodes, local_gpus=[], imex_delay_s=0.1) as sim:
        if error_rate:
            sim.faults.random_errors(error_rate, (500, 429), watch_expiry_rate=error_rate)
        conn.send(sim.kubeconfig_path)
        conn.recv()
        sim.faults.random_errors(0.0)
        conn.send(
            {
                "requests": sim.request_count,
                "injected": sum(n for (_, res), n in sim.request_counts.items() if res == "fault"),
                "leaked": sim.objects(),
                "peak_rss_mib": peak_rss_mib(),
            }
        )


def peak_rss_mib() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def launch(workload: WorkloadSpec, kubeconfig: str) -> None:
    """The product's Service and Job (its command swapped for a trivial one), then the
    driver's Job lifecycle wait for callers that create their own Job (``wait_for_job``)."""
    api = Api.connect(kubeconfig)
    try:
        job = indexed_job(workload, MODULE, [])
        job["spec"]["template"]["spec"]["containers"][0]["command"] = TRIVIAL
        job["spec"]["template"]["spec"]["containers"][0].pop("args", None)
        create_or_adopt(api, SERVICE, headless_service(workload))
        create_or_adopt(api, JOB, job)
        wait_for_job(api, workload, job["metadata"]["name"])
    finally:
        api.close()


def one_run(run_id: str, kubeconfig: str, with_launch: bool) -> dict[str, Any]:
    """Step latencies of one run, or the error that stopped it (teardown always runs)."""
    domain = DomainSpec(run_id=run_id, rct_timeout_s=120, delete_timeout_s=120)
    workload = from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="job",
        nodes=2,
        gpus_per_node=0,
        pods_running_timeout_s=120,
        job_timeout_s=120,
    )
    out: dict[str, Any] = {"error": ""}
    try:
        start = time.monotonic()
        steps.provision(domain, kubeconfig=kubeconfig)
        out["provision"] = time.monotonic() - start
        if with_launch:
            start = time.monotonic()
            launch(workload, kubeconfig)
            out["launch"] = time.monotonic() - start
    except Exception as e:  # counted and reported: teardown must still run
        out["error"] = f"{run_id}: {type(e).__name__}: {e}"
    start = time.monotonic()
    try:
        steps.teardown(domain, kubeconfig=kubeconfig)
        out["teardown"] = time.monotonic() - start
    except Exception as e:
        out["error"] = out["error"] or f"{run_id}: teardown: {type(e).__name__}: {e}"
    return out


def part(name: str, runs: int, nodes: int, error_rate: float, with_launch: bool) -> str:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=simulator, args=(child, nodes, error_rate), daemon=True)
    proc.start()
    kubeconfig = parent.recv()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=runs) as pool:
        run_ids = [f"{name}-{i:04d}" for i in range(runs)]
        results = list(pool.map(lambda run_id: one_run(run_id, kubeconfig, with_launch), run_ids))
    wall = time.monotonic() - start
    parent.send("stop")
    sim = parent.recv()
    proc.join(timeout=60)
    errors = [r["error"] for r in results if r["error"]]
    for e in errors[:5]:
        print(f"error: {e}", file=sys.stderr)
    fields = [
        f"part={name}",
        f"runs={runs}",
        f"completed={runs - len(errors)}",
        f"wall_s={wall:.1f}",
        f"leaked={len(sim['leaked'])} goal_leaked=0",
        f"requests_per_run={sim['requests'] / runs:.1f}",
        f"injected_errors={sim['injected']}",
        f"sim_peak_rss_mib={sim['peak_rss_mib']:.0f}",
    ]
    for step in ("provision", "launch", "teardown"):
        times = sorted(r[step] for r in results if step in r)
        if times:
            p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
            fields.append(f"{step}_p50_s={statistics.median(times):.2f} {step}_p99_s={p99:.2f}")
    return " ".join(fields)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--error-rate", type=float, default=0.05)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if args.runs:
        print(part("load", args.runs, 2 * args.runs, args.error_rate, with_launch=True), flush=True)
    if args.pairs:
        print(part("pairs", args.pairs, 2, 0.0, with_launch=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
