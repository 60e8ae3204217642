"""On a GPU, through the simulated cluster: a pod's main process SIGKILLed while its worker (in
a session of its own) holds 80 GiB of GPU memory and a port. Is the memory free, and the worker
gone, when the pod is reported Failed, and does the retried pod (which could not fit beside a
live worker) run? Prints one ``GPUEXIT {json}`` line.

    python bench/gpu_container_exit.py
"""

import json
import os
import subprocess
import tempfile
import time
import urllib.request

from mnnvl.ports import free_port
from mnnvl.sim import SimCluster

GIB = 80  # two of these do not fit on one H200: a retry next to a live worker would OOM
CHILD = (
    "import os, socket, time, torch\n"
    "x = torch.ones(int(os.environ['GIB']) * 2**30, dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(os.environ['PORT']))); s.listen()\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
MAIN = (
    "import os, subprocess, sys, time\n"
    f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], start_new_session=True,\n"
    "                         stdout=subprocess.PIPE, text=True)\n"
    "if child.stdout.readline() != 'ready\\n':\n"
    "    sys.exit(3)\n"
    "print(f'main {os.getpid()} child {child.pid}', flush=True)\n"
    "if os.path.exists(os.environ['FLAG']):\n"
    "    sys.exit(0)\n"
    "open(os.environ['FLAG'], 'w').close()\n"
    "time.sleep(600)\n"
)


def smi() -> dict:
    used = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    ).stdout.split()
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {"memory_used_mib": used, "apps": apps}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def main() -> None:
    flag = os.path.join(tempfile.mkdtemp(), "flag")
    env = [
        {"name": "PORT", "value": str(free_port())},
        {"name": "FLAG", "value": flag},
        {"name": "GIB", "value": str(GIB)},
    ]
    container = {
        "name": "main",
        "image": "sim",
        "command": ["python3", "-c", MAIN],
        "env": env,
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gpu"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "backoffLimitPerIndex": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }
    out: dict = {"before": smi()}
    with SimCluster(nodes=1, gpus_per_node=1) as sim:
        out["local_gpus"] = sim.local_gpus
        with open(sim.admin_kubeconfig_path, encoding="utf-8") as f:
            token = json.load(f)["users"][0]["user"]["token"]  # a platform admin makes the Job
        req = urllib.request.Request(
            sim.url + "/apis/batch/v1/namespaces/default/jobs",
            data=json.dumps(job).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        )
        urllib.request.urlopen(req).read()

        def pods() -> list:
            return [
                p
                for p in sim.store.list("pods")[0]
                if p["metadata"]["labels"].get("job-name") == "gpu"
            ]

        deadline = time.monotonic() + 120
        first = None
        while time.monotonic() < deadline:
            ps = pods()
            if ps:
                first = ps[0]["metadata"]["name"]
                lines = [
                    ln
                    for ln in sim.pod_log("default", first).splitlines()
                    if ln.startswith("main ")
                ]
                if lines:
                    main_pid, child = (int(w) for w in lines[0].split()[1::2])
                    break
            time.sleep(0.05)
        else:
            raise SystemExit(f"never ready: {sim.pod_log('default', first or '')}")
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
