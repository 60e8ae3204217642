"""The verify step end to end on the simulated cluster: real workers (gloo), verdicts, reports.

The gating rows (FAIL and NOT_JUDGED failing the step) are in ``test_fault_matrix.py``."""

from __future__ import annotations

import logging
import uuid

import pytest

from mnnvl import steps
from mnnvl.errors import VerificationFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, VerifyConfig, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster

SIM = dict(nodes=2)


@pytest.fixture
def run(sim):
    run_id = f"v-{uuid.uuid4().hex[:10]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    workload = WorkloadSpec(
        run_id=run_id, purpose="verify-pre", nodes=2, gpus_per_node=0, job_timeout_s=120
    )
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    yield workload
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert sim.objects(RunNames.for_run(run_id).selector) == []


@pytest.mark.slow
def test_verify_pass_returns_numbers_and_writes_reports(sim, run, tmp_path, caplog):
    config = VerifyConfig(max_bytes=64 << 10, min_busbw_gbps=1e-6)
    caplog.set_level(logging.INFO, logger="mnnvl")
    result = steps.verify(run, config, kubeconfig=sim.kubeconfig_path, report_dir=str(tmp_path))
    said = [m for m in caplog.messages if m.startswith("verify ")]
    assert len(said) == 1 and "None" not in said[0] and "none" not in said[0]  # no NCCL on CPU
    assert "threshold 1e-06 GB/s (user)" in said[0] and "gloo on CPU" in said[0]
    assert result.verdict == "PASS"
    assert result.raw["world_size"] == 2 and result.raw["backend"] == "gloo"
    assert all(size["correct"] for size in result.sizes)
    assert {"json", "markdown", "html"} <= set(result.report_files)


@pytest.mark.slow
def test_verify_fail_keeps_the_numbers_when_not_gating(sim, run, tmp_path):
    config = VerifyConfig(max_bytes=64 << 10, min_busbw_gbps=90_000)
    result = steps.verify(
        run, config, kubeconfig=sim.kubeconfig_path, report_dir=str(tmp_path), fail_on_fail=False
    )
    assert result.verdict == "FAIL"
    assert result.threshold_gbps == 90_000
    assert result.judged_busbw_gbps is not None and result.judged_busbw_gbps < 90_000
    assert (tmp_path / "verify.md").read_text().count("FAIL") >= 1


@pytest.mark.slow
def test_pods_that_asked_for_gpus_and_see_none_fail_naming_the_pod():
    # Simulated nodes with GPUs, but this machine has none to hand to the pods.
    with SimCluster(nodes=2, gpus_per_node=1) as cluster:
        run_id = f"g-{uuid.uuid4().hex[:10]}"
        domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
        workload = from_inputs(
            WorkloadSpec,
            run_id=run_id,
            purpose="verify-pre",
            nodes=2,
            gpus_per_node=1,
            clique_affinity=False,
            job_timeout_s=120,
        )
        steps.provision(domain, kubeconfig=cluster.kubeconfig_path)
        try:
            config = VerifyConfig(max_bytes=64 << 10, allow_unjudged=True)
            with pytest.raises(VerificationFailed) as info:
                steps.verify(workload, config, kubeconfig=cluster.kubeconfig_path)
        finally:
            steps.teardown(domain, kubeconfig=cluster.kubeconfig_path)
        message = str(info.value)
        pod = RunNames.for_run(run_id).job("verify-pre")
        assert f"pod {pod}" in message and "requested 1 GPU(s) but the worker sees none" in message
        assert "backend gloo" not in message
        assert cluster.objects(RunNames.for_run(run_id).selector) == []
