"""``make run``: the ``mnnvl-training`` KFP pipeline end to end on this machine (``make run
PIPELINE=custom``: ``mnnvl-custom`` with ``examples/custom_trainer.py``).

``kfp.local`` runs the components here against a simulated cluster (``mnnvl.sim.SimCluster``).
Stage lines go to stderr, a summary to stdout. Exit 0 when the pipeline succeeded and teardown
left no object and no process, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from mnnvl.pipelines.local_progress import ANSI, KfpLogTap, ObjectWatcher

log = logging.getLogger(__name__)

DEFAULT_OUT = Path("out") / "local-run"
LOCAL_IMAGE = "ghcr.io/mnnvl-pipelines/runtime:0.1.0"  # any valid ref: the sim runs it locally
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_trainer.py"
PIPELINE_NAMES = {"training": "mnnvl-training", "custom": "mnnvl-custom"}


def pipeline_arguments(
    args: argparse.Namespace, gpus_per_node: int, pipeline: str = "training"
) -> dict[str, Any]:
    """CPU-friendly parameters for the local run (tiny model or the example, short sweep)."""
    per_clique = getattr(args, "nodes_per_clique", 0)  # 0: all nodes in one clique
    arguments: dict[str, Any] = {
        "namespace": "default",
        "nodes": args.nodes,
        "gpus_per_node": gpus_per_node,
        "image": LOCAL_IMAGE,
        "verify_timeout_s": 300.0,
        # Clique groups keep their affinity: the simulator labels one clique per group.
        "placement": {
            "nodes_per_clique": per_clique,
            "clique_affinity": bool(gpus_per_node or per_clique),
        },
        "pod": {"shm_size": "1Gi"},
        "deadlines": {
            "rct_timeout_s": 60.0,
            "delete_timeout_s": 60.0,
            "pods_running_timeout_s": 120.0,
        },
        # CPU/gloo (and single-GPU) runs have no NVLink to judge: NOT_JUDGED is expected here.
        "verify": {"min_busbw_gbps": args.min_busbw_gbps, "allow_unjudged": True},
    }
    if pipeline == "custom":
        # The example runs one process per node and reads the rendezvous from its env.
        return arguments | {
            "command": ["python3", str(EXAMPLE), "--steps", "400"],
            "launch_timeout_s": 600.0,
        }
    return arguments | {
        "workload": getattr(args, "workload", "job"),
        "model": "tiny",
        "steps": args.steps,
        "batch_size": 2,
        "train_timeout_s": 600.0,
        "train": {"log_every": max(1, args.steps // 4)},
    }


def gpu_shape(nodes: int, asked: int | None, local: int) -> tuple[int, str]:
    """GPUs per simulated node and why, from ``--gpus-per-node`` (None: the ``local`` GPUs
    shared out whole; fewer GPUs than nodes: CPU workers). ValueError for more than there are."""
    gpus = local // max(1, nodes) if asked is None else asked
    if nodes * gpus > local:
        raise ValueError(
            f"--gpus-per-node {gpus} on {nodes} simulated nodes needs {nodes * gpus} GPUs, and "
            f"this machine has {local} (the pods run here): pass --gpus-per-node "
            f"{local // max(1, nodes)} or fewer nodes"
        )
    where = f"{nodes} simulated node(s) x {gpus} GPU(s)"
    if gpus:
        idle = local - nodes * gpus
        return gpus, f"{where}: training on this machine's GPUs" + (
            f" ({idle} of its {local} idle)" if idle else ""
        )
    if asked == 0:
        return 0, f"{where}: training on the CPU, as asked"
    if not local:
        return 0, f"{where}: training on the CPU, as this machine has no GPU"
    return 0, (
        f"{where}: training on the CPU, as this machine's {local} GPU(s) cannot give each of "
        f"the {nodes} nodes one; --nodes {local} (make run NODES={local}) trains on the GPUs"
    )


@dataclass
class RunOutcome:
    succeeded: bool
    error: str
    wall_s: float
    run_dir: Path | None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    reports: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def collect_outputs(
    run_dir: Path | None, reports_dir: Path
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Step results (by purpose) from a kfp.local run directory; the HTML reports copied out
    with an ``.html`` suffix (kfp.local names the file ``report``)."""
    results: dict[str, dict[str, Any]] = {}
    reports: dict[str, str] = {}
    if run_dir is None:
        return results, reports
    for path in sorted(run_dir.glob("*/result")):
        doc = json.loads(path.read_text())
        purpose = str(doc.get("purpose", path.parent.name))
        results[purpose] = doc
        html = path.parent / "report"
        if html.is_file():
            reports_dir.mkdir(parents=True, exist_ok=True)
            copy = reports_dir / f"{purpose}.html"
            shutil.copyfile(html, copy)
            reports[purpose] = str(copy)
    return results, reports


def run_pipeline(
    arguments: dict[str, Any],
    out: Path,
    *,
    start: float,
    verbose: bool,
    name: str = "mnnvl-training",
) -> RunOutcome:
    """Run pipeline ``name`` under kfp.local; KUBECONFIG must point at the cluster."""
    from kfp import local

    from mnnvl.pipelines.kfp_pipeline import PIPELINES

    pipeline_root = out / "kfp"
    pipeline_root.mkdir(parents=True, exist_ok=True)
    before = set(pipeline_root.glob(f"{name}-*"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
    error = ""
    log_path = out / "kfp-local.log"
    with open(log_path, "w", encoding="utf-8") as log_file:
        tap = KfpLogTap(log_file, echo=sys.stdout if verbose else None, start=start, pipeline=name)
        # kfp.local prints every task's log to stdout, and warns that the launcher image and
        # display names mean nothing locally (true, and expected here).
        with contextlib.redirect_stdout(tap), warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"kfp\.local\..*")
            try:
                PIPELINES[name](**arguments)
            except RuntimeError as e:  # kfp.local's way of saying the pipeline failed
                error = ANSI.sub("", str(e).splitlines()[0] if str(e) else type(e).__name__)
    wall_s = time.monotonic() - start
    new_dirs = sorted(set(pipeline_root.glob(f"{name}-*")) - before)
    run_dir = new_dirs[-1] if new_dirs else None
    # Each pipeline's reports apart, and only this run's: no earlier run's beside them.
    reports_dir = out / "reports" / name
    shutil.rmtree(reports_dir, ignore_errors=True)
    results, reports = collect_outputs(run_dir, reports_dir)
    return RunOutcome(not error, error, wall_s, run_dir, results, reports, dict(tap.task_errors))


def _num(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "n/a"


def _summary(
    outcome: RunOutcome, created: list[str], leftover: list[str], log_path: Path, name: str
) -> None:
    from mnnvl.report import verify_table

    state = "SUCCEEDED" if outcome.succeeded else f"FAILED ({outcome.error})"
    print(f"\n{name}: {state} in {outcome.wall_s:.1f} s")
    for stage, message in outcome.errors.items():
        print(f"  {stage} failed: {message}")
    print(f"\nObjects the run created ({len(created)}):")
    for line in created:
        print(f"  {line}")
    train = outcome.results.get("train")
    if train:
        raw = train.get("raw") or {}
        print("\nTraining:")
        print(
            f"  model {raw.get('model')} on {raw.get('world_size')} ranks ({raw.get('device')}): "
            f"{train.get('steps')} steps, final loss {_num(train.get('final_loss'), 4)}, "
            f"{_num(train.get('tokens_per_s'), 0)} tokens/s, MFU {_num(train.get('mfu'), 3)}, "
            f"{_num(raw.get('wall_s'), 1)} s"
        )
        mesh = raw.get("mesh") or {}
        if mesh.get("groups", 1) > 1:
            dims = " x ".join(f"{n} {d}" for n, d in zip(mesh["shape"], mesh["dims"], strict=True))
            print(f"  mesh: {mesh['sharding']} over {mesh['groups']} clique groups ({dims})")
    job = outcome.results.get("job")
    if job:
        print("\nYour workload (launch step):")
        wall = _num(job.get("elapsed_s"), 1)
        print(f"  Job {job.get('job')}: exit code {job.get('exit_code')}, {wall} s")
        print(f"  RESULT {json.dumps(job.get('result'))}")
    for purpose in ("verify-pre", "verify-post", "verify"):
        result = outcome.results.get(purpose)
        if result:
            print(f"\nVerification ({purpose}): {result.get('verdict')}")
            print(verify_table(result.get("raw") or {}))
    print("\nReports:")
    for purpose, path in outcome.reports.items():
        print(f"  {purpose}: {path}")
    if outcome.run_dir is not None:
        print(f"  KFP artifacts: {outcome.run_dir}")
    print(f"  kfp.local log: {log_path}")
    if leftover:
        print(f"\nTeardown LEFT {len(leftover)}: {', '.join(leftover)}")
    else:
        print("\nTeardown: nothing of the run is left: no object, no process of its pods.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mnnvl.pipelines.local_run", description=__doc__
    )
    parser.add_argument("--nodes", type=int, default=2, help="simulated nodes (default 2)")
    parser.add_argument(
        "--nodes-per-clique",
        type=int,
        default=0,
        help="nodes per NVLink clique group; the simulator gets one clique per group "
        "(default 0: all nodes in one clique)",
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=None, help="default: local GPUs / nodes, else 0"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--min-busbw-gbps",
        type=float,
        default=0.0,
        help="verification threshold in GB/s (0 = derived; 1e5 forces a FAIL verdict)",
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--verbose", action="store_true", help="show kfp.local's task logs")
    parser.add_argument(
        "--pipeline",
        choices=sorted(PIPELINE_NAMES),
        default="training",
        help="training (default) or custom (examples/custom_trainer.py via the launch step)",
    )
    parser.add_argument(
        "--workload",
        choices=("job", "trainjob"),
        default="job",
        help="train as an Indexed Job (default) or as a Kubeflow Trainer TrainJob (the "
        "simulator runs Trainer's stand-in)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from mnnvl.sim import SimCluster
    from mnnvl.sim.core.podenv import local_gpu_ids

    try:
        gpus, why = gpu_shape(args.nodes, args.gpus_per_node, len(local_gpu_ids()))
    except ValueError as e:
        log.error("%s", e)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    log.info("starting a simulated cluster: %s", why)
    cliques = args.nodes // args.nodes_per_clique if args.nodes_per_clique else 1
    trainer = args.workload == "trainjob"
    sim = SimCluster(nodes=args.nodes, gpus_per_node=gpus, cliques=cliques, trainer=trainer).start()
    start = time.monotonic()
    try:
        with (
            mock.patch.dict(os.environ, {"KUBECONFIG": str(sim.kubeconfig_path)}),
            ObjectWatcher(sim, start=start) as watcher,
        ):
            arguments = pipeline_arguments(args, gpus, args.pipeline)
            name = PIPELINE_NAMES[args.pipeline]
            outcome = run_pipeline(
                arguments, args.out, start=start, verbose=args.verbose, name=name
            )
        run_ids = {str(r["run_id"]) for r in outcome.results.values() if r.get("run_id")}
        leftover = [f"{k} {ns}/{n}" for k, ns, n in sim.objects()]
        leftover += [f"process {pid} of pod {ns}/{pod}" for ns, pod, pid in sim.processes()]
        for run_id in sorted(run_ids):
            selector = f"mnnvl.io/run-id={run_id}"
            leftover += [f"{k} {ns}/{n}" for k, ns, n in sim.objects(label_selector=selector)]
        log_path = args.out / "kfp-local.log"
        _summary(outcome, watcher.created(), sorted(set(leftover)), log_path, name)
    finally:
        sim.stop()
    return 0 if outcome.succeeded and not leftover else 1


if __name__ == "__main__":
    sys.exit(main())
