"""A TrainJob that Kueue evicts after admitting it, on the simulated cluster, as the Job path's
evictions (tests/sim/test_kueue.py): Kueue's waitForPodsReady, played short, suspends the
admitted TrainJob again and its pods go. The step names the eviction, waits for re-admission
within --max-restarts and --admission-timeout-s (every wait in the queue counted), and
counts it in the result; each case ends with nothing of the run left."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mnnvl import steps
from mnnvl.errors import WaitTimeout, WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from mnnvl.sim.policy.kueue import KueueConfig
from tests.sim.test_trainjob_standin import schemas  # noqa: F401  (the fixture)

RESULT = 'print(\'RESULT {"kind": "quick", "ok": true}\', flush=True)'
# Pods are never Ready 0.05 s after admission (scheduling alone takes longer): evicted at once,
# requeued after a 1 s back-off.
QUICK_EVICTION = KueueConfig(
    local_queues={"team": "cq"},
    quotas={"cq": {"pods": 2}},
    pods_ready_timeout_s=0.05,
    requeue_base_s=1.0,
)


@contextmanager
def queued_trainjob(schema_dir: str, config: KueueConfig, **inputs: Any) -> Iterator[Any]:
    """A provisioned run on a simulator with Kueue and Trainer; yields (sim, workload) and
    checks after teardown that nothing of the run is left."""
    with SimCluster(
        nodes=2,
        trainer=True,
        kueue=True,
        kueue_admission_delay_s=0.2,
        kueue_config=config,
        schema_dir=schema_dir,
    ) as sim:
        run_id = "tj-evict"
        domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
        steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        fields: dict[str, Any] = {
            "run_id": run_id,
            "purpose": "job",
            "nodes": 2,
            "gpus_per_node": 0,
            "clique_affinity": False,
            "workload": "trainjob",
            "queue_name": "team",
            "pods_running_timeout_s": 60,
            "job_timeout_s": 120,
        }
        yield sim, from_inputs(WorkloadSpec, **(fields | inputs))
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
        names = RunNames.for_run(run_id)
        assert sim.objects(names.selector) == []
        assert [o for o in sim.objects() if names.base in o[2]] == []


def launch_in_background(sim: SimCluster, workload: WorkloadSpec) -> Callable[[], Any]:
    """Start the step; the returned call waits for its outcome (its result or its error)."""
    outcome: list[Any] = []

    def launch() -> None:
        try:
            args = ["python3", "-c", RESULT]
            outcome.append(steps.launch(workload, "", args, kubeconfig=sim.kubeconfig_path))
        except BaseException as e:  # the step's error, checked by the test
            outcome.append(e)

    step = threading.Thread(target=launch, daemon=True)
    step.start()

    def joined() -> Any:
        step.join(120)
        assert outcome, "the step still waits after 120 s"
        return outcome[0]

    return joined


def requeues(sim: SimCluster) -> int:
    """How often Kueue requeued the run's Workload (``status.requeueState.count``)."""
    states = [
        (w.get("status") or {}).get("requeueState") or {} for w in sim.store.list("workloads")[0]
    ]
    return max((int(state.get("count") or 0) for state in states), default=0)


def test_an_evicted_trainjob_is_requeued_runs_to_the_end_and_counts_the_eviction(
    schemas: str,  # noqa: F811
    caplog,
    eventually,
) -> None:
    caplog.set_level(logging.INFO)
    with queued_trainjob(schemas, QUICK_EVICTION, max_restarts=2) as (sim, workload):
        outcome = launch_in_background(sim, workload)
        eventually(lambda: requeues(sim) >= 1, 60, "Kueue's first eviction")
        # From the second admission on, Kueue waits for the pods as long as they take.
        assert sim.kueue is not None
        sim.kueue.config = dataclasses.replace(QUICK_EVICTION, pods_ready_timeout_s=0)
        result = outcome()
        assert not isinstance(result, BaseException), result
        evicted = requeues(sim)
        name = RunNames.for_run(workload.run_id).job("job")
    assert result.exit_code == 0 and result.result == {"kind": "quick", "ok": True}
    # Counted as Kueue counted it (status.requeueState.count); an eviction is no failure.
    assert result.evictions == evicted >= 1 and result.restarts == []
    said = caplog.messages
    suspended = [m for m in said if m.startswith(f"TrainJob default/{name} was suspended again")]
    assert suspended and "Evicted (PodsReadyTimeout: Exceeded the PodsReady timeout" in suspended[0]
    assert "(eviction 1, at most 2: --max-restarts)" in suspended[0]
    readmitted = f"TrainJob default/{name} re-admitted after eviction 1 after"
    assert any(m.startswith(readmitted) for m in said)
    # The pods ran to the end after the re-admission: rank 0's RESULT above. (Their "pods 2/2
    # Running" line is not asserted: quick pods may start and end between two looks.)


def test_an_evicted_trainjob_never_readmitted_ends_queued_at_the_admission_timeout(
    schemas: str,  # noqa: F811
    caplog,
) -> None:
    # Requeued only after a 60 s back-off: past the 3 s that every wait in the queue shares.
    config = dataclasses.replace(QUICK_EVICTION, requeue_base_s=60)
    caplog.set_level(logging.INFO)
    with queued_trainjob(schemas, config, admission_timeout_s=3) as (sim, workload):
        err = launch_in_background(sim, workload)()
        name = RunNames.for_run(workload.run_id).job("job")
    assert isinstance(err, WaitTimeout) and err.exit_code == 3, err
    message = str(err)
    assert (
        f"TrainJob default/{name} queued in LocalQueue team (Kueue) for more than 3 s in all, "
        "over 2 waits" in message
    )
    assert "Evicted (PodsReadyTimeout" in message and "(--admission-timeout-s)" in message
    assert "kubectl get workloads -n default" in message
    suspended = f"TrainJob default/{name} was suspended again"
    assert any(m.startswith(suspended) for m in caplog.messages)


def test_evictions_of_a_trainjob_beyond_max_restarts_fail_the_step(
    schemas: str,  # noqa: F811
) -> None:
    config = QUICK_EVICTION
    with queued_trainjob(schemas, config, max_restarts=0) as (sim, workload):
        err = launch_in_background(sim, workload)()
        name = RunNames.for_run(workload.run_id).job("job")
    assert isinstance(err, WorkloadFailed) and err.exit_code == 4, err
    message = str(err)
    assert f"Kueue evicted TrainJob default/{name} 1 time(s), more than --max-restarts 0" in message
    assert "Evicted (PodsReadyTimeout" in message
