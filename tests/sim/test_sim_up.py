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
