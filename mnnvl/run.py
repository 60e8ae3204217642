"""``mnnvl run``: every step of a run in order, with teardown always, and a summary log.

provision -> verify-pre -> train -> verify-post, then teardown, also when a step failed or a
signal interrupted the run. The CLI parses and validates; this module only sequences steps.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from mnnvl import steps
from mnnvl.errors import MnnvlError, TeardownIncomplete
from mnnvl.report import num
from mnnvl.spec import DomainSpec, TrainConfig, VerifyConfig, WorkloadSpec

logger = logging.getLogger(__name__)


def run_all(
    domain: DomainSpec,
    workload: WorkloadSpec,
    train_cfg: TrainConfig,
    verify_cfg: VerifyConfig,
    *,
    kubeconfig: str | None,
    report_dir: str | None,
    skip_verify: bool,
) -> dict[str, Any]:
    """provision -> verify-pre -> train -> verify-post, with teardown always (also on signals).

    Returns the run id and each step's result dict by step name. Reports of a step go to
    ``<report_dir>/<step>`` when ``report_dir`` is set.
    """
    out: dict[str, Any] = {"run_id": domain.run_id}

    def step_report_dir(step: str) -> str | None:
        return f"{report_dir}/{step}" if report_dir else None

    error: BaseException | None = None
    try:
        out["provision"] = steps.provision(domain, kubeconfig=kubeconfig).to_dict()
        if not skip_verify:
            pre = dataclasses.replace(workload, purpose="verify-pre")
            out["verify_pre"] = steps.verify(
                pre, verify_cfg, kubeconfig=kubeconfig, report_dir=step_report_dir("verify-pre")
            ).to_dict()
        out["train"] = steps.train(
            workload, train_cfg, kubeconfig=kubeconfig, report_dir=step_report_dir("train")
        ).to_dict()
        if not skip_verify:
            post = dataclasses.replace(workload, purpose="verify-post")
            out["verify_post"] = steps.verify(
                post, verify_cfg, kubeconfig=kubeconfig, report_dir=step_report_dir("verify-post")
            ).to_dict()
    except BaseException as e:  # a step's error or a signal: teardown below, then re-raised
        error = e
        raise
    finally:
        try:
            out["teardown"] = steps.teardown(domain, kubeconfig=kubeconfig).to_dict()
        except MnnvlError as e:
            if error is None:
                raise  # the run itself went well: the teardown failure is the result
            # Raising here would replace the step's error (or the signal) with this one; it
            # carries what the teardown may have left instead (the CLI reports it last).
            logger.error("teardown after failure also failed: %s", e)
            if isinstance(e, TeardownIncomplete):
                error.leftovers, error.cleanup = e.leftovers, e.cleanup  # type: ignore[attr-defined]
    _log_summary(out)
    return out


def _log_summary(out: dict[str, Any]) -> None:
    train = out.get("train") or {}
    logger.info("run %s summary:", out["run_id"])
    for key in ("verify_pre", "verify_post"):
        if key in out:
            v = out[key]
            logger.info(
                "  %-12s %s judged %s GB/s (threshold %s GB/s)",
                key,
                v["verdict"],
                num(v["judged_busbw_gbps"]),
                num(v["threshold_gbps"]),
            )
    if train:
        logger.info(
            "  %-12s loss %s, %s tokens/s, %s steps",
            "train",
            num(train["final_loss"], 4),
            num(train["tokens_per_s"], 0),
            num(train["steps"]),
        )
    logger.info(
        "  %-12s deleted %d objects",
        "teardown",
        len((out.get("teardown") or {}).get("deleted", [])),
    )
    last_verify = out.get("verify_post") or out.get("verify_pre")
    if last_verify:
        from mnnvl.report import verify_table

        for line in verify_table(last_verify["raw"]).splitlines():
            logger.info("  %s", line)
