"""A tiny DeepSpeed ZeRO-2 training on CPU (gloo), started by torchrun from test_zero_reshard_real.py.

    zero_train.py save OUT   (2 ranks) trains 3 steps, saves OUT/checkpoint-3 the way HF Trainer does
                             (global_step3/ + latest), trains 2 more and writes their losses to OUT/losses-2.json
    zero_train.py load OUT   (1 rank) loads OUT/checkpoint-3-universal with checkpoint.load_universal, trains the
                             same 2 steps (the same global batch: 2 micro-batches accumulated) and writes
                             OUT/losses-1.json

Each optimizer step sees the same two samples at either size, so the losses agree only if the weights and
Adam's moments came back whole."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
runpy.run_path(str(REPO / "swiftslurm" / "data" / "deepspeed_cpu_patch.py"))  # ZeRO-1/2 on gloo
import deepspeed  # noqa: E402

GLOBAL_BATCH = 2


def engine(world: int, load_universal: bool) -> deepspeed.DeepSpeedEngine:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": GLOBAL_BATCH // world,
        "zero_optimization": {"stage": 2},
        "checkpoint": {"load_universal": load_universal},
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return ds_engine


def train(ds_engine: deepspeed.DeepSpeedEngine, steps: range, world: int) -> list[float]:
    """Step k uses samples 2k and 2k+1: one per rank at 2 ranks, both accumulated at 1."""
    data = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(20, 8, generator=data), torch.randn(20, 4, generator=data)
    rank, losses = ds_engine.global_rank, []
    for step in steps:
        total = torch.zeros(())
        for micro in range(GLOBAL_BATCH // world):
            i = step * GLOBAL_BATCH + rank + micro
            loss = torch.nn.functional.mse_loss(ds_engine(inputs[i : i + 1]), targets[i : i + 1])
            ds_engine.backward(loss)
            ds_engine.step()
            total += loss.detach()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / GLOBAL_BATCH)
    return losses


def main(mode: str, out: Path) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    world = int(os.environ["WORLD_SIZE"])
    if mode == "save":
        ds_engine = engine(world, load_universal=False)
        train(ds_engine, range(3), world)
        ds_engine.save_checkpoint(str(out / "checkpoint-3"), tag="global_step3")
        losses = train(ds_engine, range(3, 5), world)
    else:
        ds_engine = engine(world, load_universal=True)
        path, _ = ds_engine.load_checkpoint(str(out / "checkpoint-3-universal"))
        assert path is not None, "nothing loaded"
        losses = train(ds_engine, range(3, 5), world)
    if ds_engine.global_rank == 0:
        (out / f"losses-{world}.json").write_text(json.dumps(losses))
    # Every rank leaves the group together, its threads joined: a process that exits with gloo's threads still
    # running can die in their destructors ("terminate called without an active exception", SIGABRT), seen once
    # in the component tier with the cluster tier beside it.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
