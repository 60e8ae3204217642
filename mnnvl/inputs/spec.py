"""Validated inputs: frozen dataclasses that refuse a bad value in ``__post_init__`` with a
one-line message naming the field. Each field is declared once (``opt``: default, help, the
surfaces that expose it); the CLI flags, KFP signatures and Argo inputs come from these.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import MISSING, dataclass, field
from typing import Any, TypeVar

from mnnvl.errors import SpecError
from mnnvl.inputs import checks, defaults
from mnnvl.inputs.namespace import FALLBACK_NAMESPACE
from mnnvl.inputs.storage import parse_pvc

CLI, KFP, ARGO = "cli", "kfp", "argo"
DEFAULT_WARMUP_STEPS = 5
EVERY_SURFACE = (CLI, KFP, ARGO)
T = TypeVar("T")
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def opt(
    default: Any = MISSING,
    help: str = "",
    *,
    surfaces: tuple[str, ...] = EVERY_SURFACE,
    why: str = "",
    choices: tuple[str, ...] = (),
    valid: tuple[float, float] | str | None = None,
    example: tuple[str, ...] = (),
    group: str = "",
) -> Any:
    """A field with its help and the surfaces (cli, kfp, argo) that expose it; ``why`` says why
    a surface lacks it. ``choices``: a closed set (an Argo drop-down); ``valid``: a number's
    range (``check_declared``) or the valid values in words; ``example``: a list input's value;
    ``group``: its group on KFP and Argo where the spec nests none."""
    meta = {
        "help": help,
        "surfaces": frozenset(surfaces),
        "why": why,
        "choices": choices,
        "valid": valid,
        "example": example,
        "group": group,
    }
    if isinstance(default, dict):  # mutable: each spec gets a dict of its own
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def check_declared(spec: Any) -> None:
    """Every number of ``spec`` within its declared range (``opt(valid=...)``) and every value
    with declared ``choices`` one of them, in field order."""
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(f.metadata.get("valid"), tuple):
            lo, hi = f.metadata["valid"]
            checks.check_range(f.name, value, lo, hi, integer=f.type == "int")
        if f.metadata.get("choices"):
            checks.check_choice(f.name, value, f.metadata["choices"])


def group(cls: type) -> Any:
    """A spec's field holding one group of its inputs (``workload.recovery``); on KFP and Argo
    the group is one parameter named as the field, on the CLI its inputs are flags."""
    return field(default_factory=cls, metadata={"nested": cls})


def _given_to_groups(cls: type, inputs: dict[str, Any], current: Any = None) -> dict[str, Any]:
    """``inputs`` with each one a nested group holds given to that group: the group given
    whole, else ``current``'s, changed; else a new one."""
    kwargs = dict(inputs)
    for f in dataclasses.fields(cls):
        kind: Any = f.metadata.get("nested")
        mine = kind and {g.name for g in dataclasses.fields(kind)} & kwargs.keys()
        if mine:
            given = {k: kwargs.pop(k) for k in mine}
            whole = kwargs.get(f.name, getattr(current, f.name, None))
            kwargs[f.name] = dataclasses.replace(whole, **given) if whole else kind(**given)
    return kwargs


def from_inputs(cls: type[T], **inputs: Any) -> T:
    """A ``cls`` from its inputs by name, each given to the group that holds it
    (``from_inputs(WorkloadSpec, run_id="r", max_restarts=1)``); a group may also be given whole."""
    return cls(**_given_to_groups(cls, inputs))


def fields_of(cls: type) -> list[tuple[type, dataclasses.Field[Any], str]]:
    """Every input field of ``cls`` with the class declaring it and the field its nested group
    sits in (``recovery``; "" for a field of ``cls`` itself)."""
    out = []
    for f in dataclasses.fields(cls):
        nested = f.metadata.get("nested")
        out += [(c, g, f.name) for c, g, _ in fields_of(nested)] if nested else [(cls, f, "")]
    return out


def leaves(spec: Any) -> list[tuple[dataclasses.Field[Any], Any]]:
    """Every input field of ``spec`` with its value, a nested group's in place."""
    return [
        (f, getattr(getattr(spec, n) if n else spec, f.name)) for _, f, n in fields_of(type(spec))
    ]


def with_inputs(spec: T, **inputs: Any) -> T:
    """``spec`` with inputs changed by name, wherever they are nested (validated again)."""
    return dataclasses.replace(spec, **_given_to_groups(type(spec), inputs, spec))  # type: ignore[type-var]


# The inputs of a group on KFP and Argo that a spec does not nest (``opt(group=...)``).
train_opt = functools.partial(opt, group="train")
verify_opt = functools.partial(opt, group="verify")
recovery_opt = functools.partial(opt, group="recovery")
deadlines_opt = functools.partial(opt, group="deadlines")
# Inputs several specs share, declared once (a pipeline that runs both workers, or every
# step, has one parameter for each).
api_outage_opt = functools.partial(
    deadlines_opt,
    300.0,
    "how long an unreachable or overloaded Kubernetes API (restart, fail-over) is ridden "
    "out by every request and wait, s; a longer outage ends the step with exit 5",
    valid=(0, 86400),
)
collective_timeout_opt = functools.partial(
    recovery_opt,
    300.0,
    "how long a collective waits for a dead or hung peer before the worker fails "
    "(retriable), s; NCCL's own default is 600",
    valid=(1, 86400),
)
stall_timeout_opt = functools.partial(
    recovery_opt,
    0.0,
    "the pod stops its workers (retriable) when one made no progress for this long, s; "
    "0 = derived in training: 10 x the slowest recent step, at least 60, at most "
    "2 x collective_timeout_s + 60 (the bound before the first steps, during checkpoint "
    "saves and loads, and in verification)",
    valid=(0, 7 * 86400),
)


class _WorkerTimeouts:
    """The collective and stall timeouts of the training and the verification workers."""

    collective_timeout_s: float
    stall_timeout_s: float

    def _check_stall(self) -> None:
        if self.stall_timeout_s and self.stall_timeout_s <= self.collective_timeout_s:
            raise SpecError(
                "stall_timeout_s",
                f"{self.stall_timeout_s:g} must exceed recovery.collective_timeout_s "
                f"{self.collective_timeout_s:g} (a collective may wait that long on a slow peer)",
            )

    @property
    def stall_s(self) -> float:
        """The stall bound the workers report. Unset: a worker may block in two collectives
        between progress reports (a checkpoint save is barriers around a write) plus a minute
        for the write; the launcher shortens it from the steps it sees (``Watchdog``)."""
        return self.stall_timeout_s or 2 * self.collective_timeout_s + 60


@dataclass(frozen=True, kw_only=True)
class OwnerRef:
    """An owner for created objects (the launcher pod or Argo Workflow), so GC backs up teardown."""

    api_version: str
    kind: str
    name: str
    uid: str

    def __post_init__(self) -> None:
        for f in ("api_version", "kind", "name", "uid"):
            if not getattr(self, f):
                raise SpecError(f"owner.{f}", "must be non-empty")


@dataclass(frozen=True, kw_only=True)
class _Run:
    """Which run, in which namespace, owned by whom: what the domain and the workload share."""

    run_id: str = opt(
        help="run id every name and label derives from (KFP job id, Argo workflow uid)",
        surfaces=(CLI,),
        why="pipelines supply it: KFP's job id, Argo's {{workflow.uid}}",
    )
    namespace: str = opt(
        "",
        "namespace of the ComputeDomain and Jobs ('' = the pod's own, else default)",
        valid="'' or a namespace name (lowercase letters, digits and -, at most 63)",
    )
    owner: OwnerRef | None = opt(
        None,
        surfaces=(),
        why="found at run time (the launcher pod with --owner-pod), never typed in",
    )

    def __post_init__(self) -> None:
        checks.check_run_id(self.run_id)
        if not self.namespace:  # the edges resolve "" to the pod's own; here it means default
            object.__setattr__(self, "namespace", FALLBACK_NAMESPACE)
        checks.check_dns_label("namespace", self.namespace)
        check_declared(self)


@dataclass(frozen=True, kw_only=True)
class DomainSpec(_Run):
    """What provision and teardown need: which run, where, and how the channel is allocated."""

    allocation_mode: str = opt(
        "Single",
        "IMEX channels per pod: Single (channel0) or All",
        choices=defaults.ALLOCATION_MODES,
        group="placement",
    )
    rct_timeout_s: float = deadlines_opt(
        120.0, "wait for the DRA controller's channel claim template, s", valid=(0.1, 86400)
    )
    delete_timeout_s: float = deadlines_opt(
        300.0, "wait until each deleted object is gone (GET 404), s", valid=(0.1, 86400)
    )
    api_outage_s: float = api_outage_opt()


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where the worker pods run: NVLink clique groups, GPUs and node selection."""

    nodes_per_clique: int = opt(
        0,
        "nodes in each NVLink clique group (one Job each; HSDP training, per-clique verify); "
        "0 = all nodes in one clique",
        valid="a whole number from 0 to max_nodes_per_clique that divides nodes",
    )
    max_nodes_per_clique: int = opt(
        defaults.MAX_NODES, "most nodes one NVLink clique holds (NVL72: 18)", valid=(1, 99)
    )
    gpu_mode: str = opt(
        "auto",
        "auto (at run time: claim where GPUs come only from the DRA driver, else limits; "
        "rendered as limits), limits (device plugin nvidia.com/gpu) or claim (DRA claim)",
        choices=defaults.GPU_MODES,
    )
    gpu_device_class: str = opt(
        "gpu.nvidia.com",
        "DeviceClass for gpu_mode claim",
        valid="a DeviceClass name (lowercase DNS subdomain)",
    )
    clique_affinity: bool = opt(
        True, "keep every pod (of each clique group) inside one NVLink clique (clique_label)"
    )
    clique_label: str = opt(
        defaults.CLIQUE_LABEL,
        "node label whose value names a node's NVLink clique (GPU Feature Discovery or the DRA "
        "driver set nvidia.com/gpu.clique; some providers use a key of their own)",
        valid="a label key: [DNS-subdomain prefix/]name, name at most 63 characters",
    )
    node_selector: dict[str, str] = opt(
        {},
        "extra node selector for worker pods, KEY=VALUE (repeatable)",
        example=("nvidia.com/gpu.product=NVIDIA-GB200",),
    )
    tolerations: tuple[str, ...] = opt(
        (),
        "extra toleration for worker pods, key[=value]:Effect (repeatable)",
        example=("nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute"),
    )
    priority_class: str = opt(
        "",
        "PriorityClass of the worker pods",
        valid="'' or a PriorityClass name",
    )
    topology_aware: bool = opt(
        False, "with queue_name: Kueue topology-aware scheduling, each group in one clique"
    )

    def __post_init__(self) -> None:
        check_declared(self)
        checks.check_label_key("clique_label", self.clique_label)
        checks.check_subdomain("gpu_device_class", self.gpu_device_class, "DeviceClass")
        per = self.max_nodes_per_clique
        checks.check_range("nodes_per_clique", self.nodes_per_clique, 0, per, integer=True)
        for key, value in self.node_selector.items():
            checks.check_label_key("node_selector", key)
            checks.check_label_value("node_selector", value)
        for item in self.tolerations:
            checks.parse_toleration(item)
        if self.priority_class:
            checks.check_subdomain("priority_class", self.priority_class, "PriorityClass")


@dataclass(frozen=True, kw_only=True)
class PodTemplate:
    """The worker pods' template."""

    rdzv_port: int = opt(29500, "rendezvous port on pod 0 (MASTER_PORT)", valid=(1024, 65535))
    worker_service_account: str = opt(
        "",
        "service account of the worker pods ('' = namespace default)",
        valid="'' or a ServiceAccount name of the namespace",
    )
    pod_security: str = opt(
        "restricted",
        "Pod Security Standard the worker pods meet: restricted (non-root uid 1000) or "
        "baseline (the image's own user, root allowed, for images that need it)",
        choices=defaults.POD_SECURITY_LEVELS,
    )
    pvc: tuple[str, ...] = opt(
        (),
        "PersistentVolumeClaim mounted in every worker, CLAIM:/mount/path[:ro] (repeatable)",
        example=("shared-ckpt:/ckpt", "datasets:/data:ro"),
    )
    shm_size: str = opt(
        "16Gi",
        "size of the workers' /dev/shm, e.g. 16Gi",
        valid="a size in Mi or Gi, e.g. 512Mi or 16Gi",
    )
    ttl_after_finished_s: int = opt(
        0,
        "ttlSecondsAfterFinished of the Job, s; 0 = none: a finished Job stays until teardown, "
        "so the step run again returns its result instead of running it again",
        valid=(0, 30 * 86400),
    )
    image_pull_policy: str = opt(
        "IfNotPresent", "Always, IfNotPresent or Never", choices=("Always", "IfNotPresent", "Never")
    )
    trainjob_runtime: str = opt(
        "torch-distributed",
        "the ClusterTrainingRuntime whose pod template a TrainJob takes (with workload trainjob)",
        valid="a ClusterTrainingRuntime name (lowercase letters, digits and -, at most 63)",
    )

    def __post_init__(self) -> None:
        check_declared(self)
        if self.worker_service_account:
            checks.check_dns_label(
                "worker_service_account", self.worker_service_account, max_len=253
            )
        if not re.fullmatch(r"\d+(Mi|Gi)", self.shm_size):
            raise SpecError("shm_size", f"{self.shm_size!r} must look like 512Mi or 16Gi")
        parse_pvc(self.pvc)
        checks.check_dns_label("trainjob_runtime", self.trainjob_runtime)


@dataclass(frozen=True, kw_only=True)
class Deadlines:
    """A workload's deadlines and graces, in seconds."""

    admission_timeout_s: float = opt(
        0.0,
        "how long the Job may stay queued (suspended, e.g. by Kueue), s; 0 = no limit",
        valid=(0, 30 * 86400),
    )
    pods_running_timeout_s: float = opt(
        900.0,
        "deadline for all worker pods to run, s; IMEX start-up can take minutes",
        valid=(1, 86400),
    )
    unschedulable_grace_s: float = opt(
        60.0,
        "how long a pod may stay Unschedulable (or its node held by another ComputeDomain, or "
        "its creation refused by a ResourceQuota) before the step fails, s",
        valid=(0, 86400),
    )
    api_outage_s: float = api_outage_opt()

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """Gang restarts of every rank after a retriable failure."""

    max_restarts: int = opt(
        3,
        "gang restarts of every rank (from the last checkpoint) before the step fails; the "
        "Job's backoffLimitPerIndex is this, so that each restart has a retry on every index",
        valid=(0, 100),
    )

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec(_Run):
    """The multi-node Indexed Job: shape, image and NCCL profile, and its groups (``placement``,
    ``pod``, ``deadlines``, ``recovery``), each a dataclass of its own."""

    purpose: str = opt("train", "Job name suffix: train, verify-pre, verify-post, verify or job")
    nodes: int = opt(
        2,
        "worker pods, one per node; more than one clique needs nodes_per_clique (multiple of it)",
        valid="a whole number from 1; over max_nodes_per_clique a multiple of nodes_per_clique",
    )
    gpus_per_node: int = opt(
        4,
        "GPUs per worker pod; 0 = one CPU process per pod (gloo)",
        valid=(0, defaults.MAX_GPUS_PER_NODE),
    )
    image: str = opt(
        defaults.DEFAULT_IMAGE,
        "worker image (torch, NCCL >= 2.25.2; mnnvl-pipelines to train)",
        valid="an image reference: [registry/]path[:tag][@sha256:digest], path in lowercase",
    )
    nccl_profile: str = opt(
        "production",
        "production, verify-strict or single-host (docs/verification.md, NCCL profiles)",
        choices=defaults.NCCL_PROFILES,
    )
    env: dict[str, str] = opt(
        {},
        "extra worker environment, NAME=VALUE (repeatable; values may hold , =)",
        example=("NCCL_DEBUG=INFO", "NCCL_IB_HCA=mlx5_0,mlx5_1"),
    )
    queue_name: str = opt(
        "",
        "Kueue LocalQueue: labels the Job kueue.x-k8s.io/queue-name",
        valid="'' or a LocalQueue name of the namespace",
    )
    job_timeout_s: float = opt(
        7200.0, "deadline for the Job to complete, s (activeDeadline)", valid=(1, 7 * 86400)
    )
    workload: str = opt(
        "job",
        "train as an Indexed Job (job) or as a Kubeflow Trainer v2 TrainJob (trainjob; Trainer "
        ">= v2.4.0, docs/trainjob.md)",
        choices=("job", "trainjob"),
    )
    placement: Placement = group(Placement)
    pod: PodTemplate = group(PodTemplate)
    deadlines: Deadlines = group(Deadlines)
    recovery: Recovery = group(Recovery)

    def __post_init__(self) -> None:
        super().__post_init__()
        checks.check_choice("purpose", self.purpose, defaults.PURPOSES)
        self._check_cliques()
        if self.workload == "trainjob":
            self._check_trainjob()
        checks.check_image("image", self.image)
        checks.check_env("env", self.env)
        if self.queue_name:
            checks.check_dns_label("queue_name", self.queue_name)

    def _check_cliques(self) -> None:
        per, place = self.placement.max_nodes_per_clique, self.placement
        checks.check_range("nodes", self.nodes, 1, defaults.MAX_GROUPS * per, integer=True)
        if not place.nodes_per_clique and self.nodes > per:
            raise SpecError(
                "nodes",
                f"{self.nodes} nodes do not fit one NVLink clique of at most {per}; set "
                "placement.nodes_per_clique to place them as several clique groups",
            )
        if place.nodes_per_clique and self.nodes % place.nodes_per_clique:
            raise SpecError(
                "nodes",
                f"{self.nodes} is not a multiple of placement.nodes_per_clique "
                f"{place.nodes_per_clique}",
            )
        if place.topology_aware and not self.queue_name:
            raise SpecError("topology_aware", "needs queue_name (Kueue admits the groups)")
        several_groups = place.nodes_per_clique and self.nodes > place.nodes_per_clique
        if self.queue_name and several_groups and not place.topology_aware:
            raise SpecError(
                "topology_aware",
                "several clique groups under Kueue run as one Job that Kueue admits whole "
                "and places group by group with topology-aware scheduling: set "
                f"placement.topology_aware (a Kueue Topology with the level {place.clique_label})",
            )

    def _check_trainjob(self) -> None:
        """A TrainJob has one replicated job, and its runtime patches carry no priority class."""
        if self.groups > 1:
            raise SpecError(
                "nodes_per_clique",
                "clique groups need one Job per group; a TrainJob has one: set "
                "placement.nodes_per_clique to 0 or workload to job",
            )
        if self.placement.priority_class:
            raise SpecError(
                "priority_class",
                "a TrainJob cannot carry a priority class: set it in the runtime's pod template, "
                "or leave placement.priority_class empty",
            )

    @property
    def trainer_runtime(self) -> str:
        """The ClusterTrainingRuntime a TrainJob workload names; "" for the Indexed Job."""
        return self.pod.trainjob_runtime if self.workload == "trainjob" else ""

    @property
    def procs_per_node(self) -> int:
        """Worker processes per pod: one per GPU, or one CPU (gloo) process without GPUs."""
        return max(1, self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def group_nodes(self) -> int:
        """Nodes in each clique group (all of them with one group)."""
        return self.placement.nodes_per_clique or self.nodes

    @property
    def groups(self) -> int:
        """Clique groups: one Indexed Job each, all in one rendezvous."""
        return self.nodes // self.group_nodes


@dataclass(frozen=True, kw_only=True)
class TrainConfig(_WorkerTimeouts):
    """The sharded training step (runs in worker pods as ``python -m mnnvl.runtime.train``).

    ``batch_size`` 0 and the levers left at ``auto`` take the model preset's values
    (``defaults.PRESET_TRAIN_DEFAULTS``) here, so every surface and the worker see concrete values.
    """

    model: str = opt("tiny", "model preset", choices=defaults.MODEL_PRESETS)
    steps: int = opt(20, "optimizer steps in total, across resumes", valid=(1, 10_000_000))
    seq_len: int = train_opt(0, "sequence length; 0 = the preset's", valid=(0, 131072))
    batch_size: int = opt(
        0, "sequences per rank per step; 0 = the preset's (8b: 4, 1b: 8, else 2)", valid=(0, 4096)
    )
    lr: float = train_opt(3e-4, "peak learning rate", valid=(1e-8, 1.0))
    warmup_steps: int = train_opt(
        DEFAULT_WARMUP_STEPS,
        "linear warm-up steps before the cosine decay (capped at steps)",
        valid=(0, 10_000_000),
    )
    min_lr_ratio: float = train_opt(
        0.1, "final learning rate as a fraction of the peak", valid=(0.0, 1.0)
    )
    weight_decay: float = train_opt(0.1, "AdamW weight decay", valid=(0.0, 10.0))
    grad_clip: float = train_opt(1.0, "gradient norm clip; 0 = off", valid=(0.0, 1e6))
    dtype: str = train_opt("auto", "auto = bf16 on GPU, fp32 on CPU", choices=defaults.DTYPES)
    compile: str = train_opt(
        "auto",
        "torch.compile each block: true, false, or auto = on GPUs for the 125m preset and "
        "larger (never on CPU)",
        choices=defaults.SWITCHES,
    )
    activation_checkpointing: str = train_opt(
        "auto",
        f"recompute blocks' activations in the backward pass: {checks.CHECKPOINTING_HELP}; "
        "auto = the preset's (8b: every-2, else none)",
        valid="auto, none, full or every-N with N from 1 to 9999",
    )
    reshard_after_forward: str = train_opt(
        "auto",
        "FSDP frees each block's gathered weights after forward (true) or keeps them for "
        "backward (false: one all-gather less, more memory); auto = the preset's (8b: false)",
        choices=defaults.SWITCHES,
    )
    data: str = opt(
        "synthetic",
        "synthetic, or a token file under a pvc mount (.bin)",
        valid="synthetic, or an absolute path under a pvc mount",
    )
    seed: int = train_opt(0, "random seed for weights and synthetic data", valid=(0, 2**31 - 1))
    checkpoint_dir: str = recovery_opt(
        "",
        "checkpoint directory under a pvc mount; a rerun resumes",
        valid="'' or an absolute path under a pvc mount",
    )
    checkpoint_every: int = recovery_opt(
        0, "steps between checkpoints; 0 = only at the end", valid=(0, 10_000_000)
    )
    allow_local_checkpoint: bool = recovery_opt(
        False, "accept checkpoint_dir/data outside a pvc mount (single-node runs only)"
    )
    log_every: int = train_opt(10, "steps between logged metrics", valid=(1, 10_000_000))
    collective_timeout_s: float = collective_timeout_opt()
    stall_timeout_s: float = stall_timeout_opt()

    def __post_init__(self) -> None:
        check_declared(self)
        self._apply_preset()
        if self.warmup_steps > self.steps:
            if self.warmup_steps != DEFAULT_WARMUP_STEPS:
                raise SpecError(
                    "warmup_steps",
                    f"{self.warmup_steps} is more than steps {self.steps} (the learning rate "
                    f"would never reach its peak); set train.warmup_steps to {self.steps} or fewer",
                )
            # The default warm-up on a run shorter than it: the whole run warms up.
            object.__setattr__(self, "warmup_steps", self.steps)
        if not self.data:
            raise SpecError("data", "must be 'synthetic' or a path to a token file")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise SpecError("checkpoint_every", "needs recovery.checkpoint_dir to be set")
        self._check_stall()

    def _apply_preset(self) -> None:
        """Inputs left at auto (batch_size 0) take the preset's value; a given value wins."""
        if self.activation_checkpointing != "auto":
            checks.parse_checkpointing("activation_checkpointing", self.activation_checkpointing)
        preset = defaults.PLAIN_TRAIN_DEFAULTS | defaults.PRESET_TRAIN_DEFAULTS.get(self.model, {})
        for f in dataclasses.fields(self):
            if f.name in preset and getattr(self, f.name) == f.default:  # auto, batch_size 0
                object.__setattr__(self, f.name, preset[f.name])

    @property
    def ac_every(self) -> int:
        """Checkpoint every N-th block (1 = all of them); 0 = no activation checkpointing."""
        return checks.parse_checkpointing("activation_checkpointing", self.activation_checkpointing)

    @property
    def reshard(self) -> bool:
        return self.reshard_after_forward == "true"

    def compiles(self, on_gpu: bool) -> bool:
        """Whether the blocks are compiled: ``compile`` when given; for auto, GPU runs of
        ``defaults.COMPILED_PRESETS`` (the one place this is decided)."""
        if self.compile != "auto":
            return self.compile == "true"
        return on_gpu and self.model in defaults.COMPILED_PRESETS


@dataclass(frozen=True, kw_only=True)
class VerifyConfig(_WorkerTimeouts):
    """NVLink/NCCL verification (runs in worker pods as ``python -m mnnvl.runtime.verify``);
    the help texts say what 0 picks."""

    min_bytes: int = verify_opt(
        0, "smallest all-reduce size, e.g. 1M; 0 = 1 MiB on GPU, 1 KiB on CPU", valid=(0, 1 << 36)
    )
    max_bytes: int = verify_opt(
        0, "largest all-reduce size, e.g. 4G; 0 = 4 GiB on GPU, 1 MiB on CPU", valid=(0, 1 << 36)
    )
    iters: int = verify_opt(
        0,
        "timed all-reduces per size; 0 = adaptive (mean known within 1 percent)",
        valid=(0, 100_000),
    )
    warmup_iters: int = verify_opt(
        0, "untimed all-reduces before each size; 0 = automatic", valid=(0, 100_000)
    )
    min_busbw_gbps: float = verify_opt(
        0.0,
        "pass threshold, GB/s; 0 = a matching baseline, else active links x speed x efficiency",
        valid=(0.0, 100_000.0),
    )
    min_inter_clique_busbw_gbps: float = verify_opt(
        0.0,
        "pass threshold for the sweeps across clique groups, GB/s; 0 = not judged",
        valid=(0.0, 100_000.0),
    )
    efficiency: float = verify_opt(
        0.62, "fraction of the NVLink limit a derived threshold asks for", valid=(0.01, 1.0)
    )
    judge_min_bytes: int = verify_opt(
        1 << 30, "sizes from this one up are judged against the threshold", valid=(1, 1 << 36)
    )
    fabric_wait_s: float = deadlines_opt(
        60.0,
        "how long verify waits for a GPU fabric still registering (NOT_STARTED, IN_PROGRESS), s",
        valid=(0.0, 3600.0),
    )
    cuda_graphs: bool = verify_opt(
        True, "also time small sizes as CUDA graphs and direct NCCL calls"
    )
    allow_unjudged: bool = verify_opt(
        False, "accept NOT_JUDGED (no bandwidth threshold applied, e.g. CPU/gloo) as success"
    )
    collective_timeout_s: float = collective_timeout_opt()
    stall_timeout_s: float = stall_timeout_opt()
    output_dir: str = opt(
        "",
        "a directory inside the worker pod where rank 0 writes verify.json/.md/.html and "
        "busbw.png (e.g. on a pvc mount); the step's own reports go to --report-dir",
        surfaces=(CLI,),
        why="a directory inside the worker pod; pipelines get the reports as artifacts",
    )

    def __post_init__(self) -> None:
        check_declared(self)
        if self.min_bytes and self.max_bytes and self.min_bytes > self.max_bytes:
            raise SpecError(
                "min_bytes", f"{self.min_bytes} is larger than verify.max_bytes {self.max_bytes}"
            )
        self._check_stall()


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """What ``launch`` runs in every worker pod: a Python module started once per GPU by
    the pods' launcher (torchrun's worker variables, rendezvous from the Job's env), or any
    command, which receives ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK``,
    ``NNODES``, ``NPROC_PER_NODE`` and ``JOB_COMPLETION_INDEX`` and starts its own processes."""

    module: str = opt(
        "",
        "Python module to run once per GPU (torchrun's variables); '' = run `command`",
        valid="'' or a Python module name such as pkg.entry",
    )
    command: tuple[str, ...] = opt(
        (),
        "with a module: its arguments; without: the program and its arguments (a list)",
        example=("python3", "train.py", "--steps", "100"),
    )

    def __post_init__(self) -> None:
        if self.module and not MODULE_NAME.match(self.module):
            raise SpecError("module", f"{self.module!r} is not a Python module name like a.b")
        if not all(isinstance(a, str) for a in self.command):
            raise SpecError("command", "every item must be a string")
        if not self.module and not self.command:
            raise SpecError("command", "is empty: give a module or a command to run")
