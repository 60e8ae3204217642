"""The command line: render without a cluster, bad input before any request, one JSON line last."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mnnvl import steps
from mnnvl.cli import main as cli
from mnnvl.cli.help import COMMANDS
from mnnvl.errors import Interrupted, TeardownIncomplete, WaitTimeout
from mnnvl.inputs.checks import DNS1123_LABEL
from mnnvl.inputs.names import LABEL_RUN_ID, RunNames
from mnnvl.sim import SimCluster

RENDER = ["render", "--run-id", "demo-run", "--namespace", "team-a", "--nodes", "2"]


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, list[str], str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def last_json(lines: list[str]) -> dict:
    assert lines, "nothing on stdout"
    return json.loads(lines[-1])


def test_render_prints_every_object_as_yaml_with_valid_names(capsys):
    code, lines, err = run_cli(capsys, [*RENDER, "--gpus-per-node", "4"])
    assert code == 0
    docs = list(yaml.safe_load_all("\n".join(lines)))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ComputeDomain", *["Service", "Job"] * 3]
    names = RunNames.for_run("demo-run")
    assert docs[0]["metadata"]["name"] == names.domain
    jobs = {d["metadata"]["name"]: d["spec"]["activeDeadlineSeconds"] for d in docs[2::2]}
    # as a run creates them: the verify step's deadline for both verifications
    assert jobs == {
        names.job("verify-pre"): 1800,
        names.job("train"): 7200,
        names.job("verify-post"): 1800,
    }
    for doc in docs:
        name = doc["metadata"]["name"]
        assert len(name) <= 63 and DNS1123_LABEL.match(name), name
        assert doc["metadata"]["namespace"] == "team-a"
        assert doc["metadata"]["labels"][LABEL_RUN_ID] == "demo-run"
    job = docs[2]
    assert job["spec"]["completions"] == 2
    claims = job["spec"]["template"]["spec"]["resourceClaims"]
    assert claims[0]["resourceClaimTemplateName"] == names.channel_template
    result = last_json(err.splitlines())
    assert result["ok"] is True and result["command"] == "render"


def test_render_with_gpu_claims_adds_the_gpu_template(capsys):
    code, lines, _ = run_cli(capsys, [*RENDER, "--gpus-per-node", "4", "--gpu-mode", "claim"])
    assert code == 0
    kinds = [d["kind"] for d in yaml.safe_load_all("\n".join(lines))]
    assert kinds[:2] == ["ComputeDomain", "ResourceClaimTemplate"]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["render", "--run-id", "r1", "--nodes", "40"], "nodes (--nodes)"),
        (["render", "--run-id", "r1", "--namespace", "Bad_NS"], "namespace (--namespace)"),
        (["render", "--run-id", "bad id!"], "run_id (--run-id)"),
        (["provision", "--namespace", "default"], "the following arguments are required"),
        (
            ["train", "--run-id", "r1", "--env", "NCCL_CUMEM_ENABLE=0"],
            "env.NCCL_CUMEM_ENABLE (--env)",
        ),
        (
            ["verify", "--run-id", "r1", "--min-bytes", "4G", "--max-bytes", "1M"],
            "verify.min_bytes (--min-bytes)",
        ),
        (
            ["provision", "--run-id", "r1", "--rct-timeout-s", "0"],
            "deadlines.rct_timeout_s (--rct-timeout-s)",
        ),
    ],
)
def test_bad_input_exits_2_with_a_one_line_message(capsys, argv, field):
    code, lines, err = run_cli(capsys, argv)
    assert code == 2
    result = last_json(err.splitlines() if argv[0] == "render" else lines)
    assert result == {"ok": False, "command": argv[0], "error": result["error"], "exit_code": 2}
    assert result["error"].startswith(field + ":")
    assert "\n" not in result["error"]
    assert "Traceback" not in err


def test_input_errors_name_the_input_by_its_group_path_and_the_flag_typed(capsys):
    code, lines, _ = run_cli(
        capsys, ["train", "--run-id", "r1", "--steps", "4", "--warmup-steps", "9"]
    )
    assert code == 2
    error = last_json(lines)["error"]
    assert error.startswith("train.warmup_steps (--warmup-steps): 9 is more than steps 4")
    assert error.endswith("set train.warmup_steps to 4 or fewer")


def test_input_errors_repeat_a_typed_value_as_typed(capsys):
    """A typed path holding an input's name stays as typed."""
    argv = ["train", "--run-id", "r1", "--nodes", "2", "--checkpoint-dir", "/scratch/run_id/ckpt"]
    code, lines, _ = run_cli(capsys, argv)
    assert code == 2
    error = last_json(lines)["error"]
    assert error.startswith(
        "recovery.checkpoint_dir (--checkpoint-dir): /scratch/run_id/ckpt is not under a"
    )


@pytest.mark.parametrize("value", ["00", "0x0", "-0", "+0", "false"])
@pytest.mark.parametrize("command", ["train", "verify", "render", "launch"])
def test_cumem_off_in_any_spelling_is_refused_before_anything_is_created(capsys, command, value):
    argv = [command, "--run-id", "r1", "--env", f"NCCL_CUMEM_ENABLE={value}"]
    code, lines, err = run_cli(capsys, [*argv, *(["--module", "m"] if command == "launch" else [])])
    assert code == 2
    result = last_json(err.splitlines() if command == "render" else lines)
    assert "NCCL_CUMEM_ENABLE" in result["error"] and "silently disables MNNVL" in result["error"]


def test_unknown_flag_is_a_usage_error_with_a_json_line(capsys):
    code, lines, _ = run_cli(capsys, ["provision", "--run-id", "r1", "--no-such-flag"])
    assert code == 2
    assert last_json(lines)["exit_code"] == 2


def test_unreachable_cluster_exits_5(capsys, tmp_path):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    code, lines, _ = run_cli(
        capsys,
        ["teardown", "--run-id", "r1", "--kubeconfig", str(kubeconfig), "--api-outage-s", "0"],
    )
    assert code == 5
    result = last_json(lines)
    assert "cannot reach the Kubernetes API" in result["error"]
    # the teardown could not start: everything of the run may be left, and the JSON says how
    # to remove it
    assert any("ComputeDomain default/" in item for item in result["leftovers"])
    assert result["cleanup"] == "mnnvl teardown --run-id r1 --namespace default"


def test_run_with_no_cluster_configured_says_only_what_is_true(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)  # and no ~/.kube/config under HOME
    code, lines, err = run_cli(capsys, ["run", "--run-id", "r1", "--report-dir", str(tmp_path)])
    assert code == 5
    result = last_json(lines)
    assert result["error"].startswith("no Kubernetes configuration found")
    assert "leftovers" not in result and "cleanup" not in result
    assert "may be left" not in err and "also failed" not in err
    assert "the run created nothing" in err


def test_an_explicit_kubeconfig_that_fails_is_the_only_thing_tried(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # in a pod, yet --kubeconfig wins
    missing = tmp_path / "missing.kubeconfig"
    code, lines, _ = run_cli(capsys, ["status", "--run-id", "r1", "--kubeconfig", str(missing)])
    assert code == 2
    error = last_json(lines)["error"]
    assert f"kubeconfig (--kubeconfig): '{missing}'" in error and "in-cluster" not in error


@pytest.mark.parametrize(
    ("failure", "code"), [(WaitTimeout("channel template not created"), 3), (Interrupted(15), 143)]
)
def test_run_ends_with_the_steps_error_and_what_its_failed_teardown_left(
    capsys, tmp_path, monkeypatch, failure, code
):
    def fail(*args, **kwargs):
        raise failure

    def teardown_fails(*args, **kwargs):
        left = ["ComputeDomain default/x"]
        raise TeardownIncomplete("API gone", exit_code=5, leftovers=left, cleanup="mnnvl teardown")

    monkeypatch.setattr(steps, "provision", fail)
    monkeypatch.setattr(steps, "teardown", teardown_fails)
    got, lines, err = run_cli(capsys, ["run", "--run-id", "r1", "--report-dir", str(tmp_path)])
    result = last_json(lines)
    assert got == result["exit_code"] == code and result["error"] == str(failure)
    assert result["leftovers"] == ["ComputeDomain default/x"]
    assert result["cleanup"] == "mnnvl teardown"
    assert "teardown after failure also failed: API gone" in err


def test_result_path_gets_the_same_json(capsys, tmp_path):
    path = tmp_path / "result.json"
    code, _, err = run_cli(capsys, [*RENDER, "--result-path", str(path)])
    assert code == 0
    assert json.loads(path.read_text()) == last_json(err.splitlines())


def test_python_dash_m_mnnvl_ends_with_one_json_line():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mnnvl",
            "teardown",
            "--run-id",
            "r1",
            "--kubeconfig",
            "/nonexistent",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert json.loads(last)["exit_code"] == 2
    assert sum(1 for line in proc.stdout.splitlines() if line.startswith("{")) == 1


def test_bad_input_exits_2_before_any_request_to_the_cluster(capsys):
    with SimCluster(nodes=1) as sim:
        before = sim.request_count
        for argv in (
            ["train", "--run-id", "r1", "--nodes", "0"],
            ["provision", "--run-id", "r1", "--allocation-mode", "Many"],
            ["run", "--run-id", "r1", "--gpus-per-node", "9"],
            ["train", "--run-id", "r1", "--env", "MASTER_ADDR=elsewhere"],
            ["launch", "--run-id", "r1", "--module", "not a module"],
            ["launch", "--run-id", "r1"],  # neither a module nor a command
            ["launch", "--run-id", "r1", "--module", "a.b", "--command", "--", "x"],
            ["launch", "--run-id", "r1", "--command"],  # an empty command
            ["provision", "--run-id", "r1", "--pipeline", "mnnvl-training",
             "--pipeline-parameters", '[{"name": "model", "value": "70b"}]'],
            ["provision", "--run-id", "r1", "--pipeline", "mnnvl-custom",
             "--pipeline-parameters", '{"nodes": 0, "command": "[\\"x\\"]"}'],
        ):  # fmt: skip
            code, lines, _ = run_cli(capsys, [*argv, "--kubeconfig", sim.kubeconfig_path])
            assert code == 2 and last_json(lines)["exit_code"] == 2
        assert sim.request_count == before


def test_every_subcommand_has_a_description_an_example_and_help_for_every_option():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == set(COMMANDS)
    for name, p in sub.choices.items():
        assert p.description and f"example:\n  mnnvl {name}" in (p.epilog or ""), name
        for action in p._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"mnnvl {name} {action.option_strings or action.dest}"


def _help_of(capsys, *words: str) -> str:
    assert cli.main([*words, "--help"]) == 0
    return capsys.readouterr().out


def test_help_shows_required_inputs_as_required_and_no_placeholder_defaults(capsys):
    for name in ("provision", "launch", "train", "verify", "teardown", "status", "render"):
        text = _help_of(capsys, name)
        assert "_MISSING_TYPE" not in text and "<dataclasses" not in text, name
        usage = text.split("\n\n")[0]
        assert " --run-id TEXT" in usage and "[--run-id" not in usage, name
        assert "(required)" in text, name
    assert "[--run-id TEXT]" in _help_of(capsys, "run")  # a run names itself


def test_each_command_lists_only_the_inputs_it_uses_in_groups(capsys):
    status = _help_of(capsys, "status")
    assert "--allocation-mode" not in status and "--rct-timeout-s" not in status
    assert "--delete-timeout-s" not in status and "\ndeadlines: " in status
    assert "--purpose" not in _help_of(capsys, "run")
    assert "--purpose" not in _help_of(capsys, "train")
    teardown = _help_of(capsys, "teardown")
    assert "--allocation-mode" not in teardown and "--delete-timeout-s" in teardown
    assert "--delete-timeout-s" not in _help_of(capsys, "provision")
    run = _help_of(capsys, "run")
    for title in ("inputs:", "placement: ", "pod: ", "deadlines: ", "recovery: ", "train: "):
        assert f"\n{title}" in run, title
    assert "--verify-json" in run and "\n  --min-bytes" in run
    assert run.count("\n  --run-id") == 1 and run.count("\n  --namespace") == 1


def test_render_and_baselines_list_no_option_they_ignore(capsys):
    render = _help_of(capsys, "render")
    for ignored in ("--kubeconfig", "--rct-timeout-s", "--delete-timeout-s", "--api-outage-s",
                    "--admission-timeout-s", "--pods-running-timeout-s",
                    "--unschedulable-grace-s"):  # fmt: skip
        assert ignored not in render, ignored
    # the Jobs carry them (activeDeadlineSeconds)
    assert "--train-timeout-s" in render and "--verify-timeout-s" in render
    assert "--kubeconfig" not in _help_of(capsys, "baselines")
    assert "--kubeconfig" in _help_of(capsys, "run")


def _actions(name: str) -> dict[str, argparse.Action]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {a.dest: a for a in sub.choices[name]._actions}


def _expanded(action: argparse.Action) -> str:
    return " ".join(argparse.HelpFormatter("mnnvl")._expand_help(action).split())


def test_sim_up_help_shows_every_default():
    shown = {
        dest: _expanded(action)
        for dest, action in _actions("sim").items()
        if action.option_strings
        and dest not in ("help", "verbose")
        and action.default is not None
        and action.default is not False
    }
    assert {"nodes", "gpus_per_node", "cliques", "imex_delay_s", "namespaces"} <= set(shown)
    for dest, text in shown.items():
        assert "default: " in text, dest


def test_help_points_only_at_documentation_that_exists(capsys):
    root = Path(__file__).resolve().parents[2]
    texts = [_help_of(capsys, name) for name in COMMANDS]
    refs = {
        m for t in texts for m in re.findall(r"\((docs/[\w-]+\.md), ([^)]+)\)", " ".join(t.split()))
    }
    assert ("docs/verification.md", "NCCL profiles") in refs  # --nccl-profile
    for path, section in refs:
        headings = re.findall(r"^#+ (.+)$", (root / path).read_text(), re.M)
        assert section in headings, (path, section)
    assert not any("(README)" in t for t in texts)


def test_output_dir_and_report_dir_say_where_each_is():
    actions = _actions("verify")
    output_dir, report_dir = _expanded(actions["output_dir"]), _expanded(actions["report_dir"])
    assert "inside the worker pod" in output_dir and "--report-dir" in output_dir
    assert "on the machine this command runs on" in report_dir
    assert "--output-dir" in report_dir
    # A whole run writes its reports on this side only.
    assert "output_dir" not in _actions("run")
    assert "on the machine this command runs on" in _expanded(_actions("run")["report_dir"])


@pytest.mark.parametrize("purpose", ["train", "verify", "verify-pre", "verify-post"])
def test_launch_refuses_a_step_s_job_name(capsys, purpose):
    argv = ["launch", "--run-id", "r1", "--purpose", purpose, "--module", "pkg.entry"]
    code, lines, _ = run_cli(capsys, argv)
    assert code == 2
    assert last_json(lines)["error"].startswith(f"purpose (--purpose): {purpose!r} names the ")


def test_mnnvl_alone_lists_the_commands_and_exits_2(capsys):
    assert cli.main([]) == 2
    captured = capsys.readouterr()
    for name in COMMANDS:
        assert f"\n    {name}" in captured.err, name
    assert json.loads(captured.out.splitlines()[-1])["error"].startswith("no command given")
