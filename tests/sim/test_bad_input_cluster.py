"""Bad input a new user meets against a cluster: one line naming the field, exit 2 (or 5 for
an unusable kubeconfig), before anything is created, and nothing of the run left behind.
Also: the namespace is never read (a namespace-scoped account may not), only inferred."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from mnnvl.cli import main as cli
from mnnvl.inputs import namespace
from mnnvl.inputs.names import RunNames
from mnnvl.sim import SimCluster

SIM = dict(nodes=2, namespaces=("default", "team-b"))


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(argv)
    out = capsys.readouterr().out.splitlines()
    assert out, "nothing on stdout"
    return code, json.loads(out[-1])


def settled_request_count(sim: SimCluster, quiet_s: float = 0.3) -> int:
    """The simulator's request count once an earlier test's watches have wound down (a wait's
    watch threads end a moment after the wait returns): nothing of this test is counted."""
    count, deadline = sim.request_count, time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        if sim.request_count == count:
            return count
        count = sim.request_count
    return count


def left_of(sim: SimCluster, run_id: str) -> list[tuple[str, str, str]]:
    return sim.objects(RunNames.for_run(run_id).selector)


def test_result_path_in_a_missing_directory_exits_2_before_anything_is_created(
    sim, capsys, tmp_path
):
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    target = tmp_path / "no-such-dir" / "result.json"
    before = settled_request_count(sim)
    argv = ["provision", "--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
    code, result = run_cli(capsys, [*argv, "--result-path", str(target)])
    assert code == 2 and result["exit_code"] == 2
    assert result["error"] == (
        f"--result-path: directory {str(target.parent)!r} does not exist; "
        "create it or pick another path"
    )
    assert sim.request_count == before
    assert left_of(sim, run_id) == [] and not target.parent.exists()


def test_kubeconfig_that_is_not_yaml_exits_5_naming_the_file(sim, capsys, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nclusters: [\n  - bad: : :\n")
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    code, result = run_cli(
        capsys, ["provision", "--run-id", run_id, "--kubeconfig", str(kubeconfig)]
    )
    assert code == 5 and result["exit_code"] == 5
    assert result["error"].startswith(f"kubeconfig {kubeconfig} is not valid YAML (")
    assert "line 3" in result["error"] and "\n" not in result["error"]
    kubeconfig.write_text("- just\n- a list\n")
    code, result = run_cli(
        capsys, ["teardown", "--run-id", run_id, "--kubeconfig", str(kubeconfig)]
    )
    assert code == 5 and f"kubeconfig {kubeconfig} is not a kubeconfig" in result["error"]
    assert left_of(sim, run_id) == []


@pytest.mark.parametrize("step", ["verify", "provision"])
def test_step_in_a_missing_namespace_as_the_runner_exits_5_naming_both_causes(sim, capsys, step):
    """The runner's Role is namespaced: in a namespace that does not exist (or where the Role
    is not bound) RBAC refuses before anything could answer 404, as on a real cluster."""
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    argv = [step, "--run-id", run_id, "--namespace", "no-such-ns"]
    if step == "verify":
        argv += ["--nodes", "2", "--gpus-per-node", "0"]
    code, result = run_cli(capsys, [*argv, "--kubeconfig", sim.kubeconfig_path])
    assert code == 5 and result["exit_code"] == 5, result
    assert 'in the namespace "no-such-ns"' in result["error"]
    assert "check that the namespace exists" in result["error"]
    assert left_of(sim, run_id) == []


@pytest.mark.parametrize("step", ["verify", "provision"])
def test_step_in_a_missing_namespace_exits_2_without_reading_namespaces(sim, capsys, step):
    """With permission there (a cluster admin's kubeconfig), the API's 404 names the namespace."""
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    argv = [step, "--run-id", run_id, "--namespace", "no-such-ns"]
    if step == "verify":
        argv += ["--nodes", "2", "--gpus-per-node", "0"]
    before = sim.request_counts
    code, result = run_cli(capsys, [*argv, "--kubeconfig", sim.admin_kubeconfig_path])
    assert code == 2 and result["exit_code"] == 2, result
    seen = sim.request_counts - before
    if step == "verify":  # a workload step first reads the run's domain there
        assert result["error"].startswith("ComputeDomain no-such-ns/")
        assert "provision first (`mnnvl provision" in result["error"]
        assert seen[("POST", "services")] == seen[("POST", "jobs")] == 0
    else:  # provision learns it from its create's 404
        assert result["error"].startswith("namespace (--namespace): 'no-such-ns' does not exist")
        assert "kubectl create namespace no-such-ns" in result["error"]
        assert seen[("POST", "computedomains")] == 1
    assert not any(resource == "namespaces" for _, resource in seen)
    assert left_of(sim, run_id) == []


@pytest.mark.parametrize("account", ["runner", "admin"])
@pytest.mark.parametrize("command", ["teardown", "reap"])
def test_teardown_and_reap_in_a_missing_namespace_exit_2_naming_it(sim, capsys, account, command):
    """A typo must not read as a clean namespace. The runner's namespaced Role is refused
    there (403, before anything could answer 404); an account with rights beyond one namespace
    lists an empty namespace that does not exist, and a dry-run create tells it (404)."""
    kubeconfig = sim.kubeconfig_path if account == "runner" else sim.admin_kubeconfig_path
    argv = ["--namespace", "no-such-ns", "--kubeconfig", kubeconfig]
    which = ["--run-id", "typo"] if command == "teardown" else ["--all-dead"]
    before = sim.request_counts
    code, result = run_cli(capsys, [command, *which, *argv])
    assert code == 2 and result["exit_code"] == 2, result
    assert result["error"].startswith("namespace (--namespace): 'no-such-ns' does not exist")
    assert "\n" not in result["error"] and "leftovers" not in result
    seen = sim.request_counts - before
    assert not any(resource == "namespaces" for _, resource in seen)  # never read
    assert not [k for k in seen if k[0] == "DELETE"]
    assert sim.objects() == [] or all(ns != "no-such-ns" for _, ns, _ in sim.objects())


@pytest.mark.parametrize("command", ["teardown", "reap"])
def test_teardown_and_reap_in_an_empty_namespace_still_succeed(sim, capsys, command):
    which = ["--run-id", "never-ran"] if command == "teardown" else ["--all-dead"]
    for kubeconfig in (sim.kubeconfig_path, sim.admin_kubeconfig_path):
        argv = [command, *which, "--namespace", "team-b", "--kubeconfig", kubeconfig]
        code, result = run_cli(capsys, argv)
        assert code == 0 and result["deleted"] == [], result


def test_warmup_longer_than_the_run_exits_2_before_any_request(sim, capsys):
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    before = settled_request_count(sim)
    argv = ["train", "--run-id", run_id, "--steps", "10", "--warmup-steps", "20"]
    code, result = run_cli(capsys, [*argv, "--kubeconfig", sim.kubeconfig_path])
    assert code == 2
    assert result["error"].startswith(
        "train.warmup_steps (--warmup-steps): 20 is more than steps 10"
    )
    assert sim.request_count == before
    assert left_of(sim, run_id) == []


def test_steps_without_namespace_use_the_pods_own_namespace(
    sim, capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    sa_namespace = tmp_path / "namespace"
    sa_namespace.write_text("team-b")
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(namespace, "SERVICE_ACCOUNT_NAMESPACE_FILE", str(sa_namespace))
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    names = RunNames.for_run(run_id)
    argv = ["--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
    code, result = run_cli(capsys, ["provision", *argv])
    assert code == 0 and result["namespace"] == "team-b"
    assert left_of(sim, run_id) == [("ComputeDomain", "team-b", names.domain)]
    code, result = run_cli(capsys, ["teardown", *argv])
    assert code == 0 and result["deleted"] == [f"ComputeDomain team-b/{names.domain}"]
    assert left_of(sim, run_id) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["launch", "--command-json", "not json"],
         "command: --command-json 'not json' is not a JSON list of strings"),
        (["launch", "--command-json", "{}"],
         "command: --command-json '{}' is not a JSON list of strings"),
        (["launch", "--command-json", "[]"], "command: is empty: give the program to run"),
        (["launch", "--module", "m", "--env", "A=1", "--env", "A=2"],
         "env (--env): A is given twice"),
        (["provision", "--pipeline", "mnnvl-training", "--pipeline-parameters", "[1,2]"],
         "pipeline_parameters (--pipeline-parameters): must be a JSON object of name: value"),
        (["provision", "--pipeline", "mnnvl-training",
          "--pipeline-parameters", '{"no_such_param": 1}'],
         "no_such_param: is not a parameter of pipeline mnnvl-training"),
        (["provision", "--pipeline", "mnnvl-training",
          "--pipeline-parameters", '[{"name": "launcher-image", "value": "x"}, {"name": "nodez"}]'],
         "nodez: is not a parameter of pipeline mnnvl-training"),
    ],
)  # fmt: skip
def test_bad_launch_and_pipeline_input_exits_2_before_any_request(sim, capsys, extra, message):
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    step, *rest = extra
    before = settled_request_count(sim)
    argv = (
        [step, "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0"]
        if step == "launch"
        else [step, "--run-id", run_id]
    )
    code, result = run_cli(capsys, [*argv, *rest, "--kubeconfig", sim.kubeconfig_path])
    assert code == 2 and result["exit_code"] == 2, result
    assert result["error"].startswith(message) and "\n" not in result["error"], result["error"]
    assert sim.request_count == before
    assert left_of(sim, run_id) == []


def test_unwritable_result_path_exits_2_before_the_domain_is_created(sim, capsys):
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    before = settled_request_count(sim)
    argv = ["provision", "--run-id", run_id, "--kubeconfig", sim.kubeconfig_path]
    code, result = run_cli(capsys, [*argv, "--result-path", "/proc/nope.json"])
    assert code == 2 and result["exit_code"] == 2, result
    assert result["error"].startswith("--result-path: '/proc/nope.json' is not writable (")
    assert sim.request_count == before and left_of(sim, run_id) == []


@pytest.mark.parametrize("step", ["verify", "train", "run"])
@pytest.mark.parametrize("where", ["/proc/reports", "/sys/reports", "a-file", "a-file/sub"])
def test_unwritable_report_dir_exits_2_before_anything_is_created(
    sim, capsys, tmp_path, step, where
):
    (tmp_path / "a-file").write_text("not a directory")
    target = where if where.startswith("/") else str(tmp_path / where)
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    before = settled_request_count(sim)
    argv = [step, "--run-id", run_id, "--nodes", "2", "--gpus-per-node", "0"]
    code, result = run_cli(
        capsys, [*argv, "--kubeconfig", sim.kubeconfig_path, "--report-dir", target]
    )
    assert code == 2 and result["exit_code"] == 2, result
    assert result["error"].startswith("--report-dir: ") and "\n" not in result["error"]
    assert ("is a file" in result["error"]) == (not where.startswith("/"))
    assert sim.request_count == before and left_of(sim, run_id) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # the check left nothing


def test_sim_up_with_a_kubeconfig_in_a_missing_directory_exits_2_naming_it(capsys, tmp_path):
    target = tmp_path / "missing" / "dir" / "k.yaml"
    code, result = run_cli(capsys, ["sim", "up", "--kubeconfig", str(target)])
    assert code == 2 and result["exit_code"] == 2, result
    assert result["error"] == (
        f"--kubeconfig: directory {str(target.parent)!r} does not exist; "
        "create it or pick another path"
    )
    assert not target.parent.exists()
