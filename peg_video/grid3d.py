"""Space-time token grids: ``(B, T*H*W, C)`` tokens <-> ``(B, C, T, H, W)`` maps, without copies.

The 3-D forms of :func:`peg_core.tokens_to_grid` / :func:`peg_core.grid_to_tokens`, checking the
rank.  The space-time PEG itself is :class:`peg_core.PEG3d` (one implementation,
:class:`peg_core.PEGNd`, for 2D and 3D; ``from peg_video import PEG3d``), and its start from a
trained 2D PEG is :func:`peg_video.interop.inflate.inflate_peg2d`.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from peg_core import grid_to_tokens, tokens_to_grid

__all__ = ["grid3d_to_tokens", "tokens_to_grid3d"]


def tokens_to_grid3d(x: Tensor, size: Sequence[int]) -> Tensor:
    """``(B, T*H*W, C)`` tokens -> ``(B, C, T, H, W)`` map as a *view* (channels-last-3d strides, no copy)."""
    if len(size) != 3:
        raise ValueError(f"size must be (T, H, W); got {tuple(size)}")
    return tokens_to_grid(x, size)


def grid3d_to_tokens(x: Tensor) -> Tensor:
    """``(B, C, T, H, W)`` map -> ``(B, T*H*W, C)`` tokens; free when the map is channels-last-3d."""
    if x.dim() != 5:
        raise ValueError(f"expected a (B, C, T, H, W) map; got shape {tuple(x.shape)}")
    return grid_to_tokens(x)
