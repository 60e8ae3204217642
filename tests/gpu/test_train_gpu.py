"""Two-GPU FSDP2 training through torchrun: finite, falling loss and a measured MFU."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from mnnvl.runtime.local import torchrun_command

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 CUDA GPUs"),
]


def test_twenty_steps_on_two_gpus_learn_and_report_mfu() -> None:
    cmd = torchrun_command("mnnvl.runtime.train", [
        "--model", "small", "--steps", "20", "--log-every", "5", "--batch-size", "8",
        "--lr", "3e-3", "--warmup-steps", "3",
    ], nproc=2)  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, check=False, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT ") :])
    losses = [loss for _step, loss in result["losses"]]
    assert result["device"] == "cuda"
    assert result["world_size"] == 2
    assert result["steps"] == 20
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.5
    assert result["mfu"] is not None and result["mfu"] > 0
    assert result["peak_mem_gib"] > 0
