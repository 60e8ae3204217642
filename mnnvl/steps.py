"""The steps of a run: provision, launch (train, verify), teardown, reap.

Plain functions over validated specs, returning frozen, JSON-able results. KFP components,
Argo templates and the CLI all call these; the Kubernetes work lives in ``mnnvl.driver``.
Progress goes to logging (stderr); nothing here prints.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from mnnvl.contract.result import NOT_JUDGED, schema_problems, verdict_accepted
from mnnvl.driver import (
    Api,
    Deadline,
    Deletions,
    Verdict,
    delete_domain,
    delete_step_jobs,
    delete_workload,
    ensure_domain,
    launcher_owner,
    reap_namespace,
    refuse_forced_single,
    refused_namespace,
    require_namespace,
    run_job,
    skip_foreign_namesakes,
    wait_for_channel_template,
)
from mnnvl.driver.inspect import run_status
from mnnvl.driver.preflight import check_cluster, table
from mnnvl.driver.preflight import failure as preflight_failure
from mnnvl.driver.preflight_trainer import trainer_rows
from mnnvl.driver.trainjob_run import run_trainjob
from mnnvl.errors import (
    ClusterUnavailable,
    Refused,
    VerificationFailed,
    WaitTimeout,
    WorkloadFailed,
)
from mnnvl.inputs.checks import check_dns_label
from mnnvl.inputs.flags import to_args
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.namespace import resolve_namespace
from mnnvl.inputs.spec import DomainSpec, TrainConfig, VerifyConfig, WorkloadSpec
from mnnvl.inputs.storage import check_shared_storage
from mnnvl.manifests import TRAIN_MODULE, VERIFY_MODULE, rank0_job, step_workload
from mnnvl.report import (
    nccl_line,
    num,
    preload_plotting,
    verdict_lines,
    verdict_numbers,
    write_preflight_report,
    write_verify_report,
)
from mnnvl.report_train import fault_line, goodput, goodput_line, write_train_report

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ProvisionResult(Result):
    run_id: str
    namespace: str
    domain: str
    channel_template: str
    uid: str
    adopted: bool
    elapsed_s: float


@dataclass(frozen=True)
class LaunchResult(Result):
    """A finished workload: rank 0's RESULT (None when it printed none) and its log tail.

    ``exit_code`` is 0: a workload that exits otherwise raises ``WorkloadFailed`` instead.
    """

    job: str
    pods: list[str]
    result: dict[str, Any] | None
    log_tail: str
    elapsed_s: float
    exit_code: int = 0
    restarts: list[dict[str, Any]] = field(default_factory=list)  # gang restarts, in order
    excluded_nodes: list[str] = field(default_factory=list)  # kept out after failing there
    # The step's Job as this step found it, "complete since <time> (created <time>)" when it
    # had run before with the same inputs (its result is that run's); "" when created now.
    adopted: str = ""
    evictions: int = 0  # admissions Kueue took back (counted against --max-restarts)


@dataclass(frozen=True)
class TrainResult(Result):
    job: str
    final_loss: float | None
    tokens_per_s: float | None
    mfu: float | None
    steps: int | None
    start_step: int
    checkpoint: str
    peak_mem_gib: float | None
    report_files: dict[str, str]
    raw: dict[str, Any]
    elapsed_s: float
    restarts: int = 0  # gang restarts from the last checkpoint (mnnvl.driver.gang)
    evictions: int = 0  # as LaunchResult.evictions
    steps_lost: int = 0  # steps rank 0 had logged past the checkpoints resumed from
    recovery_s: float | None = None  # failure to resumed training, the last restart
    adopted: str = ""  # as LaunchResult.adopted
    excluded_nodes: list[str] = field(default_factory=list)  # kept out after failing there
    # Each gang restart: what failed and what it cost (keys: mnnvl.report_train)
    faults: list[dict[str, Any]] = field(default_factory=list)
    # Productive training time / this step's wall time (report_train.goodput); None when
    # the step adopted a Job (its wall time is not this step's) or the result lacks figures
    goodput: float | None = None

    def for_report(self) -> dict[str, Any]:
        """The worker's RESULT with the launcher's ``faults``, ``evictions`` and ``goodput``:
        what the training report shows."""
        return {
            **self.raw,
            "faults": self.faults,
            "evictions": self.evictions,
            "goodput": self.goodput,
        }


@dataclass(frozen=True)
class VerifyResult(Result):
    job: str
    verdict: str
    threshold_gbps: float | None
    peak_busbw_gbps: float | None
    judged_busbw_gbps: float | None
    sizes: list[dict[str, Any]]
    report_files: dict[str, str]
    raw: dict[str, Any]
    elapsed_s: float
    adopted: str = ""  # as LaunchResult.adopted


@dataclass(frozen=True)
class TeardownResult(Result):
    run_id: str
    deleted: list[str]
    already_gone: bool
    elapsed_s: float
    skipped: list[str] = field(default_factory=list)  # objects with our names, not ours
    message: str = ""


@dataclass(frozen=True)
class StatusResult(Result):
    run_id: str
    namespace: str
    domain: dict[str, Any] | None
    channel_template: bool
    jobs: list[dict[str, Any]]
    trainjobs: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    services: list[str]


@dataclass(frozen=True)
class PreflightResult(Result):
    namespace: str
    passed: bool  # no row fails
    rows: list[dict[str, str]]  # check, status (the verdicts, WARN or SKIPPED), saw, fix
    table: str
    report_files: dict[str, str]
    elapsed_s: float


@dataclass(frozen=True)
class ReapResult(Result):
    namespace: str
    runs: list[str]
    deleted: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    skipped: list[str] = field(default_factory=list)
    dry_run: bool = False
    would_delete: list[str] = field(default_factory=list)
    idle_s: dict[str, float] = field(default_factory=dict)


def _since(start: float) -> float:
    return round(time.monotonic() - start, 3)


@contextmanager
def _namespace_checked(namespace: str, touched: Callable[[], list[str]]) -> Iterator[None]:
    """A teardown or reap in a namespace that does not exist is bad input naming it (exit 2),
    not an unreachable cluster (exit 5): with the shipped Role (namespaced) its first list
    there is refused. ``touched``: what was deleted or skipped so far (then it is no typo)."""
    try:
        yield
    except Refused as e:
        if touched() or not str(e).startswith("list "):
            raise
        raise refused_namespace(namespace, e) from e


def provision(
    spec: DomainSpec, *, kubeconfig: str | None = None, owner_pod: bool = False
) -> ProvisionResult:
    """Create (or adopt) the run's ComputeDomain and wait for its channel template.

    Never waits for the domain to be Ready: that needs workload pods (see the README).
    ``owner_pod`` makes the launcher pod this runs in the domain's owner (off by default:
    a KFP launcher pod ends before the exit handler's teardown would run).
    """
    start = time.monotonic()
    with Api.connect(kubeconfig, outage_s=spec.api_outage_s) as api:
        if owner_pod and spec.owner is None:
            spec = dataclasses.replace(spec, owner=launcher_owner(api, spec.namespace))
        domain = ensure_domain(api, spec)
        rct = wait_for_channel_template(api, domain, Deadline(spec.rct_timeout_s))
        refuse_forced_single(api, spec, domain, rct, Deadline(spec.delete_timeout_s))
    return ProvisionResult(
        run_id=spec.run_id,
        namespace=spec.namespace,
        domain=domain.name,
        channel_template=domain.channel_template,
        uid=domain.uid,
        adopted=domain.adopted,
        elapsed_s=_since(start),
    )


def launch(
    workload: WorkloadSpec,
    module: str,
    args: list[str],
    *,
    kubeconfig: str | None = None,
    own_trainjob: dict[str, Any] | None = None,
) -> LaunchResult:
    """Run ``module`` on the workload's nodes; return rank 0's RESULT (None if it printed none).

    ``module`` empty runs ``args`` as the command itself (it gets the rendezvous env).
    The whole Job lifecycle (domain check, create, queue/pod/Job-aware waits, rank-0 log,
    RESULT) is :func:`mnnvl.driver.run_job`. Completed Jobs stay until teardown. With
    ``workload.workload`` trainjob the workload is a Kubeflow Trainer TrainJob naming
    ``workload.trainjob_runtime`` (:func:`mnnvl.driver.trainjob_run.run_trainjob`); with
    ``own_trainjob``, that TrainJob made the run's (its command and runtime, the run's
    claims, labels and placement).
    """
    start = time.monotonic()
    runtime = workload.trainer_runtime
    with Api.connect(kubeconfig, outage_s=workload.deadlines.api_outage_s) as api:
        if runtime or own_trainjob:
            outcome = run_trainjob(api, workload, module, args, runtime, own_trainjob)
        else:
            outcome = run_job(api, workload, module, args)
    if outcome.adopted.startswith("complete"):
        again = "; `mnnvl verify --measure-again` measures again" if module == VERIFY_MODULE else ""
        logger.warning(
            "Job %s/%s already ran with these inputs (%s): its result is returned again, "
            "nothing ran now%s",
            workload.namespace,
            outcome.job,
            outcome.adopted,
            again,
        )
    return LaunchResult(
        job=outcome.job,
        pods=outcome.pods,
        result=outcome.result,
        log_tail=outcome.log_tail,
        elapsed_s=_since(start),
        restarts=outcome.restarts,
        excluded_nodes=excluded_nodes(outcome.restarts),
        adopted=outcome.adopted,
        evictions=outcome.evictions,
    )


def excluded_nodes(restarts: list[dict[str, Any]]) -> list[str]:
    """The nodes the step kept out of its Jobs after they failed (``Gang.summary``)."""
    return sorted({r["excluded"] for r in restarts if r.get("excluded")})


def _require_result(launched: LaunchResult, kind: str) -> dict[str, Any]:
    raw = launched.result
    if raw is None or raw.get("kind") != kind:
        raise WorkloadFailed(
            f"Job {launched.job} completed but rank 0 printed no {kind} RESULT line; "
            f"last log lines:\n{launched.log_tail}"
        )
    problems = schema_problems(raw)
    if problems:
        raise WorkloadFailed(
            f"Job {launched.job}: rank 0's {kind} RESULT does not match the report schema "
            f"({'; '.join(problems)}); is the worker image's mnnvl-pipelines the launcher's?",
            result=raw,
        )
    return raw


def train(
    workload: WorkloadSpec,
    config: TrainConfig,
    *,
    kubeconfig: str | None = None,
    report_dir: str | None = None,
) -> TrainResult:
    """Sharded training on the domain's nodes; metrics from rank 0's RESULT line. With
    ``workload.workload`` trainjob, as a Kubeflow Trainer TrainJob (``launch``)."""
    start = time.monotonic()
    check_shared_storage(workload, config)
    if not config.checkpoint_dir:
        logger.warning("train: no --checkpoint-dir, so a restart starts over from step 0")
    if report_dir:
        preload_plotting()
    launched = launch(
        step_workload(workload, "train"),
        TRAIN_MODULE,
        to_args(config),
        kubeconfig=kubeconfig,
    )
    raw = _require_result(launched, "train")
    if raw.get("start_step"):
        logger.info("train: resumed from step %s (%s)", raw["start_step"], raw.get("resumed_from"))
    faults = [dict(r) for r in launched.restarts]
    elapsed = _since(start)
    result = TrainResult(
        job=launched.job,
        **{k: raw.get(k) for k in ("final_loss", "tokens_per_s", "mfu", "steps", "peak_mem_gib")},
        start_step=int(raw.get("start_step") or 0),
        checkpoint=str(raw.get("checkpoint") or ""),
        report_files={},
        raw=raw,
        elapsed_s=elapsed,
        restarts=len(faults),
        evictions=launched.evictions,
        steps_lost=sum(f.get("steps_lost") or 0 for f in faults),
        recovery_s=faults[-1].get("recovery_s") if faults else None,
        adopted=launched.adopted,
        faults=faults,
        goodput=None if launched.adopted else goodput(raw, elapsed),
        excluded_nodes=excluded_nodes(launched.restarts),
    )
    if report_dir:
        result = dataclasses.replace(
            result, report_files=write_train_report(result.for_report(), report_dir)
        )
    logger.info(
        "train: final loss %s, %s tokens/s, MFU %s; %s",
        num(raw.get("final_loss"), 4),
        num(raw.get("tokens_per_s"), 0),
        num(raw.get("mfu"), 3),
        goodput_line(result.for_report()),
    )
    for n, fault in enumerate(faults, 1):
        logger.info("train: %s", fault_line(fault, n))
    return result


def verify(
    workload: WorkloadSpec,
    config: VerifyConfig,
    *,
    kubeconfig: str | None = None,
    report_dir: str | None = None,
    fail_on_fail: bool = True,
    measure_again: bool = False,
) -> VerifyResult:
    """NVLink/NCCL verification on the domain's nodes.

    Raises ``VerificationFailed`` (when ``fail_on_fail``) on FAIL, and on NOT_JUDGED unless
    ``config.allow_unjudged``: a verification that judged no bandwidth is no PASS. Run again
    with the same inputs it returns the earlier Job's verdict (``adopted`` says from when);
    ``measure_again`` deletes that Job first (its pods gone) and measures anew, on the same
    domain, with these inputs.
    """
    start = time.monotonic()
    verify_workload, args = step_workload(workload, "verify"), to_args(config)
    if measure_again:
        with Api.connect(kubeconfig, outage_s=workload.deadlines.api_outage_s) as api:
            deadline = Deadline(workload.deadlines.pods_running_timeout_s)
            removed = delete_step_jobs(api, verify_workload, VERIFY_MODULE, args, deadline)
        logger.info("verify: measuring again (deleted %s)", ", ".join(removed) or "nothing")
    if report_dir:
        preload_plotting()
    try:
        launched = launch(verify_workload, VERIFY_MODULE, args, kubeconfig=kubeconfig)
    except WorkloadFailed as err:
        # The worker exits non-zero on a FAIL verdict after printing its RESULT: keep the
        # numbers and report them; anything else (no RESULT) is a real workload failure.
        if not (err.result and err.result.get("kind") == "verify"):
            raise
        launched = LaunchResult(
            job=rank0_job(verify_workload),
            pods=[],
            result=err.result,
            log_tail=str(err),
            elapsed_s=_since(start),
        )
    raw = _require_result(launched, "verify")
    files = write_verify_report(raw, report_dir) if report_dir else {}
    result = VerifyResult(
        job=launched.job,
        verdict=str(raw.get("verdict")),
        **{k: raw.get(k) for k in ("threshold_gbps", "peak_busbw_gbps", "judged_busbw_gbps")},
        sizes=list(raw.get("sizes") or []),
        report_files=files,
        raw=raw,
        elapsed_s=_since(start),
        adopted=launched.adopted,
    )
    logger.info(
        "verify %s: %s (%s; %s)", launched.job, result.verdict, verdict_numbers(raw), nccl_line(raw)
    )
    for line in verdict_lines(raw):
        logger.info("  %s", line)
    if fail_on_fail and not verdict_accepted(result.verdict, config.allow_unjudged):
        raise VerificationFailed(
            f"verification {result.verdict} (Job {launched.job}): {verdict_numbers(raw)}, "
            f"world size {raw.get('world_size')}, backend {raw.get('backend')}; reasons: "
            f"{'; '.join(raw.get('reasons') or []) or 'none given'}"
            + ("; pass --allow-unjudged to accept it" if result.verdict == NOT_JUDGED else "")
            + (f"; report: {files.get('markdown')}" if files else "")
        )
    return result


def teardown(spec: DomainSpec, *, kubeconfig: str | None = None) -> TeardownResult:
    """Delete the run's workload (and wait for its pods), then the domain (and wait for 404).

    Only objects labelled as this run's are deleted, each with a uid precondition; an object
    with the run's names that is someone else's is left alone and named in ``skipped`` (not
    an error: the teardown did all it may). Idempotent: a second call finds nothing and
    returns ``already_gone=True``.
    """
    start = time.monotonic()
    names = RunNames.for_run(spec.run_id)
    deadline = Deadline(spec.delete_timeout_s)
    gone = Deletions(spec.run_id)
    touched = lambda: gone.deleted + gone.skipped  # noqa: E731
    try:
        # API outages are ridden out like in every step, but never past the teardown's deadline.
        api = Api.connect(kubeconfig, outage_s=min(spec.api_outage_s, spec.delete_timeout_s))
        with api, _namespace_checked(spec.namespace, touched):
            delete_workload(api, spec.namespace, gone, deadline)
            skip_foreign_namesakes(api, spec.namespace, gone)
            delete_domain(api, spec.namespace, names.domain, deadline, gone)
            if not touched():  # an empty namespace, or one that does not exist?
                require_namespace(api, spec.namespace)
    except (ClusterUnavailable, WaitTimeout) as e:
        raise gone.incomplete(spec.namespace, e) from e
    message = f"deleted {len(gone.deleted)} objects of run {spec.run_id}"
    if gone.skipped:
        message += f"; left alone (not this run's): {'; '.join(gone.skipped)}"
    elif not gone.deleted:
        message = f"run {spec.run_id}: nothing left to delete"
    logger.info("%s", message)
    return TeardownResult(
        run_id=spec.run_id,
        deleted=gone.deleted,
        already_gone=not gone.deleted,
        elapsed_s=_since(start),
        skipped=gone.skipped,
        message=message,
    )


def reap(
    namespace: str | None,
    *,
    live_run_ids: set[str] | None,
    older_than_s: float,
    all_dead: bool = False,
    dry_run: bool = False,
    kubeconfig: str | None = None,
    timeout_s: float = 300.0,
) -> ReapResult:
    """Delete objects of dead runs: not in ``live_run_ids`` (or every run with ``all_dead``),
    and idle at least ``older_than_s`` when that is > 0. ``dry_run`` deletes nothing.

    ``namespace`` None means the pod's own namespace, else ``default``. An empty or missing
    live list without ``all_dead`` or an age bound is refused (``SpecError``) before any call.
    """
    start = time.monotonic()
    live = None if live_run_ids is None else frozenset(live_run_ids)
    verdict = Verdict(live_run_ids=live, all_dead=all_dead, older_than_s=older_than_s)
    ns = resolve_namespace(namespace or "")
    check_dns_label("namespace", ns)
    with Api.connect(kubeconfig) as api, _namespace_checked(ns, list):
        out = reap_namespace(api, ns, verdict, timeout_s=timeout_s, dry_run=dry_run)
        if not out.runs:
            require_namespace(api, ns)
    return ReapResult(
        namespace=ns,
        runs=out.runs,
        deleted=out.deleted,
        elapsed_s=_since(start),
        skipped=out.skipped,
        dry_run=dry_run,
        would_delete=out.would_delete,
        idle_s=out.idle_s,
    )


def status(spec: DomainSpec, *, kubeconfig: str | None = None) -> StatusResult:
    """What the run has in the cluster now (read-only): domain and its nodes, Jobs, pods."""
    names = RunNames.for_run(spec.run_id)
    with Api.connect(kubeconfig, outage_s=spec.api_outage_s) as api:
        found = run_status(api, spec.namespace, names)
    return StatusResult(run_id=spec.run_id, namespace=spec.namespace, **found)


def preflight(
    workload: WorkloadSpec,
    *,
    kubeconfig: str | None = None,
    report_dir: str | None = None,
    fail_on_fail: bool = True,
) -> PreflightResult:
    """Is the cluster ready for a run of ``workload``'s shape? (``mnnvl.driver.preflight``;
    for a TrainJob workload, its rows too: ``preflight_trainer``)

    Raises ``VerificationFailed`` (exit 4) naming each failing row and its fix, when
    ``fail_on_fail``; the report (``preflight.ctrf.json``) is written first.
    """
    start, started = time.monotonic(), time.time()
    with Api.connect(kubeconfig, outage_s=workload.deadlines.api_outage_s) as api:
        rows = check_cluster(api, workload)
        if workload.trainer_runtime:
            rows += trainer_rows(
                api, workload.namespace, workload.trainer_runtime, workload.recovery.max_restarts
            )
    text = table(rows)
    logger.info("preflight of namespace %s:\n%s", workload.namespace, text)
    found = [r.to_dict() for r in rows]
    files = write_preflight_report(found, report_dir, started, _since(start)) if report_dir else {}
    failed = preflight_failure(found)
    if fail_on_fail and failed:
        report = f"; report: {files['ctrf']}" if files else ""
        raise VerificationFailed(f"preflight: {failed}{report}")
    return PreflightResult(
        namespace=workload.namespace,
        passed=not failed,
        rows=found,
        table=text,
        report_files=files,
        elapsed_s=_since(start),
    )
