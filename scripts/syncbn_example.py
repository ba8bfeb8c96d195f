"""Minimal use of SyncTrain's SyncBatchNorm on its own, on CPUs (gloo) or GPUs (NCCL).

    torchrun --standalone --nproc_per_node=2 scripts/syncbn_example.py   # 2 processes on the CPU
    python scripts/syncbn_example.py                                     # 1 process: plain BatchNorm

Each rank gets a *different* number of samples (rank r holds r + 2) and trains a small
Conv -> BatchNorm -> ReLU -> Linear model, converted to SyncBatchNorm, under DDP for a few steps. It
then checks that a SyncBatchNorm2d's batch statistics equal those of the concatenation of all ranks'
batches (gathered explicitly), and prints "ok" on rank 0.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the checkout

from src import comm, process_group  # noqa: E402  (the repo's gateway to torch.distributed, and forming its group)
from src.commands.user_errors import reported  # noqa: E402  (a user's mistake: one message, exit 2)
from src.syncbn import SyncBatchNorm2d, convert_sync_batchnorm  # noqa: E402


@reported
def main() -> None:
    """Train a few steps with uneven per-rank batches and check the synchronised statistics."""
    device = process_group.select_device("auto")
    process_group.init_distributed(device, timeout_s=120, init_timeout_s=120)  # no-op without torchrun
    rank, world = comm.get_rank(), comm.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=None), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    )
    model = convert_sync_batchnorm(model).to(device)  # BatchNorm2d -> SyncBatchNorm2d, same tensors
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own data
    for step in range(3):
        x = torch.randn(rank + 2, 3, 16, 16, generator=gen).to(device)
        y = torch.randint(0, 10, (rank + 2,), generator=gen).to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    # Check: a fresh layer with momentum=1.0 keeps exactly the last batch's statistics, which must be
    # those of all ranks' samples together (uneven sizes included), as one BatchNorm would see them.
    net = model.module if world > 1 else model
    with torch.no_grad():
        feats = net[0](x)
        check = SyncBatchNorm2d(8, momentum=1.0).to(device)
        check(feats)
        everything = torch.cat(comm.all_gather_tensor(feats))  # the concatenated batch
    torch.testing.assert_close(check.running_mean, everything.mean((0, 2, 3)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(check.running_var, everything.var((0, 2, 3)), atol=1e-5, rtol=1e-5)
    print(f"rank {rank}/{world}: batch of {rank + 2}, statistics match the concatenated batch of "
          f"{everything.shape[0]}; BN running_mean[:3] = {net[1].running_mean[:3].tolist()}")
    if world > 1:
        comm.barrier()
    process_group.destroy()
    if rank == 0:
        print("ok: SyncBatchNorm2d trained on", world, "process(es) with uneven batches")


if __name__ == "__main__":
    main()
