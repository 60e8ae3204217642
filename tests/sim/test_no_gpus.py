"""A cluster without GPUs and a step that asks for some (``--gpus-per-node`` forgotten): the
error names ``--gpus-per-node 0``, at once where the runner may read nodes and ResourceSlices
(the cluster reader), else when the unschedulable grace ends."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster

GRACE_S = 30  # longer than the test may take: an answer within it did not wait the grace


@pytest.mark.parametrize("reader", [True, False])
def test_gpus_asked_of_a_cluster_without_gpus_name_gpus_per_node_0(capsys, reader):
    run_id = f"nogpu-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    with SimCluster(nodes=2, gpus_per_node=0, cluster_reader=reader) as sim:
        steps.provision(domain, kubeconfig=sim.kubeconfig_path)
        if reader:  # refused before any object of the step is created
            argv = ["launch", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "4"]
            argv += ["--kubeconfig", sim.kubeconfig_path, "--module", "json.tool"]
            started = time.monotonic()
            assert cli.main([*argv, "--unschedulable-grace-s", str(GRACE_S)]) == 2
            took = time.monotonic() - started
            error = json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
            assert "no node of this cluster has a GPU" in error, error
            made = sim.objects(RunNames.for_run(run_id).selector)
            assert [o for o in made if o[0] in ("Service", "Job", "Pod")] == [], made
        else:  # nodes unreadable: the scheduler's words cannot tell none from all in use
            workload = from_inputs(
                WorkloadSpec, run_id=run_id, purpose="job", nodes=2, gpus_per_node=4,
                unschedulable_grace_s=1)  # fmt: skip
            started = time.monotonic()
            with pytest.raises(WorkloadFailed) as info:
                steps.launch(workload, "json.tool", ["--help"], kubeconfig=sim.kubeconfig_path)
            took = time.monotonic() - started
            error = str(info.value)
        steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert "pass --gpus-per-node 0" in error, error
    assert took < GRACE_S, f"answered after {took:.1f} s"
