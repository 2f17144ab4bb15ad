"""Data parallelism under torchrun (METHOD §18): the process group a training runs in.

NCCL, the backend on CUDA, accepts only tensors on the rank's own GPU, and each rank must
select that GPU (``torch.cuda.set_device(LOCAL_RANK)``) before the group starts. gloo, the CPU
backend, accepts anything, so a CPU test would never see a misplaced tensor. :class:`Group`
therefore checks NCCL's rule on every backend: each tensor handed to a collective must be on
the group's device, so the gloo tests catch what would crash the first multi-GPU run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Group:
    """This rank's place in the process group: ``rank`` of ``world_size``, and the device its
    collectives run on (cuda:LOCAL_RANK with NCCL, the CPU with gloo). The default is a world
    of one, where every collective is a no-op."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self):
        object.__setattr__(self, "device", torch.device(self.device))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def check(self, tensor: Tensor, what: str) -> None:
        """NCCL's rule, on every backend: collectives take tensors on the group's device."""
        if tensor.device != self.device:
            raise RuntimeError(
                f"{what}: a tensor on {tensor.device} handed to a collective of the process "
                f"group on {self.device} (NCCL accepts only tensors on the rank's own GPU)"
            )

    def all_reduce(self, tensor: Tensor, what: str = "all_reduce") -> Tensor:
        """Sum ``tensor`` over ranks, in place."""
        if self.distributed:
            self.check(tensor, what)
            torch.distributed.all_reduce(tensor)
        return tensor

    def broadcast(self, tensor: Tensor, what: str = "broadcast", src: int = 0) -> Tensor:
        """Rank ``src``'s ``tensor`` on every rank, in place."""
        if self.distributed:
            self.check(tensor, what)
            torch.distributed.broadcast(tensor, src=src)
        return tensor

    def broadcast_int(self, value: int, what: str = "broadcast_int") -> int:
        """Rank 0's ``value`` on every rank (e.g. an unseeded run's base seed)."""
        if not self.distributed:
            return int(value)
        shared = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        return int(self.broadcast(shared, what).item())

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def any(self, flag: bool, what: str = "any") -> bool:
        """Whether ``flag`` is true on any rank (every rank gets the same answer)."""
        if not self.distributed:
            return bool(flag)
        t = torch.tensor([float(bool(flag))], dtype=torch.float64, device=self.device)
        return bool(self.all_reduce(t, what).item() > 0)

    def average_gradients(self, params: list[Tensor], counts: Mapping[str, float] = ()) -> dict:
        """METHOD §18: each gradient summed over ranks and divided by the world size; a
        parameter with no gradient on any rank stays None, one missing on only some ranks
        counts as zero there. ``counts`` (e.g. the teacher's NaN entries) are summed over
        ranks in the same collective, so every rank takes the same decisions from them;
        returns the summed counts."""
        counts = dict(counts)
        if not self.distributed:
            return counts
        flags = [float(p.grad is not None) for p in params] + list(counts.values())
        summed = self.all_reduce(
            torch.tensor(flags, dtype=torch.float64, device=self.device), "gradient flags"
        ).tolist()  # a device -> host sync, once per iteration
        for p, present in zip(params, summed, strict=False):
            if present == 0:
                continue
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            self.all_reduce(grad, "gradient")
            p.grad = grad / self.world_size
        return dict(zip(counts, summed[len(params) :], strict=True))


def from_env(
    env: Mapping[str, str], *, device_index: int = 0, init_method: str | None = None
) -> Group:
    """The group of a ``chord train`` process: under torchrun (WORLD_SIZE > 1) start it, NCCL
    on CUDA with this rank's GPU (LOCAL_RANK) selected first, gloo on a CPU; else a world of
    one on ``cuda:device_index`` (or the CPU). ``init_method`` (e.g. ``file://...``, the
    ranks of a multi-GPU tier: :mod:`chord.training.multi_gpu_launch`) replaces torchrun's
    MASTER_ADDR/PORT."""
    world = int(env.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world <= 1:
        return Group(0, 1, torch.device("cuda", device_index) if cuda else torch.device("cpu"))
    rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    init = {}
    if init_method is not None:
        init = {"init_method": init_method, "rank": rank, "world_size": world}
    if cuda:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)  # before the group: NCCL binds each rank to its GPU
        torch.distributed.init_process_group("nccl", device_id=device, **init)
    else:
        device = torch.device("cpu")
        torch.distributed.init_process_group("gloo", **init)
    logger.info("rank %d of %d on %s", rank, world, device)
    return Group(rank, world, device)


def close(group: Group) -> None:
    if group.distributed and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
