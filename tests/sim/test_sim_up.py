"""`mnnvl sim up` as a person uses it: it says how to use it and looks like a real apiserver."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import kubernetes


def test_sim_up_prints_how_to_use_it_answers_version_and_stops_on_sigterm(tmp_path: Path):
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "1", "--kubeconfig", str(kc)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        told = []
        for line in proc.stderr:
            told.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(told)
        assert f"export KUBECONFIG={kc}" in text and "Ctrl-C" in text
        api = kubernetes.config.new_client_from_config(config_file=str(kc))
        version = kubernetes.client.VersionApi(api).get_code()  # the typed model needs every field
        assert version.git_version.startswith("v1.") and version.major == "1"
        assert version.go_version and version.platform and version.build_date
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        result = json.loads(out.splitlines()[-1])
        assert result["ok"] is True and result["command"] == "sim up"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sim_up_plays_the_dra_only_gpu_stack_with_host_managed_imex(tmp_path: Path):
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnnvl", "sim", "up", "--nodes", "1", "--gpus-per-node", "4",
         "--gpu-stack", "dra", "--imex-mode", "hostManaged", "--cluster-reader",
         "--kubeconfig", str(kc)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the simulator announces itself there
            if line.startswith("{"):
                served = json.loads(line)
                break
        assert (served["gpu_stack"], served["imex_mode"]) == ("dra", "hostManaged")
        api = kubernetes.config.new_client_from_config(config_file=str(kc))  # the runner
        (node,) = kubernetes.client.CoreV1Api(api).list_node().items  # the cluster reader
        assert "nvidia.com/gpu" not in node.status.allocatable
        raw = kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices"
        )
        devices = {
            s["spec"]["driver"]: [d["name"] for d in s["spec"]["devices"]] for s in raw["items"]
        }
        assert devices == {
            "gpu.nvidia.com": ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
            "compute-domain.nvidia.com": ["channel-0"],  # no daemon device: host-managed
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
