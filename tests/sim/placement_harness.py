"""The simulated scheduler alone, driven synchronously: nodes in cliques, the pods of a run's
Jobs as the Job controller would make them, and scheduling passes until nothing changes."""

from __future__ import annotations

from typing import Any

from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import WorkloadSpec
from mnnvl.manifests import indexed_jobs
from mnnvl.sim.api.faults import Faults
from mnnvl.sim.api.store import Store
from mnnvl.sim.core.scheduler import INDEX_LABEL, Scheduler
from mnnvl.sim.nvidia.dra import CHANNEL_CLASS

CLIQUE = "nvidia.com/gpu.clique"
NS = "default"


def cluster(cliques: list[int], seed: int) -> tuple[Store, Scheduler]:
    """A store with ``sum(cliques)`` nodes, ``cliques[i]`` of them in clique ``c<i>``."""
    store = Store()
    store.create("namespaces", {"metadata": {"name": NS}})
    n = 0
    for c, size in enumerate(cliques):
        for _ in range(size):
            name = f"node-{n}"
            labels = {"kubernetes.io/hostname": name, CLIQUE: f"c{c}"}
            alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "4"}
            node = {"metadata": {"name": name, "labels": labels}, "spec": {}}
            store.create("nodes", {**node, "status": {"allocatable": alloc}})
            n += 1
    return store, Scheduler(store, Faults(schedule_delay_s=0.0), seed)


def add_pods(
    store: Store, workload: WorkloadSpec, jobs: list[dict[str, Any]] | None = None
) -> None:
    """The channel template and every pod of the run's Jobs (``jobs``: these instead)."""

    template = RunNames.for_run(workload.run_id).channel_template
    request = {"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}
    config = {"opaque": {"parameters": {"kind": "ComputeDomainChannelConfig", "domainID": "d"}}}
    spec = {"spec": {"devices": {"requests": [request], "config": [config]}}}
    store.create(
        "resourceclaimtemplates", {"metadata": {"name": template, "namespace": NS}, "spec": spec}
    )
    for job in jobs or indexed_jobs(workload, "mnnvl.runtime.verify", []):
        tpl = job["spec"]["template"]
        for i in range(job["spec"]["completions"]):
            meta = {
                "name": f"{job['metadata']['name']}-{i}",
                "namespace": NS,
                "labels": {**tpl["metadata"]["labels"], INDEX_LABEL: str(i)},
                "annotations": {INDEX_LABEL: str(i)},
            }
            store.create("pods", {"metadata": meta, "spec": tpl["spec"], "status": {}})


def schedule(store: Store, scheduler: Scheduler, passes: int = 3) -> dict[str, str]:
    """Scheduling passes; pod name -> node name of every bound pod."""
    for _ in range(passes):
        scheduler._schedule_pending()
    pods = store.list("pods")[0]
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
