"""Recovery cost of a lost worker, a hung one and a bad node, end to end on the simulated
cluster.

One training run per fault and recovery path through the product's train step (``steps.train``
against ``mnnvl.sim``: the driver, the Job, restarts, checkpoints on a PersistentVolumeClaim
every ``--every`` steps). ``--paths in-place,in-place-disk,recreated`` (the default) runs each
fault three times, side by side: restarted in place (the workers inside the pods, the default),
resuming from the host copy of the checkpoint in the pods' memory; restarted in place with no
host copy (``MNNVL_TRAIN_TUNING=hostcopy=off``), resuming from the checkpoint on the claim; and
with the pods recreated (``MNNVL_IN_PLACE_RESTARTS=0``, every pod deleted and made again,
resuming from the claim). ``--paths trainjob`` runs the step as a Kubeflow Trainer TrainJob
(``--workload trainjob``, the simulator's Trainer stand-in): the runtime restarts the failed
workers (Trainer's ``torch-distributed``: the kubelet restarts their containers in their pods),
which resume from the host copy the pod kept. The worker test hook makes rank ``--rank``
(default: the last) signal itself right after step ``--fail-at``, once: SIGKILL is a lost
worker, SIGSTOP a hung one (its peers' collectives time out after ``--collective-timeout-s``; a
worker with no peer is stopped by its pod's watchdog after ``--stall-timeout-s``). For each it
prints, in seconds after the fault: the pod failed (its exit code; none in place), the restart
began (the driver's gang restart, or the launchers' in-place line), every pod ran again (in
place: every launcher ready to start its workers), the restarted rank 0 loaded the checkpoint
and logged its first step; and the steps redone (finished after the checkpoint the run resumed
from, so done twice). ``resume_source`` and ``resume_load_s`` are the restarted workers' own:
where they loaded the checkpoint from (``host`` or ``disk``) and how long that took.

Worker times come from the workers' own log lines (wall clock, ms), the driver's from its log
record, pod phases from polling the simulator's store every 50 ms.

    python bench/bench_recovery.py                       # CPU: tiny preset, 2 nodes (gloo)
    python bench/bench_recovery.py --model 1b --gpus-per-node 1 --steps 100 --every 40 \\
        --fail-at 60 --collective-timeout-s 60 --stall-timeout-s 120   # one GPU: one node

On GPUs the stall timeout must cover the longest gap between two reports of progress: the
start-up with the checkpoint load and the compile warm-up of the first step.
The simulated pods' ``/dev/shm`` lie in this machine's: the in-place run's host copy needs room
there (about 14.5 GB at 1b on one GPU) and within ``--shm-size`` (default 32Gi), else it loads
from disk and the run is not ``ok``.

Prints a table per fault and one JSON line; exit code 0 when every run resumed from a
checkpoint, from where its path should (``host`` in place, else ``disk``), and finished.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mnnvl import steps
from mnnvl.contract import env as contract_env
from mnnvl.contract.termination import Evidence
from mnnvl.driver.diagnose import exit_code, pod_index
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, WorkloadSpec, from_inputs
from mnnvl.runtime.parallel import TUNING_ENV
from mnnvl.runtime.progress import SIGNAL_AT_ENV
from mnnvl.sim import SimCluster
from mnnvl.sim.core.podenv import local_gpu_ids

NS, CLAIM, MOUNT = "default", "bench-ckpt", "/ckpt"
# A pod's log line: the time, then under torchrun "[rank0] INFO mnnvl.runtime.train: ".
LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?:\[rank\d+\] \w+ [\w.]+: )?(.*)$", re.M
)
STEP = re.compile(r"^step (\d+) loss ")
RESUMED = re.compile(r"^resumed from \S+ \(step (\d+)\)")
IN_PLACE = re.compile(r"^in-place restart \d+ ")
FAULTS = {"kill": "SIGKILL", "stop": "SIGSTOP", "bad-node": "SIGKILL"}
# What a worker on the bad node says as it dies: its GPU's NVLink errors rising.
BAD_NODE_SAYS = Evidence(
    reason="killed", exit_code=137, gpu="0", nvlink={"0": {"crc": 12, "replay": 3}}
).to_message()
PATHS = {
    "in-place": {},
    "in-place-disk": {TUNING_ENV: "hostcopy=off"},
    "recreated": {contract_env.IN_PLACE_RESTARTS: "0"},
    "trainjob": {},  # the runtime's JobSet restarts every pod
}
# A TrainJob's container restarts in its pod (JobSet's restartPolicy OnFailure): /dev/shm stays.
SOURCE = {"in-place": "host", "in-place-disk": "disk", "recreated": "disk", "trainjob": "host"}


def log_lines(text: str) -> list[tuple[float, str]]:
    """(wall time, message) of every timed line of a pod's log."""
    return [
        (datetime.datetime.strptime(ts, "%Y-%m-%d %H:%M:%S,%f").timestamp(), msg)
        for ts, msg in LOG_LINE.findall(text)
    ]


class Watcher(threading.Thread):
    """Polls the simulator: each pod's first sight, its node, phases and log, and the driver's
    gang-restart and exclusion log records. With ``bad_node`` it turns the node of the pod
    whose worker the test hook kills bad, and uncordons ``spare`` once the driver keeps a
    node out."""

    def __init__(
        self, sim: SimCluster, job_prefix: str, bad_node: bool = False, spare: str = ""
    ) -> None:
        super().__init__(daemon=True)
        self.sim, self.prefix, self.stop = sim, job_prefix, threading.Event()
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> name, index, node, seen, phases, log
        self.detected: list[float] = []
        self.excluded: list[float] = []
        self.bad_node, self.spare, self.bad = bad_node, spare, ""
        watcher = self

        class Records(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if "restarting every rank" in record.getMessage():
                    watcher.detected.append(record.created)
                if "is kept out of the next attempt" in record.getMessage():
                    watcher.excluded.append(record.created)

        self.handler = Records()
        logging.getLogger("mnnvl.driver").addHandler(self.handler)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            for pod in self.sim.store.list("pods")[0]:
                meta = pod["metadata"]
                if not meta["name"].startswith(self.prefix):
                    continue
                seen = self.pods.setdefault(
                    meta["uid"],
                    {"name": meta["name"], "index": pod_index(pod), "seen": time.time()},
                )
                phase = (pod.get("status") or {}).get("phase", "")
                seen.setdefault("phases", {}).setdefault(phase, time.time())
                seen["exit"] = exit_code(pod) if phase == "Failed" else seen.get("exit")
                seen["log"] = self.sim.pod_log(NS, meta["name"]) or seen.get("log", "")
                seen["node"] = pod["spec"].get("nodeName") or seen.get("node")
                if self.bad_node and not self.bad and "test hook:" in seen["log"]:
                    self.bad = str(seen["node"])
                    self.sim.faults.fail_node(self.bad, 137, BAD_NODE_SAYS)
            if self.excluded and self.spare:
                _cordon(self.sim, self.spare, False)
                self.spare = ""

    def close(self) -> None:
        self.stop.set()
        self.join()
        logging.getLogger("mnnvl.driver").removeHandler(self.handler)


def timeline(w: Watcher, nodes: int) -> dict[str, Any]:
    """Seconds after the fault of each stage, from what the watcher saw."""
    pods = sorted(w.pods.values(), key=lambda p: p["seen"])
    hook = [(t, m) for p in pods for t, m in log_lines(p.get("log", "")) if "test hook:" in m]
    fault = min(t for t, _ in hook)
    failed = sorted(
        (p for p in pods if "Failed" in p.get("phases", {})), key=lambda p: p["phases"]["Failed"]
    )
    new = [p for p in pods if p["seen"] > fault]  # the replacements (the gang restarted)
    running = sorted(p["phases"].get("Running", float("inf")) for p in new)
    # In place the same rank-0 pod goes on: its lines after the fault; else the last one made.
    rank0 = ([p for p in new or pods if p["index"] == "0"] or [None])[-1]
    lines = [(t, m) for t, m in log_lines(rank0.get("log", "")) if t > fault] if rank0 else []
    in_place = next((t for t, msg in lines if IN_PLACE.match(msg)), None)
    first = next(((t, int(m.group(1))) for t, msg in lines if (m := STEP.match(msg))), None)
    loaded, resumed = next(
        ((t, int(m.group(1))) for t, msg in lines if (m := RESUMED.match(msg))), (None, None)
    )
    at = lambda t: None if t is None or t == float("inf") else round(t - fault, 2)  # noqa: E731
    detected = min((t for t in w.detected if t >= fault), default=None)
    return {
        "fault": hook[0][1],
        "how": "in-place" if in_place is not None else "recreated" if new else "container",
        "failed_pod": f"index {failed[0]['index']}, exit code {failed[0].get('exit')}"
        if failed
        else None,
        "pod_failed_s": at(failed[0]["phases"]["Failed"]) if failed else None,
        "detected_s": at(in_place if detected is None else detected),
        "gang_restarted_s": at(running[nodes - 1]) if len(running) >= nodes else at(in_place),
        "checkpoint_loaded_s": at(loaded),
        "first_resumed_step_s": at(first[0]) if first else None,
        "resumed_from_step": resumed,
        "first_resumed_step": first[1] if first else None,
        **(_bad_node(w, new, nodes, at) if w.bad_node else {}),
    }


def _bad_node(w: Watcher, new: list[dict[str, Any]], nodes: int, at: Any) -> dict[str, Any]:
    """The bad-node rows: its second failure, the node kept out, every pod Running elsewhere."""
    again = [
        p["phases"]["Failed"] for p in new if p.get("node") == w.bad and "Failed" in p["phases"]
    ]
    excluded = min(w.excluded, default=None)
    after = [p for p in new if excluded is not None and p["seen"] >= excluded]
    running = sorted(p["phases"].get("Running", float("inf")) for p in after)
    return {
        "bad_node": w.bad,
        "failed_again_on_it_s": at(min(again, default=None)),
        "node_kept_out_s": at(excluded),
        "running_elsewhere_s": at(running[nodes - 1]) if len(running) >= nodes else None,
        "nodes_of_the_last_pods": sorted({str(p.get("node")) for p in after}),
    }


def one_fault(args: argparse.Namespace, fault: str, path: str, sim: SimCluster) -> dict[str, Any]:
    run_id = f"rec-{fault}-{path}-{int(time.time())}"
    rank = args.rank if args.rank >= 0 else args.nodes * max(1, args.gpus_per_node) - 1
    domain = DomainSpec(run_id=run_id, delete_timeout_s=120)
    bad_node = fault == "bad-node"
    spare = f"sim-node-{args.nodes}" if bad_node else ""  # the simulator's node names
    if spare:
        _cordon(sim, spare, True)
    workload = from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="train",
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        pvc=(f"{CLAIM}:{MOUNT}",),
        env={SIGNAL_AT_ENV: f"{args.fail_at}:{rank}:{FAULTS[fault]}", **PATHS[path]},
        pods_running_timeout_s=600,
        job_timeout_s=3600,
        max_restarts=args.max_restarts,
        shm_size=args.shm_size,  # the pods' /dev/shm holds the host copy
        workload="trainjob" if path == "trainjob" else "job",
    )
    config = TrainConfig(
        model=args.model,
        steps=args.steps,
        checkpoint_dir=f"{MOUNT}/{run_id}",
        checkpoint_every=args.every,
        log_every=1,
        collective_timeout_s=args.collective_timeout_s,
        stall_timeout_s=args.stall_timeout_s,
    )
    kube = sim.kubeconfig_path
    steps.provision(domain, kubeconfig=kube)
    watcher = Watcher(sim, RunNames.for_run(run_id).job("train"), bad_node, spare)
    watcher.start()
    started = time.time()
    try:
        result = steps.train(workload, config, kubeconfig=kube)
    finally:
        watcher.close()
        if watcher.bad:
            sim.faults.heal_node(watcher.bad)
        if watcher.spare:
            _cordon(sim, watcher.spare, False)
        steps.teardown(domain, kubeconfig=kube)
        shutil.rmtree(Path(sim.pvc_dir(NS, CLAIM), run_id), ignore_errors=True)  # 14 GB at 1b
    figures = timeline(watcher, args.nodes)
    if args.logs_dir:  # every pod's log, to read a timeline line by line
        out = Path(args.logs_dir, f"{fault}-{path}")
        out.mkdir(parents=True, exist_ok=True)
        for pod in watcher.pods.values():
            (out / f"{pod['name']}.log").write_text(pod.get("log", ""), encoding="utf-8")
    resumed = int(result.start_step)
    source = result.raw.get("resume_source")
    figures.update(
        resume_source=source,
        resume_load_s=result.raw.get("resume_load_s"),
        rank=rank,
        failed_after_step=args.fail_at,
        steps_redone=args.fail_at - resumed,
        restarts=result.restarts,
        driver_recovery_s=result.recovery_s,
        driver_steps_lost=result.steps_lost,
        final_loss=result.final_loss,
        wall_s=round(time.time() - started, 1),
        ok=result.restarts == 1
        and resumed > 0
        and source == SOURCE[path]
        and result.steps == args.steps,
    )
    if bad_node:  # the kill, then the bad node's worker dying as it starts: two restarts
        figures.update(
            excluded_nodes=result.excluded_nodes,
            ok=result.restarts == 2
            and result.excluded_nodes == [watcher.bad]
            and watcher.bad not in figures["nodes_of_the_last_pods"]
            and resumed > 0
            and result.steps == args.steps,
        )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument(
        "--nodes", type=int, default=0, help="0: 2 on CPU, else this machine's GPUs / per node"
    )
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--fail-at", type=int, default=25, help="the fault follows this step")
    parser.add_argument("--rank", type=int, default=-1, help="the faulted rank (-1: the last)")
    parser.add_argument("--faults", default="kill,stop,bad-node", help="kill, stop, bad-node")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"some of {', '.join(PATHS)}")
    parser.add_argument("--collective-timeout-s", type=float, default=10)
    parser.add_argument("--stall-timeout-s", type=float, default=20)
    parser.add_argument(
        "--max-restarts", type=int, default=WorkloadSpec(run_id="x").recovery.max_restarts
    )
    parser.add_argument(
        "--shm-size", default="32Gi", help="the pods' /dev/shm (the host copy: ~14.5 GB at 1b)"
    )
    parser.add_argument("--json-out", default="")
    parser.add_argument("--logs-dir", default="", help="write every pod's log here")
    args = parser.parse_args()
    if not args.nodes:
        local = len(local_gpu_ids()) // args.gpus_per_node if args.gpus_per_node else 2
        args.nodes = max(1, local)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    gpus = None if args.gpus_per_node else []  # CPU runs see no GPU even on a GPU machine
    figures: dict[str, Any] = {
        "model": args.model,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
    }
    spare = int("bad-node" in args.faults.split(","))  # a node for the run to move to
    with SimCluster(
        nodes=args.nodes + spare,
        gpus_per_node=args.gpus_per_node,
        local_gpus=gpus,
        trainer="trainjob" in args.paths.split(","),  # Kubeflow Trainer's stand-in
    ) as sim:
        _claim(sim)
        for fault in args.faults.split(","):
            for path in args.paths.split(","):
                if fault == "bad-node" and path != "recreated":
                    continue  # in place the pods stay on their nodes
                figures[f"{fault} {path}"] = one_fault(args, fault, path, sim)
    runs = [k for k in figures if " " in k]
    for fault in args.faults.split(","):
        these = [k for k in runs if k.startswith(f"{fault} ")]
        if not these:
            continue
        print(f"\n{fault} ({FAULTS[fault]} of the last rank after step {args.fail_at})")
        print(f"  {'':22} " + " ".join(f"{k.split(' ', 1)[1]:>24}" for k in these))
        for key in figures[these[0]]:
            print(f"  {key:22} " + " ".join(f"{figures[k][key]!s:>24}" for k in these))
    line = json.dumps({"bench": "recovery", **figures})
    print(line)
    if args.json_out:
        Path(args.json_out).write_text(line + "\n")
    return 0 if all(figures[k]["ok"] for k in runs) else 1


def _admin(sim: SimCluster) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=sim.admin_kubeconfig_path))


def _cordon(sim: SimCluster, node: str, on: bool) -> None:
    _admin(sim).patch_node(node, {"spec": {"unschedulable": on}})


def _claim(sim: SimCluster) -> None:
    core = _admin(sim)
    spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": CLAIM}, "spec": spec})


if __name__ == "__main__":
    sys.exit(main())
