"""A gang restart end to end on the simulated cluster: a fault in one pod mid-training, with
the default recovery inputs, to the first step the restarted run finished.

Faults: ``kill`` (SIGKILL to every process of the pod: a lost worker), ``stop`` (SIGSTOP: a hung
one, found by the collective timeout), ``kill-main`` (SIGKILL to the pod's main process only,
its workers alive: the container takes them down with it). The anchor is the fault itself:
the benchmark prints fault → failure seen by the driver → first resumed step, the steps
redone since the last checkpoint, and that the run finished with nothing left (objects and
processes). On a GPU it also reads the GPU memory still in use when the faulted pod is
reported Failed (it must be free for its replacement).

    python bench/bench_gang_restart.py --fault kill                        # CPU, tiny model
    python bench/bench_gang_restart.py --fault kill-main --nodes 1 --gpus-per-node 1 --model 1b
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import threading
import time
from typing import Any

import kubernetes

from mnnvl import steps
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, WorkloadSpec
from mnnvl.sim import SimCluster

CLAIM, MOUNT = "ckpt", "/ckpt"


def gpu_memory_used_mib() -> list[int]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(v) for v in out.split()]


def main_pid(sim: SimCluster, pod: str) -> int:
    """The pod's main process: the one whose command is the pod's launcher."""
    for _, name, pid in sim.processes():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if name == pod and b"mnnvl.runtime.launch" in f.read():
                return pid
    raise RuntimeError(f"no launcher process for pod {pod}")


class Seen(logging.Handler):
    """When the driver logged that it restarts the gang."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.at is None and "restarting every rank" in record.getMessage():
            self.at = record.created


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fault", choices=("kill", "stop", "kill-main"), default="kill")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", type=int, default=0)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--fault-after-s", type=float, default=3.0, help="after the first checkpoint")
    p.add_argument("--collective-timeout-s", type=float, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    seen = Seen()
    logging.getLogger("mnnvl").addHandler(seen)
    run_id = f"bench-{args.fault}-{os.getpid()}"
    with SimCluster(nodes=args.nodes, gpus_per_node=args.gpus_per_node) as sim:
        admin = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        claim = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
        kubernetes.client.CoreV1Api(admin).create_namespaced_persistent_volume_claim(
            "default", {"metadata": {"name": CLAIM}, "spec": claim}
        )
        kube = sim.kubeconfig_path
        domain = DomainSpec(run_id=run_id)
        workload = WorkloadSpec(
            run_id=run_id, purpose="train", nodes=args.nodes,
            gpus_per_node=args.gpus_per_node, pvc=(f"{CLAIM}:{MOUNT}",),
        )  # fmt: skip
        timeouts = {} if args.collective_timeout_s is None else {
            "collective_timeout_s": args.collective_timeout_s
        }  # fmt: skip
        config = TrainConfig(
            model=args.model, steps=args.steps, log_every=1,
            checkpoint_dir=f"{MOUNT}/{run_id}", checkpoint_every=args.every, **timeouts,
        )  # fmt: skip
        steps.provision(domain, kubeconfig=kube)
        out: dict[str, Any] = {}

        def train() -> None:
            try:
                out["result"] = steps.train(workload, config, kubeconfig=kube)
            except Exception as e:  # reported in the JSON line, with its exit code
                out["error"] = e

        thread = threading.Thread(target=train, daemon=True)
        thread.start()
        latest = os.path.join(sim.pvc_dir("default", CLAIM), run_id, "latest")
        while not os.path.exists(latest) and thread.is_alive():
            time.sleep(0.1)
        time.sleep(args.fault_after_s)
        job = RunNames.for_run(run_id).job("train")
        index = args.nodes - 1
        victim = next(
            p["metadata"]["name"]
            for p in sim.store.list("pods", "default")[0]
            if p["metadata"]["name"].startswith(f"{job}-{index}-")
            and p["status"].get("phase") == "Running"
        )
        fault_at = time.time()
        if args.fault == "kill-main":
            os.kill(main_pid(sim, victim), signal.SIGKILL)
        else:
            sim.signal_pod(
                "default", victim, signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP
            )
        failed_gpu: list[int] = []
        while thread.is_alive() and not failed_gpu:
            pod = sim.store.find("pods", "default", victim)
            if pod is None or pod["status"].get("phase") == "Failed":
                failed_gpu = gpu_memory_used_mib() or [-1]
            time.sleep(0.05)
        thread.join()
        steps.teardown(domain, kubeconfig=kube)
        left = sim.objects(RunNames.for_run(run_id).selector)
        procs = sim.processes(RunNames.for_run(run_id).selector)
    result, error = out.get("result"), out.get("error")
    detected_s = None if seen.at is None else round(seen.at - fault_at, 2)
    recovery = None if result is None else result.recovery_s
    summary = {
        "fault": args.fault, "model": args.model, "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node, "ok": result is not None,
        "exit_code": getattr(error, "exit_code", 0 if error is None else 1),
        "error": None if error is None else str(error)[:400],
        "restarts": None if result is None else result.restarts,
        "start_step": None if result is None else result.start_step,
        "steps_lost": None if result is None else result.steps_lost,
        "fault_to_detected_s": detected_s,
        "fault_to_first_resumed_step_s": None if detected_s is None or recovery is None
        else round(detected_s + recovery, 2),
        "gpu_memory_used_mib_when_failed": failed_gpu[:8],
        "objects_left": len(left), "processes_left": len(procs),
    }  # fmt: skip
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
