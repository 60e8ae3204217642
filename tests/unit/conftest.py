"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def gloo_one_rank() -> Iterator[None]:
    """A one-rank gloo process group in this pytest process, for the module's tests."""
    import torch.distributed as dist

    from mnnvl.runtime.local import free_port

    # The rendezvous env is this module's alone: later tests' subprocesses must not inherit it.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MASTER_ADDR", "127.0.0.1")
        env.setenv("MASTER_PORT", str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
        yield
        dist.destroy_process_group()
