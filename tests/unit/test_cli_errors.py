"""Errors of the command line that a first day meets: each names what was typed and what to
check next, on stderr as well as in the one JSON line, and exits 2 before any request."""

from __future__ import annotations

import json

import pytest

from mnnvl.cli import main as cli
from mnnvl.errors import SpecError
from mnnvl.inputs import surface

VERIFY = ["verify", "--run-id", "demo", "--nodes", "2", "--gpus-per-node", "0"]


def _failed(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[str, str]:
    """(the JSON line's error, stderr) of a command that exits 2."""
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    return json.loads(out.splitlines()[-1])["error"], err


def test_an_unknown_group_key_is_named_with_its_group_and_a_guess(capsys):
    error, _ = _failed(capsys, [*VERIFY, "--verify-json", '{"min_busbw": 5}'])
    assert error.startswith("verify.min_busbw: is not a key of verify; ")
    assert "did you mean verify.min_busbw_gbps?" in error
    keys = error.split("its keys: ")[1].split(", ")
    assert "verify.iters" in keys and "verify.efficiency" in keys and "verify.min_bytes" in keys
    assert all(k.startswith("verify.") for k in keys), keys  # never a CLI flag, never bare


@pytest.mark.parametrize("values", [{"verify": {"min_busbw": 5}}, [
    {"name": "verify", "value": '{"min_busbw": 5}'}]])  # fmt: skip
def test_a_pipelines_unknown_group_key_is_named_the_same_way(values):
    with pytest.raises(SpecError) as e:
        surface.check_pipeline("mnnvl-training", values)
    assert "did you mean verify.min_busbw_gbps?" in str(e.value)
    assert ", verify.iters," in str(e.value) and ", iters," not in str(e.value)


def test_a_mistyped_kubeconfig_path_is_bad_input_naming_the_path(capsys, tmp_path):
    missing = str(tmp_path / "sim.kubecfg")
    error, err = _failed(capsys, ["status", "--run-id", "demo", "--kubeconfig", missing])
    assert error == f"kubeconfig (--kubeconfig): {missing!r} does not exist; check the path"
    assert error in err


def test_a_report_dir_that_cannot_be_written_says_it_is_not_writable(capsys):
    error, _ = _failed(capsys, [*VERIFY, "--report-dir", "/proc"])
    assert error.startswith("--report-dir: '/proc' is not writable"), error


def test_an_unknown_flag_is_named_on_stderr_too_by_its_command(capsys):
    assert cli.main([*VERIFY, "--bogus"]) == 2
    out, err = capsys.readouterr()
    result = json.loads(out.splitlines()[-1])
    assert result["command"] == "verify" and "unrecognized arguments: --bogus" in result["error"]
    assert err.startswith("usage: mnnvl verify ")
    assert err.splitlines()[-1] == "mnnvl verify: error: unrecognized arguments: --bogus"


def test_a_kfp_components_unknown_group_key_keeps_one_prefix_on_every_key():
    with pytest.raises(SpecError) as e:
        surface.group_values("verify", {"min_busbw": 5})
    said = str(surface.named(e.value))  # how a component names it
    assert "verify.verify." not in said and ", verify.iters," in said, said
