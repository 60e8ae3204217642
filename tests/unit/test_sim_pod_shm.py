"""A simulated pod's /dev/shm is its own and as large as the memory emptyDir the Job mounts
there (``--shm-size``): a host copy that does not fit is refused as on a cluster node, where
/dev/shm is a tmpfs of that size, and a resume loads the disk's checkpoint instead."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mnnvl import manifests
from mnnvl.contract import env as contract_env
from mnnvl.inputs.flags import to_args
from mnnvl.inputs.spec import TrainConfig, WorkloadSpec, from_inputs
from mnnvl.runtime import hostcopy
from mnnvl.runtime.checkpoint import Checkpointer
from mnnvl.runtime.hostcopy import HostCopy
from mnnvl.runtime.parallel import DistInfo
from mnnvl.runtime.train import Trainer
from mnnvl.sim.api.store import Store
from mnnvl.sim.core.podenv import ProcessEnv

CFG = TrainConfig(model="tiny", steps=8, warmup_steps=1)  # its host copy: about 2 MiB


@pytest.fixture
def sim() -> Iterator[ProcessEnv]:
    """The simulated kubelet's container environments (no cluster needed)."""
    env = ProcessEnv(Store(), 0, [])
    yield env
    env.close()


def pod_env(sim: ProcessEnv, tmp: Path, shm_size: str, name: str) -> dict[str, str]:
    """The environment the simulated kubelet gives the train Job's pod ``name``."""
    workload = from_inputs(WorkloadSpec, run_id="shm-run", shm_size=shm_size)
    job = manifests.indexed_job(workload, manifests.TRAIN_MODULE, to_args(CFG))
    template: dict[str, Any] = job["spec"]["template"]
    pod = {
        "metadata": {**template["metadata"], "name": name, "namespace": "default", "uid": name},
        "spec": {**template["spec"], "nodeName": "node-0"},
    }
    workdir = tmp / name
    workdir.mkdir()
    _, env = sim.command_and_env(pod, pod["spec"]["containers"][0], str(workdir))
    return env


def in_pod(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """This process as the pod's worker, as far as the host copy reads its environment."""
    for name in (
        contract_env.RUN_ID,
        contract_env.POD_NAME,
        contract_env.SHM_DIR,
        contract_env.SHM_SIZE,
    ):
        if name in env:
            monkeypatch.setenv(name, env[name])


def test_each_simulated_pod_has_a_dev_shm_of_its_own_the_size_of_its_emptydir(
    sim: ProcessEnv, tmp_path: Path
) -> None:
    a, b = (pod_env(sim, tmp_path, "1Gi", name) for name in ("pod-a", "pod-b"))
    assert a[contract_env.SHM_DIR] != b[contract_env.SHM_DIR]
    assert all(Path(e[contract_env.SHM_DIR]).is_dir() for e in (a, b))
    assert a[contract_env.SHM_SIZE] == b[contract_env.SHM_SIZE] == str(2**30)


@pytest.mark.parametrize(("shm_size", "source"), [("1Mi", "disk"), ("1Gi", "host")])
def test_a_host_copy_larger_than_the_pods_shm_size_is_refused_and_the_resume_loads_the_disk(
    gloo_one_rank: None,
    sim: ProcessEnv,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    shm_size: str,
    source: str,
) -> None:
    env = pod_env(sim, tmp_path, shm_size, "pod-a")
    in_pod(monkeypatch, env)
    info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
    identity = {"checkpoint_dir": str(tmp_path / "ckpt"), "rank": 0, "world_size": 1}

    def trainer() -> Trainer:
        t = Trainer(CFG, info)
        copy = HostCopy.for_pod({**identity, "model": "tiny"})
        assert copy is not None and copy.dir.is_relative_to(env[contract_env.SHM_DIR])
        t.ckpt = Checkpointer(str(tmp_path / "ckpt"), rank=0, host_copy=copy)
        return t

    first = trainer()
    first.step(1)
    extra = {"loss": 0.0, "scheduler": first.sched.state_dict(), "model": "tiny"}
    with caplog.at_level(logging.WARNING, logger=hostcopy.__name__):
        first.ckpt.save(1, first.model, first.opt, extra)
        first.ckpt.finish()
    first.close()
    said = [r.getMessage() for r in caplog.records if r.name == hostcopy.__name__]
    if source == "disk":  # the tiny model's copy needs about 2 MiB
        (line,) = said
        assert line.startswith("no host copy of checkpoint step 1: it needs ")
        assert " has 1 MiB free; raise --shm-size" in line  # the pod's 1Mi, not the host's
    again = trainer()
    again.resume()
    again.ckpt.finish()
    again.close()
    assert (again.resume_source, again.start_step) == (source, 1)
