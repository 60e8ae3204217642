"""torch.compile by default where it pays: GPU runs of the 125m preset and larger compile their
blocks, tiny and small runs and every CPU run do not; ``--compile``/``--no-compile`` win, and
the choice shows in the worker's log line and its RESULT."""

from __future__ import annotations

import logging

import pytest
import torch

from mnnvl.cli.main import build_parser
from mnnvl.errors import SpecError
from mnnvl.inputs.defaults import MODEL_PRESETS
from mnnvl.inputs.flags import from_namespace, to_args
from mnnvl.inputs.spec import TrainConfig
from mnnvl.runtime import train
from mnnvl.runtime.parallel import DistInfo

torch.set_num_threads(1)
COMPILED_ON_GPU = {"125m", "350m", "1b", "3b", "8b"}


@pytest.mark.parametrize("model", MODEL_PRESETS)
@pytest.mark.parametrize("on_gpu", [True, False])
def test_auto_compiles_gpu_runs_of_the_125m_preset_and_larger_only(
    model: str, on_gpu: bool
) -> None:
    cfg = TrainConfig(model=model)
    assert cfg.compile == "auto"
    assert cfg.compiles(on_gpu) is (on_gpu and model in COMPILED_ON_GPU)


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False)])
@pytest.mark.parametrize("model", ["tiny", "1b"])
@pytest.mark.parametrize("on_gpu", [True, False])
def test_a_given_compile_value_wins_on_every_preset_and_device(
    value: str, expected: bool, model: str, on_gpu: bool
) -> None:
    assert TrainConfig(model=model, compile=value).compiles(on_gpu) is expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], "auto"), (["--compile"], "true"), (["--no-compile"], "false")]
    + [(["--compile", v], v) for v in ("auto", "true", "false")],
)
def test_cli_and_worker_flags_keep_compile_and_no_compile(argv: list[str], expected: str) -> None:
    cli = from_namespace(TrainConfig, build_parser().parse_args(["train", "--run-id", "r1", *argv]))
    worker = train.parse_config(argv)
    assert cli.compile == worker.compile == expected
    # What the Job builder passes the workers: nothing for auto, so they decide on their device.
    assert train.parse_config(to_args(cli)).compile == expected
    assert ("--compile" in to_args(cli)) is (expected != "auto")


def test_a_bad_compile_value_is_refused_naming_the_choices() -> None:
    with pytest.raises(SpecError, match=r"^compile: 'yes' is not one of auto, true, false$"):
        TrainConfig(compile="yes")


def test_the_choice_is_in_the_log_line_and_the_result(
    gloo_one_rank: None, caplog: pytest.LogCaptureFixture
) -> None:
    info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
    caplog.set_level(logging.INFO, logger="mnnvl.runtime.train")
    trainer = train.Trainer(TrainConfig(model="tiny", steps=2, log_every=1), info)
    trainer.run()
    assert "compile False (--compile auto: tiny preset on CPU)" in caplog.text
    result = trainer.result(1.0, 1.0)
    assert (result["compile"], result["compile_input"]) == (False, "auto")
    assert result["first_step_s"] is not None and result["first_step_s"] > 0
