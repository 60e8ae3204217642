"""API requests one run issues against the simulated cluster (provision, 18-node launch, teardown).

The driver waits with watches, never by polling, so the count should not grow with the time
the IMEX daemons take to come up. Prints one line per setting; asserts nothing.

    python bench/bench_api_requests.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from mnnvl import steps
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster

GOAL = 40
NODES = 18
BASE_IMEX_DELAY_S = 0.2
TRIVIAL = 'import os\nif os.environ["JOB_COMPLETION_INDEX"] == "0":\n    print("RESULT {}")\n'


def one_run(imex_delay_s: float, module_dir: str) -> tuple[int, float]:
    with SimCluster(nodes=NODES, imex_delay_s=imex_delay_s) as sim:
        run_id = f"bench-{int(imex_delay_s * 1000)}"
        domain = DomainSpec(run_id=run_id)
        workload = from_inputs(
            WorkloadSpec,
            run_id=run_id,
            purpose="job",
            nodes=NODES,
            gpus_per_node=0,
            env={"PYTHONPATH": module_dir},
            pods_running_timeout_s=300,
            job_timeout_s=600,
        )
        before, start = sim.request_count, time.monotonic()
        steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        steps.launch(workload, "bench_trivial", [], kubeconfig=sim.kubeconfig_path)
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
        return sim.request_count - before, time.monotonic() - start


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "bench_trivial.py").write_text(TRIVIAL)
        for factor in (1, 10):
            delay = BASE_IMEX_DELAY_S * factor
            n, wall = one_run(delay, tmp)
            print(
                f"imex_delay_s={delay:g} requests={n} goal={GOAL} ratio={n / GOAL:.2f} "
                f"wall_s={wall:.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
