"""What each ``mnnvl`` subcommand does, for ``mnnvl <command> --help``."""

from __future__ import annotations

# Subcommand -> (one-line help, what it does beyond that line, an example). Every example runs
# as written against `mnnvl sim up` (tests/sim/test_examples.py), so it uses CPU workers.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "provision": (
        "create or adopt the run's ComputeDomain",
        "Waits for the DRA driver's IMEX channel claim template, never for Ready (that needs "
        "the workload's pods).",
        "mnnvl provision --run-id demo --namespace team-a",
    ),
    "launch": (
        "run your module or command on the domain's nodes",
        "One pod per node: --module once per GPU with torchrun's variables, or --command -- CMD "
        "ARGS with MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK, NNODES, NPROC_PER_NODE. "
        "Prints its RESULT line (optional: without one the Job's success decides).",
        "mnnvl launch --run-id demo --namespace team-a --nodes 2 --gpus-per-node 0 "
        "--module torch.utils.collect_env",
    ),
    "train": (
        "train on the domain's nodes",
        "Sharded (FSDP2) training of a Llama-style model; prints loss, tokens/s and MFU.",
        "mnnvl train --run-id demo --namespace team-a --nodes 2 --gpus-per-node 0 "
        "--model tiny --steps 20",
    ),
    "verify": (
        "verify NVLink on the domain's nodes",
        "NVML checks and an all-reduce bus-bandwidth sweep, judged against a threshold from the "
        "detected topology or --min-busbw-gbps (needed on CPU, as in the example).",
        "mnnvl verify --run-id demo --namespace team-a --nodes 2 --gpus-per-node 0 "
        "--min-busbw-gbps 0.001 --report-dir out/",
    ),
    "teardown": (
        "delete the run's workload, then its domain",
        "Waits until the pods, then the ComputeDomain, are gone. Idempotent.",
        "mnnvl teardown --run-id demo --namespace team-a",
    ),
    "status": (
        "show the run's domain, Jobs and pods (read-only)",
        "The run's ComputeDomain and its nodes, Jobs, pods and Services as the cluster has them.",
        "mnnvl status --run-id demo --namespace team-a",
    ),
    "logs": (
        "print the log of one of the run's worker pods",
        "The pod of the run's latest step, on stdout (the result line goes to stderr).",
        "mnnvl logs --run-id demo --namespace team-a --rank 1",
    ),
    "preflight": (
        "check that the cluster is ready for a run (read-only)",
        "One row per check (ComputeDomain CRD, DeviceClasses, clique labels, IMEX channels, GPU "
        "stack and --gpu-mode, IMEX mode, --queue-name, permissions), each failing row with its "
        "fix; cluster-scoped rows need manifests/overlays/cluster-reader (else SKIPPED). Exit 0 "
        "when no row fails, 4 when one does, 5 when the API is unreachable, 2 on bad input.",
        "mnnvl preflight --namespace team-a --nodes 2 --gpus-per-node 0 --report-dir out/",
    ),
    "run": (
        "provision, verify, train, verify, teardown",
        "In one process; teardown runs whatever happened before it.",
        "mnnvl run --sim --run-id demo --nodes 2 --gpus-per-node 0 --min-busbw-gbps 0.001",
    ),
    "render": (
        "print every object of a run as YAML",
        "On stdout (the result line goes to stderr); needs no cluster.",
        "mnnvl render --run-id demo --namespace team-a | kubectl apply --dry-run=server -f -",
    ),
    "reap": (
        "delete objects of runs that are gone",
        "A backstop for exit handlers that KFP Terminate or argo terminate skipped.",
        "mnnvl reap --namespace team-a --older-than-s 86400 --dry-run",
    ),
    "baselines": (
        "print the bus-bandwidth baseline table",
        "What verify judges against without --min-busbw-gbps, with sources, on stderr (a "
        "partial NVL72 rack gets the rack's row). Needs no cluster.",
        "mnnvl baselines --system gb200 --nodes 4 --gpus-per-node 4",
    ),
    "sim": (
        "the embedded simulated cluster",
        "API server, DRA driver, Jobs and a kubelet running pods as local processes; other "
        "shells use it through the kubeconfig it prints.",
        "mnnvl sim up --nodes 2 --gpus-per-node 0 --kubeconfig sim.kubeconfig",
    ),
}
