"""``mnnvl <command>``: the steps from a shell (Argo templates and people use this).

Input is validated before any API call; progress goes to stderr; the last stdout line is one
JSON object (``render`` and ``logs`` write it to stderr: their stdout is YAML or a log). Exit
codes: 0 ok, 2 bad input, 3 timeout, 4 workload or verification failed, 5 cluster or CRD
unavailable, 1 unexpected, 130/143 on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import yaml

from mnnvl import steps
from mnnvl.cli.help import COMMANDS
from mnnvl.cli.parser import UsageError, build_parser
from mnnvl.contract import exit_codes
from mnnvl.driver.api import Api
from mnnvl.driver.inspect import rank_pod, status_lines
from mnnvl.errors import Interrupted, MnnvlError, SpecError
from mnnvl.inputs import baselines, flags, surface
from mnnvl.inputs.checks import check_dns_label, check_range, parse_list
from mnnvl.inputs.defaults import MAX_GPUS_PER_NODE
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.namespace import resolve_namespace
from mnnvl.inputs.spec import DomainSpec, LaunchSpec, WorkloadSpec
from mnnvl.manifests import indexed_job, render_run, render_trainjob
from mnnvl.manifests.trainjob import take_trainjob
from mnnvl.run import PlannedTask, objects, plan, run_all
from mnnvl.yaml_stream import to_yaml

logger = logging.getLogger("mnnvl.cli")


class _StderrHandler(logging.StreamHandler[Any]):
    """Writes to whatever ``sys.stderr`` is at the time (tests swap it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging(verbose: int) -> None:
    root = logging.getLogger("mnnvl")
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-5s %(message)s", "%H:%M:%S")
        )
        root.addHandler(handler)


# ---- commands -------------------------------------------------------------------------------


def _own_namespace(ns: argparse.Namespace) -> dict[str, str]:
    """The namespace to work in: --namespace, else the pod's own, else default (resolved
    here, at the edge: building a spec reads no environment)."""
    return {"namespace": resolve_namespace(getattr(ns, "namespace", None))}


def _specs(step: str, ns: argparse.Namespace, *classes: type) -> list[Any]:
    """The step's specs (or only ``classes``) from the command's flags; an unset flag takes
    the step's default."""
    values = flags.ns_values(ns) | _own_namespace(ns)
    return surface.step_specs(step, ns.run_id, values, *classes)


def cmd_provision(ns: argparse.Namespace) -> dict[str, Any]:
    (domain,) = _specs("provision", ns)
    if ns.pipeline:  # the pipeline's first task: all of its parameters, before any object
        surface.check_pipeline(ns.pipeline, ns.pipeline_parameters)
    return steps.provision(domain, kubeconfig=ns.kubeconfig, owner_pod=ns.owner_pod).to_dict()


def _json_words(text: str) -> list[str]:
    """``--command-json``: a JSON list of strings (read as every list input is), nothing else:
    a typo must not become a one-word command that a Job then fails to run."""
    if text.strip() and not text.lstrip().startswith("["):
        raise SpecError("command", f"--command-json {text!r} is not a JSON list of strings")
    return list(parse_list(text, "command"))


def _launch_spec(ns: argparse.Namespace) -> LaunchSpec:
    words = ns.command[1:] if ns.command[:1] == ["--"] else list(ns.command)
    if ns.command_json is not None:
        if words:
            raise SpecError("command", "give the command after -- or as --command-json, not both")
        words = _json_words(ns.command_json)
    module = ns.module or ""
    if ns.as_command and module:
        raise SpecError("module", "give --module or --command, not both")
    if not ns.as_command and not module and ns.command_json is None:
        raise SpecError("module", "is required: --module pkg.entry, or --command -- CMD ARGS")
    if not module and not words:
        raise SpecError("command", "is empty: give the program to run (--command -- CMD ARGS)")
    return LaunchSpec(module=module, command=tuple(words))


def cmd_launch(ns: argparse.Namespace) -> dict[str, Any]:
    (workload,) = _specs("launch", ns, WorkloadSpec)  # the command is read below
    if own := _own_trainjob(ns.trainjob_file, workload):
        return steps.launch(workload, "", [], kubeconfig=ns.kubeconfig, own_trainjob=own).to_dict()
    launch = _launch_spec(ns)
    args = list(launch.command)
    indexed_job(workload, launch.module, args)  # bad module names or env stop here
    return steps.launch(workload, launch.module, args, kubeconfig=ns.kubeconfig).to_dict()


def _own_trainjob(path: str | None, workload: WorkloadSpec) -> dict[str, Any] | None:
    """``--trainjob-file``'s TrainJob (YAML), refused before anything is created when it is not
    a TrainJob of ``workload``'s shape; None without the flag."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            own = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise SpecError(
            "trainjob_file", f"cannot read {path}: {e}; give a YAML file holding one TrainJob"
        ) from e
    if not isinstance(own, dict):
        raise SpecError("trainjob_file", f"{path} holds no object; give one TrainJob")
    take_trainjob(own, workload)
    return own


def _domain(workload: WorkloadSpec) -> DomainSpec:
    return DomainSpec(run_id=workload.run_id, namespace=workload.namespace)


def cmd_train(ns: argparse.Namespace) -> dict[str, Any]:
    workload, config = _specs("train", ns)
    render_run(_domain(workload), workload, config, None)  # every object, before any API call
    if own := _own_trainjob(ns.trainjob_file, workload):  # its RESULT line is the step's
        return steps.launch(workload, "", [], kubeconfig=ns.kubeconfig, own_trainjob=own).to_dict()
    if workload.trainer_runtime:
        render_trainjob(_domain(workload), workload, config, workload.trainer_runtime)
    return steps.train(
        workload, config, kubeconfig=ns.kubeconfig, report_dir=ns.report_dir
    ).to_dict()


def cmd_verify(ns: argparse.Namespace) -> dict[str, Any]:
    workload, config = _specs("verify", ns)
    render_run(_domain(workload), workload, None, config)  # every object, before any API call
    return steps.verify(
        workload,
        config,
        kubeconfig=ns.kubeconfig,
        report_dir=ns.report_dir,
        fail_on_fail=ns.fail_on_fail,
        measure_again=ns.measure_again,
    ).to_dict()


def cmd_teardown(ns: argparse.Namespace) -> dict[str, Any]:
    return steps.teardown(*_specs("teardown", ns), kubeconfig=ns.kubeconfig).to_dict()


def cmd_status(ns: argparse.Namespace) -> dict[str, Any]:
    found = steps.status(*_specs("teardown", ns), kubeconfig=ns.kubeconfig).to_dict()
    for line in status_lines(found, RunNames.for_run(found["run_id"])):
        logger.info("%s", line)
    return found


def cmd_logs(ns: argparse.Namespace) -> dict[str, Any]:
    """The log of the run's worker pod of one node rank, on stdout as it is read."""
    names, namespace = RunNames.for_run(ns.run_id), _own_namespace(ns)["namespace"]
    check_dns_label("namespace", namespace)
    check_range("rank", ns.rank, 0, 1 << 20, integer=True)
    with Api.connect(ns.kubeconfig) as api:
        pod, container = rank_pod(api, namespace, names, ns.rank)
        logger.info("logs of pod %s/%s (node rank %d)", namespace, pod, ns.rank)
        if ns.follow:
            for line in api.follow_log(namespace, pod, container):
                print(line, flush=True)
        else:
            sys.stdout.write(api.pod_log(namespace, pod, container))
            sys.stdout.flush()
    return {"run_id": ns.run_id, "namespace": namespace, "rank": ns.rank, "pod": pod}


def cmd_preflight(ns: argparse.Namespace) -> dict[str, Any]:
    ns.run_id = "preflight"
    (workload,) = _specs("preflight", ns)
    return steps.preflight(workload, kubeconfig=ns.kubeconfig, report_dir=ns.report_dir).to_dict()


def cmd_render(ns: argparse.Namespace) -> dict[str, Any]:
    objs = objects(*_run_plan(ns))  # the run's own plan: what `mnnvl run` would create
    sys.stdout.write(to_yaml(objs))
    return {"run_id": ns.run_id, "objects": [f"{o['kind']} {o['metadata']['name']}" for o in objs]}


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def cmd_reap(ns: argparse.Namespace) -> dict[str, Any]:
    live = None if ns.live_run_ids is None else set(_comma_list(ns.live_run_ids))
    return steps.reap(
        ns.namespace,
        live_run_ids=live,
        older_than_s=ns.older_than_s,
        all_dead=ns.all_dead,
        dry_run=ns.dry_run,
        kubeconfig=ns.kubeconfig,
    ).to_dict()


def _run_plan(ns: argparse.Namespace) -> tuple[list[PlannedTask], dict[str, Any] | None]:
    """Every task's specs of ``mnnvl run`` from its flags (unset flags: the step's default),
    and the team's TrainJob of ``--trainjob-file`` (None without it)."""
    given = flags.ns_values(ns)
    names = [*(p.name for p in surface.run_parameters()), *surface.GROUP_HELP]
    values = {name: given.get(name) for name in names}
    skip_verify = getattr(ns, "skip_verify", False)
    planned = plan(values | _own_namespace(ns), ns.run_id, skip_verify=skip_verify)
    workload = next(p.specs[0] for p in planned if p.task.step == "train")
    return planned, _own_trainjob(ns.trainjob_file, workload)


def _fits_this_machine(nodes: int, gpus_per_node: int, local_gpus: list[str] | None) -> None:
    """A simulated cluster runs its pods as local processes, on this machine's GPUs (checked
    when ``local_gpus`` is given): refuse one this machine cannot hold before anything is built."""
    from mnnvl.sim.core.podenv import gpus_problem
    from mnnvl.sim.core.procs import machine_problem

    if problem := machine_problem(nodes, max(1, gpus_per_node)):
        raise SpecError("nodes", problem)
    if local_gpus is not None and (problem := gpus_problem(nodes, gpus_per_node, len(local_gpus))):
        raise SpecError("gpus_per_node", problem)


def cmd_run(ns: argparse.Namespace) -> dict[str, Any]:
    if not ns.run_id:
        ns.run_id = f"run-{uuid.uuid4().hex[:12]}"
    if ns.sim:
        from mnnvl.sim.core.podenv import local_gpu_ids

        shape = flags.from_namespace(WorkloadSpec, ns, run_id=ns.run_id, **_own_namespace(ns))
        gpus = local_gpu_ids()  # the simulated nodes' GPUs are this machine's
        _fits_this_machine(shape.nodes, shape.gpus_per_node, gpus)
    planned, own = _run_plan(ns)  # every task's specs and objects build before any call
    workload = next(p.specs[0] for p in planned if p.task.step == "train")
    reports = _run_reports(ns)
    if not ns.sim:
        return run_all(planned, kubeconfig=ns.kubeconfig, report_dir=reports, own_trainjob=own)
    from mnnvl.sim import SimCluster

    with SimCluster(
        nodes=workload.nodes,
        gpus_per_node=workload.gpus_per_node,
        cliques=workload.groups,  # one NVLink clique per group, as the placement asks
        namespaces=(planned[0].specs[0].namespace,),
        local_gpus=gpus,
        trainer=bool(workload.trainer_runtime or own),  # Kubeflow Trainer's stand-in
        kueue=bool(workload.queue_name),  # Kueue's stand-in admits what a queue holds
    ) as sim:
        result = run_all(
            planned, kubeconfig=sim.kubeconfig_path, report_dir=reports, own_trainjob=own
        )
        result["sim"] = {
            "url": sim.url,
            "requests": sim.request_count,
            "leftover": [list(o) for o in sim.objects()],
            "leftover_processes": [list(p) for p in sim.processes()],  # (namespace, pod, pid)
        }
    return result


def _run_reports(ns: argparse.Namespace) -> str | None:
    """Where ``mnnvl run`` writes its reports: --report-dir (checked up front), else
    ``out/reports/<run id>`` (none, with a warning, where that cannot be written); logged."""
    folder = ns.report_dir or os.path.join("out", "reports", ns.run_id)  # in the working dir
    problem = _path_problem("--report-dir", folder, folder=True)
    if problem:  # only the default can be unwritable here
        logger.warning("run: no reports (%s); pass --report-dir DIR to have them", problem)
        return None
    logger.info("run: reports go to %s/<task>", os.path.abspath(folder))
    return folder


# The flags of `mnnvl sim up` that are the simulated cluster's options as they are.
SIM_OPTIONS = ["nodes", "gpus_per_node", "imex_delay_s", "cliques", "kueue", "trainer"]
SIM_OPTIONS += ["gpu_stack", "imex_mode", "cluster_reader"]


def cmd_sim(ns: argparse.Namespace) -> dict[str, Any]:
    check_range("nodes", ns.nodes, 1, 1024, integer=True)
    check_range("gpus_per_node", ns.gpus_per_node, 0, MAX_GPUS_PER_NODE, integer=True)
    check_range("imex_delay_s", ns.imex_delay_s, 0, 3600)
    check_range("cliques", ns.cliques, 1, ns.nodes, integer=True)
    _fits_this_machine(ns.nodes, ns.gpus_per_node, None)  # its nodes may lack GPUs (CPU workers)
    namespaces = tuple(_comma_list(ns.namespaces))
    if not namespaces:
        raise SpecError("namespaces", "needs at least one namespace, e.g. default")
    for name in namespaces:
        check_dns_label("namespaces", name)
    from mnnvl.sim import serve

    # The simulator announces itself on stdout; stdout is reserved for our one result line.
    with contextlib.redirect_stdout(sys.stderr):
        served = serve(
            **{key: getattr(ns, key) for key in SIM_OPTIONS},
            kubeconfig_path=ns.kubeconfig,
            admin_kubeconfig_path=ns.admin_kubeconfig,
            namespaces=namespaces,
        )
    shown = ("nodes", "gpus_per_node", "cliques", "gpu_stack", "imex_mode")
    return {"kubeconfig": served} | {key: getattr(ns, key) for key in shown}


def cmd_baselines(ns: argparse.Namespace) -> dict[str, Any]:
    """The baseline table for people on stderr, or with --system the row one shape gets; the
    result line (stdout) holds it as JSON."""
    out: dict[str, Any] = {"version": baselines.TABLE_VERSION, "baselines": baselines.rows()}
    if not ns.system:
        print(baselines.table_text(), file=sys.stderr, flush=True)
        return out
    if ns.nodes < 1 or ns.gpus_per_node < 1:
        raise SpecError("nodes", "--nodes and --gpus-per-node must be at least 1")
    row = baselines.for_shape(ns.system, ns.nodes, ns.gpus_per_node, platform=ns.platform)
    text = baselines.shape_text(ns.system, ns.nodes, ns.gpus_per_node, row)
    print(text, file=sys.stderr, flush=True)
    shape = {"system": ns.system, "nodes": ns.nodes, "gpus_per_node": ns.gpus_per_node}
    return out | shape | {"platform": ns.platform, "row": baselines.as_dict(row) if row else None}


# Each command of ``COMMANDS`` is run by its ``cmd_<command>`` (a missing one fails the import).
HANDLERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    name: globals()[f"cmd_{name}"] for name in COMMANDS
}


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM/SIGINT raise ``Interrupted`` in the main thread, so teardown in ``finally`` runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous: dict[signal.Signals, Any] = {}
    # Outside the main thread signal.signal raises ValueError: leave signals alone there.
    with contextlib.suppress(ValueError):
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _path_problem(flag: str, path: str | None, *, folder: bool = False) -> str:
    """Why ``path`` (with ``folder``: a directory, made later where missing) cannot be written
    ("" when it can), found before anything is created: the file (for a folder, one in the
    nearest folder that exists) is really opened for appending, so /proc, /sys, read-only
    mounts and missing permissions all show; a file the check made is removed again."""
    if not path:
        return ""
    if os.path.exists(path) and os.path.isdir(path) != folder:
        return f"{flag}: {path!r} is a " + (
            "file; name a directory" if folder else "directory; name a file in it"
        )
    where = os.path.abspath(path if folder else os.path.dirname(os.path.abspath(path)))
    while folder and not os.path.exists(where):
        where = os.path.dirname(where)
    if folder and not os.path.isdir(where):
        return f"{flag}: {where!r} is a file, so {path!r} cannot be a directory"
    if not os.path.isdir(where):
        return f"{flag}: directory {where!r} does not exist; create it or pick another path"
    probe = os.path.join(where, f".mnnvl-check-{os.getpid()}") if folder else path
    existed = os.path.exists(probe)
    try:
        with open(probe, "a", encoding="utf-8"):
            pass
    except OSError as e:
        bad, other = (where, "directory") if folder else (path, "path")
        return f"{flag}: {bad!r} is not writable ({e.strerror}); pick another {other}"
    if not existed:
        os.remove(probe)
    return ""


# Commands whose stdout is data for another program: their result line goes to stderr.
RESULT_ON_STDERR = frozenset({"render", "logs"})


def _emit(payload: dict[str, Any], result_path: str | None) -> None:
    """The result line: whole in ``--result-path``; on stdout a step's worker RESULT (``raw``,
    ``sizes``) is left out where its report files hold it (``report_files`` names them)."""
    if result_path:
        with open(result_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(payload, default=str) + "\n")
    stream = sys.stderr if payload.get("command") in RESULT_ON_STDERR else sys.stdout
    stream.write(json.dumps(_pointing_at_reports(payload), default=str) + "\n")
    stream.flush()


def _pointing_at_reports(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    reported = bool(value.get("report_files"))
    return {
        k: _pointing_at_reports(v)
        for k, v in value.items()
        if not (reported and k in ("raw", "sizes"))
    }


def _failed(
    command: str | None, error: str, code: int, result_path: str | None = None, **extra: Any
) -> int:
    """Emit a failure's result line; returns its exit code."""
    where = {"command": command} if command else {}
    _emit({"ok": False, **where, "error": error, "exit_code": code, **extra}, result_path)
    return code


def _leftovers(e: MnnvlError | Interrupted) -> dict[str, Any]:
    """What a teardown that could not finish left (see ``TeardownIncomplete``), logged last."""
    if not e.leftovers:
        return {}
    logger.error("may be left: %s; remove with `%s`", "; ".join(e.leftovers), e.cleanup)
    return {"leftovers": list(e.leftovers), "cleanup": e.cleanup}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:  # --help or --version
        return int(e.code or 0)
    except UsageError as e:  # the usage is on stderr already
        return _failed(e.command, f"{e} (see usage above)", exit_codes.BAD_INPUT)
    if ns.command_name is None:  # `mnnvl` alone: what it can do, not an argparse complaint
        sys.stderr.write(parser.format_help())
        return _failed(None, "no command given: mnnvl <command> --help", exit_codes.BAD_INPUT)
    setup_logging(ns.verbose)
    command = ns.command_name if ns.command_name != "sim" else f"sim {ns.action}"
    paths = {"--result-path": ns.result_path, "--report-dir": getattr(ns, "report_dir", None)}
    if ns.command_name == "sim":  # `sim up` writes the kubeconfig it serves
        paths = {"--kubeconfig": ns.kubeconfig} | paths
    for flag, path in paths.items():
        if problem := _path_problem(flag, path, folder=flag == "--report-dir"):
            logger.error("%s failed: %s", command, problem)
            return _failed(command, problem, exit_codes.BAD_INPUT)
    try:
        with _signals_raise():
            result = HANDLERS[ns.command_name](ns)
    except (MnnvlError, Interrupted) as e:
        if isinstance(e, SpecError):  # recovery.max_restarts (--max-restarts)
            actions = parser.commands[ns.command_name]._actions  # type: ignore[attr-defined]
            e = surface.named(
                e, {a.dest: a.option_strings[0] for a in actions[::-1] if a.option_strings}
            )
        logger.error("%s %s", command, e if isinstance(e, Interrupted) else f"failed: {e}")
        return _failed(command, str(e), e.exit_code, ns.result_path, **_leftovers(e))
    except Exception as e:
        logger.exception("%s failed unexpectedly", command)
        error = f"{type(e).__name__}: {e}"
        return _failed(command, error, exit_codes.UNEXPECTED, ns.result_path)
    _emit({"ok": True, "command": command, **result}, ns.result_path)
    return exit_codes.OK
