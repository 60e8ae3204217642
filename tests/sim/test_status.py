"""`mnnvl status`: what a run has in the cluster, before and after teardown."""

from __future__ import annotations

import json

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec
from mnnvl.sim import SimCluster


def test_status_shows_the_domain_and_job_then_nothing_after_teardown(capsys):
    domain = DomainSpec(run_id="status-run", delete_timeout_s=30)
    with SimCluster(nodes=2) as sim:
        kube = sim.kubeconfig_path
        steps.provision(domain, kubeconfig=kube)
        workload = WorkloadSpec(run_id=domain.run_id, purpose="job", nodes=2, gpus_per_node=0)
        steps.launch(workload, "json.tool", ["--help"], kubeconfig=kube)

        capsys.readouterr()
        assert cli.main(["status", "--run-id", domain.run_id, "--kubeconfig", kube]) == 0
        said = capsys.readouterr()
        found = json.loads(said.out.splitlines()[-1])
        # Lines a person reads, not Python reprs.
        assert (
            "{'" not in said.err
            and "0 active, 2 succeeded, 0 failed; SuccessCriteriaMet, Complete" in said.err
        )
        assert found["ok"] is True and found["domain"]["name"].startswith("mnnvl-status-run")
        assert found["channel_template"] is True
        assert [j["succeeded"] for j in found["jobs"]] == [2]
        assert sorted(p["index"] for p in found["pods"]) == ["0", "1"]
        assert {p["phase"] for p in found["pods"]} == {"Succeeded"}

        steps.teardown(domain, kubeconfig=kube)
        after = steps.status(domain, kubeconfig=kube)
        assert after.domain is None and after.channel_template is False
        assert (after.jobs, after.pods, after.services) == ([], [], [])


def test_status_of_a_run_with_nothing_names_the_domain_it_looked_for(capsys):
    with SimCluster(nodes=1) as sim:
        code = cli.main(["status", "--run-id", "gone-run", "--kubeconfig", sim.kubeconfig_path])
    said = capsys.readouterr().err
    assert code == 0
    assert "ComputeDomain -" not in said
    assert "ComputeDomain mnnvl-gone-run" in said and ": absent" in said
