"""NCCL profiles: the one place that decides NCCL environment variables.

Pure standard library, so the Job manifests put the same profile into pod env that the
worker applies at start-up (one source of truth).

Rules, in order:
1. Machine-pinned variables (``NCCL_NVLS_ENABLE``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST``,
   ``NVSHMEM_DISABLE_NVLS``) are never written, whatever a profile says.
2. ``NCCL_CUMEM_ENABLE`` set to anything NCCL reads as cuMem off (``0``, ``00``, ``0x0``,
   ``false``: ``mnnvl.contract.env.forbidden_problem``) is refused: NCCL's MNNVL path needs
   cuMem, so it silently turns MNNVL off.
3. A profile's ``defaults`` fill in only what the user did not set; its ``required``
   values win over the user's and every such override is logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from mnnvl.contract import env as contract_env
from mnnvl.contract.errors import SpecError

logger = logging.getLogger(__name__)


# How torch's NCCL watchdog ends a worker after a collective error or timeout, in every
# profile (a user's value wins): 3 ("SkipCleanUp") ends the process without aborting its
# communicators, which can hang on a broken fabric; the pod fails at once and the gang
# restarts. torch's own default in ProcessGroupNCCL; torchrun's agent would set 1 instead
# (torch/distributed/elastic/agent/server/local_elastic_agent.py), which the worker
# launcher does not inherit.
ASYNC_ERROR_HANDLING = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    defaults: dict[str, str] = field(default_factory=dict)
    required: dict[str, str] = field(default_factory=dict)
    fabric_required: dict[str, str] = field(default_factory=dict)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "production",
            "MNNVL on auto (NCCL_MNNVL_ENABLE default 2), cuMem on, no debug knobs",
        ),
        Profile(
            "verify-strict",
            "NCCL_MNNVL_ENABLE=1 where the node reports NVLink fabric, so a broken IMEX "
            "domain fails NCCL init instead of falling back; INIT logs prove the transport",
            defaults={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"},
            fabric_required={"NCCL_MNNVL_ENABLE": "1"},
        ),
        Profile(
            "single-host",
            "one host's NVLink/NVSwitch, no multi-node fabric: MNNVL off",
            required={"NCCL_MNNVL_ENABLE": "0"},
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise SpecError("nccl_profile", f"{name!r} is not one of {', '.join(PROFILES)}") from None


def pod_env(name: str) -> dict[str, str]:
    """Static env for worker pods; the fabric-dependent part is applied in the pod."""
    profile = get_profile(name)
    env = {
        contract_env.NCCL_PROFILE: profile.name,
        **ASYNC_ERROR_HANDLING,
        **profile.defaults,
        **profile.required,
    }
    return {k: v for k, v in env.items() if k not in contract_env.PINNED}


def apply_profile(
    name: str,
    *,
    fabric_present: bool,
    environ: MutableMapping[str, str] | None = None,
) -> dict[str, str]:
    """Apply a profile to ``environ`` (default ``os.environ``); return what was changed."""
    env = os.environ if environ is None else environ
    problem = contract_env.forbidden_problem(env)
    if problem:
        raise SpecError(*problem)
    profile = get_profile(name)
    changed: dict[str, str] = {}
    wanted = dict(profile.required)
    if fabric_present:
        wanted.update(profile.fabric_required)
    for key, val in {**ASYNC_ERROR_HANDLING, **profile.defaults}.items():
        if key in contract_env.PINNED or key in env:
            continue
        env[key] = changed[key] = val
        logger.info("NCCL profile %s: set %s=%s", name, key, val)
    for key, val in wanted.items():
        if key in contract_env.PINNED:
            logger.warning("NCCL profile %s: leaving machine-pinned %s untouched", name, key)
            continue
        old = env.get(key)
        if old == val:
            continue
        if old is not None:
            logger.warning("NCCL profile %s: overriding %s=%s with %s", name, key, old, val)
        else:
            logger.info("NCCL profile %s: set %s=%s", name, key, val)
        env[key] = changed[key] = val
    return changed
