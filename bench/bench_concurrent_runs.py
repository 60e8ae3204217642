"""100 runs provisioned and torn down at once (threads) against one simulated cluster.

Prints the wall time against a 10 s goal and the objects left behind against a goal of 0;
asserts nothing.

    python bench/bench_concurrent_runs.py [RUNS]
"""

from __future__ import annotations

import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from mnnvl import steps
from mnnvl.inputs.spec import DomainSpec
from mnnvl.sim import SimCluster

RUNS = 100
GOAL_WALL_S = 10.0


def provision_and_teardown(run_id: str, kubeconfig: str) -> str:
    spec = DomainSpec(run_id=run_id, rct_timeout_s=60, delete_timeout_s=60)
    try:
        steps.provision(spec, kubeconfig=kubeconfig)
        return ""
    except Exception as e:  # counted and reported, not raised: teardown must still run
        return f"{run_id}: provision: {e}"
    finally:
        steps.teardown(spec, kubeconfig=kubeconfig)


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    with SimCluster(nodes=2) as sim:
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=runs) as pool:
            errors = [
                e
                for e in pool.map(
                    provision_and_teardown,
                    [f"conc-{i:03d}" for i in range(runs)],
                    [sim.kubeconfig_path] * runs,
                )
                if e
            ]
        wall = time.monotonic() - start
        leaked = sim.objects()
        requests = sim.request_count
    for e in errors[:5]:
        print(f"error: {e}", file=sys.stderr)
    print(
        f"runs={runs} wall_s={wall:.2f} goal_s={GOAL_WALL_S:g} ratio={wall / GOAL_WALL_S:.2f} "
        f"leaked={len(leaked)} goal_leaked=0 errors={len(errors)} requests={requests}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
