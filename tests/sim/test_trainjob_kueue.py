"""TrainJobs under Kueue on the simulated cluster: queued suspended until Kueue admits them (no
pod before), the step says so as it does for a Job, and one never admitted ends the step with
the queued diagnosis at its admission timeout, leaving nothing of the run."""

from __future__ import annotations

import json
import logging

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.errors import WaitTimeout
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from mnnvl.sim.policy.kueue import KueueConfig
from tests.sim.test_trainjob_standin import schemas  # noqa: F401  (the fixture)


def test_a_queued_trainjob_run_is_admitted_verifies_before_and_after_and_leaves_nothing(
    capsys, caplog, tmp_path
) -> None:
    caplog.set_level(logging.INFO)
    argv = ["run", "--sim", "--run-id", "tj-queued", "--nodes", "2", "--gpus-per-node", "0"]
    argv += ["--min-busbw-gbps", "0.001", "--workload", "trainjob", "--queue-name", "team"]
    assert cli.main([*argv, "--report-dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["verify_pre"]["verdict"] == out["verify_post"]["verdict"] == "PASS"
    name = RunNames.for_run("tj-queued").job("train")
    said = caplog.messages
    assert f"TrainJob default/{name} queued in LocalQueue team (Kueue)" in said
    assert any(m.startswith(f"Kueue: Workload trainjob-{name}-") for m in said)
    assert any(m.startswith(f"TrainJob default/{name} admitted after ") for m in said)
    assert "pods 2/2 Running" in said
    assert out["sim"]["leftover"] == [] and out["sim"]["leftover_processes"] == []


def test_a_trainjob_kueue_never_admits_makes_no_pod_and_ends_queued_at_the_timeout(
    schemas: str,  # noqa: F811
) -> None:
    config = KueueConfig(local_queues={"team": "gpu-cq"}, quotas={"gpu-cq": {"pods": 1}})
    with SimCluster(
        nodes=2,
        trainer=True,
        kueue=True,
        kueue_admission_delay_s=0.2,
        kueue_config=config,
        schema_dir=schemas,
    ) as sim:
        domain = DomainSpec(run_id="tj-held", delete_timeout_s=30)
        steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        workload = from_inputs(
            WorkloadSpec,
            run_id="tj-held",
            purpose="job",
            nodes=2,
            gpus_per_node=0,
            clique_affinity=False,
            workload="trainjob",
            queue_name="team",
            admission_timeout_s=3,
        )
        with pytest.raises(WaitTimeout) as info:
            steps.launch(
                workload, "", ["python3", "-c", "print(1)"], kubeconfig=sim.kubeconfig_path
            )
        name = RunNames.for_run("tj-held").job("job")
        message = str(info.value)
        assert info.value.exit_code == 3
        assert (
            f"TrainJob default/{name} queued in LocalQueue team (Kueue) for more than 3 s"
            in message
        )
        assert "insufficient quota for pods in flavor default-flavor" in message
        assert "kubectl get workloads -n default" in message
        created = [e for e in sim.events if e.get("reason") == "SuccessfulCreate"]
        assert not [e for e in created if e["involvedObject"]["name"].startswith(name)]
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
        assert sim.objects(RunNames.for_run("tj-held").selector) == []
        assert [o for o in sim.objects() if name in o[2]] == []
