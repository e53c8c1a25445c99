"""Data-parallel training of one run with torch.distributed: DDP over the processes torchrun starts.

    torchrun --standalone --nproc_per_node 4 -m ablations run --rows base --budget short --accumulation 4

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; `setup` joins the process group (NCCL on GPUs, gloo on
CPU) and gives each process its GPU. Every rank reads the same deterministic batch stream and keeps
its share of each step's micro-batches (`shard`), so a step trains on exactly the batches of a
single-process run with the same --accumulation; DDP averages the gradients. Rank 0 alone writes
logs, checkpoints and results (and holds the run's lock); every rank resumes from the same checkpoint.
With `run --ddp`, one process under torchrun takes the same path (process group, DDP, all-reduces) rather than
training as a plain process: a check of that path on a machine with one GPU.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import nn

T = TypeVar("T")
# Rank 0 scores the dev set (perplexity, beam search) while the others wait at their next collective.
TIMEOUT = datetime.timedelta(hours=2)


@dataclass(frozen=True)
class Ranks:
    """Where this process stands among the data-parallel processes of one run (world 1: a plain process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    forced: bool = False  # data-parallel even at world 1 (run --ddp)

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes metrics, checkpoints, config.json and final.json."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        """Whether the process group, DDP and the all-reduces are used: over several processes, or when forced."""
        return self.world > 1 or self.forced


SINGLE = Ranks()


def from_environment(force: bool = False) -> Ranks:
    """The ranks torchrun describes in RANK, WORLD_SIZE and LOCAL_RANK; a plain process is SINGLE. With `force`
    (run --ddp) a world of one is data-parallel too, which needs torchrun's variables: a one-line error without them."""
    if force and not {"RANK", "WORLD_SIZE"} <= set(os.environ):
        raise ValueError(
            "--ddp: no torchrun environment (RANK and WORLD_SIZE are not set); start the run under torchrun, "
            "e.g. python -m torch.distributed.run --standalone --nproc_per_node 1 -m ablations run ... --ddp"
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not force:
        return SINGLE
    return Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", os.environ["RANK"])), force)


def setup(ranks: Ranks, device: torch.device) -> torch.device:
    """Join the process group (NCCL for CUDA, gloo for CPU) and return this rank's device."""
    if not ranks.parallel:
        return device
    if device.type == "cuda":
        if torch.cuda.device_count() <= ranks.local_rank:
            raise ValueError(
                f"rank {ranks.rank} wants GPU {ranks.local_rank} but this machine shows "
                f"{torch.cuda.device_count()}; start at most that many processes per node"
            )
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if device.type == "cuda":  # bound to its GPU: NCCL need not guess the device from the rank (a hang if wrong)
            dist.init_process_group("nccl", timeout=TIMEOUT, device_id=device)
        else:
            dist.init_process_group("gloo", timeout=TIMEOUT)
    return device


def backend(ranks: Ranks) -> str | None:
    """The process group's backend (nccl, gloo) of a data-parallel run; None in a plain process."""
    return dist.get_backend() if ranks.parallel and dist.is_initialized() else None


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def check_accumulation(accumulation: int, ranks: Ranks) -> None:
    """Each rank takes whole micro-batches, so a step's micro-batches must divide evenly among the ranks."""
    if accumulation % ranks.world:
        raise ValueError(
            f"--accumulation {accumulation} cannot be split among {ranks.world} processes; give a multiple "
            f"of {ranks.world}, e.g. --accumulation {ranks.world} (the same batches as one process with it)"
        )


def shard(micro_batches: Sequence[T], ranks: Ranks) -> list[T]:
    """This rank's micro-batches of a step: every world-th one, starting at the rank."""
    return list(micro_batches[ranks.rank :: ranks.world])


def wrap(model: nn.Module, ranks: Ranks, device: torch.device) -> nn.Module:
    """The module to call for training: DistributedDataParallel over the ranks, or the model itself."""
    if not ranks.parallel:
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The dropout seed of one rank at one step: ranks draw different masks, and a resumed run draws the same ones."""
    return (seed * 1_000_003 + step) * 1_009 + rank


def sum_over_ranks(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """The sum of a tensor over all ranks (itself in a plain process)."""
    if ranks.parallel:
        dist.all_reduce(value)
    return value


def barrier(ranks: Ranks) -> None:
    if ranks.parallel:
        dist.barrier()


def main_first(ranks: Ranks, make: Callable[[], T]) -> T:
    """make() on rank 0, then on the other ranks: what rank 0 caches (the BPE model) they load rather than train again."""
    if ranks.main:
        made = make()
    barrier(ranks)
    if not ranks.main:
        made = make()
    return made


def first_signal(signum: int | None, ranks: Ranks, device: torch.device) -> int | None:
    """A stop signal seen by any rank after a step (the largest number if several): all ranks stop after the same step."""
    if not ranks.parallel:
        return signum
    flag = torch.tensor([signum or 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None


def from_main(value: T, ranks: Ranks) -> T:
    """Rank 0's value on every rank (what rank 0 alone decides: whether a run is taken, whether it already ended)."""
    if not ranks.parallel:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
