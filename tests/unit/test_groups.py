"""Clique groups of ranks: from the placement variables, and the fabric check per group."""

from __future__ import annotations

import pytest

from mnnvl.errors import WorkloadFailed
from mnnvl.runtime.groups import RankPlace, fabric_mismatches, from_env
from mnnvl.runtime.nccl_log import transport_problems


def test_without_placement_variables_all_ranks_are_one_fsdp_group() -> None:
    groups = from_env(5, 8, {})
    assert (groups.count, groups.size, groups.index) == (1, 8, 0)
    assert groups.mesh_shape == (8,) and groups.mesh_dims == ("shard",)


def test_ranks_are_laid_out_group_by_group() -> None:
    env = {"MNNVL_NUM_GROUPS": "3", "MNNVL_GROUP_INDEX": "1"}
    groups = from_env(5, 12, env)
    assert (groups.count, groups.size, groups.index) == (3, 4, 1)
    assert groups.mesh_shape == (3, 4) and groups.mesh_dims == ("replicate", "shard")
    assert groups.ranks(2) == [8, 9, 10, 11] and groups.leaders == [0, 4, 8]


def test_group_count_that_does_not_divide_the_world_fails() -> None:
    with pytest.raises(WorkloadFailed, match="does not divide the world of 6 ranks"):
        from_env(0, 6, {"MNNVL_NUM_GROUPS": "4"})


def test_a_rank_in_another_clique_than_its_group_is_named_with_its_pod() -> None:
    places = [
        RankPlace(0, "r-g0-0", 0, "aa/1"),
        RankPlace(1, "r-g0-1", 0, "aa/1"),
        RankPlace(2, "r-g1-0", 1, "aa/2"),
        RankPlace(3, "r-g1-1", 1, "aa/3"),
    ]
    problems = fabric_mismatches(places)
    assert len(problems) == 1
    assert problems[0].startswith("pod r-g1-1 (rank 3, group 1) is in NVLink clique aa/3")
    assert "group's pod r-g1-0 is in aa/2" in problems[0]


def test_groups_in_different_cliques_or_without_a_fabric_are_fine() -> None:
    places = [RankPlace(0, "a", 0, "x/1"), RankPlace(1, "b", 1, "x/2"), RankPlace(2, "c", 1, None)]
    assert fabric_mismatches([*places, RankPlace(3, "d", 1, "x/2")]) == []


def test_a_group_across_cliques_names_the_label_the_placement_used(monkeypatch) -> None:
    monkeypatch.setenv("MNNVL_CLIQUE_LABEL", "cloud.example.com/nvlink-domain")
    places = [RankPlace(0, "a", 0, "x/1"), RankPlace(1, "b", 0, "x/2")]
    (problem,) = fabric_mismatches(places)
    assert "check the nodes' cloud.example.com/nvlink-domain labels" in problem
    nccl = {"transport": "network (NET/IB)"}
    (why,) = transport_problems(nccl, nodes=2, mnnvl_fabric=True, nvlink=True)
    assert "different NVLink cliques (node label cloud.example.com/nvlink-domain)" in why
