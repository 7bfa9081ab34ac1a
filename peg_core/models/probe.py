"""Attention diagnostics: the mean attention entropy and mean attention distance of each layer.

The extrapolation literature explains why an encoding fails at a larger input with two numbers per
layer: how spread out a query's attention is (entropy, in nats) and how far from the query the
attended tokens lie (distance, in grid cells).  :class:`AttentionStats` collects both from every
:class:`peg_core.models.layers.Attention` that runs while :func:`attention_probe` is active, in any
model built on it (CPVT, the video ViT, your own), also inside a command that builds its own model::

    stats = AttentionStats(grid=(14, 14))
    with attention_probe(stats), torch.no_grad():
        model(images)                       # any number of forwards
    stats.summary()                         # {"entropy": [per layer], "distance": [per layer]}

Per layer, over the batch, the heads and the *grid* queries (prefix tokens' rows are left out):

* entropy ``-sum_j a_ij log a_ij`` over all keys (prefix keys included), ``a`` the attention
  probabilities with the model's own mask / bias;
* distance ``sum_j a_ij |p_i - p_j| / sum_j a_ij`` over the grid keys ``j`` (Euclidean, grid
  cells), i.e. where the attention paid to the grid lands.

A layer is an attention module, numbered in the order the first forward calls them (a divided
video block has two: space, then time).  An attention whose token count matches none of the grids
given (its tokens are not a grid this probe knows) is counted in ``skipped`` and left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from ..rope import rope_coords
from .layers import Attention

__all__ = ["AttentionStats", "attention_probe"]


class AttentionStats:
    """Accumulates per-layer attention entropy and distance (module docstring).

    Args:
        grid: the token grid ``(H, W)`` or ``(T, H, W)`` of the forwards to come.
        also: further grids an attention may run over (a divided video block: ``(H, W)`` for its
            spatial attention, ``(T,)`` for its temporal one); the first grid whose size fits wins.
        num_prefix_tokens: the prefix (class / register) tokens in front of the grid tokens, when known:
            an attention then matches a grid only with exactly that many (or none); otherwise any
            number up to ``max_prefix``.
        max_prefix: the most prefix tokens in front of a grid when ``num_prefix_tokens`` is None.
        chunk: queries' batch entries processed at once (bounds the ``(chunk, heads, N, N)`` memory).
    """

    def __init__(
        self,
        grid: Sequence[int],
        also: Sequence[Sequence[int]] = (),
        *,
        num_prefix_tokens: int | None = None,
        max_prefix: int = 8,
        chunk: int = 8,
    ) -> None:
        self.grids = [tuple(int(s) for s in g) for g in (grid, *also)]
        self.num_prefix_tokens = num_prefix_tokens
        self.max_prefix = max_prefix
        self.chunk = chunk
        self._layer: dict[int, int] = {}  # id(attention module) -> layer number
        self._sums: list[list[float]] = []  # per layer: [entropy sum, distance sum, queries]
        self._dist: dict[tuple[int, ...], Tensor] = {}
        self.skipped = 0

    def _match(self, n: int) -> tuple[tuple[int, ...], int] | None:
        for g in self.grids:
            p = n - math.prod(g)
            if p == 0 or (
                p == self.num_prefix_tokens
                if self.num_prefix_tokens is not None
                else 0 < p <= self.max_prefix
            ):
                return g, p
        return None

    def _distance(self, grid: tuple[int, ...], device: torch.device) -> Tensor:
        if grid not in self._dist:
            coords = rope_coords(grid, device=device, dtype=torch.float32)  # (N, k), row-major
            self._dist[grid] = torch.cdist(coords, coords)  # (N, N)
        return self._dist[grid]

    @torch.no_grad()
    def __call__(self, module: Attention, q: Tensor, k: Tensor, attn_mask: Tensor | None) -> None:
        """One attention call: queries / keys ``(B, heads, N, D)`` (rotated), its SDPA mask or None."""
        found = self._match(q.shape[-2])
        if found is None:
            self.skipped += 1
            return
        grid, p = found
        layer = self._layer.setdefault(id(module), len(self._layer))
        while len(self._sums) <= layer:
            self._sums.append([0.0, 0.0, 0.0])
        dist = self._distance(grid, q.device)
        scale = q.shape[-1] ** -0.5
        for s in range(0, q.shape[0], self.chunk):
            qs, ks = q[s : s + self.chunk].float(), k[s : s + self.chunk].float()
            logits = (qs @ ks.transpose(-2, -1)) * scale  # (b, heads, N, N)
            if attn_mask is not None:
                m = attn_mask if attn_mask.shape[0] == 1 else attn_mask[s : s + self.chunk]
                logits = (
                    logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m.float()
                )
            a = logits.softmax(-1)[:, :, p:]  # the grid queries' rows (b, heads, G, N)
            entropy = torch.special.entr(a).sum(-1)  # (b, heads, G)
            on_grid = a[..., p:]
            distance = (on_grid * dist).sum(-1) / on_grid.sum(-1).clamp_min(1e-12)
            sums = self._sums[layer]
            sums[0] += float(entropy.sum())
            sums[1] += float(distance.sum())
            sums[2] += entropy.numel()

    def summary(self) -> dict[str, list[float]]:
        """``{"entropy": [...], "distance": [...]}``: per layer, the mean over every query seen."""
        return {
            "entropy": [e / n for e, _, n in self._sums],
            "distance": [d / n for _, d, n in self._sums],
        }


@contextmanager
def attention_probe(stats: AttentionStats) -> Iterator[AttentionStats]:
    """Within the block, every :class:`Attention` (any model, any instance) reports to ``stats``.

    A class-level hook, so it also reaches the models a command builds itself (``evaluate``); one
    probe at a time.  Models traced or exported outside the block carry no trace of it.
    """
    if Attention.probe is not None:
        raise RuntimeError("an attention probe is already active")
    Attention.probe = stats
    try:
        yield stats
    finally:
        Attention.probe = None
