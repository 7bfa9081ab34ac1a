"""torch.distributed helpers that are no-ops in a single process.

``init_distributed`` reads the variables ``torchrun`` sets (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``); without them the run is single-process.

A library module: it imports torch and the standard library alone, so the models and losses that
reduce across processes (``reduce_sum``, ``get_world_size``, ``is_main_process``) load no command
line, trainer, argparse or tqdm.  :mod:`peg_core.engine.distributed` re-exports it for the engine.
"""

from __future__ import annotations

import os
import random
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "all_gather_object",
    "barrier",
    "cleanup_distributed",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_main_process",
    "reduce_mean",
    "reduce_sum",
    "sample_seed",
    "seed_everything",
    "seeded",
]


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "auto", backend: str | None = None) -> DistInfo:
    """Initialise the process group when launched by torchrun; choose the device.

    Args:
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        backend: ``nccl`` on CUDA, ``gloo`` on CPU when ``None``.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch.cuda.is_available() is False")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend or ("nccl" if dev.type == "cuda" else "gloo"))
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    return get_rank() == 0


def barrier() -> None:
    if get_world_size() > 1:
        dist.barrier()


def reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of a tensor over all processes (a copy; the input is unchanged)."""
    t = t.detach().clone()
    if get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def reduce_mean(t: torch.Tensor) -> torch.Tensor:
    return reduce_sum(t) / get_world_size()


def all_gather_object(obj):
    """List of ``obj`` from every rank (``[obj]`` in a single process)."""
    if get_world_size() == 1:
        return [obj]
    out = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed python, numpy (when installed) and torch; each rank gets ``seed + rank``."""
    s = seed + rank
    random.seed(s)
    torch.manual_seed(s)
    try:
        import numpy as np

        np.random.seed(s % 2**32)
    except ImportError:  # pragma: no cover - numpy ships with torch in practice
        pass


def sample_seed(*key: Hashable) -> int:
    """A 62-bit seed that is a function of ``key`` alone, e.g. ``(seed, epoch, index)``.

    Goes through SHA-512 in :class:`random.Random` (a string seed), so it is the same in every
    process, worker and Python run: a sample's augmentation does not depend on which data-loader
    worker (or how many) produced it, nor on what the generator drew before.
    """
    return random.Random("peg-sample:" + ":".join(map(str, key))).getrandbits(62)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The global CPU generator (the one torchvision's v2 transforms draw from) seeded with
    ``seed`` for the block only; the caller's random state is restored after it."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield
