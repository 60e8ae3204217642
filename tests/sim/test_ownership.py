"""A run touches only what it owns: adoption by spec hash, deletes by label and uid, reap.

Every test drives the product (CLI or steps) against the simulated cluster over HTTP and
ends by checking that nothing of the run is left.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.driver import Api, Deletions
from mnnvl.driver.api import COMPUTE_DOMAIN, JOB, POD, SERVICE
from mnnvl.driver.lifecycle import wait_for_job
from mnnvl.driver.workload import create_workload
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs, with_inputs
from mnnvl.manifests import SPEC_HASH_ANNOTATION
from mnnvl.runtime.local import free_port
from mnnvl.sim import SimCluster
from tests.sim.simkit import foreign_domain
from tests.sim.simkit import wait_for as wait_until

RESULT_ONE = textwrap.dedent(
    """
    import json, os
    if os.environ["JOB_COMPLETION_INDEX"] == "0":
        print("RESULT " + json.dumps({"kind": "one"}), flush=True)
    """
)
RESULT_TWO = RESULT_ONE.replace('"one"', '"two"')


SIM = dict(nodes=2, namespaces=("default", "reap-empty", "reap-age"))
WORKERS = {
    "result_one.py": RESULT_ONE,
    "result_two.py": RESULT_TWO,
    "silent.py": "print('done, nothing to report')\n",
}


def job_workload(run_id: str, workers: str) -> WorkloadSpec:
    return from_inputs(
        WorkloadSpec,
        run_id=run_id,
        purpose="job",
        nodes=2,
        gpus_per_node=0,
        env={"PYTHONPATH": workers},
        rdzv_port=free_port(),
        pods_running_timeout_s=180,
        job_timeout_s=180,
    )


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(argv)
    return code, json.loads(capsys.readouterr().out.splitlines()[-1])


def left_of(sim: SimCluster, run_id: str) -> list[tuple[str, str, str]]:
    return sim.objects(RunNames.for_run(run_id).selector)


def test_teardown_leaves_a_foreign_domain_with_the_runs_name_alone(sim, capsys):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    names = RunNames.for_run(run_id)
    flags = ["--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
    with Api.connect(sim.kubeconfig_path) as api:
        theirs = api.create(COMPUTE_DOMAIN, "default", foreign_domain(names.domain))
        code, result = run_cli(capsys, ["provision", *flags])
        assert code == 2 and "not part of run" in result["error"]

        code, result = run_cli(capsys, ["teardown", *flags])
        assert code == 0 and result["ok"] is True
        assert result["deleted"] == []
        assert result["skipped"] == [
            f"ComputeDomain default/{names.domain}: not part of run {run_id} "
            "(it has none of our labels); left alone"
        ]
        assert (
            f"left alone (not this run's): ComputeDomain default/{names.domain}"
            in (result["message"])
        )
        still = api.get(COMPUTE_DOMAIN, "default", names.domain)
        assert still["metadata"]["uid"] == theirs["metadata"]["uid"]
        assert not still["metadata"].get("deletionTimestamp")
        assert left_of(sim, run_id) == []
        api.delete(COMPUTE_DOMAIN, "default", names.domain)


def test_teardown_reports_every_foreign_object_with_the_runs_names(sim, capsys):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    names = RunNames.for_run(run_id)
    theirs = {"name": "", "namespace": "default", "labels": {"team": "x"}}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {**theirs, "name": names.service("job")},
        "spec": {"clusterIP": "None", "ports": [{"port": 1}]},
    }
    pod = {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**theirs, "name": names.job("train", 1)},
        "spec": {"suspend": True, "template": {"spec": pod}},
    }
    with Api.connect(sim.kubeconfig_path) as api:
        api.create(COMPUTE_DOMAIN, "default", foreign_domain(names.domain))
        api.create(SERVICE, "default", service)
        api.create(JOB, "default", job)
        code, result = run_cli(
            capsys, ["teardown", "--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
        )
        assert code == 0 and result["deleted"] == [], result
        why = f"not part of run {run_id} (it has none of our labels); left alone"
        assert sorted(result["skipped"]) == sorted(
            f"{kind} default/{name}: {why}"
            for kind, name in (
                ("ComputeDomain", names.domain),
                ("Service", names.service("job")),
                ("Job", names.job("train", 1)),
            )
        )
        assert api.get(SERVICE, "default", names.service("job"))
        assert api.get(JOB, "default", names.job("train", 1))
        api.delete(JOB, "default", names.job("train", 1), propagation="Background")
        api.delete(SERVICE, "default", names.service("job"))
        api.delete(COMPUTE_DOMAIN, "default", names.domain)


def test_launch_of_a_module_that_prints_no_result_line_succeeds_with_a_null_result(
    sim, workers, capsys
):
    """The Job's success is the verdict of a user's launch; a RESULT line is optional there
    (docs/troubleshooting.md: only train and verify need one)."""
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    flags = ["--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
    argv = ["launch", *flags, "--nodes", "2", "--gpus-per-node", "0", "--module", "silent"]
    argv += ["--env", f"PYTHONPATH={workers}", "--rdzv-port", str(free_port())]
    assert run_cli(capsys, ["provision", *flags])[0] == 0
    code, result = run_cli(capsys, argv)
    assert code == 0 and result["ok"] is True and result["result"] is None, result
    assert "done, nothing to report" in result["log_tail"]
    assert run_cli(capsys, ["teardown", *flags])[0] == 0
    assert left_of(sim, run_id) == []


def test_every_created_object_carries_its_spec_hash(sim, workers):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    workload = job_workload(run_id, workers)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    steps.launch(workload, "result_one", [], kubeconfig=sim.kubeconfig_path)
    names = RunNames.for_run(run_id)
    with Api.connect(sim.kubeconfig_path) as api:
        objects = [
            api.get(COMPUTE_DOMAIN, "default", names.domain),
            api.get(SERVICE, "default", names.service("job")),
            api.get(JOB, "default", names.job("job")),
        ]
    hashes = [o["metadata"]["annotations"][SPEC_HASH_ANNOTATION] for o in objects]
    assert all(len(h) == 16 for h in hashes) and len(set(hashes)) == 3
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert left_of(sim, run_id) == []


def test_launch_of_another_module_with_the_same_run_id_is_a_conflict(sim, workers, capsys):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    workload = job_workload(run_id, workers)
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    first = steps.launch(workload, "result_one", [], kubeconfig=sim.kubeconfig_path)
    assert first.result == {"kind": "one"}

    job = RunNames.for_run(run_id).job("job")
    argv = ["launch", "--run-id", run_id, "--purpose", "job", "--nodes", "2"]
    argv += ["--gpus-per-node", "0", "--env", f"PYTHONPATH={workers}"]
    argv += ["--rdzv-port", str(workload.pod.rdzv_port), "--job-timeout-s", "180"]
    argv += ["--pods-running-timeout-s", "180", "--kubeconfig", sim.kubeconfig_path]
    same_module = [*argv, "--module", "result_one"]
    argv += ["--module", "result_two"]
    code, result = run_cli(capsys, argv)
    assert code == 2 and result["exit_code"] == 2, result
    assert f"Job default/{job} of run {run_id} exists with a different spec" in result["error"]
    assert f"mnnvl teardown --run-id {run_id}" in result["error"]
    code, result = run_cli(capsys, same_module)  # the same launch again adopts its Job
    assert code == 0 and result["result"] == {"kind": "one"}, result

    code, result = run_cli(
        capsys, ["teardown", "--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
    )
    assert code == 0 and result["skipped"] == []
    assert left_of(sim, run_id) == []


@pytest.mark.slow
def test_a_retried_step_fails_on_its_failed_job_and_other_input_replaces_it(sim, workers):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    # No restarts: the one failed pod fails the Job (maxFailedIndexes: 0).
    workload = with_inputs(job_workload(run_id, workers), max_restarts=0)
    job = RunNames.for_run(run_id).job("job")
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    sim.faults.fail_pod(job, index=1, mode="Failed", exit_code=1)
    with Api.connect(sim.kubeconfig_path) as api:
        # A step that died before it could remove its failed Job (a failed step removes it
        # itself): the Job is left Failed.
        create_workload(api, workload, "result_one", [])
        with pytest.raises(WorkloadFailed):
            wait_for_job(api, workload, job)

        def job_failed() -> bool:
            conditions = api.get(JOB, "default", job).get("status", {}).get("conditions") or []
            return any(c["type"] == "Failed" and c["status"] == "True" for c in conditions)

        wait_until(job_failed)  # the Job controller's verdict follows the pod's failure
        failed_uid = api.get(JOB, "default", job)["metadata"]["uid"]

        # The retry adopts the Failed Job: the step fails with the Job's own diagnosis and
        # leaves the record of it, instead of running the workload again.
        with pytest.raises(WorkloadFailed) as info:
            steps.launch(workload, "result_one", [], kubeconfig=sim.kubeconfig_path)
        assert f"Job default/{job} failed" in str(info.value) and "exit code 1" in str(info.value)
        assert api.get(JOB, "default", job)["metadata"]["uid"] != failed_uid  # the record

        retried = steps.launch(workload, "result_two", [], kubeconfig=sim.kubeconfig_path)
        assert retried.result == {"kind": "two"}  # other input replaced the record
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    assert left_of(sim, run_id) == []


@pytest.mark.client  # the delete's uid precondition, as the client sends it
def test_a_delete_never_removes_an_object_that_replaced_the_one_it_read(sim):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    labels = RunNames.for_run(run_id).labels("job")
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"svc-{run_id}", "namespace": "default", "labels": labels},
        "spec": {"clusterIP": "None", "ports": [{"port": 29500}]},
    }
    with Api.connect(sim.kubeconfig_path) as api:
        read = api.create(SERVICE, "default", body)
        api.delete(SERVICE, "default", body["metadata"]["name"])
        newer = api.create(SERVICE, "default", body)
        gone = Deletions(run_id)
        assert gone.delete(api, SERVICE, read) is False
        assert gone.deleted == []
        assert "replaced by another object" in gone.skipped[0]
        kept = api.get(SERVICE, "default", body["metadata"]["name"])
        assert kept["metadata"]["uid"] == newer["metadata"]["uid"]
        assert gone.delete(api, SERVICE, kept) is True
    assert left_of(sim, run_id) == []


def test_reap_with_an_empty_live_list_is_refused_then_dry_run_lists_without_deleting(sim, capsys):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    names = RunNames.for_run(run_id)
    domain = DomainSpec(run_id=run_id, namespace="reap-empty")
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    base = ["reap", "--namespace", "reap-empty", "--kubeconfig", sim.kubeconfig_path]

    before = sim.request_counts
    code, result = run_cli(capsys, [*base, "--live-run-ids", ""])
    assert code == 2 and result["error"].startswith("live_run_ids (--live-run-ids): is empty")
    assert "all_dead" in result["error"]
    code, result = run_cli(capsys, base)
    assert code == 2 and result["error"].startswith(
        "live_run_ids (--live-run-ids): reap needs to know"
    )
    seen = sim.request_counts - before  # refused before it listed or deleted anything
    assert not [k for k in seen if k[0] in ("LIST", "DELETE") and k[1] == "computedomains"]

    code, result = run_cli(capsys, [*base, "--live-run-ids", "", "--all-dead", "--dry-run"])
    assert code == 0 and result["dry_run"] is True
    assert result["runs"] == [run_id] and result["deleted"] == []
    assert result["would_delete"] == [f"ComputeDomain reap-empty/{names.domain}"]
    assert left_of(sim, run_id) == [("ComputeDomain", "reap-empty", names.domain)]

    code, result = run_cli(capsys, [*base, "--all-dead"])
    assert code == 0 and result["deleted"] == [f"ComputeDomain reap-empty/{names.domain}"]
    assert left_of(sim, run_id) == []


def _sleeping_job(run_id: str, namespace: str, seconds: float) -> dict[str, Any]:
    names = RunNames.for_run(run_id)
    labels = names.labels("job")
    container = {"name": "worker", "image": "busybox", "command": ["sleep", str(seconds)]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": names.job("job"), "namespace": namespace, "labels": labels},
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def test_reap_age_counts_from_the_runs_last_activity_not_its_creation(sim):
    run_id = f"own-{uuid.uuid4().hex[:8]}"
    names = RunNames.for_run(run_id)
    ns = "reap-age"
    steps.provision(DomainSpec(run_id=run_id, namespace=ns), kubeconfig=sim.kubeconfig_path)
    created = time.monotonic()

    def reap(dry_run: bool = True) -> steps.ReapResult:
        return steps.reap(
            ns, live_run_ids=None, older_than_s=2.0, dry_run=dry_run, kubeconfig=sim.kubeconfig_path
        )

    with Api.connect(sim.kubeconfig_path) as api:
        api.create(JOB, ns, _sleeping_job(run_id, ns, 4))

        def phases() -> set[str]:
            pods = api.list(POD, ns, label_selector=names.selector)["items"]
            return {p.get("status", {}).get("phase", "") for p in pods}

        wait_until(lambda: phases() == {"Running"})
        time.sleep(max(0.0, created + 3.0 - time.monotonic()))
        assert reap().runs == []  # every object is older than 2 s, but a pod is Running

        wait_until(lambda: phases() == {"Succeeded"})
        assert reap().runs == []  # the pod just finished: the run was active moments ago

        time.sleep(2.5)
        dry = reap()
        assert dry.runs == [run_id] and dry.idle_s[run_id] >= 2.0
        assert sorted(dry.would_delete) == [
            f"ComputeDomain {ns}/{names.domain}",
            f"Job {ns}/{names.job('job')}",
        ]
        assert len(left_of(sim, run_id)) == 3  # domain, Job, pod: a dry run deletes nothing

    done = reap(dry_run=False)
    assert done.runs == [run_id] and len(done.deleted) == 2
    assert left_of(sim, run_id) == []
