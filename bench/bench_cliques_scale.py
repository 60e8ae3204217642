"""A run across NVLink cliques at scale on the simulated cluster: provision, launch, teardown.

One simulated cluster per size (``nodes`` nodes split into ``cliques`` clique labels, no GPUs);
the run places ``nodes / cliques`` nodes per clique group (one Indexed Job each, one Service)
and goes through the product's steps: ``steps.provision``, ``steps.launch`` (the driver's
lifecycle: create, one watch over every group's Jobs and pods, rank 0's RESULT) and
``steps.teardown``. The worker command is swapped for a trivial one (a torchrun start costs
seconds and ~300 MB per pod; 144 of them do not fit this machine), so the figures are the
control plane's: wall time, API requests per run (and per node: it must not grow faster
than linearly with the node count) and leaked objects (goal 0).

    python bench/bench_cliques_scale.py                 # 18/1, 36/2, 72/4, 144/8
    python bench/bench_cliques_scale.py --sizes 144x8

Asserts nothing; prints a Markdown table. Exit code 1 when a run failed or leaked.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from mnnvl import steps
from mnnvl.driver import workload as driver_workload
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster

# Group 0's index 0 is rank 0: it prints the RESULT the launcher reads.
TRIVIAL = [
    "python3",
    "-c",
    "import os\n"
    "if os.environ.get('MNNVL_GROUP_INDEX', '0') == '0' and "
    "os.environ['JOB_COMPLETION_INDEX'] == '0':\n"
    "    print('RESULT {\"ok\": true}')\n",
]


def _trivial_jobs(builder: Any) -> Any:
    def build(workload: WorkloadSpec, module: str, args: list[str]) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = builder(workload, module, args)
        for job in jobs:
            job["spec"]["template"]["spec"]["containers"][0]["command"] = TRIVIAL
        return jobs

    return build


def one_run(nodes: int, cliques: int) -> dict[str, Any]:
    run_id = f"scale-{nodes}x{cliques}"
    domain = DomainSpec(run_id=run_id, rct_timeout_s=300, delete_timeout_s=300)
    workload = from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="job",
        nodes=nodes,
        nodes_per_clique=nodes // cliques,
        max_nodes_per_clique=max(18, nodes // cliques),
        gpus_per_node=0,
        pods_running_timeout_s=600,
        job_timeout_s=600,
    )
    with SimCluster(nodes=nodes, cliques=cliques, local_gpus=[], imex_delay_s=0.2) as sim:
        kube = sim.kubeconfig_path
        before, start = sim.request_count, time.monotonic()
        steps.provision(domain, kubeconfig=kube)
        t_prov = time.monotonic()
        launched = steps.launch(workload, "unused", [], kubeconfig=kube)
        t_launch = time.monotonic()
        steps.teardown(domain, kubeconfig=kube)
        end = time.monotonic()
        requests = sim.request_count - before
        leaked = sim.objects()
    return {
        "nodes": nodes,
        "cliques": cliques,
        "jobs": workload.groups,
        "ok": launched.result == {"ok": True} and len(launched.pods) == nodes,
        "provision_s": t_prov - start,
        "launch_s": t_launch - t_prov,
        "teardown_s": end - t_launch,
        "wall_s": end - start,
        "requests": requests,
        "leaked": [f"{k} {ns}/{n}" for k, ns, n in leaked],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=["18x1", "36x2", "72x4", "144x8"])
    ns = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    driver_workload.indexed_jobs = _trivial_jobs(driver_workload.indexed_jobs)  # type: ignore[assignment]
    rows = []
    print(
        "| nodes | cliques | Jobs | provision s | launch s | teardown s | wall s | requests "
        "| requests/node | leaked | ok |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for size in ns.sizes:
        nodes, cliques = (int(x) for x in size.split("x"))
        row = one_run(nodes, cliques)
        rows.append(row)
        print(
            f"| {nodes} | {cliques} | {row['jobs']} | {row['provision_s']:.1f} | "
            f"{row['launch_s']:.1f} | {row['teardown_s']:.1f} | {row['wall_s']:.1f} | "
            f"{row['requests']} | {row['requests'] / nodes:.2f} | {len(row['leaked'])} | "
            f"{'yes' if row['ok'] else 'NO'} |",
            flush=True,
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        growth = (last["requests"] / first["requests"]) / (last["nodes"] / first["nodes"])
        print(
            f"\nrequests grew {last['requests'] / first['requests']:.2f}x for "
            f"{last['nodes'] / first['nodes']:.0f}x the nodes (ratio to linear {growth:.2f}; "
            "<= 1 is at most linear)"
        )
    return 0 if all(r["ok"] and not r["leaked"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
