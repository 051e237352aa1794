"""Processes of a data-parallel run: one (the default) or several started by `accelerate launch` / torchrun.

Several processes (WORLD_SIZE > 1 in the environment, as `accelerate launch --multi_gpu` and torchrun set it):
torch.distributed with NCCL on CUDA, gloo on the CPU. Each process makes its share of the grids and takes its
share of every batch; the heads' gradients are averaged (weighted by each share's grids), so every process
holds the same heads after every step, as one process would on the whole batch.
"""
from __future__ import annotations

import datetime
import os

import torch

TIMEOUT = datetime.timedelta(hours=6)  # a process waits this long for the others (a shard, the features file)


class Group:
    """rank / world of this run and the few collectives training needs (no-ops for one process)."""

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0):
        self.rank, self.world, self.local_rank = rank, world, local_rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def average_gradients(self, params, weight: float) -> None:
        """grad <- sum over processes of weight_r * grad_r (weight: this process's share of the batch's grids)."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads]) * weight
        torch.distributed.all_reduce(flat)
        at = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[at:at + n].view_as(g).to(g.dtype)
            at += n

    def agree(self, values: list[float]) -> list[float]:
        """The largest of each value over the processes (stop flags, the clock), so that all decide alike."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return t.tolist()

    def _device(self):
        return torch.device("cuda", torch.cuda.current_device()) if torch.distributed.get_backend() == "nccl" \
            else torch.device("cpu")


def from_environment(device_type: str = "cpu") -> Group:
    """The Group the launcher set up (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR / PORT), joined once."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Group()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.distributed.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend, timeout=TIMEOUT)
    return Group(torch.distributed.get_rank(), torch.distributed.get_world_size(), local)
