"""Run id -> names: DNS-1123, short enough, deterministic and collision-free."""

from __future__ import annotations

import random
import re
import string

import pytest

from mnnvl.errors import SpecError
from mnnvl.inputs.defaults import MAX_NODES, PURPOSES
from mnnvl.inputs.names import (
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    LABEL_RUN_ID,
    MANAGED_SELECTOR,
    RunNames,
)

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
ID_CHARS = string.ascii_letters + string.digits + "-_."

SAMPLE_IDS = [
    "a",
    "0",
    "run-1",
    "RUN-1",
    "Run_1",
    "run.1",
    "f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
    "a" * 63,
    "A" * 63,
    "9" * 63,
    "x" + "-" * 61 + "y",
    "x" + "_" * 61 + "y",
    "x" + "." * 61 + "y",
    "pipeline-run-20250101-120000-abcdef0123456789abcdef0123456789",
]


def all_names(names: RunNames) -> list[str]:
    out = [names.domain, names.channel_template, names.gpu_template]
    for purpose in PURPOSES:
        job = names.job(purpose)
        out += [job, names.service(purpose)]
        out += [f"{job}-{index}" for index in range(MAX_NODES)]  # pod hostnames
    return out


def random_ids(count: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    ids: set[str] = set()
    while len(ids) < count:
        n = rng.randint(1, 63)
        middle = "".join(rng.choice(ID_CHARS) for _ in range(max(0, n - 2)))
        ends = [rng.choice(string.ascii_letters + string.digits) for _ in range(2)]
        ids.add((ends[0] + middle + ends[1])[:n] if n > 1 else ends[0])
    return sorted(ids)


@pytest.mark.parametrize("run_id", SAMPLE_IDS)
def test_every_name_and_pod_hostname_is_a_dns1123_label_of_at_most_63(run_id: str) -> None:
    for name in all_names(RunNames.for_run(run_id)):
        assert len(name) <= 63, name
        assert DNS1123_LABEL.match(name), name


def test_verify_post_hostname_of_the_last_pod_fits_for_the_longest_ids() -> None:
    for run_id in ("a" * 63, "Z" * 63, "a1" * 31 + "b"):
        host = f"{RunNames.for_run(run_id).job('verify-post')}-{MAX_NODES - 1}"
        assert len(host) <= 63
        assert DNS1123_LABEL.match(host)


def test_names_are_deterministic() -> None:
    for run_id in SAMPLE_IDS:
        assert RunNames.for_run(run_id) == RunNames.for_run(run_id)
        assert all_names(RunNames.for_run(run_id)) == all_names(RunNames.for_run(run_id))


def test_names_are_stable_across_releases() -> None:
    # Teardown and reap of runs started by an older release depend on this exact value.
    assert RunNames.for_run("run-1").domain == RunNames.for_run("run-1").base
    assert RunNames.for_run("run-1").domain.startswith("mnnvl-run-1-")
    assert len(RunNames.for_run("run-1").domain.rsplit("-", 1)[1]) == 8


def test_ten_thousand_random_run_ids_never_share_a_name() -> None:
    seen: dict[str, str] = {}
    for run_id in random_ids(10_000):
        names = RunNames.for_run(run_id)
        for name in (names.domain, names.channel_template, names.gpu_template):
            assert seen.setdefault(name, run_id) == run_id, (name, run_id, seen[name])
            assert DNS1123_LABEL.match(name) and len(name) <= 63


@pytest.mark.parametrize(
    "variants",
    [
        ["run-1", "Run-1", "RUN-1", "run_1", "run.1", "run--1", "run1"],
        ["a" * 63, "a" * 62, "A" * 63, "a" * 62 + "b"],
        ["job.x_y-z", "job-x-y-z", "job_x_y_z", "JOB.X.Y.Z"],
    ],
)
def test_case_and_punctuation_variants_get_distinct_names(variants: list[str]) -> None:
    domains = {RunNames.for_run(v).domain for v in variants}
    assert len(domains) == len(variants)


def test_channel_template_is_unique_per_domain_and_never_another_runs_name() -> None:
    ids = random_ids(2_000, seed=99)
    every_name: dict[str, str] = {}
    for run_id in ids:
        for name in all_names(RunNames.for_run(run_id)):
            every_name.setdefault(name, run_id)
    for run_id in ids:
        names = RunNames.for_run(run_id)
        assert names.channel_template != names.domain
        assert names.channel_template != names.gpu_template
        assert every_name[names.channel_template] == run_id
        assert names.channel_template not in {names.job(p) for p in PURPOSES}


def test_job_and_service_share_a_name_per_purpose_and_differ_across_purposes() -> None:
    names = RunNames.for_run("run-1")
    jobs = [names.job(p) for p in PURPOSES]
    assert len(set(jobs)) == len(PURPOSES)
    assert all(names.service(p) == names.job(p) for p in PURPOSES)


def test_unknown_purpose_is_refused() -> None:
    with pytest.raises(SpecError, match=r"^purpose: "):
        RunNames.for_run("run-1").job("bench")


@pytest.mark.parametrize("bad", ["", "a" * 64, "-x", "x y", "x/y"])
def test_invalid_run_ids_are_refused_before_any_name_is_made(bad: str) -> None:
    with pytest.raises(SpecError) as info:
        RunNames.for_run(bad)
    assert info.value.field == "run_id"


def test_labels_carry_the_exact_run_id_and_valid_values() -> None:
    run_id = "Run_1.x"
    labels = RunNames.for_run(run_id).labels("compute-domain")
    assert labels == {
        LABEL_MANAGED_BY: "mnnvl-pipelines",
        LABEL_PART_OF: "mnnvl-pipelines",
        LABEL_RUN_ID: run_id,
        LABEL_COMPONENT: "compute-domain",
    }
    assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in labels.values())
    assert LABEL_COMPONENT not in RunNames.for_run(run_id).labels()


def test_selector_matches_the_run_labels_and_extends_the_managed_selector() -> None:
    names = RunNames.for_run("Run_1.x")
    pairs = dict(item.split("=", 1) for item in names.selector.split(","))
    assert pairs.items() <= names.labels("train").items()
    assert names.selector.startswith(MANAGED_SELECTOR)
