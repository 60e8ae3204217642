"""A lost step process costs nothing but time: the same `mnnvl train` run again adopts its Job.

A KFP or Argo step pod that is evicted or drained takes the step's process with it (SIGTERM, or
SIGKILL past the grace period); the orchestrator's retry runs the same command again. Each test
runs the CLI as its own process against the simulator, stops it mid-training, runs it again
and checks: exit 0, the same Job (uid) and no new pods unless a gang restart made them, the
result of the whole training, only requests the shipped Role grants, nothing left after
teardown. Each prints what the retry cost (retry start to the Job adopted, to rank 0's log
followed again), the figures docs/recovery.md quotes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw, create_claim, wait_for
from tests.sim.test_rbac_least_privilege import REPO, role_rules

SIM = dict(nodes=2, local_gpus=[], imex_delay_s=0.1)
CLAIM, MOUNT = "adopt-ckpt", "/ckpt"
ROLE = role_rules(REPO / "manifests" / "base" / "rbac.yaml")
CDS = "/apis/resource.nvidia.com/v1beta1/namespaces/default/computedomains"
WORKERS = {"done.py": "print('RESULT {\"ok\": true}', flush=True)\n"}


@pytest.fixture(scope="module")
def sim(sim: SimCluster) -> SimCluster:
    """The module's cluster with the claim the runs checkpoint on."""
    create_claim(sim, CLAIM)
    return sim


@pytest.fixture(scope="module")
def fixture_requests(sim: SimCluster) -> set[tuple[str, str, str]]:
    """What the fixtures asked of the API (the claim): not the steps' requests."""
    return sim.rbac_requests


class Run:
    """One provisioned run and the `mnnvl train` command line of its step."""

    def __init__(self, sim: SimCluster, *extra: str) -> None:
        self.sim, self.id = sim, f"ad-{uuid.uuid4().hex[:8]}"
        self.names = RunNames.for_run(self.id)
        self.job = self.names.job("train")
        self.domain = DomainSpec(run_id=self.id, delete_timeout_s=30)
        steps.provision(self.domain, kubeconfig=sim.kubeconfig_path)
        self.argv = [sys.executable, "-m", "mnnvl", "train", "-v", "--run-id", self.id]
        self.argv += ["--kubeconfig", sim.kubeconfig_path, "--nodes", "2", "--gpus-per-node", "0"]
        self.argv += ["--steps", "150", "--log-every", "5", "--checkpoint-every", "10"]
        self.argv += ["--pvc", f"{CLAIM}:{MOUNT}", "--checkpoint-dir", f"{MOUNT}/{self.id}"]
        self.argv += ["--collective-timeout-s", "10", "--stall-timeout-s", "20"]
        self.argv += ["--pods-running-timeout-s", "120", "--job-timeout-s", "300", *extra]

    def start(self) -> subprocess.Popen[str]:
        """The step, once its first checkpoint is written (training is under way)."""
        proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        latest = Path(self.sim.pvc_dir("default", CLAIM)) / self.id / "latest"
        wait_for(lambda: latest.exists() or proc.poll() is not None, 180, "a first checkpoint")
        assert proc.poll() is None, proc.communicate()
        return proc

    def job_uid(self) -> str:
        return str(Raw(self.sim).get(self.path)["metadata"]["uid"])

    @property
    def path(self) -> str:
        return f"/apis/batch/v1/namespaces/default/jobs/{self.job}"

    def pods(self) -> list[dict[str, Any]]:
        found = Raw(self.sim).call(
            "GET", "/api/v1/namespaces/default/pods", labelSelector=f"job-name={self.job}"
        )
        return list(found["items"])

    def pod(self, index: int) -> str:
        return next(
            p["metadata"]["name"]
            for p in self.pods()
            if p["metadata"]["name"].startswith(f"{self.job}-{index}-")
            and p["status"].get("phase") == "Running"
        )

    def pods_created(self) -> int:
        created = [e for e in self.sim.events if e.get("reason") == "SuccessfulCreate"]
        return sum(e["involvedObject"]["name"] == self.job for e in created)

    def close(self) -> None:
        steps.teardown(self.domain, kubeconfig=self.sim.kubeconfig_path)  # the exit handler
        assert self.sim.objects(self.names.selector) == []
        assert [o for o in self.sim.objects() if self.names.base in o[2]] == []


@pytest.fixture
def run(sim: SimCluster) -> Iterator[Any]:
    made: list[Run] = []

    def make(*extra: str) -> Run:
        made.append(Run(sim, *extra))
        return made[-1]

    yield make
    for r in made:
        r.close()


class Retry:
    """The step run again, its stderr read as it comes: when the Job was adopted, when rank
    0's log was followed again."""

    def __init__(self, r: Run) -> None:
        self.started = time.monotonic()
        self.adopted_s: float | None = None
        self.following_s: float | None = None
        self.lines: list[str] = []
        proc = subprocess.Popen(r.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        reader = threading.Thread(target=self._read, args=(proc.stderr, r.job), daemon=True)
        reader.start()
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=300)
        reader.join(timeout=10)
        self.wall_s = time.monotonic() - self.started
        self.code = proc.returncode
        self.result: dict[str, Any] = json.loads(out.splitlines()[-1])

    def _read(self, stream: Any, job: str) -> None:
        for line in stream:
            self.lines.append(line)
            now = time.monotonic() - self.started
            if self.adopted_s is None and f"adopted Job default/{job}," in line:
                self.adopted_s = now
            if self.following_s is None and line.startswith(f"[{job}-0-"):
                self.following_s = now

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def report(self, what: str) -> None:
        def s(seconds: float | None) -> str:
            return "—" if seconds is None else f"{seconds:.2f} s"

        print(
            f"{what}: retry adopted the Job after {s(self.adopted_s)}, followed rank 0 after "
            f"{s(self.following_s)}, finished after {self.wall_s:.1f} s"
        )


def refused(sim: SimCluster, fixture_requests: set[tuple[str, str, str]]) -> list[Any]:
    """Requests of the steps that the shipped Role would refuse (403 on a real cluster)."""
    return sorted(sim.rbac_requests - fixture_requests - ROLE)


@pytest.mark.slow(50)
def test_a_train_step_killed_mid_training_and_run_again_adopts_its_job_and_finishes(
    sim: SimCluster, run: Any, fixture_requests: set[tuple[str, str, str]]
) -> None:
    r = run()
    proc = r.start()
    uid, created = r.job_uid(), r.pods_created()
    proc.kill()  # the step's pod is gone: no handler runs
    proc.communicate()
    retry = Retry(r)
    assert retry.code == 0, retry.stderr[-3000:]
    assert retry.result["ok"] is True and retry.result["steps"] == 150
    assert retry.result["restarts"] == 0 and retry.result["start_step"] == 0
    assert r.job_uid() == uid and r.pods_created() == created  # adopted, not recreated
    assert f"adopted Job default/{r.job}, running since " in retry.stderr
    assert refused(sim, fixture_requests) == []
    retry.report("killed step")


@pytest.mark.slow(65)
def test_a_killed_step_whose_job_lost_a_worker_meanwhile_restarts_the_gang_when_run_again(
    sim: SimCluster, run: Any, fixture_requests: set[tuple[str, str, str]]
) -> None:
    r = run("--max-restarts", "4")
    proc = r.start()
    uid = r.job_uid()
    proc.kill()
    proc.communicate()
    # While nobody watches, a worker is lost and its peer stays in its collective, as NCCL's
    # ranks do with a dead peer until their timeout (gloo's would fail at once).
    sim.signal_pod("default", r.pod(0), signal.SIGSTOP)
    victim = r.pod(1)
    sim.signal_pod("default", victim, signal.SIGKILL)
    wait_for(
        lambda: any(
            p["metadata"]["name"] == victim and p["status"].get("phase") == "Failed"
            for p in r.pods()
        ),
        30,
        "the lost worker's pod to fail",
    )
    retry = Retry(r)
    assert retry.code == 0, retry.stderr[-3000:]
    result = retry.result
    assert result["ok"] is True and result["steps"] == 150 and result["restarts"] == 1
    assert result["start_step"] >= 10  # resumed from a checkpoint, not from step 0
    assert f"attempt 1 failed: pod {victim} (rank 1) on node " in retry.stderr
    assert "first: exit code 137 (signal SIGKILL)" in retry.stderr
    assert r.job_uid() == uid
    assert refused(sim, fixture_requests) == []
    retry.report("killed step, worker lost meanwhile")
    print(f"  gang restart: recovery {result['recovery_s']} s, steps lost {result['steps_lost']}")


@pytest.mark.slow
def test_a_sigtermed_train_step_leaves_its_healthy_job_for_the_retry(
    sim: SimCluster, run: Any, fixture_requests: set[tuple[str, str, str]]
) -> None:
    r = run()
    proc = r.start()
    uid, created = r.job_uid(), r.pods_created()
    os.kill(proc.pid, signal.SIGTERM)  # a node drain: the pod is deleted gracefully
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    assert json.loads(out.splitlines()[-1])["error"] == "interrupted by SIGTERM"
    assert f"Job default/{r.job} is left as it is; the step run again" in err
    job = Raw(sim).get(r.path)
    assert "deletionTimestamp" not in job["metadata"] and job["status"].get("active") == 2
    assert sorted(p["status"]["phase"] for p in r.pods()) == ["Running", "Running"]
    retry = Retry(r)
    assert retry.code == 0, retry.stderr[-3000:]
    assert retry.result["steps"] == 150 and retry.result["restarts"] == 0
    assert r.job_uid() == uid and r.pods_created() == created
    assert refused(sim, fixture_requests) == []
    retry.report("SIGTERMed step")


def test_a_step_run_again_after_its_job_completed_returns_its_result_and_says_so(
    sim: SimCluster, workers: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = f"ad-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    workload = WorkloadSpec(run_id=run_id, purpose="job", nodes=2, gpus_per_node=0,
                            env={"PYTHONPATH": workers}, job_timeout_s=60)  # fmt: skip
    job = RunNames.for_run(run_id).job("job")
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    first = steps.launch(workload, "done", [], kubeconfig=sim.kubeconfig_path)
    uid = Raw(sim).get(f"/apis/batch/v1/namespaces/default/jobs/{job}")["metadata"]["uid"]
    caplog.set_level("INFO", logger="mnnvl")
    again = steps.launch(workload, "done", [], kubeconfig=sim.kubeconfig_path)
    assert again.result == first.result == {"ok": True} and again.job == first.job
    adopted = [m for m in caplog.messages if m.startswith(f"adopted Job default/{job}, ")]
    assert len(adopted) == 1 and adopted[0].split(", ")[1].startswith("complete since 20")
    # The result says so too, and the log in words a reader cannot miss.
    assert first.adopted == "" and again.adopted.startswith("complete since 20")
    assert again.to_dict()["adopted"] == again.adopted
    assert any(
        r.levelname == "WARNING" and "already ran with these inputs" in r.getMessage()
        for r in caplog.records
    )
    assert Raw(sim).get(f"/apis/batch/v1/namespaces/default/jobs/{job}")["metadata"]["uid"] == uid
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert sim.objects(RunNames.for_run(run_id).selector) == []


def test_verify_run_again_returns_its_verdict_and_says_from_when_until_asked_to_measure_again(
    sim: SimCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from mnnvl.cli import main as cli

    run_id = f"ad-{uuid.uuid4().hex[:8]}"
    names = RunNames.for_run(run_id)
    job, cd = names.job("verify"), f"{CDS}/{names.domain}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    domain_uid = Raw(sim).get(cd)["metadata"]["uid"]
    argv = ["verify", "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0",
            "--min-busbw-gbps", "0.001", "--kubeconfig", sim.kubeconfig_path]  # fmt: skip

    def verify(*extra: str) -> tuple[dict[str, Any], str, str]:
        assert cli.main([*argv, *extra]) == 0
        out, err = capsys.readouterr()
        uid = Raw(sim).get(f"/apis/batch/v1/namespaces/default/jobs/{job}")["metadata"]["uid"]
        return json.loads(out.splitlines()[-1]), err, uid

    first, _, first_uid = verify()
    again, err, again_uid = verify()
    assert first["adopted"] == "" and again["adopted"].startswith("complete since 20")
    assert again_uid == first_uid and again["raw"] == first["raw"]
    assert "already ran with these inputs" in err and "--measure-again" in err
    measured, err, measured_uid = verify("--measure-again")
    assert measured["adopted"] == "" and measured_uid != first_uid
    assert measured["raw"]["wall_s"] != first["raw"]["wall_s"]  # a new measurement
    assert f"verify: measuring again (deleted Job default/{job})" in err
    assert Raw(sim).get(cd)["metadata"]["uid"] == domain_uid  # the domain stayed
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert sim.objects(names.selector) == []
