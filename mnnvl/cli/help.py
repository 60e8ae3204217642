"""What each ``mnnvl`` subcommand does, for ``mnnvl <command> --help``."""

from __future__ import annotations

# Subcommand -> (one-line help, what it does, an example). Every example runs as written
# against `mnnvl sim up` (tests/sim/test_examples.py), so it uses CPU workers (0 GPUs).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "provision": (
        "create or adopt the run's ComputeDomain",
        "Create the run's ComputeDomain (or adopt it when this run already made it) and wait "
        "until the DRA driver has created its IMEX channel claim template. Never waits for "
        "Ready: that needs the workload's pods.",
        "mnnvl provision --run-id demo --namespace team-a",
    ),
    "launch": (
        "run your module or command on the domain's nodes",
        "Run a Python module once per GPU (--module, torchrun's variables) or any command "
        "(--command -- CMD ARGS, "
        "which gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK, NNODES, NPROC_PER_NODE) "
        "on every node of the run's domain (one pod per node) and print its RESULT line (optional: "
        "without one the result is null and the Job's success decides).",
        "mnnvl launch --run-id demo --namespace team-a --nodes 2 --gpus-per-node 0 "
        "--module torch.utils.collect_env",
    ),
    "train": (
        "train on the domain's nodes",
        "Sharded (FSDP2) training of a Llama-style model on the run's nodes; prints loss, "
        "tokens/s and MFU.",
        "mnnvl train --run-id demo --namespace team-a --nodes 2 --gpus-per-node 0 "
        "--model tiny --steps 20",
    ),
    "verify": (
        "verify NVLink on the domain's nodes",
        "NVML checks and an all-reduce bus-bandwidth sweep on the run's nodes, judged against "
        "a threshold from the detected topology (or --min-busbw-gbps; on CPU there is no "
        "topology to derive one from, so give it, as the example does).",
        "mnnvl verify --run-id demo --namespace team-a --nodes 2 --gpus-per-node 0 "
        "--min-busbw-gbps 0.001 --report-dir out/",
    ),
    "teardown": (
        "delete the run's workload, then its domain",
        "Delete the run's Jobs and Services (and wait for their pods), then its ComputeDomain "
        "(and wait until it is gone). Idempotent.",
        "mnnvl teardown --run-id demo --namespace team-a",
    ),
    "status": (
        "show the run's domain, Jobs and pods (read-only)",
        "What the run has in the cluster now: its ComputeDomain and nodes, Jobs, pods, Services.",
        "mnnvl status --run-id demo --namespace team-a",
    ),
    "logs": (
        "print the log of one of the run's worker pods",
        "Print the log of the run's worker pod of node rank --rank on stdout: the pod of the "
        "run's latest step (the result line goes to stderr).",
        "mnnvl logs --run-id demo --namespace team-a --rank 1",
    ),
    "preflight": (
        "check that the cluster is ready for a run (read-only)",
        "One row per check: the ComputeDomain CRD, the DeviceClasses, clique labels, IMEX "
        "channel devices, the GPU stack and the --gpu-mode it needs, the IMEX mode, the Kueue "
        "queue (--queue-name) and this account's permissions, each failing row with its fix. "
        "Cluster-scoped rows need manifests/overlays/cluster-reader (else SKIPPED). Exit 0 when "
        "no row fails, 4 when one does, 5 when the API is unreachable, 2 on bad input.",
        "mnnvl preflight --namespace team-a --nodes 2 --gpus-per-node 0 --report-dir out/",
    ),
    "run": (
        "provision, verify, train, verify, teardown",
        "The whole run in one process; teardown runs whatever happened before it.",
        "mnnvl run --sim --run-id demo --nodes 2 --gpus-per-node 0 --min-busbw-gbps 0.001",
    ),
    "render": (
        "print every object of a run as YAML",
        "Print every object a run would create as YAML on stdout (the result line goes to "
        "stderr); needs no cluster.",
        "mnnvl render --run-id demo --namespace team-a | kubectl apply --dry-run=server -f -",
    ),
    "reap": (
        "delete objects of runs that are gone",
        "Delete the objects of runs that are not live any more, a backstop for exit handlers "
        "that KFP Terminate or argo terminate skipped.",
        "mnnvl reap --namespace team-a --older-than-s 86400 --dry-run",
    ),
    "baselines": (
        "print the bus-bandwidth baseline table",
        "Print the all-reduce busbw baselines verify judges against when no --min-busbw-gbps "
        "is given, each with its source and date, on stderr; with --system, the row a run of "
        "--nodes x --gpus-per-node GPUs gets (a partial NVL72 rack gets the rack's row). Needs "
        "no cluster.",
        "mnnvl baselines --system gb200 --nodes 4 --gpus-per-node 4",
    ),
    "sim": (
        "the embedded simulated cluster",
        "Serve a simulated cluster (API server, DRA driver, Jobs, kubelet running pods as local "
        "processes) until Ctrl-C; other shells use it through the kubeconfig it prints.",
        "mnnvl sim up --nodes 2 --gpus-per-node 0 --kubeconfig sim.kubeconfig",
    ),
}
