"""Argo Workflows: one WorkflowTemplate per pipeline of ``surface.PIPELINES``, ``mnnvl-launch``
(the step templates only, for ``templateRef``), a Workflow and two CronWorkflows.

The run id is ``{{workflow.uid}}``, so the exit handler (teardown) derives the steps' names; the
first task validates ``{{workflow.parameters.json}}`` before it creates anything. ``ARGO_ONLY``
holds the parameters KFP has no twin of (launcher account, image and pod deadlines). The
CronWorkflows (a nightly fabric check, an hourly ``mnnvl reap``) name no namespace: kustomize
places them. Everything is set on hera's objects; nothing edits hera's output.
"""

from __future__ import annotations

import itertools
from typing import Any

from hera.workflows import (
    DAG,
    Container,
    CronWorkflow,
    Parameter,
    Task,
    Workflow,
    WorkflowTemplate,
)
from hera.workflows import models as m

from mnnvl.components import argo_templates as t
from mnnvl.components import launcher_pod as lp
from mnnvl.inputs import surface
from mnnvl.inputs.defaults import DEFAULT_LAUNCHER_IMAGE
from mnnvl.inputs.names import LABEL_PART_OF, PART_OF
from mnnvl.inputs.spec import ARGO

TEMPLATE_NAME = "mnnvl-training"
LAUNCH_TEMPLATE_NAME = "mnnvl-launch"
ENTRYPOINT = "main"
EXIT_HANDLER = "exit-handler"
DEFAULT_SERVICE_ACCOUNT = lp.SERVICE_ACCOUNT
WORKFLOW_TEMPLATES = (*surface.PIPELINES, LAUNCH_TEMPLATE_NAME)
# Formerly `service-account`: renamed, as it names the launcher's account, not the workers'.
LAUNCHER_SERVICE_ACCOUNT = "launcher-service-account"

# Workflow parameters with no KFP twin, and why.
ARGO_ONLY: dict[str, tuple[str, str]] = {
    LAUNCHER_SERVICE_ACCOUNT: (
        DEFAULT_SERVICE_ACCOUNT,
        "service account of the launcher (step) pods, which holds the mnnvl-runner Role; the "
        "worker pods' is worker-service-account",
    ),
    t.LAUNCHER_IMAGE_INPUT: (DEFAULT_LAUNCHER_IMAGE, "image of the launcher (step) pods"),
    **{
        f"{step}-deadline-s": (
            seconds,
            surface.LAUNCHER_DEADLINE_HELP.format(step=step, margin=surface.LAUNCHER_MARGIN_S),
        )
        for step, seconds in t.DEADLINES.items()
    },
}


def workflow_settings() -> dict[str, Any]:
    """hera ``WorkflowTemplate``/``CronWorkflow`` keyword arguments every shipped one carries."""
    return {
        "ttl_strategy": m.TTLStrategy(seconds_after_success=86400, seconds_after_failure=7 * 86400),
        "pod_gc": m.PodGC(strategy="OnPodSuccess"),
        "security_context": m.PodSecurityContext.model_validate(lp.POD_SECURITY_CONTEXT),
    }


def labels(name: str) -> dict[str, str]:
    """Labels of a shipped Argo object (WorkflowTemplate, Workflow, CronWorkflow) named ``name``."""
    return {LABEL_PART_OF: PART_OF, "app.kubernetes.io/name": name}


def _wf(name: str) -> str:
    return f"{{{{workflow.parameters.{name}}}}}"


def workflow_parameters(plan: surface.Pipeline) -> list[Parameter]:
    """The pipeline's parameters (kebab-case), then the Argo-only ones its steps use."""
    params = [
        Parameter(name=p.kebab, value=p.text(), description=p.description, enum=t.parameter(p).enum)
        for p in surface.grouped(plan.parameters(ARGO))
    ]
    steps = {task.step for task in plan.tasks}
    for name, (default, description) in ARGO_ONLY.items():
        if not name.endswith("-deadline-s") or name.removesuffix("-deadline-s") in steps:
            params.append(Parameter(name=name, value=default, description=description))
    return params


def _arguments(plan: surface.Pipeline, task: surface.Task) -> dict[str, str]:
    """Each input of the task's template (``step_template``): from its workflow parameter,
    or the task's fixed value."""
    refs = {p.name: _wf(p.kebab) for p in surface.grouped(plan.parameters(ARGO))}
    given = plan.component_arguments(task, refs)  # a fixed input is text already (purpose)
    args = {name.replace("_", "-"): str(value) for name, value in given.items()}
    if task.step == "provision":  # the first task: it validates every workflow parameter
        args[t.PIPELINE_INPUT] = plan.name
        args[t.PIPELINE_PARAMETERS_INPUT] = "{{workflow.parameters.json}}"
    args[t.LAUNCHER_IMAGE_INPUT] = _wf(t.LAUNCHER_IMAGE_INPUT)
    if task.step in t.DEADLINES:
        args[t.DEADLINE_INPUT] = _wf(f"{task.step}-deadline-s")
    return args


def build_workflow_template(name: str = TEMPLATE_NAME) -> WorkflowTemplate:
    """The hera WorkflowTemplate ``name``: a pipeline's, or ``mnnvl-launch``'s step templates,
    each naming the launcher's account itself, so that a caller's workflow that reaches one by
    ``templateRef`` runs it under that account."""
    plan = surface.PIPELINES.get(name)
    description = plan.description if plan else t.LAUNCH_DESCRIPTION
    with WorkflowTemplate(
        name=name,
        labels=labels(name),
        annotations={"workflows.argoproj.io/description": description},
        entrypoint=ENTRYPOINT if plan else "launch",
        on_exit=EXIT_HANDLER if plan else None,
        service_account_name=_wf(LAUNCHER_SERVICE_ACCOUNT) if plan else DEFAULT_SERVICE_ACCOUNT,
        arguments=workflow_parameters(plan) if plan else None,
        **workflow_settings(),
    ) as wt:
        templates = {s: t.step_template(s, check=bool(plan) and s == "provision") for s in t.STEPS}
        if not plan:
            for template in templates.values():
                template.service_account_name = DEFAULT_SERVICE_ACCOUNT
            return wt
        *main, teardown = plan.tasks
        with DAG(name=ENTRYPOINT):
            tasks = [
                Task(
                    name=task.name, template=templates[task.step], arguments=_arguments(plan, task)
                )
                for task in main
            ]
            for before, after in itertools.pairwise(tasks):
                before >> after
        with DAG(name=EXIT_HANDLER):
            Task(
                name="teardown",
                template=templates["teardown"],
                arguments=_arguments(plan, teardown),
            )
    return wt


def workflow_manifest() -> dict[str, Any]:
    """A Workflow that runs the training template (what ``argo submit --from`` creates), as a
    plain dict."""
    return Workflow(
        generate_name=f"{TEMPLATE_NAME}-",
        labels=labels(TEMPLATE_NAME),
        workflow_template_ref=m.WorkflowTemplateRef(name=TEMPLATE_NAME),
        arguments=[Parameter(name="gpus-per-node", value="4"), Parameter(name="nodes", value="2")],
    ).to_dict()


FABRIC_CHECK_NAME = "mnnvl-nightly-fabric-check"
REAP_NAME = "mnnvl-reap"


def _cron(name: str, schedule: str, description: str, **workflow_spec: Any) -> CronWorkflow:
    return CronWorkflow(
        name=name,
        labels=labels(name),
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
    settings = workflow_settings()
    cron = _cron(
        FABRIC_CHECK_NAME,
        "0 2 * * *",
        "Nightly NVLink fabric check (mnnvl-verify-only).",
        workflow_template_ref=m.WorkflowTemplateRef(name="mnnvl-verify-only"),
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
        service_account_name=DEFAULT_SERVICE_ACCOUNT,
        **workflow_settings(),
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
