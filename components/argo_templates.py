"""Argo Workflows (hera) container templates: ``mnnvl <step> --run-id {{workflow.uid}} ...`` in
the launcher image, its JSON result (``--result-path``) as the output parameter ``result``.

Template inputs are the step's inputs in kebab case (``gpus-per-node`` -> ``--gpus-per-node``),
with the defaults of the CLI and KFP; lists are JSON lists, groups JSON objects
(``--placement-json``). Provision and teardown retry on exit codes a retry can fix; train,
verify and launch only when their pod was lost (the retry adopts the step's Job). Call
``step_template()`` inside a hera ``WorkflowTemplate``/``Workflow`` context.
"""

from __future__ import annotations

from typing import Any

from hera.workflows import Artifact, Container, Parameter, RetryStrategy
from hera.workflows import models as m

from mnnvl.components import launcher_pod as lp
from mnnvl.contract import exit_codes
from mnnvl.inputs import surface
from mnnvl.inputs.defaults import DEFAULT_LAUNCHER_IMAGE
from mnnvl.inputs.spec import ARGO
from mnnvl.inputs.surface import Input

RUN_ID = "{{workflow.uid}}"
RESULT_PATH = "/tmp/result.json"
REPORT_DIR = "/tmp/report"  # verify, train, preflight: report files and key figures
RETRY_LIMIT = str(surface.STEP_RETRIES)  # Argo's schema types IntOrString as string
LAUNCHER_IMAGE_INPUT = "launcher-image"
DEADLINE_INPUT = "deadline-s"
PIPELINE_INPUT = "pipeline"
PIPELINE_PARAMETERS_INPUT = "pipeline-parameters"
DEADLINES = {"train": "28800", "verify": "3600", "launch": "28800"}
# In the order the WorkflowTemplates list them.
STEPS = ("provision", "preflight", "train", "verify", "launch", "teardown")
LAUNCH_DESCRIPTION = (
    "Run the user's image and command on every node of the run's domain; retried if lost."
)
RETRY_EXPRESSION = exit_codes.argo_retry_expression()
LOST_POD_RETRY_EXPRESSION = exit_codes.argo_lost_pod_retry_expression()


def launcher_pod(step: str) -> dict[str, Any]:
    """hera ``Container`` keyword arguments that make it a launcher pod, with its own ``/tmp``
    volume and pod security context: a ``templateRef`` does not bring the WorkflowTemplate's."""
    return {
        "resources": m.ResourceRequirements.model_validate(lp.RESOURCES),
        "security_context": m.SecurityContext.model_validate(lp.CONTAINER_SECURITY_CONTEXT),
        "pod_security_context": m.PodSecurityContext.model_validate(lp.POD_SECURITY_CONTEXT),
        "volumes": [
            m.Volume(
                name=lp.TMP_VOLUME,
                empty_dir=m.EmptyDirVolumeSource(size_limit=m.Quantity(lp.TMP_SIZE_LIMIT)),
            )
        ],
        "volume_mounts": [m.VolumeMount(name=lp.TMP_VOLUME, mount_path=lp.TMP_PATH)],
        "labels": lp.labels(step),
    }


def retry(*, backoff: bool = True, lost_pod: bool = False) -> RetryStrategy:
    """Up to ``RETRY_LIMIT`` retries, only for exit codes a retry can fix; ``lost_pod``: only
    when the step's pod was lost. A workload step may be lost hours into its Job, so its
    retries have no ``maxDuration`` (Argo counts it from the first attempt's start); its
    ``activeDeadlineSeconds`` bounds each attempt instead."""
    return RetryStrategy(
        limit=RETRY_LIMIT,
        retry_policy="Always",
        backoff=(
            m.Backoff(
                duration=f"{surface.STEP_RETRY_BACKOFF_S}s",
                factor=m.IntOrString(str(surface.STEP_RETRY_FACTOR)),
                max_duration=None if lost_pod else surface.STEP_RETRY_WINDOW,
            )
            if backoff
            else None
        ),
        expression=LOST_POD_RETRY_EXPRESSION if lost_pod else RETRY_EXPRESSION,
    )


def _ref(name: str) -> str:
    return f"{{{{inputs.parameters.{name}}}}}"


def input_args(item: Input) -> list[str]:
    """The CLI words one template input becomes."""
    ref = f"inputs.parameters['{item.kebab}']"
    if item.kind == "bool":
        # The CLI takes --x/--no-x; an Argo expression picks one from "true"/"false".
        return [f"{{{{={ref} == 'true' ? '{item.flag}' : '--no-{item.kebab}'}}}}"]
    # A group, and the command (a JSON list), come as one JSON text: --<name>-json.
    flag = item.flag + "-json" if item.kind == "dict" or item.name == "command" else item.flag
    return [flag, _ref(item.kebab)]


def parameter(item: Input) -> Parameter:
    """An Argo parameter (template input or workflow parameter) for one input."""
    enum = ["true", "false"] if item.kind == "bool" else list(item.choices) or None
    return Parameter(name=item.kebab, default=item.text(), description=item.description, enum=enum)


def step_template(step: str, *, check: bool = False) -> Container:
    """The template of ``step`` (named after it). ``check``: provision first validates a whole
    pipeline's parameters (the pipeline's first task)."""
    items = surface.grouped(surface.step_inputs(step, ARGO))
    args = [step] + (["--run-id", RUN_ID] if step != "preflight" else [])
    for item in items:
        args += input_args(item)
    parameters = [parameter(item) for item in items]
    if check:
        args += ["--pipeline", _ref(PIPELINE_INPUT)]
        args += ["--pipeline-parameters", _ref(PIPELINE_PARAMETERS_INPUT)]
        parameters += [
            Parameter(name=PIPELINE_INPUT, description="Pipeline whose parameters to validate"),
            Parameter(
                name=PIPELINE_PARAMETERS_INPUT,
                default="{}",
                description="Its parameters ({{workflow.parameters.json}}), checked first",
            ),
        ]
    args += ["--result-path", RESULT_PATH]
    if step in ("verify", "preflight", "train"):
        args += ["--report-dir", REPORT_DIR]
    parameters.append(
        Parameter(
            name=LAUNCHER_IMAGE_INPUT,
            default=DEFAULT_LAUNCHER_IMAGE,
            description="Image of this step's pod (mnnvl-pipelines, no torch)",
        )
    )
    deadline = DEADLINES.get(step)  # the workload steps: train, verify, launch
    if deadline is not None:
        parameters.append(
            Parameter(
                name=DEADLINE_INPUT,
                default=deadline,
                description="Pod deadline (s); must cover the step's own timeouts",
            )
        )
    return Container(
        name=step,
        image=_ref(LAUNCHER_IMAGE_INPUT),
        command=["mnnvl"],
        args=args,
        inputs=parameters,
        outputs=[
            Parameter(
                name="result",
                value_from=m.ValueFrom(path=RESULT_PATH, default="{}"),
                description="The step's JSON result",
            ),
            *_report_outputs(step),
        ],
        # Preflight only reads; provision and teardown are idempotent; a workload step retries
        # only when its pod was lost.
        retry_strategy=None if step == "preflight" else retry(lost_pod=deadline is not None),
        active_deadline_seconds=_ref(DEADLINE_INPUT) if deadline is not None else None,
        **launcher_pod(step),
    )


def _report_outputs(step: str) -> list[Parameter | Artifact]:
    """verify and train: key figures as parameters, the HTML (and verify's CTRF) report as
    artifacts; preflight: the CTRF report. Argo saves a failed step's outputs too; a Job that
    ended without a verdict leaves the defaults (``""``) and no artifacts (optional)."""
    from mnnvl.report import CTRF_FILE, KEY_FIGURES
    from mnnvl.report_train import TRAIN_FIGURES

    plain = m.ArchiveStrategy(none=m.NoneStrategy())  # served as is (the UI shows the HTML)
    if step == "preflight":
        path = f"{REPORT_DIR}/preflight.ctrf.json"
        return [Artifact(name="ctrf", path=path, optional=True, archive=plain)]
    if step not in ("verify", "train"):
        return []
    figures = TRAIN_FIGURES if step == "train" else KEY_FIGURES
    outputs: list[Parameter | Artifact] = [
        Parameter(
            name=name.replace("_", "-"),
            value_from=m.ValueFrom(path=f"{REPORT_DIR}/{file}", default=""),
            description=description,
        )
        for name, (file, description) in figures.items()
    ]
    outputs.append(
        Artifact(name="report", path=f"{REPORT_DIR}/{step}.html", optional=True, archive=plain)
    )
    if step == "verify":
        ctrf = Artifact(name="ctrf", path=f"{REPORT_DIR}/{CTRF_FILE}", optional=True, archive=plain)
        outputs.append(ctrf)
    return outputs
