"""Argo Workflows (hera) container templates for the four steps.

Each template runs ``mnnvl <step> --run-id {{workflow.uid}} ...`` in the launcher image and
exposes the step's JSON result (``--result-path /tmp/result.json``) as the output parameter
``result``. Template inputs are named after the CLI flags they feed (``gpus-per-node`` ->
``--gpus-per-node``), so a template reads like the command it runs.

Call the ``*_template()`` builders inside a hera ``WorkflowTemplate``/``Workflow`` context
(see ``mnnvl.pipelines.argo_workflow``); they register themselves there.
"""

from __future__ import annotations

from dataclasses import dataclass

from hera.workflows import Container, Parameter, Resources, RetryStrategy
from hera.workflows import models as m

from mnnvl.spec import DEFAULT_IMAGE, DEFAULT_LAUNCHER_IMAGE

RUN_ID = "{{workflow.uid}}"
RESULT_PATH = "/tmp/result.json"
RETRY_LIMIT = "2"  # Argo's schema types IntOrString as string


@dataclass(frozen=True)
class Input:
    """A template input that becomes one CLI flag."""

    name: str
    default: str
    description: str
    boolean: bool = False

    def args(self) -> list[str]:
        ref = f"inputs.parameters['{self.name}']"
        if self.boolean:
            # The CLI takes --x/--no-x; an Argo expression picks one from "true"/"false".
            return [f"{{{{={ref} == 'true' ? '--{self.name}' : '--no-{self.name}'}}}}"]
        return [f"--{self.name}", f"{{{{inputs.parameters.{self.name}}}}}"]

    def parameter(self) -> Parameter:
        enum = ["true", "false"] if self.boolean else None
        return Parameter(
            name=self.name, default=self.default, description=self.description, enum=enum
        )


NAMESPACE = Input("namespace", "default", "Namespace of the run's objects")
DOMAIN_INPUTS = [
    NAMESPACE,
    Input("allocation-mode", "Single", "IMEX channel allocation: Single or All"),
    Input("rct-timeout-s", "120", "Wait for the DRA controller's claim template (s)"),
]
TEARDOWN_INPUTS = [
    NAMESPACE,
    Input("delete-timeout-s", "300", "Wait until each object is gone (s)"),
]
WORKLOAD_INPUTS = [
    NAMESPACE,
    Input("nodes", "2", "Worker pods, one per node"),
    Input("gpus-per-node", "4", "GPUs per worker pod (0 = one CPU process)"),
    Input("image", DEFAULT_IMAGE, "Worker (runtime) image"),
    Input("gpu-mode", "limits", "limits (device plugin) or claim (DRA gpu.nvidia.com)"),
    Input("clique-affinity", "true", "Keep all pods in one NVLink clique", boolean=True),
    Input("service-account", "", "Service account of the worker pods"),
    Input("node-selector", "", "Extra node selector of the workers: key=value,..."),
    Input("tolerations", "", "Extra tolerations of the workers: key[=value]:Effect,..."),
    Input("priority-class", "", "PriorityClass of the worker pods"),
    Input("queue-name", "", "Kueue LocalQueue of the worker Job"),
    Input("pvc", "", "PersistentVolumeClaims in every worker: CLAIM:/path[:ro],..."),
    Input("shm-size", "16Gi", "Size of the workers' /dev/shm"),
    Input("pods-running-timeout-s", "900", "Deadline for all worker pods to be Running (s)"),
]
TRAIN_INPUTS = [
    *WORKLOAD_INPUTS,
    Input("nccl-profile", "production", "NCCL profile"),
    Input("job-timeout-s", "7200", "Deadline for the training Job (s)"),
    Input("model", "1b", "Model preset: tiny, small, 125m, 350m, 1b, 3b, 8b"),
    Input("steps", "100", "Optimizer steps"),
    Input("seq-len", "0", "Sequence length (0 = preset's)"),
    Input("batch-size", "4", "Micro-batch per rank"),
    Input("lr", "0.0003", "Peak learning rate"),
    Input("warmup-steps", "5", "Linear warm-up steps"),
    Input("dtype", "auto", "auto, bf16 or fp32"),
    Input("compile", "true", "torch.compile the model", boolean=True),
    Input("activation-checkpointing", "false", "Recompute activations", boolean=True),
    Input("data", "synthetic", "synthetic, or a token file visible to the workers"),
    Input("seed", "0", "Random seed"),
    Input("checkpoint-dir", "", "Shared checkpoint/resume directory"),
    Input("checkpoint-every", "0", "Steps between checkpoints (0 = only at the end)"),
    Input("log-every", "10", "Steps between logged losses"),
]
VERIFY_INPUTS = [
    *WORKLOAD_INPUTS,
    Input("purpose", "verify", "Job purpose: verify-pre, verify-post or verify"),
    Input("nccl-profile", "verify-strict", "NCCL profile (verify-strict forces MNNVL on)"),
    Input("job-timeout-s", "1800", "Deadline for the verification Job (s)"),
    Input("min-busbw-gbps", "0", "Pass threshold in GB/s (0 = derive from topology)"),
    Input("efficiency", "0.62", "Fraction of the link limit a derived threshold asks for"),
    Input("max-bytes", "0", "Largest all-reduce size (0 = pick for the device)"),
    Input("iters", "0", "Timed iterations per size (0 = pick for the device)"),
    Input("allow-unjudged", "false", "Accept NOT_JUDGED (no threshold applied)", boolean=True),
]
DEADLINE_INPUT = "deadline-s"

LAUNCHER_RESOURCES = Resources(cpu_request="100m", memory_request="256Mi", memory_limit="1Gi")


def _retry() -> RetryStrategy:
    return RetryStrategy(
        limit=RETRY_LIMIT,
        retry_policy="Always",
        backoff=m.Backoff(duration="15s", factor=m.IntOrString("2"), max_duration="10m"),
    )


def _container(
    name: str,
    step: str,
    inputs: list[Input],
    *,
    retry: bool = False,
    deadline_s: str | None = None,
) -> Container:
    args = [step, "--run-id", RUN_ID]
    for item in inputs:
        args += item.args()
    args += ["--result-path", RESULT_PATH]
    parameters = [item.parameter() for item in inputs]
    if deadline_s is not None:
        parameters.append(
            Parameter(name=DEADLINE_INPUT, default=deadline_s, description="Pod deadline (s)")
        )
    return Container(
        name=name,
        image=DEFAULT_LAUNCHER_IMAGE,
        command=["mnnvl"],
        args=args,
        inputs=parameters,
        outputs=[
            Parameter(
                name="result",
                value_from=m.ValueFrom(path=RESULT_PATH, default="{}"),
                description="The step's JSON result",
            )
        ],
        resources=LAUNCHER_RESOURCES,
        retry_strategy=_retry() if retry else None,
        active_deadline_seconds=(
            f"{{{{inputs.parameters.{DEADLINE_INPUT}}}}}" if deadline_s is not None else None
        ),
        labels={"app.kubernetes.io/part-of": "mnnvl-pipelines", "mnnvl.io/step": step},
    )


def provision_template(name: str = "provision") -> Container:
    """Create or adopt the ComputeDomain; idempotent, so it retries."""
    return _container(name, "provision", DOMAIN_INPUTS, retry=True)


def train_template(name: str = "train") -> Container:
    """Run the multi-node training Job; no retry (a rerun costs GPU hours)."""
    return _container(name, "train", TRAIN_INPUTS, deadline_s="28800")


def verify_template(name: str = "verify") -> Container:
    """Run the NVLink verification Job; exits 4 on a FAIL verdict."""
    return _container(name, "verify", VERIFY_INPUTS, deadline_s="3600")


def teardown_template(name: str = "teardown") -> Container:
    """Delete the run's objects (workload, then ComputeDomain); idempotent, so it retries."""
    return _container(name, "teardown", TEARDOWN_INPUTS, retry=True)
