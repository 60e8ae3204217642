"""Bad input stops in spec.py with a one-line message naming the field; flags round-trip."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from mnnvl.errors import SpecError
from mnnvl.inputs import namespace, surface
from mnnvl.inputs.checks import parse_bytes, parse_env
from mnnvl.inputs.flags import add_inputs, from_namespace, to_args
from mnnvl.inputs.spec import (
    DomainSpec,
    LaunchSpec,
    OwnerRef,
    Placement,
    TrainConfig,
    VerifyConfig,
    WorkloadSpec,
    from_inputs,
    with_inputs,
)
from mnnvl.inputs.surface import class_inputs

RUN = "run-1"

# (constructor, kwargs, field named in the error, phrase in the message)
BAD_INPUTS: list[tuple[type, dict[str, Any], str, str]] = [
    (DomainSpec, {"run_id": ""}, "run_id", "non-empty"),
    (DomainSpec, {"run_id": "a" * 64}, "run_id", "at most 63 characters"),
    (DomainSpec, {"run_id": "-leading-dash"}, "run_id", "valid label value"),
    (DomainSpec, {"run_id": "has space"}, "run_id", "valid label value"),
    (DomainSpec, {"run_id": "slash/in/id"}, "run_id", "valid label value"),
    (DomainSpec, {"run_id": RUN, "namespace": "Default"}, "namespace", "DNS-1123 label"),
    (DomainSpec, {"run_id": RUN, "namespace": "ns_1"}, "namespace", "DNS-1123 label"),
    (DomainSpec, {"run_id": RUN, "namespace": "n" * 64}, "namespace", "at most 63"),
    (DomainSpec, {"run_id": RUN, "allocation_mode": "single"}, "allocation_mode", "not one of"),
    (DomainSpec, {"run_id": RUN, "rct_timeout_s": 0}, "rct_timeout_s", "out of range"),
    (DomainSpec, {"run_id": RUN, "delete_timeout_s": -1}, "delete_timeout_s", "out of range"),
    (DomainSpec, {"run_id": RUN, "rct_timeout_s": float("nan")}, "rct_timeout_s", "out of range"),
    (DomainSpec, {"run_id": RUN, "rct_timeout_s": "60"}, "rct_timeout_s", "must be a number"),
    (WorkloadSpec, {"run_id": RUN, "nodes": 0}, "nodes", "out of range"),
    (WorkloadSpec, {"run_id": RUN, "nodes": 19}, "nodes", "do not fit one NVLink clique of at"),
    (WorkloadSpec, {"run_id": RUN, "nodes": 10, "nodes_per_clique": 4}, "nodes", "not a multiple"),
    (
        WorkloadSpec,
        {"run_id": RUN, "nodes": 40, "nodes_per_clique": 20},
        "nodes_per_clique",
        "out of range",
    ),
    (WorkloadSpec, {"run_id": RUN, "max_nodes_per_clique": 100}, "max_nodes_per_clique", "range"),
    (WorkloadSpec, {"run_id": RUN, "topology_aware": True}, "topology_aware", "needs queue_name"),
    (
        WorkloadSpec,
        {"run_id": RUN, "queue_name": "q", "nodes": 4, "nodes_per_clique": 2},
        "topology_aware",
        "admits whole",
    ),
    (WorkloadSpec, {"run_id": RUN, "nodes": 2.0}, "nodes", "whole number"),
    (WorkloadSpec, {"run_id": RUN, "nodes": True}, "nodes", "must be a number"),
    (WorkloadSpec, {"run_id": RUN, "gpus_per_node": 9}, "gpus_per_node", "out of range"),
    (WorkloadSpec, {"run_id": RUN, "gpus_per_node": -1}, "gpus_per_node", "out of range"),
    (WorkloadSpec, {"run_id": RUN, "purpose": "bench"}, "purpose", "not one of"),
    (WorkloadSpec, {"run_id": RUN, "image": ""}, "image", "must name a container image"),
    (WorkloadSpec, {"run_id": RUN, "image": "Registry/Trainer:1"}, "image", "not a valid image"),
    (WorkloadSpec, {"run_id": RUN, "image": "repo/img:bad tag"}, "image", "not a valid image"),
    (WorkloadSpec, {"run_id": RUN, "image": "img@sha256:abc"}, "image", "not a valid image"),
    (WorkloadSpec, {"run_id": RUN, "gpu_mode": "both"}, "gpu_mode", "not one of"),
    (WorkloadSpec, {"run_id": RUN, "gpu_device_class": "GPU!"}, "gpu_device_class", "DeviceClass"),
    (WorkloadSpec, {"run_id": RUN, "nccl_profile": "fast"}, "nccl_profile", "not one of"),
    (WorkloadSpec, {"run_id": RUN, "env": {"1BAD": "x"}}, "env.1BAD", "not a valid environment"),
    (WorkloadSpec, {"run_id": RUN, "env": {"A-B": "x"}}, "env.A-B", "not a valid environment"),
    (WorkloadSpec, {"run_id": RUN, "env": {"A": 1}}, "env.A", "must be a string"),
    (
        WorkloadSpec,
        {"run_id": RUN, "env": {"NCCL_CUMEM_ENABLE": "0"}},
        "env.NCCL_CUMEM_ENABLE",
        "silently disables MNNVL",
    ),
    (
        WorkloadSpec,
        {"run_id": RUN, "env": {"NCCL_CUMEM_ENABLE": " 0 "}},
        "env.NCCL_CUMEM_ENABLE",
        "silently disables MNNVL",
    ),
    (WorkloadSpec, {"run_id": RUN, "rdzv_port": 80}, "rdzv_port", "out of range"),
    (WorkloadSpec, {"run_id": RUN, "rdzv_port": 70000}, "rdzv_port", "out of range"),
    (
        WorkloadSpec,
        {"run_id": RUN, "worker_service_account": "Bad_SA"},
        "worker_service_account",
        "DNS-1123",
    ),
    (WorkloadSpec, {"run_id": RUN, "shm_size": "16G"}, "shm_size", "512Mi or 16Gi"),
    (WorkloadSpec, {"run_id": RUN, "shm_size": "1Ti"}, "shm_size", "512Mi or 16Gi"),
    (WorkloadSpec, {"run_id": RUN, "job_timeout_s": 0}, "job_timeout_s", "out of range"),
    (WorkloadSpec, {"run_id": RUN, "job_timeout_s": 8 * 86400}, "job_timeout_s", "out of range"),
    (
        WorkloadSpec,
        {"run_id": RUN, "pods_running_timeout_s": 0.5},
        "pods_running_timeout_s",
        "out of range",
    ),
    (WorkloadSpec, {"run_id": RUN, "ttl_after_finished_s": -1}, "ttl_after_finished_s", "range"),
    (WorkloadSpec, {"run_id": RUN, "max_restarts": 101}, "max_restarts", "out of range"),
    (WorkloadSpec, {"run_id": RUN, "image_pull_policy": "always"}, "image_pull_policy", "one of"),
    (TrainConfig, {"steps": 3, "warmup_steps": 4}, "warmup_steps", "4 is more than steps 3"),
    (
        TrainConfig,
        {"steps": 10, "warmup_steps": 11},
        "warmup_steps",
        "set train.warmup_steps to 10",
    ),
    (TrainConfig, {"model": "70b"}, "model", "not one of"),
    (TrainConfig, {"steps": 0}, "steps", "out of range"),
    (TrainConfig, {"batch_size": -1}, "batch_size", "out of range"),
    (TrainConfig, {"activation_checkpointing": "every-0"}, "activation_checkpointing", "every-N"),
    (TrainConfig, {"reshard_after_forward": "no"}, "reshard_after_forward", "auto, true, false"),
    (TrainConfig, {"lr": 0.0}, "lr", "out of range"),
    (TrainConfig, {"lr": 2.0}, "lr", "out of range"),
    (TrainConfig, {"min_lr_ratio": 1.5}, "min_lr_ratio", "out of range"),
    (TrainConfig, {"dtype": "fp16"}, "dtype", "not one of"),
    (TrainConfig, {"data": ""}, "data", "synthetic"),
    (TrainConfig, {"seq_len": 200000}, "seq_len", "out of range"),
    (TrainConfig, {"checkpoint_every": 10}, "checkpoint_every", "needs recovery.checkpoint_dir"),
    (TrainConfig, {"log_every": 0}, "log_every", "out of range"),
    (
        VerifyConfig,
        {"min_bytes": 1 << 20, "max_bytes": 1024},
        "min_bytes",
        "larger than verify.max_bytes",
    ),
    (VerifyConfig, {"max_bytes": 1 << 37}, "max_bytes", "out of range"),
    (VerifyConfig, {"min_busbw_gbps": -1.0}, "min_busbw_gbps", "out of range"),
    (VerifyConfig, {"efficiency": 0.0}, "efficiency", "out of range"),
    (VerifyConfig, {"efficiency": 1.5}, "efficiency", "out of range"),
    (VerifyConfig, {"judge_min_bytes": 0}, "judge_min_bytes", "out of range"),
    (VerifyConfig, {"iters": -1}, "iters", "out of range"),
    (OwnerRef, {"api_version": "v1", "kind": "Pod", "name": "p", "uid": ""}, "owner.uid", "empty"),
    (
        WorkloadSpec,
        {"run_id": RUN, "node_selector": {"bad key!": "x"}},
        "node_selector",
        "label key",
    ),
    (
        WorkloadSpec,
        {"run_id": RUN, "node_selector": {"pool": "-x"}},
        "node_selector",
        "label value: at most 63 characters of letters, digits, '-', '_' or '.', starting and",
    ),
    (WorkloadSpec, {"run_id": RUN, "tolerations": ("gpu",)}, "tolerations", "key[=value]:Effect"),
    (WorkloadSpec, {"run_id": RUN, "tolerations": ("gpu:Never",)}, "tolerations", "not one of"),
    (
        WorkloadSpec,
        {"run_id": RUN, "priority_class": "High_Prio"},
        "priority_class",
        "PriorityClass",
    ),
    (WorkloadSpec, {"run_id": RUN, "queue_name": "Team Queue"}, "queue_name", "DNS-1123"),
    (LaunchSpec, {"module": "a b"}, "module", "not a Python module name"),
    (LaunchSpec, {"module": "mnnvl.runtime.train;rm"}, "module", "not a Python module name"),
    (LaunchSpec, {"module": "1abc"}, "module", "not a Python module name"),
    (LaunchSpec, {"command": ("python3", 1)}, "command", "must be a string"),
    (LaunchSpec, {}, "command", "give a module or a command"),
]


@pytest.mark.parametrize(
    ("cls", "kwargs", "field", "phrase"),
    BAD_INPUTS,
    ids=[f"{c.__name__}-{f}-{i}" for i, (c, _, f, _) in enumerate(BAD_INPUTS)],
)
def test_bad_input_is_refused_with_a_one_line_message_naming_the_field(
    cls: type, kwargs: dict[str, Any], field: str, phrase: str
) -> None:
    with pytest.raises(SpecError) as info:
        from_inputs(cls, **kwargs)
    err = info.value
    assert err.field == field
    message = str(err)
    assert message.startswith(f"{field}: ")
    assert phrase in message
    assert "\n" not in message
    assert err.exit_code == 2


def test_spec_error_is_also_a_value_error() -> None:
    with pytest.raises(ValueError, match="nodes"):
        WorkloadSpec(run_id=RUN, nodes=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1M", 1 << 20), ("64MiB", 64 << 20), ("4G", 4 << 30), ("1048576", 1 << 20), ("2k", 2048)],
)
def test_parse_bytes_reads_binary_units(text: str, expected: int) -> None:
    assert parse_bytes("max_bytes", text) == expected


def test_parse_bytes_names_the_field_on_garbage() -> None:
    with pytest.raises(SpecError, match=r"^max_bytes: .*not a size"):
        parse_bytes("max_bytes", "lots")


def test_env_values_keep_commas_and_equals_on_every_surface() -> None:
    # CLI: repeated flags; KFP: a list; Argo: one JSON list string.
    expected = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG_SUBSYS": "INIT,ENV", "B": "x=y"}
    items = ["NCCL_IB_HCA=mlx5_0,mlx5_1", "NCCL_DEBUG_SUBSYS=INIT,ENV", "B=x=y"]
    assert parse_env(items) == expected
    assert parse_env(json.dumps(items)) == expected
    assert parse_env([json.dumps(items[:1]), items[1], "", items[2]]) == expected
    with pytest.raises(SpecError, match=r"^env: .*JSON list"):
        parse_env('["A=1"')
    with pytest.raises(SpecError, match=r"^env: .*NAME=value"):
        parse_env(["NOEQUALS"])


def test_namespace_left_empty_is_the_pods_own_else_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(namespace, "SERVICE_ACCOUNT_NAMESPACE_FILE", str(tmp_path / "absent"))
    assert namespace.resolve_namespace("") == "default"
    sa_file = tmp_path / "namespace"
    sa_file.write_text("team-b\n")
    monkeypatch.setattr(namespace, "SERVICE_ACCOUNT_NAMESPACE_FILE", str(sa_file))
    assert namespace.resolve_namespace("") == "team-b"
    assert namespace.resolve_namespace(None) == "team-b"  # left out: the pod's own too
    monkeypatch.setenv("POD_NAMESPACE", "team-c")
    assert namespace.resolve_namespace("") == "team-c"  # the downward API wins
    assert namespace.resolve_namespace("team-a") == "team-a"


def test_building_a_spec_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "team-b")
    assert DomainSpec(run_id=RUN, namespace="").namespace == "default"
    assert DomainSpec(run_id=RUN).namespace == "default"
    assert WorkloadSpec(run_id=RUN, namespace="").namespace == "default"


def test_the_cli_and_the_components_resolve_the_pods_namespace_at_the_edge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mnnvl.cli import main as cli
    from mnnvl.components import bodies

    monkeypatch.setenv("POD_NAMESPACE", "team-b")
    ns = cli.build_parser().parse_args(["provision", "--run-id", RUN])
    assert cli._specs("provision", ns)[0].namespace == "team-b"
    ns = cli.build_parser().parse_args(["provision", "--run-id", RUN, "--namespace", "team-a"])
    assert cli._specs("provision", ns)[0].namespace == "team-a"
    assert bodies._specs("verify", {"run_id": RUN})[0].namespace == "team-b"


def test_the_default_warmup_is_capped_at_a_shorter_run() -> None:
    assert TrainConfig(steps=2).warmup_steps == 2
    assert TrainConfig(steps=20).warmup_steps == 5


def test_valid_inputs_are_accepted() -> None:
    domain = DomainSpec(run_id="Run_1.x", namespace="team-a", allocation_mode="All")
    assert domain.allocation_mode == "All" and domain.namespace == "team-a"
    workload = from_inputs(
        WorkloadSpec,
        run_id="f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
        image="registry.example.com:5000/team/trainer:1.0@sha256:" + "a" * 64,
        gpus_per_node=0,
        env={"NCCL_CUMEM_ENABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"},
        shm_size="512Mi",
    )
    assert workload.procs_per_node == 1 and workload.world_size == 2  # CPU: one process a pod
    assert TrainConfig(checkpoint_dir="/ckpt", checkpoint_every=5).checkpoint_every == 5
    assert VerifyConfig(min_bytes=1024, max_bytes=1024).max_bytes == 1024


def _round_trip(cls: type, cfg: Any, **extra: Any) -> Any:
    parser = argparse.ArgumentParser()
    add_inputs(parser, class_inputs(cls))
    first: Any = from_namespace(cls, parser.parse_args(to_args(cfg)), **extra)
    argv = to_args(first)
    return first, from_namespace(cls, parser.parse_args(argv), **extra)


ROUND_TRIPS: list[tuple[type, Any]] = [
    (TrainConfig, TrainConfig()),
    (
        TrainConfig,
        TrainConfig(
            model="1b",
            steps=123,
            seq_len=2048,
            batch_size=8,
            lr=1.5e-4,
            warmup_steps=0,
            min_lr_ratio=0.0,
            dtype="bf16",
            compile="false",
            activation_checkpointing="every-3",
            reshard_after_forward="false",
            data="/data/tokens.bin",
            seed=7,
            checkpoint_dir="/ckpt/run 1",
            checkpoint_every=50,
            log_every=1,
        ),
    ),
    (VerifyConfig, VerifyConfig()),
    (
        VerifyConfig,
        VerifyConfig(
            min_bytes=1024,
            max_bytes=1 << 30,
            iters=20,
            warmup_iters=5,
            min_busbw_gbps=300.5,
            efficiency=0.5,
            judge_min_bytes=1 << 20,
            cuda_graphs=False,
            output_dir="/out",
        ),
    ),
]


@pytest.mark.parametrize(("cls", "cfg"), ROUND_TRIPS)
def test_config_flags_round_trip_to_an_equal_dataclass(cls: type, cfg: Any) -> None:
    first, second = _round_trip(cls, cfg)
    assert first == cfg == second


def test_workload_flags_round_trip_including_env_and_booleans() -> None:
    owner = OwnerRef(api_version="v1", kind="Pod", name="launcher", uid="u-1")
    cfg = from_inputs(
        WorkloadSpec,
        run_id="Run_7",
        namespace="team-a",
        purpose="verify-post",
        nodes=18,
        gpus_per_node=8,
        image="registry.example.com/t/img:2",
        gpu_mode="claim",
        gpu_device_class="gpu.example.com",
        clique_affinity=False,
        nccl_profile="verify-strict",
        env={"NCCL_SOCKET_IFNAME": "eth0", "X": "a=b"},
        rdzv_port=29400,
        worker_service_account="worker",
        shm_size="512Mi",
        pods_running_timeout_s=60.0,
        job_timeout_s=600.5,
        ttl_after_finished_s=0,
        max_restarts=2,
        image_pull_policy="Always",
        owner=owner,
    )
    first, second = _round_trip(WorkloadSpec, cfg, owner=owner)
    assert first == cfg == second


def test_unset_flags_keep_the_dataclass_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_inputs(parser, class_inputs(WorkloadSpec))
    assert from_namespace(WorkloadSpec, parser.parse_args([]), run_id=RUN) == WorkloadSpec(
        run_id=RUN
    )


def test_size_flags_accept_units() -> None:
    parser = argparse.ArgumentParser()
    add_inputs(parser, class_inputs(VerifyConfig))
    cfg = from_namespace(
        VerifyConfig, parser.parse_args(["--min-bytes", "1K", "--max-bytes", "4G"])
    )
    assert (cfg.min_bytes, cfg.max_bytes) == (1024, 4 << 30)


def test_bad_flag_value_fails_in_validation_not_later() -> None:
    parser = argparse.ArgumentParser()
    add_inputs(parser, class_inputs(TrainConfig))
    with pytest.raises(SpecError, match=r"^checkpoint_every: "):
        from_namespace(TrainConfig, parser.parse_args(["--checkpoint-every", "5"]))


def test_every_input_field_has_help_text_for_the_cli() -> None:
    from mnnvl.inputs.surface import SPEC_CLASSES, class_inputs

    missing = [
        i.name for cls in SPEC_CLASSES for i in class_inputs(cls) if i.surfaces and not i.help
    ]
    assert missing == []


def test_scheduling_flags_parse_into_the_workload() -> None:
    parser = argparse.ArgumentParser()
    add_inputs(parser, class_inputs(WorkloadSpec))
    argv = ["--node-selector", "pool=gb200", "--node-selector", "zone=", "--tolerations",
            "dedicated=ml:NoSchedule", "--tolerations", "", "--priority-class", "training-high",
            "--queue-name", "team-a"]  # fmt: skip
    workload = from_namespace(WorkloadSpec, parser.parse_args(argv), run_id=RUN)
    assert workload.placement.node_selector == {"pool": "gb200", "zone": ""}
    assert workload.placement.tolerations == ("dedicated=ml:NoSchedule",)  # blank items dropped
    assert (workload.placement.priority_class, workload.queue_name) == ("training-high", "team-a")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 20_000_000}, "steps: 20000000 is out of range; allowed 1 to 10000000"),
        ({"batch_size": -1}, "batch_size: -1 is out of range; allowed 0 to 4096"),
        ({"lr": 2.0}, "lr: 2 is out of range; allowed 1e-08 to 1"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio: 1.5 is out of range; allowed 0 to 1"),
    ],
)
def test_ranges_print_as_numbers_are_typed_and_include_zero_where_it_is_valid(kwargs, message):
    with pytest.raises(SpecError) as err:
        TrainConfig(**kwargs)
    assert str(err.value) == message


def test_a_workloads_groups_are_the_groups_its_forms_show() -> None:
    """Each input KFP and Argo carry in a group is read from that group of the workload."""
    workload = from_inputs(WorkloadSpec, run_id=RUN, max_restarts=7, shm_size="1Gi")
    assert (workload.recovery.max_restarts, workload.pod.shm_size) == (7, "1Gi")
    grouped = [i for i in surface.class_inputs(WorkloadSpec) if i.group]
    assert {i.group for i in grouped} == {"placement", "pod", "deadlines", "recovery"}
    for item in grouped:
        assert hasattr(getattr(workload, item.group), item.name), item.name


def test_changing_a_grouped_input_checks_the_whole_workload_again() -> None:
    workload = from_inputs(WorkloadSpec, run_id=RUN, nodes=4, nodes_per_clique=2)
    with pytest.raises(
        SpecError, match=r"^nodes: 4 is not a multiple of placement.nodes_per_clique 3"
    ):
        with_inputs(workload, nodes_per_clique=3)
    both = with_inputs(workload, placement=Placement(gpu_mode="claim"), nodes_per_clique=4)
    assert (both.placement.gpu_mode, both.placement.nodes_per_clique) == ("claim", 4)
