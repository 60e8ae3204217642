"""The ``mnnvl`` command line: subcommands and their flags (the flags come from the specs)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from mnnvl import __version__
from mnnvl.cli.help import COMMANDS
from mnnvl.inputs import flags, surface
from mnnvl.sim.nvidia.stacks import GPU_STACKS, IMEX_MODES

# Commands that talk to no cluster: no --kubeconfig (`sim up` has its own: where it writes one).
NO_CLUSTER = frozenset({"render", "baselines", "sim"})
# What only a step talking to a cluster uses (its waits): no rendered object carries it.
_RENDER_SKIPS = frozenset(
    {"rct_timeout_s", "delete_timeout_s", "api_outage_s", "admission_timeout_s"}
    | {"pods_running_timeout_s", "unschedulable_grace_s"}
)
# Where reports go, and where they do not: --output-dir is in the worker pods.
_ON_THIS_MACHINE = "on the machine this command runs on (not --output-dir, inside the worker pods)"


def _grouped_flags(
    p: argparse.ArgumentParser,
    inputs: list[surface.Input],
    *,
    required: bool = True,
) -> None:
    """One flag per input under its group's heading in --help, and ``--<group>-json``: the
    group's inputs as one JSON object, as the Argo templates pass them."""
    # In --help: the inputs of their own, then KFP's and Argo's groups.
    groups = {"": p.add_argument_group("inputs")} | {
        name: p.add_argument_group(f"{name}: {about}") for name, about in surface.GROUP_HELP.items()
    }
    flags.add_inputs(p, inputs, group=lambda i: groups[i.group], required=required)
    for name in dict.fromkeys(i.group for i in inputs if i.group):
        groups[name].add_argument(
            f"--{name}-json",
            metavar="JSON",
            help=f"some of the {name} inputs as one JSON object, e.g. as Argo passes them",
        )


def _opt(default: Any, help: str, **kwargs: Any) -> dict[str, Any]:
    """A flag's argparse arguments, its type from its default (False: a switch); ``--help``
    shows a default that is set."""
    if default is False:
        return {"action": "store_true", "help": help, **kwargs}
    shown = "" if default in (None, "") else " (default: %(default)s)"
    kind = str if default is None else type(default)
    return {"type": kind, "default": default, "help": help + shown, **kwargs}


_NAMESPACE_HELP = "(default: the pod's own, else default)"
_REPORT_DIR = {
    "--report-dir": _opt(
        None, f"write the step's reports (JSON, Markdown, HTML, busbw PNG) here, {_ON_THIS_MACHINE}"
    )
}
_TRAINJOB_FILE = {
    "--trainjob-file": _opt(
        None,
        "run your own Kubeflow Trainer TrainJob (YAML) as the run's: its runtime and command, "
        "with the run's name, labels, channel claim and placement (no command needed)",
        metavar="FILE",
    ),
}
# The flags of each command besides its spec inputs (``_spec_flags``), in --help order.
OWN_FLAGS: dict[str, dict[str, dict[str, Any]]] = {
    "provision": {
        "--owner-pod": _opt(False, "make this launcher pod the owner"),
        "--pipeline": _opt(
            None,
            "validate this pipeline's parameters first (what its first task does)",
            choices=sorted(surface.PIPELINES),
        ),
        "--pipeline-parameters": _opt(
            "{}",
            "the pipeline's parameters: a JSON object or Argo's {{workflow.parameters.json}}",
            metavar="JSON",
        ),
    },
    "launch": {
        "--command": _opt(
            False,
            "the words after -- are a program and its arguments, not a module's arguments",
            dest="as_command",
        ),
        "--command-json": _opt(
            None,
            "the command (or the module's arguments) as one JSON list (how Argo passes it)",
            metavar="JSON",
        ),
        **_TRAINJOB_FILE,
        "command": dict(nargs=argparse.REMAINDER, help="after --: the command or arguments"),
    },
    "train": {**_REPORT_DIR, **_TRAINJOB_FILE},
    "verify": {
        **_REPORT_DIR,
        "--fail-on-fail": dict(
            action=argparse.BooleanOptionalAction,
            default=True,
            help="exit 4 on a FAIL verdict (--no-fail-on-fail: report it and exit 0)",
        ),
        "--measure-again": _opt(
            False,
            "run again, the same run id: delete this step's earlier verification Job (whose "
            "verdict a rerun would return) and measure anew; the domain stays",
        ),
    },
    "preflight": {"--report-dir": _opt(None, "write preflight.ctrf.json here")},
    "run": {
        "--report-dir": _opt(
            None,
            "write each task's reports to DIR/<task> (default: out/reports/<run id>), "
            f"{_ON_THIS_MACHINE}",
        ),
        "--sim": _opt(False, "run against an embedded simulated cluster"),
        "--skip-verify": _opt(False, "train only"),
        **_TRAINJOB_FILE,
    },
    "render": {**_TRAINJOB_FILE},
    "logs": {
        "--run-id": _opt(None, "the run whose worker pod to read", required=True),
        "--namespace": _opt(None, f"the run's namespace {_NAMESPACE_HELP}"),
        "--rank": _opt(0, "node rank of the pod to read"),
        "--follow": _opt(False, "stream the log until the container ends"),
    },
    "reap": {
        "--namespace": _opt(None, f"where to look {_NAMESPACE_HELP}"),
        "--live-run-ids": _opt(
            None,
            "comma-separated run ids still running; every other run is dead (an empty list "
            "needs --all-dead or --older-than-s)",
        ),
        "--older-than-s": _opt(
            0.0, "only runs idle this long: no new object or pod transition, no pod Running"
        ),
        "--all-dead": _opt(False, "treat every run as dead"),
        "--dry-run": _opt(False, "list what would go; delete nothing"),
    },
    "baselines": {
        "--system": _opt("", "GPU model (gb200, gb300, h200, h100): show its row"),
        "--nodes": _opt(1, "nodes of the shape (with --system)"),
        "--gpus-per-node": _opt(4, "GPUs per node of the shape (with --system)"),
        "--platform": _opt("", "a provider's rows, e.g. eks ('' = any cluster)"),
    },
    "sim": {
        "action": dict(choices=("up",), help="up: serve until Ctrl-C or SIGTERM"),
        "--nodes": _opt(
            2,
            "simulated nodes; each runs its pods as local processes, so at most what this "
            "machine's memory holds",
        ),
        "--gpus-per-node": _opt(0, "simulated GPUs per node (0 = CPU workers)"),
        "--cliques": _opt(1, "NVLink cliques (nvidia.com/gpu.clique values)"),
        "--imex-delay-s": _opt(
            0.2, "how long each node's simulated IMEX daemon takes to get ready, s"
        ),
        "--kueue": _opt(
            False,
            "Kueue stand-in: Jobs and TrainJobs labelled kueue.x-k8s.io/queue-name start suspended",
        ),
        "--trainer": _opt(
            False,
            "Kubeflow Trainer stand-in: TrainJobs run as the torch-distributed runtime runs them "
            "(--workload trainjob); the runner gets manifests/overlays/trainer",
        ),
        "--gpu-stack": _opt(
            "device-plugin",
            "where GPUs come from: device-plugin (nvidia.com/gpu allocatable) or dra (only "
            "gpu.nvidia.com ResourceSlices, as GPU Operator's GPUCluster)",
            choices=GPU_STACKS,
        ),
        "--imex-mode": _opt(
            "daemons",
            "who runs IMEX: daemons (the driver's, per domain) or hostManaged (the host's "
            "nvidia-imex service: no daemons, node labels or status.nodes; channel Single)",
            choices=IMEX_MODES,
        ),
        "--cluster-reader": _opt(
            False,
            "bind manifests/overlays/cluster-reader to the runner (nodes, DeviceClasses, ...)",
        ),
        "--namespaces": _opt(
            "default,team-a",
            "namespaces to serve, each with manifests/base applied for the runner (the "
            "examples use these)",
            metavar="NS,NS",
        ),
        "--admin-kubeconfig": _opt(
            None,
            "where to write a cluster-admin kubeconfig for setting up fixtures (namespaces, "
            "PVCs, quotas; default: <kubeconfig>.admin); --kubeconfig is the mnnvl-runner "
            "service account with manifests/base applied, as a run gets on a real cluster",
            metavar="PATH",
        ),
        "--kubeconfig": _opt(
            None, "where to write the simulator's kubeconfig (default: a temporary file)"
        ),
    },
}


class UsageError(Exception):
    """A command line argparse rejects: which command, and argparse's one-line reason."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.command = prog.removeprefix("mnnvl").strip()


class Parser(argparse.ArgumentParser):
    """argparse that prints the usage and raises ``UsageError`` instead of exiting, so the
    CLI's one JSON line can name the command and the reason."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise UsageError(self.prog, message)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but an unknown flag is reported by the command it was given to (its
        usage and name), not by ``mnnvl`` itself."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = getattr(self, "commands", {})
            command = commands.get(getattr(ns, "command_name", None), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns


def _spec_flags(p: argparse.ArgumentParser, name: str) -> None:
    """The flags a command's inputs declared on the specs: a step's, at the step's defaults;
    ``run`` and ``render``: the training pipeline's parameters, named as the KFP and Argo
    pipelines name them (``--train-timeout-s``); ``status``: the run's domain."""
    if name in surface.STEP_CLASSES:
        _grouped_flags(p, surface.step_inputs(name))
    elif name == "status":
        teardown = surface.step_inputs("teardown")  # the run's domain, without its waits
        _grouped_flags(p, [i for i in teardown if i.name != "delete_timeout_s"])
    elif name in ("run", "render"):
        # `run` names a run itself when no --run-id is given; `render` needs one.
        skip = _RENDER_SKIPS if name == "render" else frozenset()
        inputs = [i for i in surface.run_parameters() if i.name not in skip]
        _grouped_flags(p, inputs, required=name == "render")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mnnvl", description="the steps of a multi-node NVLink run from a shell")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="<command>", title="commands")
    for name, (help_text, what, example) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=help_text,
            description=f"{help_text[:1].upper()}{help_text[1:]}. {what}",
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _spec_flags(p, name)
        for flag, kwargs in OWN_FLAGS.get(name, {}).items():
            p.add_argument(flag, **kwargs)
        if name not in NO_CLUSTER:
            p.add_argument(
                "--kubeconfig", help="kubeconfig path (default: in-cluster, $KUBECONFIG)"
            )
        p.add_argument("--result-path", help="also write the result JSON to this file")
        p.add_argument("-v", "--verbose", action="count", default=0, help="debug logging")
    parser.commands = sub.choices  # type: ignore[attr-defined]
    return parser
