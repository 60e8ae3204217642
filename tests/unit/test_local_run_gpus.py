"""``make run`` says whether its simulated nodes train on this machine's GPUs or on the CPU,
and why, before the simulator starts; a shape the GPUs cannot hold is refused first."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnnvl.pipelines import local_run
from mnnvl.sim import SimCluster
from mnnvl.sim.core import podenv


class Started(Exception):
    """The simulator was about to start: what ``make run`` said before is all there is."""


def said_before_start(
    argv: list[str], gpus: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> tuple[bool, str]:
    """(whether the simulator would have started, what was logged) for ``make run`` ``argv``
    on a machine with ``gpus`` GPUs."""
    monkeypatch.setattr(podenv, "local_gpu_ids", lambda: [str(i) for i in range(gpus)])

    def start(self: SimCluster) -> SimCluster:
        raise Started

    monkeypatch.setattr(SimCluster, "start", start)
    started = False
    with caplog.at_level("INFO"):
        try:
            code = local_run.main(argv)
        except Started:
            started = True
        else:
            assert code == 2
    return started, caplog.text


def test_one_gpu_and_two_nodes_says_it_trains_on_the_cpu_and_how_to_use_the_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    started, said = said_before_start(["--out", str(tmp_path)], 1, monkeypatch, caplog)
    assert started
    assert "2 simulated node(s) x 0 GPU(s): training on the CPU" in said
    assert "make run NODES=1" in said


def test_one_gpu_and_one_node_says_it_trains_on_the_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    argv = ["--nodes", "1", "--out", str(tmp_path)]
    started, said = said_before_start(argv, 1, monkeypatch, caplog)
    assert started and "1 simulated node(s) x 1 GPU(s): training on this machine's GPUs" in said


def test_more_gpus_than_the_machine_has_is_refused_before_the_simulator_starts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    argv = ["--gpus-per-node", "1", "--out", str(tmp_path)]
    started, said = said_before_start(argv, 1, monkeypatch, caplog)
    assert not started
    assert "needs 2 GPUs on this machine, which has 1" in said and "--gpus-per-node 0" in said
