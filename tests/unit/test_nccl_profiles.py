"""NCCL profiles: pinned variables, refused values, logged overrides, fabric dependence."""

from __future__ import annotations

import logging

import pytest

from mnnvl.contract import env as contract_env
from mnnvl.contract import nccl
from mnnvl.errors import SpecError

PINNED_VALUES = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@pytest.fixture
def greedy_profile(monkeypatch: pytest.MonkeyPatch) -> str:
    """A profile that tries to set every machine-pinned variable, as default and required."""
    profile = nccl.Profile(
        "greedy",
        "sets what it must not",
        defaults={"NCCL_NVLS_ENABLE": "1", "NCCL_DEBUG": "WARN"},
        required={"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NCCL_MNNVL_ENABLE": "1"},
        fabric_required={"NVSHMEM_DISABLE_NVLS": "0"},
    )
    monkeypatch.setitem(nccl.PROFILES, "greedy", profile)
    return "greedy"


def test_pinned_variables_survive_a_profile_that_sets_them(greedy_profile: str) -> None:
    env = dict(PINNED_VALUES)
    changed = nccl.apply_profile(greedy_profile, fabric_present=True, environ=env)
    assert {k: env[k] for k in PINNED_VALUES} == PINNED_VALUES
    assert not set(changed) & set(contract_env.PINNED)
    assert changed == {"NCCL_DEBUG": "WARN", "NCCL_MNNVL_ENABLE": "1", **nccl.ASYNC_ERROR_HANDLING}


def test_pinned_variables_are_not_added_when_absent(greedy_profile: str) -> None:
    env: dict[str, str] = {}
    nccl.apply_profile(greedy_profile, fabric_present=True, environ=env)
    assert not set(env) & set(contract_env.PINNED)


def test_pod_env_never_carries_pinned_variables(greedy_profile: str) -> None:
    assert not set(nccl.pod_env(greedy_profile)) & set(contract_env.PINNED)


def test_cumem_disable_is_refused() -> None:
    with pytest.raises(SpecError, match="NCCL_CUMEM_ENABLE"):
        nccl.apply_profile("production", fabric_present=False, environ={"NCCL_CUMEM_ENABLE": "0"})


# What NCCL's strtoll(value, nullptr, 0) reads as cuMem off: no digits is 0, 0x hex, 0 octal,
# and any negative but -2 (auto); a 64-bit number is kept as a C int (2**32 is 0).
CUMEM_OFF = ["00", "0x0", "-0", "+0", "false", "true", " 0", "0abc", "-1", "08", "4294967296"]
CUMEM_ON = ["1", "-2", "2", "0x1", "010", " 1", "", "99999999999999999999"]


@pytest.mark.parametrize("value", CUMEM_OFF)
def test_the_worker_refuses_every_spelling_nccl_reads_as_cumem_off(value: str) -> None:
    with pytest.raises(SpecError, match=r"^NCCL_CUMEM_ENABLE: .*silently disables MNNVL"):
        nccl.apply_profile("production", fabric_present=True, environ={"NCCL_CUMEM_ENABLE": value})


@pytest.mark.parametrize("value", CUMEM_ON)
def test_values_nccl_reads_as_cumem_on_or_its_default_pass(value: str) -> None:
    env = {"NCCL_CUMEM_ENABLE": value}
    nccl.apply_profile("production", fabric_present=True, environ=env)
    assert env["NCCL_CUMEM_ENABLE"] == value


def test_the_refusal_says_what_nccl_reads() -> None:
    problem = contract_env.forbidden_problem({"NCCL_CUMEM_ENABLE": "false"})
    assert problem is not None and "NCCL_CUMEM_ENABLE=false (NCCL reads it as 0)" in problem[1]


def test_required_override_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    env = {"NCCL_MNNVL_ENABLE": "1"}
    with caplog.at_level(logging.INFO, logger="mnnvl.contract.nccl"):
        changed = nccl.apply_profile("single-host", fabric_present=False, environ=env)
    assert env["NCCL_MNNVL_ENABLE"] == "0"
    assert changed == {"NCCL_MNNVL_ENABLE": "0", **nccl.ASYNC_ERROR_HANDLING}
    assert any(
        r.levelno == logging.WARNING and "overriding NCCL_MNNVL_ENABLE=1 with 0" in r.getMessage()
        for r in caplog.records
    )


def test_user_values_win_over_profile_defaults(caplog: pytest.LogCaptureFixture) -> None:
    env = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    with caplog.at_level(logging.INFO, logger="mnnvl.contract.nccl"):
        changed = nccl.apply_profile("verify-strict", fabric_present=False, environ=env)
    assert env["NCCL_DEBUG"] == "WARN" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert changed == {"NCCL_DEBUG_SUBSYS": "INIT,ENV"}
    assert any("set NCCL_DEBUG_SUBSYS=INIT,ENV" in r.getMessage() for r in caplog.records)


def test_verify_strict_forces_mnnvl_only_with_fabric() -> None:
    without: dict[str, str] = {}
    nccl.apply_profile("verify-strict", fabric_present=False, environ=without)
    assert "NCCL_MNNVL_ENABLE" not in without
    with_fabric = {"NCCL_MNNVL_ENABLE": "2"}
    nccl.apply_profile("verify-strict", fabric_present=True, environ=with_fabric)
    assert with_fabric["NCCL_MNNVL_ENABLE"] == "1"


def test_unknown_profile_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="nccl_profile"):
        nccl.apply_profile("turbo", fabric_present=False, environ={})


def test_every_profile_and_the_worker_launcher_agree_on_nccl_error_handling() -> None:
    """How a worker ends after a collective error is one value, whichever profile a Job has
    and whether or not the launcher's environment has it."""
    from mnnvl.runtime.launch import parse, worker_env

    key = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    ns = parse(["--nnodes=1", "--nproc-per-node=1", "-m", "mnnvl.runtime.verify"])
    launched = worker_env(0, ns)[key]
    for name in nccl.PROFILES:
        environ: dict[str, str] = {}
        nccl.apply_profile(name, fabric_present=True, environ=environ)
        assert nccl.pod_env(name)[key] == environ[key] == launched, name
