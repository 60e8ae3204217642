"""The Kubeflow Trainer stand-in: a TrainJob from the builder runs as Trainer's torch runtime
runs it (pods, names, env, claims), restarts as the runtime's JobSet failure policy says, ends
``Complete`` or ``Failed`` as Trainer reports it; its API is served and validated only where
Trainer is installed, and the runner may use it through ``manifests/overlays/trainer``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client import ApiException
from kubernetes.dynamic import DynamicClient

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.manifests import compute_domain
from mnnvl.manifests.trainjob import trainjob
from mnnvl.sim import SimCluster
from tests.conftest import REPO_ROOT, find_schema_dir
from tests.sim.simkit import NS, Raw, _NoDiscovery, wait_for

TJ_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
RUNTIMES = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
PRINT_RANK = (
    "import json, os; print('SEEN', json.dumps({k: os.environ.get(k) for k in "
    "('PET_NODE_RANK', 'PET_NNODES', 'PET_MASTER_PORT', 'MASTER_ADDR', 'MNNVL_RUN_ID')}))"
)


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The upstream schemas plus Trainer's TrainJob CRD, in MNNVL_SCHEMA_DIR's layout."""
    out = tmp_path_factory.mktemp("schemas")
    for entry in find_schema_dir().iterdir():
        (out / entry.name).symlink_to(entry)
    (out / "kubeflow-trainer").symlink_to(REPO_ROOT / "tests" / "schemas" / "kubeflow-trainer")
    return str(out)


@pytest.fixture(scope="module")
def sim(schemas: str) -> Iterator[SimCluster]:
    with SimCluster(nodes=2, trainer=True, schema_dir=schemas) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def raw(sim: SimCluster) -> Raw:
    return Raw(sim)


def domain(raw: Raw, run_id: str) -> None:
    body = compute_domain(DomainSpec(run_id=run_id))
    raw.call("POST", f"/apis/resource.nvidia.com/v1beta1/namespaces/{NS}/computedomains", body)
    template = RunNames.for_run(run_id).channel_template
    path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates/{template}"
    wait_for(lambda: not raw.gone(path), what="channel template")


def condition(raw: Raw, name: str) -> dict[str, Any] | None:
    tj = raw.get(f"{TJ_PATH}/{name}")
    done = [c for c in (tj.get("status") or {}).get("conditions") or [] if c["status"] == "True"]
    return done[0] if done else None


def pods(raw: Raw, name: str) -> list[dict[str, Any]]:
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"
    return raw.call("GET", f"/api/v1/namespaces/{NS}/pods", labelSelector=sel)["items"]


def log(raw: Raw, pod: str) -> str:
    resp = raw.open("GET", f"/api/v1/namespaces/{NS}/pods/{pod}/log")
    try:
        return resp.data.decode()
    finally:
        resp.release_conn()


def make(raw: Raw, run_id: str, code: str, runtime: str = "torch-distributed") -> str:
    domain(raw, run_id)
    workload = from_inputs(
        WorkloadSpec, run_id=run_id, nodes=2, gpus_per_node=0, clique_affinity=False
    )
    tj = trainjob(workload, "", ["python3", "-c", code], runtime=runtime)
    raw.call("POST", TJ_PATH, tj)
    return tj["metadata"]["name"]


def test_a_trainjob_runs_one_pod_per_node_with_trainers_names_env_and_the_channel_claim(raw):
    name = make(raw, "tj-run", PRINT_RANK)
    done = wait_for(lambda: condition(raw, name), timeout=60, what="TrainJob finished")
    assert (done["type"], done["reason"]) == ("Complete", "AllJobsCompleted")
    found = sorted(pods(raw, name), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"].rsplit("-", 1)[0] for p in found] == [
        f"{name}-node-0-0",
        f"{name}-node-0-1",
    ]
    seen = []
    for pod in found:
        assert pod["spec"]["subdomain"] == name and pod["spec"]["hostname"].startswith(name)
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in pod["spec"]["resourceClaims"]}
        assert claims == {"imex-channel": RunNames.for_run("tj-run").channel_template}
        assert {"name": "imex-channel"} in pod["spec"]["containers"][0]["resources"]["claims"]
        line = next(x for x in log(raw, pod["metadata"]["name"]).splitlines() if "SEEN" in x)
        seen.append(json.loads(line.split("SEEN ", 1)[1]))
    assert sorted(s["PET_NODE_RANK"] for s in seen) == ["0", "1"]
    assert {s["PET_NNODES"] for s in seen} == {"2"} and {s["MNNVL_RUN_ID"] for s in seen} == {
        "tj-run"
    }
    assert raw.get(f"/api/v1/namespaces/{NS}/services/{name}")["spec"]["clusterIP"] == "None"


def gang_runtime(raw: Raw, name: str, max_restarts: int) -> None:
    runtime = raw.get(f"{RUNTIMES}/torch-distributed")
    runtime["metadata"] = {"name": name}
    spec = runtime["spec"]["template"]["spec"]
    spec["failurePolicy"] = {"maxRestarts": max_restarts}
    spec["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 0
    raw.call("POST", RUNTIMES, runtime)


def test_a_failed_pod_recreates_every_pod_up_to_max_restarts_then_completes(raw, tmp_path):
    gang_runtime(raw, "gang-1", 1)
    marker = tmp_path / "failed-once"
    code = (
        f"import os, sys; p = {str(marker)!r}\n"
        "if os.environ['PET_NODE_RANK'] == '1' and not os.path.exists(p):\n"
        "    open(p, 'w').close(); sys.exit(3)\n"
    )
    name = make(raw, "tj-restart", code, runtime="gang-1")
    done = wait_for(lambda: condition(raw, name), timeout=90, what="TrainJob finished")
    assert done["type"] == "Complete"
    attempts = {
        p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in pods(raw, name)
    }
    assert attempts == {"1"}  # every pod of the first attempt was replaced


def test_without_restarts_left_the_trainjob_fails_as_jobset_words_it(raw):
    name = make(raw, "tj-fail", "import sys; sys.exit(3)")
    done = wait_for(lambda: condition(raw, name), timeout=60, what="TrainJob finished")
    assert (done["type"], done["reason"]) == ("Failed", "FailedJobs")


class RunnerRaw(Raw):
    """Calls as the run's service account (``mnnvl-runner``), not as an admin."""

    def __init__(self, sim: SimCluster) -> None:
        self.api = kubernetes.config.new_client_from_config(config_file=sim.kubeconfig_path)
        self.dynamic = DynamicClient(self.api, discoverer=_NoDiscovery)


def test_the_runner_may_create_trainjobs_and_read_the_runtime_through_the_overlay(sim):
    runner = RunnerRaw(sim)
    assert runner.get(f"{RUNTIMES}/torch-distributed")["metadata"]["name"] == "torch-distributed"
    assert isinstance(runner.call("GET", TJ_PATH)["items"], list)
    with pytest.raises(ApiException) as refused:
        runner.call("DELETE", f"{RUNTIMES}/torch-distributed")
    assert refused.value.status == 403


def test_an_unknown_trainjob_field_is_refused_like_the_real_api_server(raw):
    body = trainjob(WorkloadSpec(run_id="tj-bad", nodes=2), "", ["true"])
    body["spec"]["trainer"]["numNode"] = 2
    with pytest.raises(ApiException) as refused:
        raw.call("POST", TJ_PATH, body)
    assert refused.value.status == 422 and "numNode" in str(refused.value.body)


def test_a_trainer_before_v2_4_refuses_the_claim_field(schemas):
    with SimCluster(
        nodes=1, trainer=True, trainer_claims_per_node=False, schema_dir=schemas
    ) as old:
        body = trainjob(WorkloadSpec(run_id="tj-old", nodes=1), "", ["true"])
        with pytest.raises(ApiException) as refused:
            Raw(old).call("POST", TJ_PATH, body)
    assert refused.value.status == 422 and "resourceClaimsPerNode" in str(refused.value.body)


def test_without_trainer_the_trainjob_api_is_not_served():
    with SimCluster(nodes=1) as bare, pytest.raises(ApiException) as missing:
        Raw(bare).call("GET", TJ_PATH)
    assert missing.value.status == 404


def test_teardown_removes_the_trainjob_and_its_pods_before_the_domain(sim, raw):
    name = make(raw, "tj-down", "import time; time.sleep(30)")
    wait_for(lambda: len(pods(raw, name)) == 2, timeout=60, what="the TrainJob's pods")
    result = steps.teardown(DomainSpec(run_id="tj-down"), kubeconfig=sim.kubeconfig_path)
    assert f"TrainJob default/{name}" in result.deleted
    assert raw.gone(f"{TJ_PATH}/{name}") and pods(raw, name) == []
    assert [o for o in sim.objects() if name in o[2]] == []
    assert sim.processes(f"jobset.sigs.k8s.io/jobset-name={name}") == []


REPORT = (
    'import os\nprint("RESULT {\\"ok\\": true, \\"rank\\": %s}" % os.environ["RANK"], flush=True)\n'
)


def test_the_step_runs_a_trainjob_restarted_by_its_runtime_and_counts_the_restart(
    sim, raw, tmp_path
):
    """The step's path: create the TrainJob, wait until Trainer says Complete, read rank 0's
    RESULT; a killed worker is restarted by the runtime's failure policy and counted."""
    gang_runtime(raw, "gang-step", 2)
    (tmp_path / "report.py").write_text(REPORT)
    marker = tmp_path / "killed-once"
    (tmp_path / "flaky.py").write_text(
        f"import os, sys\np = {str(marker)!r}\n"
        "if os.environ['RANK'] == '1' and not os.path.exists(p):\n"
        "    open(p, 'w').close(); sys.exit(1)\n" + REPORT
    )
    env = {"PYTHONPATH": str(tmp_path)}
    steps.provision(DomainSpec(run_id="tj-step"), kubeconfig=sim.kubeconfig_path)
    workload = from_inputs(
        WorkloadSpec,
        run_id="tj-step",
        purpose="job",
        nodes=2,
        gpus_per_node=0,
        clique_affinity=False,
        env=env,
        workload="trainjob",
        trainjob_runtime="gang-step",
    )
    launched = steps.launch(workload, "flaky", [], kubeconfig=sim.kubeconfig_path)
    assert launched.result == {"ok": True, "rank": 0}
    assert len(launched.restarts) == 1
    steps.teardown(DomainSpec(run_id="tj-step"), kubeconfig=sim.kubeconfig_path)
    assert raw.gone(f"{TJ_PATH}/{launched.job}")


def test_a_failed_trainjob_fails_the_step_with_trainers_reason_and_the_next_step(sim, raw):
    steps.provision(DomainSpec(run_id="tj-crash"), kubeconfig=sim.kubeconfig_path)
    workload = from_inputs(
        WorkloadSpec,
        run_id="tj-crash",
        purpose="job",
        nodes=2,
        gpus_per_node=0,
        clique_affinity=False,
        workload="trainjob",
    )
    with pytest.raises(WorkloadFailed) as failed:
        command = ["python3", "-c", "raise SystemExit(3)"]
        steps.launch(workload, "", command, kubeconfig=sim.kubeconfig_path)
    assert "FailedJobs" in str(failed.value) and "failurePolicy" in str(failed.value)
    steps.teardown(DomainSpec(run_id="tj-crash"), kubeconfig=sim.kubeconfig_path)


def test_mnnvl_run_sim_with_a_trainjob_verifies_before_and_after_and_leaves_nothing(
    capsys, tmp_path
):
    argv = ["run", "--sim", "--run-id", "tj-cli", "--nodes", "2", "--gpus-per-node", "0"]
    argv += ["--min-busbw-gbps", "0.001", "--workload", "trainjob", "--report-dir", str(tmp_path)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr()
    out = json.loads(printed.out.splitlines()[-1])
    # Rank 0's progress, as the Job path shows it: the step, the pace and the time left.
    assert re.search(r"train: step \d+/20, .*tokens/s, ETA \d+", printed.err), printed.err
    assert out["verify_pre"]["verdict"] == out["verify_post"]["verdict"] == "PASS"
    assert out["train"]["job"] == RunNames.for_run("tj-cli").job("train")
    assert f"TrainJob default/{out['train']['job']}" in out["teardown"]["deleted"]
    assert out["sim"]["leftover"] == [] and out["sim"]["leftover_processes"] == []


def test_a_teams_own_trainjob_runs_as_the_runs_and_teardown_removes_it(sim, raw, tmp_path, capsys):
    own = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "team-llm"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"command": ["python3", "-c", PRINT_RANK], "numNodes": 2},
        },
    }
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump(own))
    kube = ["--kubeconfig", sim.kubeconfig_path, "--run-id", "tj-own"]
    assert cli.main(["provision", *kube]) == 0
    shape = ["--nodes", "2", "--gpus-per-node", "0", "--no-clique-affinity", "--purpose", "job"]
    assert cli.main(["launch", *kube, *shape, "--trainjob-file", str(path)]) == 0
    launched = json.loads(capsys.readouterr().out.splitlines()[-1])
    name = RunNames.for_run("tj-own").job("job")
    assert launched["job"] == name and launched["result"] is None  # the team's, no RESULT line
    claims = [p["spec"]["resourceClaims"] for p in pods(raw, name)]
    assert all(c[0]["name"] == "imex-channel" for c in claims) and len(claims) == 2
    assert cli.main(["teardown", *kube]) == 0
    assert raw.gone(f"{TJ_PATH}/{name}") and pods(raw, name) == []


def test_a_file_that_is_no_trainjob_is_refused_before_anything_is_created(
    sim, raw, tmp_path, capsys
):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "batch/v1", "kind": "Job"}))
    argv = ["launch", "--kubeconfig", sim.kubeconfig_path, "--run-id", "tj-bad-file"]
    assert cli.main([*argv, "--trainjob-file", str(path)]) == 2
    error = json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
    assert "not a TrainJob" in error and "kind TrainJob" in error
    made = raw.call("GET", TJ_PATH, labelSelector="mnnvl.io/run-id=tj-bad-file")["items"]
    assert made == []
