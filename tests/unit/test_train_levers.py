"""Training levers (activation checkpointing, reshard after forward, batch) and the presets'
defaults: from the CLI, KFP and Argo to the worker's command, and into the sharded model."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch
import yaml
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.tensor import DTensor

from mnnvl.cli import main as cli
from mnnvl.cli.main import build_parser
from mnnvl.components import kfp_components as kc
from mnnvl.errors import SpecError
from mnnvl.inputs import surface
from mnnvl.inputs.flags import from_namespace
from mnnvl.inputs.spec import DomainSpec, TrainConfig, WorkloadSpec
from mnnvl.manifests.render import render_run
from mnnvl.pipelines.compile import COMPILED_DIR
from mnnvl.runtime import train
from mnnvl.runtime.model import preset
from mnnvl.runtime.parallel import DistInfo, build_sharded_model

torch.set_num_threads(1)
LEVERS = ("batch_size", "activation_checkpointing", "reshard_after_forward")
MEASURED_8B = (4, "every-2", "false")
USER_8B = {"batch_size": 2, "activation_checkpointing": "full", "reshard_after_forward": "true"}


def levers(cfg: TrainConfig) -> tuple[Any, ...]:
    return tuple(getattr(cfg, name) for name in LEVERS)


def worker_config(train_cfg: TrainConfig) -> TrainConfig:
    """What the worker pods of the rendered train Job parse from their command line."""
    domain = DomainSpec(run_id="r1")
    workload = WorkloadSpec(run_id="r1", gpus_per_node=4)
    docs = render_run(domain, workload, train_cfg, None)
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    words = [*container.get("command", []), *container.get("args", [])]
    return train.parse_config(words[words.index(train.__name__) + 1 :])


def test_8b_preset_defaults_are_the_measured_winner() -> None:
    cfg = TrainConfig(model="8b")
    assert levers(cfg) == MEASURED_8B
    assert (cfg.ac_every, cfg.reshard) == (2, False)
    assert preset("8b").seq_len == 2048  # the length those defaults were measured at


@pytest.mark.parametrize("model", ["tiny", "3b"])
def test_other_presets_keep_batch_2_without_checkpointing_and_reshard(model: str) -> None:
    cfg = TrainConfig(model=model)
    assert levers(cfg) == (2, "none", "true")
    assert (cfg.ac_every, cfg.reshard) == (0, True)


def test_1b_preset_defaults_to_its_measured_batch_of_8() -> None:
    cfg = TrainConfig(model="1b")
    assert levers(cfg) == (8, "none", "true")  # 53.7 % MFU on 2 x H200 against 27.1 % at 2
    assert levers(TrainConfig(model="1b", batch_size=2))[0] == 2


def test_a_given_value_wins_over_the_preset() -> None:
    assert levers(TrainConfig(model="8b", **USER_8B)) == (2, "full", "true")
    one = TrainConfig(model="8b", activation_checkpointing="none")
    assert levers(one) == (4, "none", "false")
    assert levers(TrainConfig(model="1b", activation_checkpointing="every-3")) == (
        8,
        "every-3",
        "true",
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("activation_checkpointing", "true"),
        ("activation_checkpointing", "every-0"),
        ("activation_checkpointing", "every2"),
        ("reshard_after_forward", "yes"),
    ],
)
def test_bad_lever_values_are_refused_naming_the_choices(field: str, value: str) -> None:
    with pytest.raises(SpecError, match=rf"^{field}: {value!r} is not one of .*auto") as err:
        TrainConfig(**{field: value})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--activation-checkpointing", "sometimes"],
        ["--reshard-after-forward", "maybe"],
    ],
)
def test_cli_refuses_a_bad_lever_with_exit_2_before_rendering_anything(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert cli.main(["render", "--run-id", "r1", *argv]) == 2
    out, err = capsys.readouterr()
    assert "kind:" not in out  # no object was rendered
    name = "train." + argv[0][2:].replace("-", "_")
    assert f"render failed: {name} ({argv[0]}): {argv[1]!r} is not one of" in err  # and the flag


def test_cli_defaults_reach_the_workers_as_the_presets_levers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["render", "--run-id", "r1", "--model", "8b"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    (job,) = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("train")]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    words = [*container.get("command", []), *container.get("args", [])]
    cfg = train.parse_config(words[words.index(train.__name__) + 1 :])
    assert levers(cfg) == MEASURED_8B


def test_cli_flags_override_the_preset_on_the_workers() -> None:
    argv = ["train", "--run-id", "r1", "--model", "8b", "--batch-size", "2"]
    argv += ["--activation-checkpointing", "full", "--reshard-after-forward", "true"]
    cfg = from_namespace(TrainConfig, build_parser().parse_args(argv))
    assert levers(worker_config(cfg)) == (2, "full", "true")


def test_kfp_component_takes_the_levers_and_its_values_reach_the_workers() -> None:
    params = inspect.signature(kc.train_sharded.python_func).parameters
    assert params["train"].default["activation_checkpointing"] == "auto"
    assert params["train"].default["reshard_after_forward"] == "auto"
    assert params["batch_size"].default == 0
    # what KFP hands the component body: the levers in the train group
    grouped = {k: v for k, v in USER_8B.items() if k != "batch_size"}
    typed = {"model": "8b", "batch_size": USER_8B["batch_size"], "train": grouped}
    _, cfg = surface.step_specs("train", "r1", typed)
    assert levers(worker_config(cfg)) == (2, "full", "true")
    _, auto = surface.step_specs("train", "r1", {"model": "8b"})
    assert levers(worker_config(auto)) == MEASURED_8B


def _argo_train_args(values: dict[str, str]) -> list[str]:
    """The `mnnvl train` arguments the Argo train template passes for these parameters."""
    doc = yaml.safe_load((COMPILED_DIR / "mnnvl-training.workflowtemplate.yaml").read_text())
    (template,) = [t for t in doc["spec"]["templates"] if t["name"] == "train"]
    given = {p["name"]: p.get("default", "") for p in template["inputs"]["parameters"]}
    given |= values
    args = []
    for arg in template["container"]["args"]:
        if arg.startswith("{{="):  # booleans: '--flag' or '--no-flag'
            name = arg.split("'")[1]
            arg = f"--{name}" if given[name] == "true" else f"--no-{name}"
        for key, value in given.items():
            arg = arg.replace(f"{{{{inputs.parameters.{key}}}}}", value)
        args.append(arg.replace("{{workflow.uid}}", "r1"))
    return args


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"model": "8b", "batch-size": "0"}, MEASURED_8B),
        (
            {
                "model": "8b",
                "batch-size": "2",
                "train": '{"activation_checkpointing": "full", "reshard_after_forward": "true"}',
            },
            (2, "full", "true"),
        ),
    ],
)
def test_argo_parameters_reach_the_workers(values: dict[str, str], expected: tuple) -> None:
    args = _argo_train_args(values)
    assert args[0] == "train"
    ns = build_parser().parse_args(args)
    cfg = from_namespace(TrainConfig, ns)
    assert levers(worker_config(cfg)) == expected


def test_argo_pipeline_check_refuses_a_bad_lever_before_provisioning() -> None:
    with pytest.raises(SpecError) as err:
        surface.check_pipeline(
            "mnnvl-training",
            [{"name": "train", "value": '{"activation_checkpointing": "half"}'}],
        )
    assert err.value.field == "train.activation_checkpointing"  # as Argo's form holds it


# ---- the sharded model on one gloo rank -----------------------------------------------------


@pytest.fixture(scope="module")
def one_rank(gloo_one_rank: None) -> DistInfo:
    return DistInfo(rank=0, world_size=1, device=torch.device("cpu"))


def _sharded(info: DistInfo, cfg: TrainConfig) -> Any:
    five_blocks = dataclasses.replace(preset("tiny"), n_layers=5)
    return build_sharded_model(
        five_blocks,
        dist_info=info,
        param_dtype=torch.float32,
        ac_every=cfg.ac_every,
        reshard=cfg.reshard,
    )


@pytest.mark.parametrize(
    ("value", "wrapped"),
    [("none", []), ("full", [0, 1, 2, 3, 4]), ("every-2", [0, 2, 4]), ("every-3", [0, 3])],
)
def test_checkpointing_wraps_every_nth_block(
    one_rank: DistInfo, value: str, wrapped: list[int]
) -> None:
    model = _sharded(one_rank, TrainConfig(activation_checkpointing=value))
    blocks = list(model.layers.values())
    assert [i for i, b in enumerate(blocks) if isinstance(b, CheckpointWrapper)] == wrapped


@pytest.mark.parametrize(("value", "gathered"), [("true", [4]), ("false", [0, 1, 2, 3, 4])])
def test_reshard_after_forward_decides_which_blocks_stay_gathered_for_backward(
    one_rank: DistInfo, value: str, gathered: list[int]
) -> None:
    model = _sharded(one_rank, TrainConfig(reshard_after_forward=value))
    logits = model(torch.randint(512, (1, 8)))
    blocks = list(model.layers.values())

    def unsharded() -> list[int]:
        return [
            i
            for i, b in enumerate(blocks)
            if not any(isinstance(p, DTensor) for p in b.parameters())
        ]

    # true: each block's full weights are freed after its forward (the last one is kept: it
    # is needed first in backward); false: all stay gathered until backward.
    assert unsharded() == gathered
    logits.sum().backward()
    assert unsharded() == []  # after backward every block is sharded again


def test_log_words_for_activation_checkpointing_and_per_rank_rates():
    from mnnvl.runtime.metrics import worker_unit
    from mnnvl.runtime.parallel import ac_words

    assert ac_words(0) == "activation checkpointing off"  # never "AC every 0"
    assert ac_words(1) == "activation checkpointing on every block"
    assert ac_words(2) == "activation checkpointing on 1 block in 2"
    assert worker_unit(torch.device("cpu")) == "rank"  # no "/gpu" rate without GPUs
    assert worker_unit(torch.device("cuda", 0)) == "gpu"
