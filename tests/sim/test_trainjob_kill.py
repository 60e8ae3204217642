"""The train step as a TrainJob: a worker killed mid-training is restarted, by the runtime's
JobSet failure policy (every pod recreated) or, where the runtime has none (Trainer's
``torch-distributed``), by the child Job's retries (the failed pods made again); training
completes, and the restart is counted in the step's result either way."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.driver.rank0 import STEP_LINE
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.simkit import NS, Raw, wait_for
from tests.sim.test_trainjob_standin import gang_runtime, log, pods, raw, schemas, sim

__all__ = ["raw", "schemas", "sim"]  # the stand-in's module fixtures, used here too

RUN = "tj-kill"
STEPS = 300


def _training(raw: Raw, name: str) -> dict[str, Any] | None:
    """Rank 1's pod of the first attempt once rank 0 logged a training step; else None."""
    first = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
        for p in pods(raw, name)
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/restart-attempt") == "0"
        and (p.get("status") or {}).get("phase") == "Running"
    }
    if {"0", "1"} <= first.keys() and STEP_LINE.search(log(raw, first["0"]["metadata"]["name"])):
        return first["1"]
    return None


@pytest.mark.parametrize(
    ("runtime", "attempts"),
    [("gang-kill", {"1"}), ("torch-distributed", {"0"})],  # JobSet recreated all, or Job retried
)
def test_a_killed_worker_is_restarted_by_the_runtimes_failure_policy_and_counted(
    sim: SimCluster, raw: Raw, runtime: str, attempts: set[str]
) -> None:
    if runtime == "gang-kill":
        gang_runtime(raw, runtime, 2)
    domain = DomainSpec(run_id=RUN, delete_timeout_s=30)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    workload = from_inputs(
        WorkloadSpec,
        run_id=RUN,
        nodes=2,
        gpus_per_node=0,
        clique_affinity=False,
        workload="trainjob",
        trainjob_runtime=runtime,
    )
    config = TrainConfig(model="tiny", steps=STEPS, batch_size=2, log_every=1)
    name = RunNames.for_run(RUN).job("train")
    killed: list[str] = []

    def kill_rank_1() -> None:
        pod = wait_for(lambda: _training(raw, name), timeout=300, what="training under way")
        sim.signal_pod(NS, pod["metadata"]["name"], signal.SIGKILL)
        killed.append(pod["metadata"]["name"])

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    result = steps.train(workload, config, kubeconfig=sim.kubeconfig_path)
    killer.join(timeout=5)

    assert killed, "rank 1 was never killed"
    assert result.job == name and result.steps == STEPS and result.restarts == 1
    seen = {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in pods(raw, name)}
    assert seen == attempts
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert pods(raw, name) == [] and sim.objects(label_selector=f"mnnvl.io/run-id={RUN}") == []
