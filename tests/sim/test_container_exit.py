"""A container's exit takes down every process it started, as a real runtime's cgroup does:
before its pod is reported terminal, when the simulator stops, and for torchrun's workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes

from mnnvl.ports import free_port
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw, pod_body, wait_for

SIM = dict(nodes=1, local_gpus=[])
JOBS = "/apis/batch/v1/namespaces/default/jobs"

# Binds $PORT, says so, then works on: a training worker holding its rendezvous port.
LISTENER = (
    "import os, socket, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(os.environ['PORT'])))\n"
    "s.listen()\n"
    "print('bound', flush=True)\n"
    "time.sleep(300)\n"
)


def launcher(listener: str) -> str:
    """The main process starts ``listener`` in a session of its own; the first attempt (no
    $FLAG yet) then works on until it is killed, a later one exits 0 once its listener bound."""
    return (
        "import os, subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {listener!r}], start_new_session=True,\n"
        "                         stdout=subprocess.PIPE, text=True)\n"
        "if child.stdout.readline() != 'bound\\n':\n"
        "    sys.exit(3)\n"
        "print(f'main {os.getpid()} child {child.pid}', flush=True)\n"
        "if os.path.exists(os.environ['FLAG']):\n"
        "    sys.exit(0)\n"
        "open(os.environ['FLAG'], 'w').close()\n"
        "time.sleep(300)\n"
    )


def exit_job(name: str, container: dict[str, Any]) -> dict[str, Any]:
    """An Indexed Job of one pod running ``container``, retried once."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "backoffLimitPerIndex": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


# Starts a daemon (new session, its parent exits at once: it is re-parented away from the
# container's tree), prints its pid and works on.
DAEMONIZER = (
    "import os, subprocess, sys, time\n"
    "code = 'import os, time; print(\"daemon\", os.getpid(), flush=True); time.sleep(300)'\n"
    "spawn = f'import subprocess, sys; subprocess.Popen([sys.executable, \"-c\", {code!r}], '\n"
    "spawn += 'start_new_session=True)'\n"
    "subprocess.run([sys.executable, '-c', spawn], check=True)\n"
    "time.sleep(300)\n"
)
TORCHRUN_WORKER = (
    "import os, time\n"
    "print(f'worker {os.getpid()} launcher {os.getppid()}', flush=True)\n"
    "time.sleep(300)\n"
)


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie holds no port and no memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def pid_line(sim: SimCluster, pod: str, word: str) -> list[int]:
    """The numbers on the first line of the pod's log that starts with ``word``."""
    for line in sim.pod_log("default", pod).splitlines():
        if line.startswith(word + " "):
            return [int(w) for w in line.split() if w.isdigit()]
    return []


def job_pods(raw: Raw, job: str) -> list[dict[str, Any]]:
    pods = raw.call("GET", "/api/v1/namespaces/default/pods", labelSelector=f"job-name={job}")
    return list(pods["items"])


def test_killing_only_the_main_process_takes_its_worker_down_before_the_pod_fails(
    sim: SimCluster, raw: Raw, tmp_path: Path
) -> None:
    port = free_port()
    env = [{"name": "PORT", "value": str(port)}, {"name": "FLAG", "value": str(tmp_path / "f")}]
    command = ["python3", "-c", launcher(LISTENER)]
    raw.call(
        "POST",
        JOBS,
        exit_job("exit", {"name": "main", "image": "sim", "command": command, "env": env}),
    )
    first = wait_for(lambda: job_pods(raw, "exit"), what="the first pod")[0]["metadata"]["name"]
    main, child = wait_for(lambda: pid_line(sim, first, "main"), 30, "the listener bound")
    assert os.getsid(child) == child != os.getsid(main)  # a session of its own
    os.kill(main, signal.SIGKILL)  # the main process only, not its group or session

    def failed() -> dict[str, Any] | None:
        pod = raw.pod(first)
        return pod if pod["status"].get("phase") == "Failed" else None

    pod = wait_for(failed, 15, "the pod Failed")
    assert not alive(child), "the listener outlived its container's main process"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137

    def complete() -> bool:
        conds = raw.get(f"{JOBS}/exit").get("status", {}).get("conditions") or []
        return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conds)

    wait_for(complete, 30, "the Job finished")
    conds = {c["type"] for c in raw.get(f"{JOBS}/exit")["status"]["conditions"]}
    assert "Complete" in conds, raw.get(f"{JOBS}/exit")["status"]
    (second,) = [p for p in job_pods(raw, "exit") if p["metadata"]["name"] != first]
    assert second["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    assert second["status"]["phase"] == "Succeeded"
    again = pid_line(sim, second["metadata"]["name"], "main")
    assert again and not alive(again[1])  # the second listener bound the port, then went too
    assert sim.processes("job-name=exit") == []
    raw.call("DELETE", f"{JOBS}/exit", propagationPolicy="Background")


def test_processes_of_a_pod_are_listed_wherever_they_went_until_the_pod_ends(
    sim: SimCluster, raw: Raw
) -> None:
    body = pod_body("daemonizer", DAEMONIZER)
    body["metadata"]["labels"] = {"app": "daemonizer"}
    raw.create_pod(body)
    (daemon,) = wait_for(lambda: pid_line(sim, "daemonizer", "daemon"), 30, "the daemon")
    listed = sim.processes("app=daemonizer")
    assert {(ns, pod) for ns, pod, _ in listed} == {("default", "daemonizer")}
    (main,) = {pid for _, _, pid in listed} - {daemon}
    parent = int(Path(f"/proc/{daemon}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert os.getsid(daemon) == daemon and parent != main  # left the session and the tree
    assert sim.processes("app=other") == []
    raw.call("DELETE", "/api/v1/namespaces/default/pods/daemonizer", gracePeriodSeconds=1)
    wait_for(lambda: raw.gone("/api/v1/namespaces/default/pods/daemonizer"), 15, "pod gone")
    assert not alive(daemon)
    assert sim.processes("app=daemonizer") == []


def test_a_killed_torchrun_launcher_takes_its_workers_down_before_the_pod_fails(
    sim: SimCluster, raw: Raw, tmp_path: Path
) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(TORCHRUN_WORKER)
    body = pod_body("torchrun")
    argv = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(worker)]
    body["spec"]["containers"][0]["command"] = ["python3", *argv]
    raw.create_pod(body)
    found = wait_for(lambda: pid_line(sim, "torchrun", "worker"), 120, "the torchrun worker")
    worker_pid, launcher = found
    assert os.getsid(worker_pid) == worker_pid  # torchrun starts each worker in a new session
    os.kill(launcher, signal.SIGKILL)
    pod = wait_for(
        lambda: (p := raw.pod("torchrun"))["status"].get("phase") == "Failed" and p, 15, "Failed"
    )
    assert not alive(worker_pid), "torchrun's worker outlived its launcher's container"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    raw.call("DELETE", "/api/v1/namespaces/default/pods/torchrun", gracePeriodSeconds=0)


def test_stopping_the_simulator_leaves_no_process_of_any_pod() -> None:
    sim = SimCluster(nodes=1, local_gpus=[]).start()
    try:
        Raw(sim).create_pod(pod_body("daemonizer", DAEMONIZER))
        (daemon,) = wait_for(lambda: pid_line(sim, "daemonizer", "daemon"), 30, "the daemon")
    finally:
        sim.stop()
    assert not alive(daemon)


def test_sigterm_to_sim_up_leaves_no_process_of_any_pod(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    cmd = [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "1", "--kubeconfig", str(kc)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        admin = kc.with_name("kubeconfig.admin")  # written after the runner's
        wait_for(admin.exists, 60, "the admin kubeconfig")
        core = kubernetes.client.CoreV1Api(
            kubernetes.config.new_client_from_config(config_file=str(admin))
        )
        core.create_namespaced_pod("default", pod_body("daemonizer", DAEMONIZER))

        def daemon() -> list[int]:
            try:
                text = core.read_namespaced_pod_log("daemonizer", "default")
            except kubernetes.client.ApiException:  # not started yet
                return []
            return [int(w) for w in text.split() if w.isdigit()]

        (pid,) = wait_for(daemon, 30, "the daemon")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not alive(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
