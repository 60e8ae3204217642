"""Argo Workflows: the ``mnnvl-training`` WorkflowTemplate and a Workflow that runs it.

DAG: provision -> verify-pre (gate) -> train -> verify-post; ``onExit`` runs teardown.
The run id is ``{{workflow.uid}}``, so the exit handler derives the same object names as
the steps. Only the idempotent steps (provision, teardown) retry; the long steps carry an
``activeDeadlineSeconds``. The launcher pods run as the service account named by the
workflow parameter ``service-account`` (RBAC: ``components/README.md``).

``argo submit --from workflowtemplate/mnnvl-training -p nodes=4`` runs it, as does applying
``workflow_manifest()`` (a Workflow with ``workflowTemplateRef``).
"""

from __future__ import annotations

from typing import Any

from hera.workflows import DAG, Container, Parameter, Task, Workflow, WorkflowTemplate
from hera.workflows import models as m

from mnnvl.components import argo_templates as t
from mnnvl.spec import DEFAULT_IMAGE

TEMPLATE_NAME = "mnnvl-training"
ENTRYPOINT = "main"
EXIT_HANDLER = "exit-handler"
DEFAULT_SERVICE_ACCOUNT = "mnnvl-runner"  # manifests/base/rbac.yaml
LABELS = {"app.kubernetes.io/part-of": "mnnvl-pipelines", "app.kubernetes.io/name": TEMPLATE_NAME}


# A workflow parameter has the same shape as a template input: name, default, description.
WfParam = t.Input


WORKFLOW_PARAMETERS = [
    WfParam("service-account", DEFAULT_SERVICE_ACCOUNT, "Service account of the launcher pods"),
    WfParam("namespace", "default", "Namespace of the ComputeDomain and worker Jobs"),
    WfParam("nodes", "2", "Worker pods, one per node"),
    WfParam("gpus-per-node", "4", "GPUs per worker pod (0 = one CPU process)"),
    WfParam("image", DEFAULT_IMAGE, "Worker (runtime) image"),
    WfParam("gpu-mode", "limits", "limits (device plugin) or claim (DRA gpu.nvidia.com)"),
    WfParam("allocation-mode", "Single", "IMEX channel allocation: Single or All"),
    WfParam("clique-affinity", "true", "Keep all pods in one NVLink clique", boolean=True),
    WfParam("worker-service-account", "", "Service account of the worker pods"),
    WfParam("node-selector", "", "Extra node selector of the workers: key=value,..."),
    WfParam("tolerations", "", "Extra tolerations of the workers: key[=value]:Effect,..."),
    WfParam("priority-class", "", "PriorityClass of the worker pods"),
    WfParam("queue-name", "", "Kueue LocalQueue of the worker Jobs"),
    WfParam("pvc", "", "PersistentVolumeClaims in every worker: CLAIM:/path[:ro],..."),
    WfParam("shm-size", "16Gi", "Size of the workers' /dev/shm"),
    WfParam("model", "1b", "Model preset: tiny, small, 125m, 350m, 1b, 3b, 8b"),
    WfParam("steps", "100", "Optimizer steps"),
    WfParam("seq-len", "0", "Sequence length (0 = preset's)"),
    WfParam("batch-size", "4", "Micro-batch per rank"),
    WfParam("lr", "0.0003", "Peak learning rate"),
    WfParam("warmup-steps", "5", "Linear warm-up steps"),
    WfParam("dtype", "auto", "auto, bf16 or fp32"),
    WfParam("compile", "true", "torch.compile the model", boolean=True),
    WfParam("activation-checkpointing", "false", "Recompute activations", boolean=True),
    WfParam("data", "synthetic", "synthetic, or a token file visible to the workers"),
    WfParam("seed", "0", "Random seed"),
    WfParam("checkpoint-dir", "", "Shared checkpoint/resume directory"),
    WfParam("checkpoint-every", "0", "Steps between checkpoints (0 = only at the end)"),
    WfParam("log-every", "10", "Steps between logged losses"),
    WfParam("min-busbw-gbps", "0", "Verification threshold in GB/s (0 = derive from topology)"),
    WfParam("efficiency", "0.62", "Fraction of the link limit a derived threshold asks for"),
    WfParam("verify-max-bytes", "0", "Largest all-reduce size (0 = pick for the device)"),
    WfParam("verify-iters", "0", "Timed iterations per size (0 = pick for the device)"),
    WfParam(
        "allow-unjudged", "false", "Accept a NOT_JUDGED verification (no threshold)", boolean=True
    ),
    WfParam("rct-timeout-s", "120", "Wait for the DRA controller's claim template (s)"),
    WfParam("delete-timeout-s", "300", "Wait until each object is gone (s)"),
    WfParam("pods-running-timeout-s", "900", "Deadline for worker pods to be Running (s)"),
    WfParam("train-timeout-s", "7200", "Deadline for the training Job (s)"),
    WfParam("verify-timeout-s", "1800", "Deadline for each verification Job (s)"),
    WfParam("train-deadline-s", "28800", "activeDeadlineSeconds of the train launcher pod"),
    WfParam("verify-deadline-s", "3600", "activeDeadlineSeconds of each verify launcher pod"),
]
_WF_NAMES = {p.name for p in WORKFLOW_PARAMETERS}

# Template input -> workflow parameter, where the names differ.
TRAIN_RENAMES = {
    "service-account": "worker-service-account",
    "job-timeout-s": "train-timeout-s",
    t.DEADLINE_INPUT: "train-deadline-s",
}
VERIFY_RENAMES = {
    "service-account": "worker-service-account",
    "job-timeout-s": "verify-timeout-s",
    "max-bytes": "verify-max-bytes",
    "iters": "verify-iters",
    t.DEADLINE_INPUT: "verify-deadline-s",
}


def _arguments(
    template: Container, renames: dict[str, str] | None = None, **fixed: str
) -> dict[str, str]:
    """Wire each template input to its workflow parameter; inputs without one keep defaults."""
    renames = renames or {}
    args: dict[str, str] = {}
    inputs = template.inputs if isinstance(template.inputs, list) else []
    for param in inputs:
        name = str(getattr(param, "name", ""))
        if name in fixed:
            args[name] = fixed[name]
            continue
        source = renames.get(name, name)
        if source in _WF_NAMES:
            args[name] = f"{{{{workflow.parameters.{source}}}}}"
    return args


def _workflow_parameters() -> list[Parameter]:
    return [
        Parameter(
            name=p.name,
            value=p.default,
            description=p.description,
            enum=["true", "false"] if p.boolean else None,
        )
        for p in WORKFLOW_PARAMETERS
    ]


def build_workflow_template() -> WorkflowTemplate:
    """The hera WorkflowTemplate (post-process with ``workflow_template_manifest``)."""
    with WorkflowTemplate(
        name=TEMPLATE_NAME,
        labels=LABELS,
        annotations={
            "workflows.argoproj.io/description": "ComputeDomain -> NVLink "
            "verification -> sharded training -> verification; teardown on exit."
        },
        entrypoint=ENTRYPOINT,
        on_exit=EXIT_HANDLER,
        service_account_name="{{workflow.parameters.service-account}}",
        arguments=_workflow_parameters(),
    ) as wt:
        provision = t.provision_template()
        train = t.train_template()
        verify = t.verify_template()
        teardown = t.teardown_template()
        with DAG(name=ENTRYPOINT):
            p = Task(name="provision", template=provision, arguments=_arguments(provision))
            pre = Task(
                name="verify-pre",
                template=verify,
                arguments=_arguments(verify, VERIFY_RENAMES, purpose="verify-pre"),
            )
            tr = Task(name="train", template=train, arguments=_arguments(train, TRAIN_RENAMES))
            post = Task(
                name="verify-post",
                template=verify,
                arguments=_arguments(verify, VERIFY_RENAMES, purpose="verify-post"),
            )
            p >> pre
            pre >> tr
            tr >> post
        with DAG(name=EXIT_HANDLER):
            Task(name="teardown", template=teardown, arguments=_arguments(teardown))
    return wt


def _int_or_string_as_strings(doc: dict[str, Any]) -> dict[str, Any]:
    # hera emits what it was given; make sure IntOrString fields Argo's schema types as
    # strings stay strings even if a future hera turns them into integers.
    for template in doc["spec"]["templates"]:
        retry = template.get("retryStrategy")
        if retry:
            retry["limit"] = str(retry["limit"])
            if "backoff" in retry and "factor" in retry["backoff"]:
                retry["backoff"]["factor"] = str(retry["backoff"]["factor"])
        if "activeDeadlineSeconds" in template:
            template["activeDeadlineSeconds"] = str(template["activeDeadlineSeconds"])
    return doc


def workflow_template_manifest() -> dict[str, Any]:
    """The WorkflowTemplate as a plain dict, ready for YAML."""
    return _int_or_string_as_strings(build_workflow_template().to_dict())


def build_workflow(arguments: dict[str, str] | None = None) -> Workflow:
    """A Workflow that runs the template (what ``argo submit --from`` creates)."""
    params = arguments or {"nodes": "2", "gpus-per-node": "4"}
    return Workflow(
        generate_name=f"{TEMPLATE_NAME}-",
        labels=LABELS,
        workflow_template_ref=m.WorkflowTemplateRef(name=TEMPLATE_NAME),
        arguments=[Parameter(name=k, value=v) for k, v in sorted(params.items())],
    )


def workflow_manifest(arguments: dict[str, str] | None = None) -> dict[str, Any]:
    """The Workflow as a plain dict, ready for YAML."""
    return build_workflow(arguments).to_dict()
