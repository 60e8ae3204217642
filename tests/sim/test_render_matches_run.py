"""`mnnvl render` prints what `mnnvl run` creates: the same objects, names and deadlines."""

from __future__ import annotations

from typing import Any

from mnnvl import run
from mnnvl.inputs.names import LABEL_RUN_ID
from mnnvl.sim import SimCluster

OURS = ("computedomains", "resourceclaimtemplates", "services", "jobs")


def shape(obj: dict[str, Any]) -> tuple[str, str, Any]:
    return (obj["kind"], obj["metadata"]["name"], obj["spec"].get("activeDeadlineSeconds"))


def test_render_equals_what_a_run_creates(sim: SimCluster) -> None:
    values = {"nodes": 2, "gpus_per_node": 0, "min_busbw_gbps": 0.001, "steps": 2}
    planned = run.plan(values, "render-vs-run")
    rendered = [shape(o) for o in run.objects(planned)]
    created = sim.store.subscribe(OURS, namespace="default")
    try:
        run.run_all(planned, kubeconfig=sim.kubeconfig_path, report_dir=None)
    finally:
        sim.store.unsubscribe(created)
    seen = []
    while (ev := created.queue.get()) is not None:
        labels = ev.obj["metadata"].get("labels") or {}
        if ev.type == "ADDED" and labels.get(LABEL_RUN_ID) == "render-vs-run":
            seen.append(shape(ev.obj))
    assert seen == rendered
    assert [k for k, *_ in rendered] == ["ComputeDomain", *["Service", "Job"] * 3]
