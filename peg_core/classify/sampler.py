"""Training order: a new shuffle every epoch, a function of (seed, epoch) alone."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

__all__ = ["EpochShuffle"]


class EpochShuffle(Sampler[int]):
    """Shuffled indices of ``n`` items; the same order for the same ``(seed, epoch)``, so a resumed run
    sees the data in the order an uninterrupted one would.

    Epoch ``e``'s order is the ``(e + 1)``-th ``randperm`` of a generator seeded with ``seed``: the
    order of a plain loop that draws one permutation per epoch from one generator (the classifier's
    earlier trainer; the demo's numbers depend on it), replayed so that any epoch can come first.
    With several processes each takes every ``world_size``-th index, padded to equal length.
    """

    def __init__(self, n: int, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        self.n, self.seed, self.rank, self.world_size = int(n), int(seed), rank, world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return math.ceil(self.n / self.world_size)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epoch):
            torch.randperm(self.n, generator=g)  # the draws of the earlier epochs
        order = torch.randperm(self.n, generator=g).tolist()
        order += order[: len(self) * self.world_size - self.n]  # every rank the same number of steps
        return iter(order[self.rank :: self.world_size])
