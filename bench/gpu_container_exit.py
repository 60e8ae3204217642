"""On a GPU, through the simulated cluster: a pod's main process SIGKILLed while its worker (in
a session of its own) holds 80 GiB of GPU memory and a port. Is the memory free, and the worker
gone, when the pod is reported Failed, and does the retried pod (which could not fit beside a
live worker) run? The pod runs the programs of tests/sim/test_container_exit.py, its listener
holding GPU memory first. Prints one ``GPUEXIT {json}`` line.

    python -m bench.gpu_container_exit
"""

import json
import os
import subprocess
import tempfile
import time

import kubernetes

from mnnvl.ports import free_port
from mnnvl.sim import SimCluster
from tests.sim.simkit import wait_for
from tests.sim.test_container_exit import LISTENER, alive, exit_job, launcher, pid_line

GIB = 80  # two of these do not fit on one H200: a retry next to a live worker would OOM
CHILD = (
    "import os, torch\n"
    "x = torch.ones(int(os.environ['GIB']) * 2**30, dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\n"
) + LISTENER


def smi() -> dict:
    def query(what: str, fmt: str) -> str:
        cmd = ["nvidia-smi", f"--query-{what}", f"--format={fmt}"]
        return subprocess.run(cmd, capture_output=True, text=True).stdout

    return {
        "memory_used_mib": query("gpu=memory.used", "csv,noheader,nounits").split(),
        "apps": query("compute-apps=pid,used_memory", "csv,noheader").strip(),
    }


def main() -> None:
    env = {"PORT": str(free_port()), "FLAG": os.path.join(tempfile.mkdtemp(), "flag"), "GIB": GIB}
    container = {
        "name": "main",
        "image": "sim",
        "command": ["python3", "-c", launcher(CHILD)],
        "env": [{"name": k, "value": str(v)} for k, v in env.items()],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    out: dict = {"before": smi()}
    with SimCluster(nodes=1, gpus_per_node=1) as sim:
        out["local_gpus"] = sim.local_gpus
        admin = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        kubernetes.client.BatchV1Api(admin).create_namespaced_job(
            "default", exit_job("gpu", container)
        )

        def pods() -> list:
            return [
                p
                for p in sim.store.list("pods")[0]
                if p["metadata"]["labels"].get("job-name") == "gpu"
            ]

        first = wait_for(pods, 120, "the pod")[0]["metadata"]["name"]
        main_pid, child = wait_for(lambda: pid_line(sim, first, "main"), 120, "GPU memory held")
        out["running"] = smi()
        out["processes_running"] = sim.processes("job-name=gpu")
        t0 = time.monotonic()
        os.kill(main_pid, 9)
        while True:
            pod = sim.store.find("pods", "default", first)
            if pod["status"].get("phase") == "Failed":
                break
            time.sleep(0.005)
        t1 = time.monotonic()
        out["at_failed"] = smi()
        out["child_alive_at_failed"] = alive(child)
        out["kill_to_failed_s"] = round(t1 - t0, 3)
        out["exit_code"] = pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
        while True:
            j = sim.store.find("jobs", "default", "gpu")
            conds = {
                c["type"]
                for c in (j.get("status") or {}).get("conditions") or []
                if c["status"] == "True"
            }
            if conds & {"Complete", "Failed"}:
                break
            if time.monotonic() - t1 > 180:
                conds = {"timeout"}
                break
            time.sleep(0.05)
        out["job"] = sorted(conds)
        out["kill_to_job_done_s"] = round(time.monotonic() - t0, 3)
        out["logs"] = {
            p["metadata"]["name"]: sim.pod_log("default", p["metadata"]["name"]) for p in pods()
        }
        out["processes_after"] = sim.processes("job-name=gpu")
        out["after"] = smi()
    out["after_stop"] = smi()
    print("GPUEXIT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
