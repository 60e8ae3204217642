"""``mnnvl run --sim`` hands the simulated nodes this machine's GPUs: asking for more than it has
is refused before the simulator starts, naming the flag that fixes it."""

from __future__ import annotations

import json

import pytest

from mnnvl.cli import main as cli
from mnnvl.sim import SimCluster
from mnnvl.sim.core import podenv


def test_more_gpus_than_the_machine_has_exits_2_before_the_simulator_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(podenv, "local_gpu_ids", lambda: ["0", "1"])
    started: list[SimCluster] = []
    monkeypatch.setattr(SimCluster, "start", lambda self: started.append(self))
    # --gpus-per-node is 4 unless given: 4 nodes x 4 GPUs on a machine with 2.
    code = cli.main(["run", "--sim", "--nodes", "4", "--nodes-per-clique", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and started == []
    result = json.loads(out.splitlines()[-1])
    assert result["error"].startswith(
        "gpus_per_node (--gpus-per-node): 4 on 4 simulated nodes needs 16 GPUs"
    )
    assert "which has 2" in result["error"] and "--gpus-per-node 0" in result["error"]
    assert "Traceback" not in err
