"""Validated inputs. Every bad value stops here with a one-line message naming the field.

The dataclasses are frozen and validate in ``__post_init__``; nothing talks to a cluster
or imports a heavy library. ``add_arguments``/``from_namespace``/``to_args`` turn any of
them into command-line flags and back, so the CLI, the worker pods and the pipeline
components share one definition of every input.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from mnnvl.errors import SpecError
from mnnvl.storage import parse_pvc

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_IMAGE_DOMAIN = rf"{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?"
IMAGE_REF = re.compile(
    rf"^(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)

ALLOCATION_MODES = ("Single", "All")
GPU_MODES = ("limits", "claim")
NCCL_PROFILES = ("production", "verify-strict", "single-host")
PURPOSES = ("train", "verify-pre", "verify-post", "verify", "job")
MODEL_PRESETS = ("tiny", "small", "125m", "350m", "1b", "3b", "8b")
DTYPES = ("auto", "bf16", "fp32")
MAX_NODES = 18  # one IMEX domain (NVL72 rack: 18 compute trays); MNNVL never spans cliques
MAX_GROUPS = 999_999  # clique groups of one run (bounded only by the 63-character hostnames)
MAX_GPUS_PER_NODE = 8
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
FALLBACK_NAMESPACE = "default"
DEFAULT_IMAGE = "ghcr.io/mnnvl-pipelines/runtime:0.1.0"
DEFAULT_LAUNCHER_IMAGE = "ghcr.io/mnnvl-pipelines/launcher:0.1.0"

# Values that silently disable MNNVL; refused wherever a user can pass environment.
FORBIDDEN_ENV = {"NCCL_CUMEM_ENABLE": "0"}
# Set on the GPU hosts to keep NVLink multicast off; nothing we ship may override them.
PINNED_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
# Set by the Job itself (rendezvous, rank, profile); a user value would break the run.
JOB_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NPROC_PER_NODE",
    "MNNVL_RUN_ID",
    "JOB_COMPLETION_INDEX",
    "MNNVL_NCCL_PROFILE",
    "MNNVL_GPUS_PER_NODE",
    "MNNVL_NUM_GROUPS",
    "MNNVL_GROUP_INDEX",
    "MNNVL_NODES_PER_GROUP",
    "MNNVL_NODE_RANK_BASE",
)
# Placement across NVLink cliques, set on every worker by the Job builder (one Job per group).
NUM_GROUPS_ENV = "MNNVL_NUM_GROUPS"
GROUP_INDEX_ENV = "MNNVL_GROUP_INDEX"
NODES_PER_GROUP_ENV = "MNNVL_NODES_PER_GROUP"
NODE_RANK_BASE_ENV = "MNNVL_NODE_RANK_BASE"


def pod_namespace() -> str:
    """The namespace of the pod this process runs in, or "" outside a pod.

    ``POD_NAMESPACE`` (downward API) wins; else the service account's namespace file, which
    every pod with a mounted token has. Read locally: a namespace-scoped account may not GET
    namespaces.
    """
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"].strip()
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def resolve_namespace(value: str) -> str:
    """``value``, or when it is empty the pod's own namespace, else ``default``."""
    return value or pod_namespace() or FALLBACK_NAMESPACE


def check_dns_label(field_name: str, value: str, *, max_len: int = 63) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(field_name, "must be a non-empty string")
    if len(value) > max_len:
        raise SpecError(field_name, f"{value!r} is {len(value)} characters; at most {max_len}")
    if not DNS1123_LABEL.match(value):
        raise SpecError(
            field_name,
            f"{value!r} is not a DNS-1123 label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit)",
        )


def check_run_id(value: str) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(
            "run_id", "must be a non-empty string (e.g. the KFP job id or Argo workflow uid)"
        )
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise SpecError(
            "run_id",
            f"{value!r} must be a valid label value: at most 63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit",
        )


def check_range(
    field_name: str, value: float, lo: float, hi: float, *, integer: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field_name, f"must be a number, got {value!r}")
    if integer and not isinstance(value, int):
        raise SpecError(field_name, f"must be a whole number, got {value!r}")
    if math.isnan(value) or not lo <= value <= hi:
        raise SpecError(field_name, f"{value!r} is out of range; allowed {lo:g}..{hi:g}")


def check_choice(field_name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(field_name, f"{value!r} is not one of {', '.join(choices)}")


def check_image(field_name: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(
            field_name, "must name a container image, e.g. registry.example.com/team/trainer:1.0"
        )
    if len(value) > 512 or not IMAGE_REF.match(value):
        raise SpecError(
            field_name,
            f"{value!r} is not a valid image reference "
            "([registry/]path[:tag][@sha256:digest], path in lowercase)",
        )


def check_env(field_name: str, env: dict[str, str]) -> None:
    for name, val in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise SpecError(f"{field_name}.{name}", "is not a valid environment variable name")
        if not isinstance(val, str):
            raise SpecError(f"{field_name}.{name}", f"value must be a string, got {val!r}")
        if FORBIDDEN_ENV.get(name) == val.strip():
            raise SpecError(
                f"{field_name}.{name}",
                f"{name}={val} silently disables MNNVL "
                "(NCCL needs cuMem for fabric memory); remove it",
            )


def parse_env(items: list[str] | tuple[str, ...] | str, field: str = "env") -> dict[str, str]:
    """Parse ``NAME=value`` items (a list, or one comma-separated string); blanks are skipped."""
    if isinstance(items, str):
        items = items.split(",")
    env: dict[str, str] = {}
    for item in (i for i in items if i.strip()):
        if "=" not in item:
            raise SpecError(field, f"{item!r} must look like NAME=value")
        name, val = item.split("=", 1)
        env[name.strip()] = val
    return env


def parse_list(items: list[str] | tuple[str, ...] | str) -> tuple[str, ...]:
    """A list flag's items, or one comma-separated string, without blanks."""
    if isinstance(items, str):
        items = items.split(",")
    return tuple(i.strip() for i in items if i.strip())


def check_label_key(field_name: str, key: str) -> None:
    prefix, _, name = key.rpartition("/")
    ok = bool(name) and len(name) <= 63 and bool(LABEL_VALUE.match(name))
    if prefix:
        ok = ok and len(prefix) <= 253 and bool(DNS1123_SUBDOMAIN.match(prefix))
    if not ok:
        raise SpecError(field_name, f"{key!r} is not a label key ([prefix/]name, name <= 63 chars)")


def check_label_value(field_name: str, value: str) -> None:
    if value and (len(value) > 63 or not LABEL_VALUE.match(value)):
        raise SpecError(
            field_name, f"{value!r} is not a label value (<= 63 chars, alphanumeric ends)"
        )


TOLERATION = re.compile(r"^(?P<key>[^=:]+)(?:=(?P<value>[^:]*))?:(?P<effect>[A-Za-z]+)$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_toleration(item: str) -> dict[str, str]:
    """``key[=value]:Effect`` -> a pod toleration (Equal with a value, else Exists)."""
    m = TOLERATION.match(item)
    if not m:
        raise SpecError("tolerations", f"{item!r} must look like key[=value]:Effect")
    check_label_key("tolerations", m["key"])
    check_choice("tolerations", m["effect"], TAINT_EFFECTS)
    if m["value"] is None:
        return {"key": m["key"], "operator": "Exists", "effect": m["effect"]}
    check_label_value("tolerations", m["value"])
    return {"key": m["key"], "operator": "Equal", "value": m["value"], "effect": m["effect"]}


def parse_bytes(field_name: str, value: str | int) -> int:
    """Parse a byte count like ``1M``, ``64MiB``, ``4G`` or ``1048576`` (binary units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(value), re.IGNORECASE)
    if not m:
        raise SpecError(field_name, f"{value!r} is not a size like 1M, 64MiB or 4G")
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")


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
class DomainSpec:
    """What provision and teardown need: which run, where, and how the channel is allocated."""

    run_id: str
    namespace: str = "default"  # "": the launcher pod's own namespace, else "default"
    allocation_mode: str = "Single"
    rct_timeout_s: float = 120.0
    delete_timeout_s: float = 300.0
    owner: OwnerRef | None = None

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        object.__setattr__(self, "namespace", resolve_namespace(self.namespace))
        check_dns_label("namespace", self.namespace)
        check_choice("allocation_mode", self.allocation_mode, ALLOCATION_MODES)
        check_range("rct_timeout_s", self.rct_timeout_s, 0.1, 86400)
        check_range("delete_timeout_s", self.delete_timeout_s, 0.1, 86400)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """The multi-node Indexed Job: shape, image, placement, NCCL profile and deadlines."""

    run_id: str
    namespace: str = "default"  # "": the launcher pod's own namespace, else "default"
    purpose: str = "train"
    nodes: int = 2
    nodes_per_clique: int = 0  # 0: all nodes in one clique
    max_nodes_per_clique: int = MAX_NODES
    gpus_per_node: int = 4
    image: str = DEFAULT_IMAGE
    gpu_mode: str = "limits"
    gpu_device_class: str = "gpu.nvidia.com"
    clique_affinity: bool = True
    nccl_profile: str = "production"
    env: dict[str, str] = field(default_factory=dict)
    rdzv_port: int = 29500
    service_account: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    priority_class: str = ""
    queue_name: str = ""
    topology_aware: bool = False
    admission_timeout_s: float = 0.0
    pvc: tuple[str, ...] = ()
    shm_size: str = "16Gi"
    pods_running_timeout_s: float = 900.0
    unschedulable_grace_s: float = 60.0
    job_timeout_s: float = 7200.0
    ttl_after_finished_s: int = 3600
    backoff_limit_per_index: int = 0
    image_pull_policy: str = "IfNotPresent"
    owner: OwnerRef | None = None

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        object.__setattr__(self, "namespace", resolve_namespace(self.namespace))
        check_dns_label("namespace", self.namespace)
        check_choice("purpose", self.purpose, PURPOSES)
        self._check_cliques()
        check_range("gpus_per_node", self.gpus_per_node, 0, MAX_GPUS_PER_NODE, integer=True)
        check_image("image", self.image)
        check_choice("gpu_mode", self.gpu_mode, GPU_MODES)
        if not DNS1123_SUBDOMAIN.match(self.gpu_device_class) or len(self.gpu_device_class) > 253:
            raise SpecError(
                "gpu_device_class", f"{self.gpu_device_class!r} is not a DeviceClass name"
            )
        check_choice("nccl_profile", self.nccl_profile, NCCL_PROFILES)
        check_env("env", self.env)
        for name in self.env:
            if name in JOB_ENV:
                raise SpecError(f"env.{name}", "is set by the Job itself; remove it")
            if name in PINNED_ENV:
                raise SpecError(f"env.{name}", "is pinned by the machine and must not be set")
        check_range("rdzv_port", self.rdzv_port, 1024, 65535, integer=True)
        if self.service_account:
            check_dns_label("service_account", self.service_account, max_len=253)
        self._check_scheduling()
        if not re.fullmatch(r"\d+(Mi|Gi)", self.shm_size):
            raise SpecError("shm_size", f"{self.shm_size!r} must look like 512Mi or 16Gi")
        parse_pvc(self.pvc)
        check_range("admission_timeout_s", self.admission_timeout_s, 0, 30 * 86400)
        check_range("pods_running_timeout_s", self.pods_running_timeout_s, 1, 86400)
        check_range("unschedulable_grace_s", self.unschedulable_grace_s, 0, 86400)
        check_range("job_timeout_s", self.job_timeout_s, 1, 7 * 86400)
        check_range("ttl_after_finished_s", self.ttl_after_finished_s, 0, 30 * 86400, integer=True)
        check_range("backoff_limit_per_index", self.backoff_limit_per_index, 0, 10, integer=True)
        check_choice(
            "image_pull_policy", self.image_pull_policy, ("Always", "IfNotPresent", "Never")
        )

    def _check_cliques(self) -> None:
        check_range("max_nodes_per_clique", self.max_nodes_per_clique, 1, 99, integer=True)
        per = self.max_nodes_per_clique
        check_range("nodes_per_clique", self.nodes_per_clique, 0, per, integer=True)
        check_range("nodes", self.nodes, 1, MAX_GROUPS * per, integer=True)
        if not self.nodes_per_clique and self.nodes > per:
            raise SpecError(
                "nodes",
                f"{self.nodes} nodes do not fit one NVLink clique of at most {per}; set "
                "nodes_per_clique to place them as several clique groups",
            )
        if self.nodes_per_clique and self.nodes % self.nodes_per_clique:
            raise SpecError(
                "nodes",
                f"{self.nodes} is not a multiple of nodes_per_clique {self.nodes_per_clique}",
            )
        if self.topology_aware and not self.queue_name:
            raise SpecError("topology_aware", "needs queue_name (Kueue admits the groups)")

    def _check_scheduling(self) -> None:
        for key, value in self.node_selector.items():
            check_label_key("node_selector", key)
            check_label_value("node_selector", value)
        for item in self.tolerations:
            parse_toleration(item)
        if self.priority_class and not DNS1123_SUBDOMAIN.match(self.priority_class):
            raise SpecError(
                "priority_class", f"{self.priority_class!r} is not a PriorityClass name"
            )
        if self.queue_name:
            check_dns_label("queue_name", self.queue_name)

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
        return self.nodes_per_clique or self.nodes

    @property
    def groups(self) -> int:
        """Clique groups: one Indexed Job each, all in one rendezvous."""
        return self.nodes // self.group_nodes


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The sharded training step (runs in worker pods as ``python -m mnnvl.runtime.train``)."""

    model: str = "tiny"
    steps: int = 20
    seq_len: int = 0
    batch_size: int = 2
    lr: float = 3e-4
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dtype: str = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    data: str = "synthetic"
    seed: int = 0
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    allow_local_checkpoint: bool = False
    log_every: int = 10

    def __post_init__(self) -> None:
        check_choice("model", self.model, MODEL_PRESETS)
        check_range("steps", self.steps, 1, 10_000_000, integer=True)
        check_range("seq_len", self.seq_len, 0, 131072, integer=True)
        check_range("batch_size", self.batch_size, 1, 4096, integer=True)
        check_range("lr", self.lr, 1e-8, 1.0)
        check_range("warmup_steps", self.warmup_steps, 0, 10_000_000, integer=True)
        if self.warmup_steps > self.steps:
            raise SpecError(
                "warmup_steps",
                f"{self.warmup_steps} is more than steps {self.steps} (the learning rate would "
                f"never reach its peak); pass --warmup-steps {self.steps} or fewer (default 5)",
            )
        check_range("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_range("weight_decay", self.weight_decay, 0.0, 10.0)
        check_range("grad_clip", self.grad_clip, 0.0, 1e6)
        check_choice("dtype", self.dtype, DTYPES)
        if not self.data:
            raise SpecError("data", "must be 'synthetic' or a path to a token file")
        check_range("seed", self.seed, 0, 2**31 - 1, integer=True)
        check_range("checkpoint_every", self.checkpoint_every, 0, 10_000_000, integer=True)
        if self.checkpoint_every and not self.checkpoint_dir:
            raise SpecError("checkpoint_every", "needs checkpoint_dir to be set")
        check_range("log_every", self.log_every, 1, 10_000_000, integer=True)


@dataclass(frozen=True, kw_only=True)
class VerifyConfig:
    """NVLink/NCCL verification (runs in worker pods as ``python -m mnnvl.runtime.verify``).

    Sizes of 0 mean "pick for the device": 1 MiB..4 GiB on GPUs, 1 KiB..1 MiB on CPU.
    ``min_busbw_gbps`` of 0 means "derive the threshold from the detected topology"
    (active links x per-link speed x ``efficiency``). ``allow_unjudged`` accepts a
    NOT_JUDGED verdict (no threshold could be applied, e.g. CPU/gloo) as success.
    With several clique groups, ``min_inter_clique_busbw_gbps`` judges the sweeps that cross
    cliques (0: those parts are NOT_JUDGED); each clique is judged like a single-clique run.
    """

    min_bytes: int = 0
    max_bytes: int = 0
    iters: int = 0
    warmup_iters: int = 0
    min_busbw_gbps: float = 0.0
    min_inter_clique_busbw_gbps: float = 0.0
    efficiency: float = 0.62
    judge_min_bytes: int = 1 << 30
    cuda_graphs: bool = True
    allow_unjudged: bool = False
    output_dir: str = ""

    def __post_init__(self) -> None:
        check_range("min_bytes", self.min_bytes, 0, 1 << 36, integer=True)
        check_range("max_bytes", self.max_bytes, 0, 1 << 36, integer=True)
        if self.min_bytes and self.max_bytes and self.min_bytes > self.max_bytes:
            raise SpecError(
                "min_bytes", f"{self.min_bytes} is larger than max_bytes {self.max_bytes}"
            )
        check_range("iters", self.iters, 0, 100_000, integer=True)
        check_range("warmup_iters", self.warmup_iters, 0, 100_000, integer=True)
        check_range("min_busbw_gbps", self.min_busbw_gbps, 0.0, 100_000.0)
        check_range("min_inter_clique_busbw_gbps", self.min_inter_clique_busbw_gbps, 0.0, 100_000.0)
        check_range("efficiency", self.efficiency, 0.01, 1.0)
        check_range("judge_min_bytes", self.judge_min_bytes, 1, 1 << 36, integer=True)
