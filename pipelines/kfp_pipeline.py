"""KFP pipelines: ``mnnvl-training`` and ``mnnvl-verify-only``.

Shape of ``mnnvl-training``::

    ExitHandler(teardown-domain):
        provision-domain -> verify-pre (gate) -> train -> verify-post

Every task gets the run id from ``dsl.PIPELINE_JOB_ID_PLACEHOLDER`` and derives all object
names from it, because the exit task may not consume other tasks' outputs. Caching is off
for every task (they all act on the cluster); only the idempotent steps (provision,
teardown) retry.
"""

from typing import Any

from kfp import dsl, kubernetes

from mnnvl.components.kfp_components import (
    provision_domain,
    teardown_domain,
    train_sharded,
    verify_nvlink,
)

TRAINING_PIPELINE_NAME = "mnnvl-training"
VERIFY_ONLY_PIPELINE_NAME = "mnnvl-verify-only"
RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER
RETRIES = 2
RETRY_BACKOFF = "15s"
LAUNCHER_UID = 65532  # the launcher image's USER


def _launcher_pod(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Non-root (KFP's compiler already drops capabilities and privilege escalation) and
    small resource requests: the launcher only waits on the API server."""
    kubernetes.set_security_context(
        task, run_as_user=LAUNCHER_UID, run_as_group=LAUNCHER_UID, run_as_non_root=True
    )
    return task.set_cpu_request("100m").set_memory_request("256Mi").set_memory_limit("1Gi")


def _idempotent(task: dsl.PipelineTask, display_name: str) -> dsl.PipelineTask:
    _launcher_pod(task).set_caching_options(False)
    task.set_retry(num_retries=RETRIES, backoff_duration=RETRY_BACKOFF, backoff_factor=2.0)
    return task.set_display_name(display_name)


def _once(task: dsl.PipelineTask, display_name: str) -> dsl.PipelineTask:
    # Training and verification create Jobs that cost GPU hours; a retry is a user decision.
    _launcher_pod(task).set_caching_options(False)
    return task.set_display_name(display_name)


@dsl.pipeline(
    name=TRAINING_PIPELINE_NAME,
    description=(
        "Provision a ComputeDomain, verify NVLink (gate), run sharded multi-node training, "
        "verify again, and always tear down."
    ),
)
def training_pipeline(
    namespace: str = "default",
    nodes: int = 2,
    gpus_per_node: int = 4,
    image: str = "ghcr.io/mnnvl-pipelines/runtime:0.1.0",
    gpu_mode: str = "limits",
    allocation_mode: str = "Single",
    clique_affinity: bool = True,
    env: str = "",
    worker_service_account: str = "",
    node_selector: str = "",
    tolerations: str = "",
    priority_class: str = "",
    queue_name: str = "",
    pvc: str = "",
    shm_size: str = "16Gi",
    model: str = "1b",
    steps: int = 100,
    seq_len: int = 0,
    batch_size: int = 4,
    lr: float = 3e-4,
    warmup_steps: int = 5,
    dtype: str = "auto",
    compile: bool = True,
    activation_checkpointing: bool = False,
    data: str = "synthetic",
    seed: int = 0,
    checkpoint_dir: str = "",
    checkpoint_every: int = 0,
    log_every: int = 10,
    min_busbw_gbps: float = 0.0,
    efficiency: float = 0.62,
    verify_max_bytes: int = 0,
    verify_iters: int = 0,
    allow_unjudged: bool = False,
    rct_timeout_s: float = 120.0,
    delete_timeout_s: float = 300.0,
    pods_running_timeout_s: float = 900.0,
    train_timeout_s: float = 7200.0,
    verify_timeout_s: float = 1800.0,
) -> None:
    """Train on a multi-node NVLink domain with NVLink verification before and after."""
    teardown = _idempotent(
        teardown_domain(run_id=RUN_ID, namespace=namespace, delete_timeout_s=delete_timeout_s),
        "teardown",
    )
    workload: dict[str, Any] = {
        "run_id": RUN_ID,
        "namespace": namespace,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "image": image,
        "gpu_mode": gpu_mode,
        "clique_affinity": clique_affinity,
        "env": env,
        "service_account": worker_service_account,
        "node_selector": node_selector,
        "tolerations": tolerations,
        "priority_class": priority_class,
        "queue_name": queue_name,
        "pvc": pvc,
        "shm_size": shm_size,
        "pods_running_timeout_s": pods_running_timeout_s,
    }
    verify_args: dict[str, Any] = {
        **workload,
        "min_busbw_gbps": min_busbw_gbps,
        "efficiency": efficiency,
        "max_bytes": verify_max_bytes,
        "iters": verify_iters,
        "allow_unjudged": allow_unjudged,
        "job_timeout_s": verify_timeout_s,
    }
    with dsl.ExitHandler(teardown, name="mnnvl-run"):
        provision = _idempotent(
            provision_domain(
                run_id=RUN_ID,
                namespace=namespace,
                allocation_mode=allocation_mode,
                rct_timeout_s=rct_timeout_s,
            ),
            "provision",
        )
        pre = _once(verify_nvlink(purpose="verify-pre", **verify_args), "verify-pre")
        pre.after(provision)
        train = _once(
            train_sharded(
                **workload,
                model=model,
                steps=steps,
                seq_len=seq_len,
                batch_size=batch_size,
                lr=lr,
                warmup_steps=warmup_steps,
                dtype=dtype,
                compile=compile,
                activation_checkpointing=activation_checkpointing,
                data=data,
                seed=seed,
                checkpoint_dir=checkpoint_dir,
                checkpoint_every=checkpoint_every,
                log_every=log_every,
                job_timeout_s=train_timeout_s,
            ),
            "train",
        )
        train.after(pre)
        post = _once(verify_nvlink(purpose="verify-post", **verify_args), "verify-post")
        post.after(train)


@dsl.pipeline(
    name=VERIFY_ONLY_PIPELINE_NAME,
    description="Provision a ComputeDomain, verify NVLink across its nodes, and always tear down.",
)
def verify_only_pipeline(
    namespace: str = "default",
    nodes: int = 2,
    gpus_per_node: int = 4,
    image: str = "ghcr.io/mnnvl-pipelines/runtime:0.1.0",
    gpu_mode: str = "limits",
    allocation_mode: str = "Single",
    clique_affinity: bool = True,
    env: str = "",
    worker_service_account: str = "",
    node_selector: str = "",
    tolerations: str = "",
    priority_class: str = "",
    queue_name: str = "",
    min_busbw_gbps: float = 0.0,
    efficiency: float = 0.62,
    verify_max_bytes: int = 0,
    verify_iters: int = 0,
    allow_unjudged: bool = False,
    rct_timeout_s: float = 120.0,
    delete_timeout_s: float = 300.0,
    pods_running_timeout_s: float = 900.0,
    verify_timeout_s: float = 1800.0,
) -> None:
    """Check a multi-node NVLink domain: IMEX channels, NVML links and all-reduce busbw."""
    teardown = _idempotent(
        teardown_domain(run_id=RUN_ID, namespace=namespace, delete_timeout_s=delete_timeout_s),
        "teardown",
    )
    with dsl.ExitHandler(teardown, name="mnnvl-run"):
        provision = _idempotent(
            provision_domain(
                run_id=RUN_ID,
                namespace=namespace,
                allocation_mode=allocation_mode,
                rct_timeout_s=rct_timeout_s,
            ),
            "provision",
        )
        verify = _once(
            verify_nvlink(
                run_id=RUN_ID,
                purpose="verify",
                namespace=namespace,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                image=image,
                gpu_mode=gpu_mode,
                clique_affinity=clique_affinity,
                env=env,
                service_account=worker_service_account,
                node_selector=node_selector,
                tolerations=tolerations,
                priority_class=priority_class,
                queue_name=queue_name,
                min_busbw_gbps=min_busbw_gbps,
                efficiency=efficiency,
                max_bytes=verify_max_bytes,
                iters=verify_iters,
                allow_unjudged=allow_unjudged,
                pods_running_timeout_s=pods_running_timeout_s,
                job_timeout_s=verify_timeout_s,
            ),
            "verify",
        )
        verify.after(provision)


PIPELINES = {
    TRAINING_PIPELINE_NAME: training_pipeline,
    VERIFY_ONLY_PIPELINE_NAME: verify_only_pipeline,
}
