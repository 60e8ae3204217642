"""The four KFP lightweight components: provision, train, verify, teardown.

Each component is a signature and a docstring; the body calls ``mnnvl.steps`` inside the
launcher image (which carries ``mnnvl-pipelines[kfp]``, so nothing is pip-installed at run
time). Object names come from ``run_id`` (pass ``dsl.PIPELINE_JOB_ID_PLACEHOLDER``), which
is what lets the teardown exit task find everything without reading other tasks' outputs.

Defaults in the signatures are literals on purpose: KFP embeds the function source in the
pipeline, so a default naming a module constant would not resolve in the task pod.
"""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Metrics, Output

from mnnvl.spec import DEFAULT_LAUNCHER_IMAGE

LAUNCHER_IMAGE = DEFAULT_LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)
def provision_domain(
    run_id: str,
    namespace: str = "default",
    allocation_mode: str = "Single",
    rct_timeout_s: float = 120.0,
) -> str:
    """Create (or adopt) the run's ComputeDomain and wait for its channel claim template.

    Args:
        run_id: Run id every object name and label derives from (the KFP job id).
        namespace: Namespace of the ComputeDomain and the workload.
        allocation_mode: IMEX channel allocation, ``Single`` or ``All``.
        rct_timeout_s: How long to wait for the DRA controller to create the template.

    Returns:
        The ComputeDomain name.
    """
    from mnnvl import spec, steps
    from mnnvl.components.artifacts import kubeconfig

    domain = spec.DomainSpec(
        run_id=run_id,
        namespace=namespace,
        allocation_mode=allocation_mode,
        rct_timeout_s=rct_timeout_s,
    )
    return steps.provision(domain, kubeconfig=kubeconfig()).domain


@dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)
def train_sharded(
    run_id: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    result: Output[Artifact],
    namespace: str = "default",
    nodes: int = 2,
    gpus_per_node: int = 4,
    image: str = "ghcr.io/mnnvl-pipelines/runtime:0.1.0",
    gpu_mode: str = "limits",
    clique_affinity: bool = True,
    nccl_profile: str = "production",
    env: str = "",
    service_account: str = "",
    node_selector: str = "",
    tolerations: str = "",
    priority_class: str = "",
    queue_name: str = "",
    pvc: str = "",
    shm_size: str = "16Gi",
    model: str = "tiny",
    steps: int = 20,
    seq_len: int = 0,
    batch_size: int = 2,
    lr: float = 3e-4,
    warmup_steps: int = 5,
    dtype: str = "auto",
    compile: bool = False,
    activation_checkpointing: bool = False,
    data: str = "synthetic",
    seed: int = 0,
    checkpoint_dir: str = "",
    checkpoint_every: int = 0,
    log_every: int = 10,
    pods_running_timeout_s: float = 900.0,
    job_timeout_s: float = 7200.0,
):
    """Run FSDP2 training as a multi-node Indexed Job inside the run's ComputeDomain.

    Args:
        run_id: Run id shared by every task of the run.
        metrics: tokens_per_s, tokens_per_s_per_gpu, mfu (GPU only), final_loss, steps,
            peak_mem_gib, world_size, wall_s.
        report: HTML training report with the loss curve.
        result: JSON of the step result (the worker's RESULT line under ``raw``).
        namespace: Namespace of the run.
        nodes: Worker pods, one per node.
        gpus_per_node: GPUs per worker pod (0 runs one CPU process per pod).
        image: Worker (runtime) image.
        gpu_mode: ``limits`` (device plugin) or ``claim`` (DRA ``gpu.nvidia.com``).
        clique_affinity: Keep all pods inside one NVLink clique.
        nccl_profile: NCCL profile, normally ``production``.
        env: Extra worker environment as ``NAME=value,NAME2=value2``.
        service_account: Service account of the worker pods ("" = namespace default).
        node_selector: Extra node selector of the worker pods, ``key=value,key2=value2``.
        tolerations: Extra tolerations of the worker pods, ``key[=value]:Effect,...``.
        priority_class: PriorityClass of the worker pods.
        queue_name: Kueue LocalQueue for the worker Job (label kueue.x-k8s.io/queue-name).
        pvc: PersistentVolumeClaims mounted in every worker, ``CLAIM:/path[:ro],...``.
        shm_size: Size of the worker's /dev/shm.
        model: Model preset (tiny, small, 125m, 350m, 1b, 3b, 8b).
        steps: Optimizer steps.
        seq_len: Sequence length (0 = the preset's).
        batch_size: Micro-batch per rank.
        lr: Peak learning rate.
        warmup_steps: Linear warm-up steps.
        dtype: auto, bf16 or fp32.
        compile: torch.compile the model.
        activation_checkpointing: Recompute activations in the backward pass.
        data: ``synthetic`` or a path to a token file visible to the workers.
        seed: Random seed.
        checkpoint_dir: Shared directory for checkpoints and resume ("" = none).
        checkpoint_every: Steps between checkpoints (0 = only at the end).
        log_every: Steps between logged losses.
        pods_running_timeout_s: Deadline for all worker pods to be Running.
        job_timeout_s: Deadline for the Job to complete.
    """
    from mnnvl import spec
    from mnnvl import steps as mnnvl_steps
    from mnnvl.components.artifacts import kubeconfig, publish_train

    workload = spec.WorkloadSpec(
        run_id=run_id,
        namespace=namespace,
        purpose="train",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        image=image,
        gpu_mode=gpu_mode,
        clique_affinity=clique_affinity,
        nccl_profile=nccl_profile,
        env=spec.parse_env(env),
        service_account=service_account,
        node_selector=spec.parse_env(node_selector, "node_selector"),
        tolerations=spec.parse_list(tolerations),
        priority_class=priority_class,
        queue_name=queue_name,
        pvc=spec.parse_list(pvc),
        shm_size=shm_size,
        pods_running_timeout_s=pods_running_timeout_s,
        job_timeout_s=job_timeout_s,
    )
    config = spec.TrainConfig(
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
    )
    outcome = mnnvl_steps.train(workload, config, kubeconfig=kubeconfig())
    publish_train(run_id, outcome, metrics, report, result)


@dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)
def verify_nvlink(
    run_id: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    result: Output[Artifact],
    purpose: str = "verify",
    fail_on_fail: bool = True,
    namespace: str = "default",
    nodes: int = 2,
    gpus_per_node: int = 4,
    image: str = "ghcr.io/mnnvl-pipelines/runtime:0.1.0",
    gpu_mode: str = "limits",
    clique_affinity: bool = True,
    nccl_profile: str = "verify-strict",
    env: str = "",
    service_account: str = "",
    node_selector: str = "",
    tolerations: str = "",
    priority_class: str = "",
    queue_name: str = "",
    pvc: str = "",
    shm_size: str = "16Gi",
    min_busbw_gbps: float = 0.0,
    efficiency: float = 0.62,
    min_bytes: int = 0,
    max_bytes: int = 0,
    judge_min_bytes: int = 1073741824,
    iters: int = 0,
    warmup_iters: int = 0,
    cuda_graphs: bool = True,
    allow_unjudged: bool = False,
    pods_running_timeout_s: float = 900.0,
    job_timeout_s: float = 1800.0,
):
    """Check NVLink/IMEX health and all-reduce bus bandwidth across the run's nodes.

    The metrics and reports are written before the verdict is enforced, so a FAIL still
    leaves its numbers behind; then the task fails (when ``fail_on_fail``) with them.

    Args:
        run_id: Run id shared by every task of the run.
        metrics: verdict_pass (1/0), peak_busbw_gbps, judged_busbw_gbps, threshold_gbps,
            world_size, and busbw_gbps_<size> per message size.
        report: HTML verification report with the busbw-vs-size plot.
        result: JSON of the step result (the worker's RESULT line under ``raw``).
        purpose: Job purpose: ``verify-pre``, ``verify-post`` or ``verify``.
        fail_on_fail: Fail the task on a FAIL verdict (a gate) instead of only reporting.
        namespace: Namespace of the run.
        nodes: Worker pods, one per node.
        gpus_per_node: GPUs per worker pod (0 runs one CPU process per pod, gloo).
        image: Worker (runtime) image.
        gpu_mode: ``limits`` (device plugin) or ``claim`` (DRA ``gpu.nvidia.com``).
        clique_affinity: Keep all pods inside one NVLink clique.
        nccl_profile: NCCL profile, normally ``verify-strict`` (MNNVL forced on).
        env: Extra worker environment as ``NAME=value,NAME2=value2``.
        service_account: Service account of the worker pods ("" = namespace default).
        node_selector: Extra node selector of the worker pods, ``key=value,key2=value2``.
        tolerations: Extra tolerations of the worker pods, ``key[=value]:Effect,...``.
        priority_class: PriorityClass of the worker pods.
        queue_name: Kueue LocalQueue for the worker Job (label kueue.x-k8s.io/queue-name).
        pvc: PersistentVolumeClaims mounted in every worker, ``CLAIM:/path[:ro],...``.
        shm_size: Size of the worker's /dev/shm.
        min_busbw_gbps: Pass threshold in GB/s (0 = derive from the detected topology).
        efficiency: Fraction of the link limit a derived threshold asks for.
        min_bytes: Smallest all-reduce size (0 = pick for the device).
        max_bytes: Largest all-reduce size (0 = pick for the device).
        judge_min_bytes: Sizes from this one up are judged against the threshold.
        iters: Timed iterations per size (0 = pick for the device).
        warmup_iters: Warm-up iterations per size (0 = pick for the device).
        cuda_graphs: Time the collectives through CUDA graphs.
        allow_unjudged: Accept NOT_JUDGED (no bandwidth threshold could be applied, e.g. a
            CPU/gloo run) as success; GPU pipelines leave it off.
        pods_running_timeout_s: Deadline for all worker pods to be Running.
        job_timeout_s: Deadline for the Job to complete.
    """
    from mnnvl import spec, steps
    from mnnvl.components.artifacts import kubeconfig, publish_verify
    from mnnvl.errors import VerificationFailed

    workload = spec.WorkloadSpec(
        run_id=run_id,
        namespace=namespace,
        purpose=purpose,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        image=image,
        gpu_mode=gpu_mode,
        clique_affinity=clique_affinity,
        nccl_profile=nccl_profile,
        env=spec.parse_env(env),
        service_account=service_account,
        node_selector=spec.parse_env(node_selector, "node_selector"),
        tolerations=spec.parse_list(tolerations),
        priority_class=priority_class,
        queue_name=queue_name,
        pvc=spec.parse_list(pvc),
        shm_size=shm_size,
        pods_running_timeout_s=pods_running_timeout_s,
        job_timeout_s=job_timeout_s,
    )
    config = spec.VerifyConfig(
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        iters=iters,
        warmup_iters=warmup_iters,
        min_busbw_gbps=min_busbw_gbps,
        efficiency=efficiency,
        judge_min_bytes=judge_min_bytes,
        cuda_graphs=cuda_graphs,
        allow_unjudged=allow_unjudged,
    )
    outcome = steps.verify(workload, config, kubeconfig=kubeconfig(), fail_on_fail=False)
    publish_verify(run_id, outcome, purpose, metrics, report, result)
    if fail_on_fail and not steps.verdict_accepted(outcome.verdict, allow_unjudged):
        raise VerificationFailed(
            f"{purpose}: verdict {outcome.verdict}: judged busbw {outcome.judged_busbw_gbps} GB/s, "
            f"peak {outcome.peak_busbw_gbps} GB/s, threshold {outcome.threshold_gbps} GB/s; "
            f"reasons: {'; '.join(outcome.raw.get('reasons') or []) or 'none given'}"
        )


@dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)
def teardown_domain(
    run_id: str,
    namespace: str = "default",
    delete_timeout_s: float = 300.0,
):
    """Delete every object of the run (workload first, then the ComputeDomain); idempotent.

    Meant as the pipeline's exit task: it reads only pipeline parameters and the run id.

    Args:
        run_id: Run id shared by every task of the run.
        namespace: Namespace of the run.
        delete_timeout_s: How long to wait until each object is gone (GET returns 404).
    """
    from mnnvl import spec, steps
    from mnnvl.components.artifacts import kubeconfig

    domain = spec.DomainSpec(run_id=run_id, namespace=namespace, delete_timeout_s=delete_timeout_s)
    steps.teardown(domain, kubeconfig=kubeconfig())


COMPONENTS = {
    "provision_domain": provision_domain,
    "train_sharded": train_sharded,
    "verify_nvlink": verify_nvlink,
    "teardown_domain": teardown_domain,
}
"""Component name -> component, in pipeline order (used by the compiler and the tests)."""
