"""Fixtures the simulator test modules share.

- ``sim``: one simulated cluster per module, built from the module's ``SIM`` dict of
  ``SimCluster`` arguments (none: the defaults, two nodes). Module scope: ``make test`` runs a
  module on one xdist worker (``--dist loadscope``), so its cluster is built once. A module
  that prepares its cluster further overrides ``sim`` with a fixture that takes ``sim``.
- ``workers``: a folder with the module's ``WORKERS`` (file name -> source), the worker
  modules its runs start (it goes on the pods' ``PYTHONPATH``).
- ``raw``: calls by path on the module's cluster (:class:`tests.sim.simkit.Raw`).
- ``run``: a provisioned domain and a two-node Job workload of the module's ``workers``, as
  ``(domain, workload)``; torn down afterwards, whatever happened. The module's ``RUN`` dict
  names the run id's ``prefix``, ``WorkloadSpec`` overrides and ``leave_nothing`` (assert
  that no object and no process of the run is left after the teardown). Modules with runs
  of their own shape define their own ``run``.
- ``eventually``: :func:`tests.sim.simkit.wait_for`, for a test that polls an outcome.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mnnvl import steps
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw, assert_nothing_left, wait_for


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    with SimCluster(**getattr(request.module, "SIM", {})) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def workers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("workers")
    for name, source in getattr(request.module, "WORKERS", {}).items():
        (path / name).write_text(source)
    return str(path)


@pytest.fixture
def eventually() -> Any:
    return wait_for


@pytest.fixture(scope="module")
def raw(sim: SimCluster) -> Raw:
    return Raw(sim)


@pytest.fixture
def run(
    request: pytest.FixtureRequest, sim: SimCluster, workers: str
) -> Iterator[tuple[DomainSpec, WorkloadSpec]]:
    options: dict[str, Any] = dict(getattr(request.module, "RUN", {}))
    prefix, leave_nothing = options.pop("prefix", "r"), options.pop("leave_nothing", False)
    run_id = f"{prefix}-{uuid.uuid4().hex[:10]}"
    domain = DomainSpec(run_id=run_id, delete_timeout_s=30)
    defaults: dict[str, Any] = dict(purpose="job", nodes=2, gpus_per_node=0)
    defaults.update(env={"PYTHONPATH": workers}, pods_running_timeout_s=60, job_timeout_s=60)
    workload = from_inputs(WorkloadSpec, run_id=run_id, **{**defaults, **options})
    steps.provision(domain, kubeconfig=sim.kubeconfig_path)
    yield domain, workload
    steps.teardown(domain, kubeconfig=sim.kubeconfig_path)
    if leave_nothing:
        names = RunNames.for_run(run_id)
        assert_nothing_left(sim, names.selector)
        assert [o for o in sim.objects() if names.base in o[2]] == []
