"""Shared storage: --pvc mounts in every worker, checkpoint and data paths must be on one, and
a killed training run resumes from its last checkpoint on the same claim."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from kubernetes import client, config

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, TrainConfig, WorkloadSpec, from_inputs
from tests.sim.simkit import create_claim, wait_for

CLAIM = "team-ckpt"
MOUNT = "/mnt/shared"


@pytest.fixture(scope="module")
def sim(sim):
    """The module's cluster (conftest) with the claim the runs mount."""
    create_claim(sim, CLAIM)
    return sim


def _left(sim, run_id: str) -> list:
    return [o for o in sim.objects() if RunNames.for_run(run_id).base in o[2]]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--checkpoint-dir", "/ckpt"], "recovery.checkpoint_dir (--checkpoint-dir)"),
        (
            ["--pvc", f"{CLAIM}:/data", "--checkpoint-dir", "/ckpt/run"],
            "recovery.checkpoint_dir (--checkpoint-dir)",
        ),
        (
            ["--pvc", f"{CLAIM}:{MOUNT}:ro", "--checkpoint-dir", f"{MOUNT}/c"],
            "recovery.checkpoint_dir (--checkpoint-dir)",
        ),
        (["--data", "/local/tokens.bin"], "data (--data)"),
        (
            ["--allow-local-checkpoint", "--checkpoint-dir", "/ckpt"],
            "recovery.allow_local_checkpoint (--allow-local-checkpoint)",
        ),
        (["--pvc", "Bad_Claim:/x"], "pod.pvc (--pvc)"),
    ],
)
def test_paths_off_a_shared_volume_exit_2_before_anything_exists(sim, capsys, extra, field):
    run_id = f"pv-{uuid.uuid4().hex[:8]}"
    steps.provision(DomainSpec(run_id=run_id), kubeconfig=sim.kubeconfig_path)
    argv = ["train", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0", *extra]
    assert cli.main([*argv, "--kubeconfig", sim.kubeconfig_path]) == 2
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert error.startswith(f"{field}:")
    assert [o[0] for o in _left(sim, run_id)] in (
        ["ComputeDomain", "ResourceClaimTemplate"],
        ["ResourceClaimTemplate", "ComputeDomain"],
    )  # only what provision made: no Job, no Service
    steps.teardown(DomainSpec(run_id=run_id, delete_timeout_s=30), kubeconfig=sim.kubeconfig_path)
    assert _left(sim, run_id) == []


def test_every_worker_pod_mounts_the_claims():
    from mnnvl.manifests import indexed_job

    workload = from_inputs(WorkloadSpec, run_id="r", pvc=(f"{CLAIM}:{MOUNT}", "data:/data:ro"))
    pod = indexed_job(workload, "m", [])["spec"]["template"]["spec"]
    volumes = {v["name"]: v.get("persistentVolumeClaim") for v in pod["volumes"]}
    assert volumes["pvc-0"] == {"claimName": CLAIM, "readOnly": False}
    assert volumes["pvc-1"] == {"claimName": "data", "readOnly": True}
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "pvc-1", "mountPath": "/data", "readOnly": True} in mounts


def _delete_job_once_checkpointed(sim, job: str, latest: Path, killed: threading.Event) -> None:
    wait_for(latest.exists, 120, "the first checkpoint")
    batch = client.BatchV1Api(config.new_client_from_config(config_file=sim.admin_kubeconfig_path))
    batch.delete_namespaced_job(job, "default", propagation_policy="Background")
    killed.set()


@pytest.mark.slow
def test_killed_training_resumes_from_the_last_checkpoint_on_the_same_claim(sim):
    train = TrainConfig(steps=120, checkpoint_dir=f"{MOUNT}/llama", checkpoint_every=5, log_every=5)
    first, second = (f"rs-{uuid.uuid4().hex[:8]}" for _ in range(2))
    latest = Path(sim.pvc_dir("default", CLAIM)) / "llama" / "latest"

    def workload(run_id: str) -> WorkloadSpec:
        return from_inputs(
            WorkloadSpec,
            run_id=run_id,
            nodes=2,
            gpus_per_node=0,
            pvc=(f"{CLAIM}:{MOUNT}",),
            job_timeout_s=300,
        )

    killed = threading.Event()
    steps.provision(DomainSpec(run_id=first), kubeconfig=sim.kubeconfig_path)
    killer = threading.Thread(
        target=_delete_job_once_checkpointed,
        args=(sim, RunNames.for_run(first).job("train"), latest, killed),
        daemon=True,
    )
    killer.start()
    with pytest.raises(WorkloadFailed, match="was deleted while the step waited"):
        steps.train(workload(first), train, kubeconfig=sim.kubeconfig_path)
    assert killed.is_set()
    steps.teardown(DomainSpec(run_id=first, delete_timeout_s=60), kubeconfig=sim.kubeconfig_path)
    saved = int(latest.read_text().strip().removeprefix("step-"))
    assert 0 < saved < 120

    steps.provision(DomainSpec(run_id=second), kubeconfig=sim.kubeconfig_path)
    try:
        result = steps.train(workload(second), train, kubeconfig=sim.kubeconfig_path)
    finally:
        steps.teardown(
            DomainSpec(run_id=second, delete_timeout_s=60), kubeconfig=sim.kubeconfig_path
        )
    assert result.start_step >= saved  # a later checkpoint may have landed before the kill
    assert result.raw["resumed_from"].endswith(f"llama/step-{result.start_step}")
    assert result.steps == 120 and result.raw["losses"][0][0] == result.start_step + 1
    assert _left(sim, first) == [] and _left(sim, second) == []


def test_run_with_a_local_checkpoint_dir_stops_before_provisioning(sim, capsys):
    run_id = f"pr-{uuid.uuid4().hex[:8]}"
    argv = ["run", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0"]
    argv += ["--checkpoint-dir", "/tmp/ckpt", "--kubeconfig", sim.kubeconfig_path]
    assert cli.main(argv) == 2
    assert (
        "recovery.checkpoint_dir (--checkpoint-dir): /tmp/ckpt is not under a mounted PVC"
        in capsys.readouterr().out
    )
    assert _left(sim, run_id) == []
