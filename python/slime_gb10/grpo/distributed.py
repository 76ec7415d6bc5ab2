"""Data-parallel GRPO over ``torch.distributed`` (``torchrun --nproc-per-node N [--nnodes 2 ...]``).

Each rank generates its contiguous share of the step's prompts (all ranks draw the same global
batch from the same seeded sampler), scores and normalises its own groups (a group never spans
ranks), and trains on its samples; gradients are summed over ranks before clipping, so every rank
takes the same optimizer step and keeps the same weights. The loss of each rank is already divided
by the token (or sequence) count of the whole global batch, so the sum over ranks is exactly the
gradient of the 1-rank run; together with the per-row sampling keys of the engines (row i of the
global batch samples with ``seed + i`` wherever it runs) N ranks reproduce the 1-rank step up to
floating-point order.

Why a coalesced all-reduce after the local backward passes instead of wrapping the model in
``DistributedDataParallel``: DDP reduces inside every backward and needs every rank to run the
same number of them, but a rank's micro-batch count depends on how many of its groups carry a
signal (zero-variance groups are skipped) and can be zero. One ``all_reduce`` per optimizer step is
what DDP does without the overlap; with a few hundred MB of gradients it costs milliseconds.

Rank 0 alone writes the run directory (metrics, evaluations, checkpoints, the final model); a
checkpoint holds every rank's RNG state and the world size, and resumes only with the same one.
Collectives time out after ``train.dist_timeout_s``, so a rank that dies ends the job (torchrun
names the rank) instead of hanging it.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


class LaunchError(ValueError):
    """A distributed launch that cannot work (world size vs batch, unsupported backend)."""


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list) -> list:
        """This rank's contiguous share of ``items`` (``len(items)`` divisible by the world size)."""
        per_rank = len(items) // self.world_size
        return items[self.rank * per_rank : (self.rank + 1) * per_rank]

    # -------------------------------------------------------------- collectives (no-ops on 1 rank)
    def sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=_comm_device())
        torch.distributed.all_reduce(tensor)
        return tensor.tolist()

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (small Python objects: metrics, RNG states), in rank order."""
        if not self.enabled:
            return [obj]
        out: list = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def all_reduce_gradients(self, parameters) -> None:
        """Sum the gradients of ``parameters`` over ranks in one coalesced all-reduce.

        A parameter without a gradient on every rank keeps none (as on one rank); one that has a
        gradient somewhere gets zeros where it has none, so all ranks hold the same gradients.
        """
        if not self.enabled:
            return
        params = [p for p in parameters if p.requires_grad]
        if not params:
            return
        device = params[0].device
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
        torch.distributed.all_reduce(has)
        for p, flag in zip(params, has.tolist(), strict=True):
            if flag and p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        torch.distributed.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def _comm_device() -> torch.device:
    """Where small tensors for collectives live: the GPU for NCCL, the CPU for gloo."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_launch(config, world_size: int) -> None:
    """Refuse, before any model loads, a launch that cannot work; one message naming the fix."""
    if world_size <= 1:
        return
    prompts = config.rollout.prompts_per_step
    if prompts % world_size:
        raise LaunchError(
            f"rollout.prompts_per_step={prompts} does not divide over {world_size} ranks; use a multiple of "
            f"{world_size} (each rank generates and scores whole groups of its share of the prompts)"
        )
    if config.backends.trainer == "megatron" or config.backends.rollout == "sglang":
        raise LaunchError(
            f"{world_size} ranks: data parallelism is implemented for the PyTorch engine and backend only "
            "(Megatron-core data/tensor parallelism and SGLang tensor parallelism are not wired in yet); "
            "use --rollout torch --trainer torch"
        )


def init(config) -> DistContext:
    """The process group from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT``): NCCL when the ranks have GPUs, gloo otherwise."""
    world_size = env_world_size()
    if world_size <= 1:
        return DistContext()
    check_launch(config, world_size)
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = config.backends.device
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=datetime.timedelta(seconds=config.train.dist_timeout_s),
            # bind the process group to this rank's GPU (else NCCL guesses it at the first barrier)
            device_id=torch.device("cuda", local_rank) if use_cuda else None,
        )
    ctx = DistContext(rank=rank, world_size=world_size, local_rank=local_rank)
    log.info(
        "rank %d of %d (local rank %d), backend %s",
        rank,
        world_size,
        local_rank,
        torch.distributed.get_backend(),
    )
    return ctx
