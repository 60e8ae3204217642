"""``manifests/overlays/trainer`` is exactly what the TrainJob path sends: every request of the
train step with a TrainJob (created, adopted by a rerun), its preflight rows, the run's status
and its teardown, recorded by the simulated API server, against the overlay's Role and
ClusterRole."""

from __future__ import annotations

from pathlib import Path

from mnnvl import steps
from mnnvl.driver.api import Api
from mnnvl.driver.preflight_trainer import trainer_rows
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.test_rbac_least_privilege import role_rules

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "manifests" / "overlays" / "trainer" / "trainer-rbac.yaml"
REPORT = 'print("RESULT {\\"ok\\": true}", flush=True)\n'


def test_the_trainer_overlay_grants_exactly_what_the_trainjob_path_sends(tmp_path):
    (tmp_path / "report.py").write_text(REPORT)
    domain = DomainSpec(run_id="tj-rbac")
    workload = from_inputs(
        WorkloadSpec,
        run_id="tj-rbac",
        purpose="job",
        nodes=2,
        gpus_per_node=0,
        clique_affinity=False,
        env={"PYTHONPATH": str(tmp_path)},
        workload="trainjob",
    )
    with SimCluster(nodes=2, trainer=True, cluster_reader=True) as sim:
        kube = sim.kubeconfig_path
        with Api.connect(kube) as api:
            rows = trainer_rows(api, "default", "torch-distributed", 0)
        assert {r.status for r in rows} == {"PASS"}, rows
        steps.provision(domain, kubeconfig=kube)
        run = steps.launch(workload, "report", [], kubeconfig=kube)
        again = steps.launch(workload, "report", [], kubeconfig=kube)
        assert run.result == again.result == {"ok": True} and again.adopted
        assert [t["name"] for t in steps.status(domain, kubeconfig=kube).trainjobs] == [run.job]
        steps.teardown(domain, kubeconfig=kube)
        sent = {r for r in sim.rbac_requests if r[1] == "trainer.kubeflow.org"}
    granted = role_rules(OVERLAY) | role_rules(OVERLAY, "ClusterRole")
    assert sorted(sent - granted) == [], "requests the overlay would refuse (403)"
    assert sorted(granted - sent) == [], "granted but never used: drop them from the overlay"
