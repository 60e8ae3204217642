"""A user's own multi-node program, run by the ``launch`` step (``mnnvl-custom`` pipeline).

It is not part of mnnvl-pipelines and imports nothing from it: it reads the rendezvous the
launch step puts into every pod (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``NNODES``)
and runs one process per node (``--command`` mode; a multi-GPU program would start its own
torchrun here). It fits a least-squares line with data-parallel SGD: each node computes the
gradient on its own shard, an all-reduce averages them. Rank 0 ends with a
``RESULT {json}`` line, which the launch step returns (its numbers become KFP metrics).

    python3 examples/custom_trainer.py --steps 50
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    start = time.monotonic()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    gen = torch.Generator().manual_seed(rank)
    x = torch.rand(256, generator=gen)
    y = 3.0 * x + 0.5  # the line every node's shard lies on
    w, b = torch.zeros(()), torch.zeros(())
    for _ in range(args.steps):
        err = w * x + b - y
        grads = torch.stack([(2 * err * x).mean(), (2 * err).mean()])
        dist.all_reduce(grads)
        grads /= world
        w -= args.lr * grads[0]
        b -= args.lr * grads[1]
    loss = float(((w * x + b - y) ** 2).mean())
    if rank == 0:
        result = {
            "kind": "custom",
            "world_size": world,
            "steps": args.steps,
            "slope": round(float(w), 4),
            "intercept": round(float(b), 4),
            "final_loss": loss,
            "wall_s": round(time.monotonic() - start, 3),
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
