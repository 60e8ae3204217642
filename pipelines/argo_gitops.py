"""Argo objects for GitOps: the WorkflowTemplates and the CronWorkflows, all built with hera.

Every object this module ships carries the hardening of ``argo_workflow.workflow_settings``
and the launcher-pod settings of ``mnnvl.components.launcher_pod``: launcher pods run as
non-root with a read-only root file system (``/tmp`` is an ``emptyDir``: the result file and
matplotlib's cache live there), no privilege escalation and no capabilities; each step template
declares its volume and pod security context itself, so ``templateRef`` works; finished
workflows are deleted after a while (``ttlStrategy``) and succeeded pods at once (``podGC``;
failed ones stay for ``kubectl logs``); a retry happens only for exit codes a retry can fix
(never 2, bad input or a conflict, nor 4, a failed workload or verdict), and for a workload
step only when its pod was lost.

The CronWorkflows reference WorkflowTemplates by name and name no namespace: kustomize (or
``kubectl apply -n``) places them, and ``{{workflow.namespace}}`` is where they run.
"""

from __future__ import annotations

from typing import Any

from hera.workflows import Container, CronWorkflow, Parameter
from hera.workflows import models as m

from mnnvl.components import argo_templates as t
from mnnvl.inputs.defaults import DEFAULT_LAUNCHER_IMAGE
from mnnvl.pipelines import argo_workflow as aw

VERIFY_ONLY_NAME = "mnnvl-verify-only"
FABRIC_CHECK_NAME = "mnnvl-nightly-fabric-check"
REAP_NAME = "mnnvl-reap"


def _cron(name: str, schedule: str, description: str, **workflow_spec: Any) -> CronWorkflow:
    return CronWorkflow(
        name=name,
        labels=aw.labels(name),
        annotations={"workflows.argoproj.io/description": description},
        schedules=[schedule],
        timezone="UTC",
        concurrency_policy="Forbid",
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=7,
        **workflow_spec,
    )


def fabric_check_cron_manifest() -> dict[str, Any]:
    """Every night: the verify-only template with its defaults (patch them with kustomize)."""
    settings = aw.workflow_settings()
    cron = _cron(
        FABRIC_CHECK_NAME,
        "0 2 * * *",
        "Nightly NVLink fabric check (mnnvl-verify-only).",
        workflow_template_ref=m.WorkflowTemplateRef(name=VERIFY_ONLY_NAME),
        # The pods are the referenced template's (hardened there); the Workflow's own lifetime
        # is set here.
        ttl_strategy=settings["ttl_strategy"],
        pod_gc=settings["pod_gc"],
    )
    return cron.to_dict()


def reap_cron_manifest() -> dict[str, Any]:
    """Every hour: ``mnnvl reap`` of runs older than two days whose exit handler never ran.

    Two days exceeds the longest run the templates allow (train 8 h, verifies 1 h each).
    """
    with _cron(
        REAP_NAME,
        "17 * * * *",
        "Hourly clean-up of orphaned runs (mnnvl reap).",
        entrypoint="reap",
        service_account_name=aw.DEFAULT_SERVICE_ACCOUNT,
        **aw.workflow_settings(),
    ) as cron:
        Container(
            name="reap",
            inputs=[Parameter(name="older-than-s", value="172800")],
            image=DEFAULT_LAUNCHER_IMAGE,
            command=["mnnvl"],
            args=[
                "reap",
                "--namespace",
                "{{workflow.namespace}}",
                "--older-than-s",
                "{{inputs.parameters.older-than-s}}",
            ],
            retry_strategy=t.retry(backoff=False),
            **t.launcher_pod("reap"),
        )
    return cron.to_dict()
