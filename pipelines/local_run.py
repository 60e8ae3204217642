"""``make run``: the ``mnnvl-training`` KFP pipeline end to end on this machine (``make run
PIPELINE=custom``: ``mnnvl-custom`` with ``examples/custom_trainer.py``).

``kfp.local`` runs the components here against a simulated cluster (``mnnvl.sim.SimCluster``).
Stage lines go to stderr, a summary to stdout. Exit 0 when the pipeline succeeded and teardown
left no object and no process, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

from mnnvl.pipelines.kfp_pipeline import PIPELINES, task_names

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
    """GPUs per simulated node and why: ``--gpus-per-node``, else the ``local`` GPUs shared
    out whole (none each where there are fewer GPUs than nodes: CPU workers)."""
    gpus = local // max(1, nodes) if asked is None else asked
    where = f"{nodes} simulated node(s) x {gpus} GPU(s): training on"
    if gpus:
        idle = local - nodes * gpus
        return gpus, f"{where} this machine's GPUs" + (f" ({idle} of {local} idle)" if idle else "")
    if asked == 0 or not local:
        return 0, f"{where} the CPU, as {'asked' if asked == 0 else 'this machine has no GPU'}"
    return 0, (
        f"{where} the CPU, as this machine's {local} GPU(s) cannot give each of the {nodes} "
        f"nodes one; --nodes {local} (make run NODES={local}) trains on the GPUs"
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


ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STARTED = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
# A step's own one-line failure (``mnnvl.components.bodies.one_line``), as KFP's executor logs it.
_FAILED = re.compile(r"ERROR\]: \w+ failed: (.+)$")
# The last line of a task's traceback, e.g. "ValueError: ...".
_ERROR = re.compile(
    r"^\s*((?:[\w]+\.)*\w*(?:Error|Exception|Failed|Timeout|Missing|Unavailable)): (.+)$"
)


class KfpLogTap(io.TextIOBase):
    """A stdout replacement: keeps kfp.local's output in a file and reports task stages on the
    process's real stderr (kfp.local takes over the root logger and stdout while it runs)."""

    def __init__(self, sink: TextIO, *, echo: TextIO | None, start: float, pipeline: str) -> None:
        super().__init__()
        self._stages = task_names(pipeline)  # kfp.local's task names -> the pipeline's
        self._streams, self._start = [sink] + ([echo] if echo else []), start
        self._partial = self._task = ""
        self.task_errors: dict[str, str] = {}
        """Stage -> the last error line its task logged."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._scan(ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()

    def _stage(self, message: str) -> None:
        elapsed = time.monotonic() - self._start
        print(f"[{elapsed:6.1f}s] {message}", file=sys.__stderr__, flush=True)

    def _scan(self, line: str) -> None:
        if m := _STARTED.search(line):
            self._task = self._stages.get(m.group(1), m.group(1))
            self._stage(f"{self._task}: started")
        elif m := _FINISHED.search(line):
            stage = self._stages.get(m.group(1), m.group(1))
            self._stage(f"{stage}: {m.group(2)}")
            if m.group(2) == "SUCCESS":
                self.task_errors.pop(stage, None)  # an attempt before, retried: not the outcome
            elif stage in self.task_errors:
                self._stage(f"{stage}: {self.task_errors[stage]}")
        elif self._task and (m := _FAILED.search(line)):
            self.task_errors[self._task] = m.group(1)
        elif self._task and (m := _ERROR.match(line)):
            self.task_errors[self._task] = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"


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
    outcome = RunOutcome(not error, error, wall_s, run_dir, errors=dict(tap.task_errors))
    # Each pipeline's reports apart, and only this run's: no earlier run's beside them.
    reports_dir = out / "reports" / name
    shutil.rmtree(reports_dir, ignore_errors=True)
    for path in sorted(run_dir.glob("*/result")) if run_dir else []:  # each step's result
        doc = json.loads(path.read_text())
        purpose = str(doc.get("purpose", path.parent.name))
        outcome.results[purpose] = doc
        if (path.parent / "report").is_file():  # its HTML report, as kfp.local names it
            reports_dir.mkdir(parents=True, exist_ok=True)
            copy = shutil.copyfile(path.parent / "report", reports_dir / f"{purpose}.html")
            outcome.reports[purpose] = str(copy)
    return outcome


def _summary(
    outcome: RunOutcome, created: list[str], leftover: list[str], log_path: Path, name: str
) -> None:
    from mnnvl.report import verify_table
    from mnnvl.report_train import summary_lines

    state = "SUCCEEDED" if outcome.succeeded else f"FAILED ({outcome.error})"
    print(f"\n{name}: {state} in {outcome.wall_s:.1f} s")
    for stage, message in outcome.errors.items():
        print(f"  {stage} failed: {message}")
    print(f"\nObjects the run created ({len(created)}):", *created, sep="\n  ")
    for purpose, result in outcome.results.items():
        if "verdict" in result:
            print(f"\nVerification ({purpose}): {result['verdict']}")
            print(verify_table(result.get("raw") or {}))
    in_order = {k: outcome.results.get(k) for k in ("verify-pre", "train", "job", "verify-post")}
    print("\nSummary:", *summary_lines(in_order), sep="\n  ")
    if job := outcome.results.get("job"):
        print(f"  {'':<12} RESULT {json.dumps(job.get('result'))}")
    print("\nReports:", *(f"{p}: {path}" for p, path in outcome.reports.items()), sep="\n  ")
    if outcome.run_dir is not None:
        print(f"  KFP artifacts: {outcome.run_dir}")
    print(f"  kfp.local log: {log_path}")
    if leftover:
        print(f"\nTeardown LEFT {len(leftover)}: {', '.join(leftover)}")
    else:
        print("\nTeardown: nothing of the run is left: no object, no process of its pods.")


# Flag -> (type, or its choices; default; what it sets).
FLAGS: dict[str, tuple[Any, Any, str]] = {
    "--nodes": (int, 2, "simulated nodes"),
    "--nodes-per-clique": (int, 0, "nodes per NVLink clique, one clique each (0: one in all)"),
    "--gpus-per-node": (int, None, "GPUs per node; None: this machine's GPUs / nodes, else 0"),
    "--out": (Path, DEFAULT_OUT, "output directory"),
    "--min-busbw-gbps": (float, 0.0, "verification threshold in GB/s (0: derived; 1e5: a FAIL)"),
    "--steps": (int, 20, "training steps"),
    "--pipeline": (sorted(PIPELINE_NAMES), "training", "custom: examples/custom_trainer.py"),
    "--workload": (["job", "trainjob"], "job", "trainjob: train as a Kubeflow Trainer TrainJob"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mnnvl.pipelines.local_run", description=__doc__
    )
    for flag, (kind, default, about) in FLAGS.items():
        choices = kind if isinstance(kind, list) else None
        parser.add_argument(
            flag,
            type=str if choices else kind,
            choices=choices,
            default=default,
            help=f"{about} (default: %(default)s)",
        )
    parser.add_argument("--verbose", action="store_true", help="show kfp.local's task logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from mnnvl.sim import SimCluster
    from mnnvl.sim.cluster import OUR_KINDS
    from mnnvl.sim.core import podenv

    local = podenv.local_gpu_ids()
    gpus, why = gpu_shape(args.nodes, args.gpus_per_node, len(local))
    if problem := podenv.gpus_problem(args.nodes, gpus, len(local)):
        log.error("%s", problem)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    log.info("starting a simulated cluster: %s", why)
    cliques = args.nodes // args.nodes_per_clique if args.nodes_per_clique else 1
    trainer = args.workload == "trainjob"
    name = PIPELINE_NAMES[args.pipeline]
    with SimCluster(args.nodes, gpus, cliques, local_gpus=local, trainer=trainer) as sim:
        watch = sim.store.subscribe(OUR_KINDS)  # every object the run creates, in order
        with mock.patch.dict(os.environ, {"KUBECONFIG": str(sim.kubeconfig_path)}):
            arguments = pipeline_arguments(args, gpus, args.pipeline)
            outcome = run_pipeline(
                arguments, args.out, start=time.monotonic(), verbose=args.verbose, name=name
            )
        sim.store.unsubscribe(watch)  # ends its queue with None
        created = dict.fromkeys(
            f"{e.obj['kind']} {e.namespace}/{e.obj['metadata']['name']}"
            for e in iter(watch.queue.get, None)
            if e.type == "ADDED"
        )
        leftover = [f"{k} {ns}/{n}" for k, ns, n in sim.objects()]  # every object, any run's
        leftover += [f"process {pid} of pod {ns}/{pod}" for ns, pod, pid in sim.processes()]
        _summary(outcome, list(created), leftover, args.out / "kfp-local.log", name)
    return 0 if outcome.succeeded and not leftover else 1


if __name__ == "__main__":
    sys.exit(main())
