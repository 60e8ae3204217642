"""Which NVLink clique group a rank belongs to, and the check that it really is there.

With ``--nodes-per-clique`` the Job builder makes one Indexed Job per group and sets
``MNNVL_NUM_GROUPS``, ``MNNVL_GROUP_INDEX`` and ``MNNVL_NODES_PER_GROUP`` on every worker;
global ranks are laid out group by group, so rank ``r`` belongs to group
``r // (world / groups)``. A worker whose declared group disagrees with its rank fails
naming its pod. Where the GPUs sit on an NVLink fabric, every rank of a group must report
the same NVML clusterUuid/cliqueId as its group's first rank; a rank that does not fails
the step naming its pod. Without the variables there is one group: today's behaviour.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mnnvl.contract.env import CLIQUE_LABEL, GROUP_INDEX, NUM_GROUPS
from mnnvl.errors import WorkloadFailed
from mnnvl.inputs import defaults
from mnnvl.runtime.devices import pod_name


@dataclass(frozen=True, kw_only=True)
class Groups:
    count: int
    size: int  # ranks per group
    index: int  # this rank's group

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """(world,) for one group (FSDP); (groups, ranks per group) for HSDP."""
        return (self.size,) if self.count == 1 else (self.count, self.size)

    @property
    def mesh_dims(self) -> tuple[str, ...]:
        return ("shard",) if self.count == 1 else ("replicate", "shard")

    def ranks(self, group: int) -> list[int]:
        return list(range(group * self.size, (group + 1) * self.size))

    @property
    def leaders(self) -> list[int]:
        """The first rank of every group."""
        return [g * self.size for g in range(self.count)]


def clique_label() -> str:
    """The node label the placement kept each group inside (``--clique-label``)."""
    return os.environ.get(CLIQUE_LABEL) or defaults.CLIQUE_LABEL


def _int_env(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "")
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise WorkloadFailed(f"{name}={text!r} is not a whole number") from None


def from_env(rank: int, world: int, environ: Mapping[str, str] | None = None) -> Groups:
    """This rank's group from the placement variables; fails naming the pod on a mismatch."""
    environ = os.environ if environ is None else environ
    count = _int_env(environ, NUM_GROUPS, 1)
    if count < 1 or world % count:
        raise WorkloadFailed(
            f"{NUM_GROUPS}={count} does not divide the world of {world} ranks into groups"
        )
    size = world // count
    index = rank // size
    declared = _int_env(environ, GROUP_INDEX, index)
    if declared != index:
        raise WorkloadFailed(
            f"pod {pod_name()} (rank {rank}) was placed in group {declared} but rank {rank} "
            f"belongs to group {index} ({size} ranks per group); the node ranks of the "
            "group Jobs overlap"
        )
    return Groups(count=count, size=size, index=index)


@dataclass(frozen=True)
class RankPlace:
    """What one rank says about itself: its pod, group and NVLink fabric (None: no fabric)."""

    rank: int
    pod: str
    group: int
    fabric: str | None


def fabric_mismatches(places: Sequence[RankPlace]) -> list[str]:
    """Ranks whose fabric differs from their group's first rank (only where both have one)."""
    leaders: dict[int, RankPlace] = {}
    problems = []
    for place in sorted(places, key=lambda p: p.rank):
        leader = leaders.setdefault(place.group, place)
        if place.fabric and leader.fabric and place.fabric != leader.fabric:
            problems.append(
                f"pod {place.pod} (rank {place.rank}, group {place.group}) is in NVLink "
                f"clique {place.fabric} but its group's pod {leader.pod} is in {leader.fabric}; "
                f"the group was not placed inside one clique (check the nodes' {clique_label()} "
                "labels: the placement keeps a group on one value of it)"
            )
    return problems


def check_fabric(groups: Groups, rank: int, fabric: str | None) -> None:
    """All-gather every rank's place; raise on all ranks when any group spans two cliques."""
    if groups.count == 1:
        return  # one group: the verify step's fabric check covers all ranks
    import torch.distributed as dist

    places: list[RankPlace | None] = [None] * dist.get_world_size()
    dist.all_gather_object(places, RankPlace(rank, pod_name(), groups.index, fabric))
    problems = fabric_mismatches([p for p in places if p is not None])
    if problems:
        raise WorkloadFailed("; ".join(problems))
