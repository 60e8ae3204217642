"""Run id -> object names and labels; the one place names are made. Names are deterministic
(an exit handler derives the steps' names), DNS-1123 labels of at most 63 characters, and hold a
hash of the exact run id, so ids differing only in case or punctuation do not collide.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from mnnvl.errors import SpecError
from mnnvl.inputs.checks import check_run_id
from mnnvl.inputs.defaults import MAX_GROUPS, PURPOSES

MANAGED_BY = "mnnvl-pipelines"
PART_OF = "mnnvl-pipelines"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_RUN_ID = "mnnvl.io/run-id"
LABEL_CLIQUE_GROUP = "mnnvl.io/clique-group"
PREFIX = "mnnvl"
_BASE_MAX = 40  # leaves room for "-verify-post" and the pod index in hostnames


@dataclass(frozen=True)
class RunNames:
    """Every name a run uses, derived from its run id."""

    run_id: str
    base: str

    @classmethod
    def for_run(cls, run_id: str) -> RunNames:
        check_run_id(run_id)
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        room = _BASE_MAX - len(PREFIX) - len(digest) - 2
        slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")[:room].rstrip("-")
        base = f"{PREFIX}-{slug}-{digest}" if slug else f"{PREFIX}-{digest}"
        return cls(run_id=run_id, base=base)

    @property
    def domain(self) -> str:
        """The ComputeDomain."""
        return self.base

    @property
    def channel_template(self) -> str:
        """The workload ResourceClaimTemplate the DRA controller creates for this domain."""
        return f"{self.base}-channel"

    @property
    def gpu_template(self) -> str:
        """The optional ``gpu.nvidia.com`` ResourceClaimTemplate (``gpu_mode='claim'``)."""
        return f"{self.base}-gpus"

    def job(self, purpose: str, group: int | None = None) -> str:
        """The Indexed Job for one purpose, e.g. ``train``; with clique groups one Job per
        group, ``<base>-<purpose>-g<group>`` (pod hostnames stay within 63 characters for
        up to ``MAX_GROUPS`` groups of up to 99 nodes)."""
        if purpose not in PURPOSES:
            raise SpecError("purpose", f"{purpose!r} is not one of {', '.join(PURPOSES)}")
        if group is None:
            return f"{self.base}-{purpose}"
        if not 0 <= group < MAX_GROUPS:
            raise SpecError("group", f"{group} is out of range; allowed 0..{MAX_GROUPS - 1}")
        return f"{self.base}-{purpose}-g{group}"

    def service(self, purpose: str) -> str:
        """The headless Service of a step: one for all its Jobs (one rendezvous)."""
        return self.job(purpose)

    def labels(self, component: str = "") -> dict[str, str]:
        """Labels on every object of the run; ``component`` says which part it is."""
        labels = {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_PART_OF: PART_OF,
            LABEL_RUN_ID: self.run_id,
        }
        if component:
            labels[LABEL_COMPONENT] = component
        return labels

    @property
    def selector(self) -> str:
        """Label selector matching every object of this run."""
        return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_RUN_ID}={self.run_id}"


MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
