"""The ``mnnvl`` command line: subcommands and their flags (the flags come from the specs)."""

from __future__ import annotations

import argparse
from typing import Any

from mnnvl import __version__, flags, surface
from mnnvl.cli_help import COMMANDS
from mnnvl.spec import DomainSpec, LaunchSpec, TrainConfig, VerifyConfig, WorkloadSpec

DESCRIPTION = "mnnvl <command>: the steps of a multi-node NVLink run from a shell."


def _common(p: argparse.ArgumentParser, *, writes_kubeconfig: bool = False) -> None:
    help_text = (
        "where to write the simulator's kubeconfig (default: a temporary file)"
        if writes_kubeconfig
        else "kubeconfig path (default: in-cluster, $KUBECONFIG)"
    )
    p.add_argument("--kubeconfig", default=None, help=help_text)
    p.add_argument("--result-path", default=None, help="also write the result JSON to this file")
    p.add_argument("-v", "--verbose", action="count", default=0, help="debug logging")


def _domain_flags(p: argparse.ArgumentParser) -> None:
    flags.add_arguments(p, DomainSpec)


def _workload_flags(p: argparse.ArgumentParser, *, step: str | None) -> None:
    """Workload flags; ``step`` None means the whole run (run id, namespace and the API outage
    tolerance come with the domain's flags)."""
    skip = ("run_id", "namespace", "api_outage_s") if step is None else ()
    overrides = {k: v for k, (v, _) in surface.STEP_DEFAULTS.get(step or "", {}).items()}
    flags.add_arguments(p, WorkloadSpec, skip=skip, defaults=overrides)


def _launch_flags(p: argparse.ArgumentParser) -> None:
    _workload_flags(p, step="launch")
    flags.add_arguments(p, LaunchSpec)
    p.add_argument(
        "--command",
        dest="as_command",
        action="store_true",
        help="the words after -- are a program and its arguments, not a module's arguments",
    )
    p.add_argument(
        "--command-json",
        default=None,
        metavar="JSON",
        help="the command (or the module's arguments) as one JSON list (how Argo passes it)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command or arguments")


def _reap_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--namespace", default=None, help="where to look (default: the pod's own, else default)"
    )
    p.add_argument(
        "--live-run-ids",
        default=None,
        help="comma-separated run ids still running; every other run is dead "
        "(an empty list needs --all-dead or --older-than-s)",
    )
    p.add_argument(
        "--older-than-s",
        type=float,
        default=0.0,
        help="only runs idle this long: no new object or pod transition, no pod Running",
    )
    p.add_argument("--all-dead", action="store_true", help="treat every run as dead")
    p.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")


def _subcommand(sub: Any, name: str) -> argparse.ArgumentParser:
    help_text, what, example = COMMANDS[name]
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=what,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _pipeline_check_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pipeline",
        default=None,
        choices=sorted(surface.PIPELINES),
        help="validate this pipeline's parameters first (what its first task does)",
    )
    p.add_argument(
        "--pipeline-parameters",
        default="{}",
        metavar="JSON",
        help="the pipeline's parameters: a JSON object or Argo's {{workflow.parameters.json}}",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnnvl", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command_name", required=True)
    p = _subcommand(sub, "provision")
    _domain_flags(p)
    p.add_argument("--owner-pod", action="store_true", help="make this launcher pod the owner")
    _pipeline_check_flags(p)
    p = _subcommand(sub, "launch")
    _launch_flags(p)
    for name, cfg in (("train", TrainConfig), ("verify", VerifyConfig)):
        p = _subcommand(sub, name)
        _workload_flags(p, step=name)
        flags.add_arguments(p, cfg)
        p.add_argument("--report-dir", default=None, help="write report files here")
        if name == "verify":
            p.add_argument(
                "--fail-on-fail",
                action=argparse.BooleanOptionalAction,
                default=True,
                help="exit 4 on a FAIL verdict (--no-fail-on-fail: report it and exit 0)",
            )
    p = _subcommand(sub, "teardown")
    _domain_flags(p)
    p = _subcommand(sub, "status")
    _domain_flags(p)
    for name in ("run", "render"):
        p = _subcommand(sub, name)
        _domain_flags(p)
        _workload_flags(p, step=None)
        flags.add_arguments(p, TrainConfig)
        flags.add_arguments(p, VerifyConfig)
        if name == "run":
            p.add_argument(
                "--report-dir", default=None, help="write the train and verify reports here"
            )
            p.add_argument(
                "--sim", action="store_true", help="run against an embedded simulated cluster"
            )
            p.add_argument("--skip-verify", action="store_true", help="train only")
    p = _subcommand(sub, "reap")
    _reap_flags(p)
    p = _subcommand(sub, "sim")
    p.add_argument("action", choices=("up",), help="up: serve until Ctrl-C or SIGTERM")
    p.add_argument("--nodes", type=int, default=2, help="simulated nodes")
    p.add_argument(
        "--gpus-per-node", type=int, default=0, help="simulated GPUs per node (0 = CPU workers)"
    )
    p.add_argument(
        "--cliques", type=int, default=1, help="NVLink cliques (nvidia.com/gpu.clique values)"
    )
    p.add_argument(
        "--imex-delay-s",
        type=float,
        default=0.2,
        help="how long each node's simulated IMEX daemon takes to get ready",
    )
    p.add_argument(
        "--kueue",
        action="store_true",
        help="Kueue stand-in: Jobs labelled kueue.x-k8s.io/queue-name start suspended",
    )
    for name, p in sub.choices.items():
        _common(p, writes_kubeconfig=name == "sim")
    return parser
