"""One line of ``--help`` text per input field (the flags come from ``mnnvl.spec``)."""

from __future__ import annotations

FIELD_HELP: dict[str, str] = {
    # DomainSpec
    "run_id": "run id every name and label derives from (KFP job id, Argo workflow uid)",
    "namespace": "namespace of the ComputeDomain and Jobs (default: the pod's own, else default)",
    "allocation_mode": "IMEX channels per pod: Single (channel0) or All (default: Single)",
    "rct_timeout_s": "wait for the DRA controller's channel claim template, s (default: 120)",
    "delete_timeout_s": "wait until each deleted object is gone (GET 404), s (default: 300)",
    # WorkloadSpec
    "purpose": "Job name suffix: train, verify-pre, verify-post, verify or job",
    "nodes": "worker pods, one per node; more than one clique needs --nodes-per-clique "
    "(default: 2)",
    "nodes_per_clique": "nodes in each NVLink clique group (one Job each; HSDP and per-clique "
    "verify); --nodes must be a multiple (default: 0 = all nodes in one clique)",
    "max_nodes_per_clique": "most nodes one NVLink clique holds (default: 18, an NVL72 rack)",
    "gpus_per_node": "GPUs per worker pod; 0 = one CPU process per pod (gloo) (default: 4)",
    "image": "worker (runtime) image with torch, NCCL >= 2.25.2 and mnnvl-pipelines",
    "gpu_mode": "limits (device plugin nvidia.com/gpu) or claim (DRA gpu.nvidia.com)",
    "gpu_device_class": "DeviceClass for --gpu-mode claim (default: gpu.nvidia.com)",
    "clique_affinity": "keep each clique group's pods inside one nvidia.com/gpu.clique "
    "(default: on)",
    "nccl_profile": "production, verify-strict or single-host (see README, NCCL profiles)",
    "env": "extra worker environment, NAME=VALUE (repeatable)",
    "rdzv_port": "torchrun rendezvous port on pod 0 (default: 29500)",
    "service_account": "service account of the worker pods (default: the namespace's default)",
    "node_selector": "extra node selector for worker pods, KEY=VALUE (repeatable)",
    "tolerations": "extra toleration for worker pods, key[=value]:Effect (repeatable)",
    "priority_class": "PriorityClass of the worker pods",
    "queue_name": "Kueue LocalQueue: labels the Job kueue.x-k8s.io/queue-name=<name>",
    "topology_aware": "with --queue-name: ask Kueue topology-aware scheduling for each group "
    "inside one nvidia.com/gpu.clique (default: off)",
    "admission_timeout_s": "how long the Job may stay queued (suspended, e.g. by Kueue) before "
    "the step fails, s; 0 = no limit (default: 0)",
    "pvc": "PersistentVolumeClaim mounted in every worker, CLAIM:/mount/path[:ro] (repeatable)",
    "shm_size": "size of the workers' /dev/shm, e.g. 16Gi (default: 16Gi)",
    "pods_running_timeout_s": "deadline for all worker pods to run, s; IMEX start-up can take "
    "minutes (default: 900)",
    "unschedulable_grace_s": "how long a pod may stay Unschedulable (or its node held by another "
    "ComputeDomain) before the step fails, s (default: 60)",
    "job_timeout_s": "deadline for the Job to complete, s; also its activeDeadlineSeconds",
    "ttl_after_finished_s": "ttlSecondsAfterFinished of the Job (default: 3600)",
    "backoff_limit_per_index": "retries per pod index before the Job fails (default: 0)",
    "image_pull_policy": "Always, IfNotPresent or Never (default: IfNotPresent)",
    # TrainConfig
    "model": "model preset: tiny, small, 125m, 350m, 1b, 3b, 8b (default: tiny)",
    "steps": "optimizer steps in total, across resumes (default: 20)",
    "seq_len": "sequence length; 0 = the preset's (default: 0)",
    "batch_size": "sequences per rank per step (default: 2)",
    "lr": "peak learning rate (default: 3e-4)",
    "warmup_steps": "linear warm-up steps before the cosine decay (default: 5)",
    "min_lr_ratio": "final learning rate as a fraction of the peak (default: 0.1)",
    "weight_decay": "AdamW weight decay (default: 0.1)",
    "grad_clip": "gradient norm clip; 0 = off (default: 1.0)",
    "dtype": "auto (bf16 on GPU, fp32 on CPU), bf16 or fp32",
    "compile": "torch.compile each block (default: off)",
    "activation_checkpointing": "recompute activations in the backward pass (default: off)",
    "data": "synthetic, or a token file under a --pvc mount (.bin uint16, .u32.bin uint32)",
    "seed": "random seed for weights and synthetic data (default: 0)",
    "checkpoint_dir": "checkpoint directory under a --pvc mount; a restarted run resumes from it",
    "checkpoint_every": "steps between checkpoints; 0 = only at the end (default: 0)",
    "allow_local_checkpoint": "accept --checkpoint-dir/--data outside a --pvc mount "
    "(single-node runs only)",
    "log_every": "steps between logged metrics (default: 10)",
    # VerifyConfig
    "min_bytes": "smallest all-reduce size, e.g. 1M; 0 = 1 MiB on GPU, 1 KiB on CPU",
    "max_bytes": "largest all-reduce size, e.g. 4G; 0 = 4 GiB on GPU, 1 MiB on CPU",
    "iters": "timed all-reduces per size; 0 = adaptive (until the mean is known within 1 percent)",
    "warmup_iters": "untimed all-reduces before each size; 0 = automatic",
    "min_busbw_gbps": "pass threshold in GB/s; 0 = active links x link speed x efficiency",
    "min_inter_clique_busbw_gbps": "pass threshold in GB/s for the sweeps across cliques; "
    "0 = not judged",
    "efficiency": "fraction of the NVLink limit a derived threshold asks for (default: 0.62)",
    "judge_min_bytes": "sizes from this one up are judged against the threshold (default: 1G)",
    "cuda_graphs": "also time small sizes as CUDA graphs and direct NCCL calls (default: on)",
    "allow_unjudged": "accept NOT_JUDGED (no bandwidth threshold applied, e.g. CPU/gloo) as "
    "success (default: off; a gate then fails)",
    "output_dir": "write verify.json/.md/.html and busbw.png here (rank 0)",
}
