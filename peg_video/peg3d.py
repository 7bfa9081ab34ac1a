"""PEG3d: the Positional Encoding Generator over a space-time token grid.

The video counterpart of :class:`peg_core.PEG2d`: the ``T*H*W`` patch tokens
are viewed as their ``(T, H, W)`` grid, a depthwise 3D convolution with zero
padding runs over it and its output is added to the tokens.  The module lives
in :mod:`peg_core` (one implementation, :class:`peg_core.PEGNd`, for 2D and
3D) and is re-exported here with the video-specific helpers.

:func:`inflate_peg2d` starts one from a trained :class:`peg_core.PEG2d`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from peg_core import PEG2d, PEG3d, grid_to_tokens, tokens_to_grid

__all__ = ["PEG3d", "grid3d_to_tokens", "inflate_peg2d", "tokens_to_grid3d"]


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


def _dense_kernel2d(peg: PEG2d) -> Tensor:
    """The single ``(C, 1, k, k)`` kernel a PEG2d applies (the outer product of its two convs if separable).

    A ``k×1`` conv after a ``1×k`` one, both zero-padded and without a bias in
    between, equals one ``k×k`` conv with the outer-product kernel.
    """
    if not peg.separable:
        return peg.proj.weight.detach()
    col = peg.proj.weight.detach()  # (C, 1, k, 1)
    row = peg.proj_w.weight.detach()  # (C, 1, 1, k)
    return col * row


@torch.no_grad()
def inflate_peg2d(
    peg2d: PEG2d, temporal_kernel: int = 3, factorized: bool = False, num_prefix_tokens: int | None = None
) -> PEG3d:
    """Build a :class:`PEG3d` that acts on every frame exactly as ``peg2d`` acts on an image.

    The 2D kernel goes into the centre temporal slice of a ``(kT, k, k)``
    kernel with zeros elsewhere (for ``factorized=True``: the 2D kernel is the
    spatial conv and the temporal conv is a unit impulse), the bias is copied.
    With the zero padding, ``PEG3d(x)[:, :, t] == PEG2d(x[:, :, t])`` for every
    frame ``t`` of any clip; training then learns the temporal taps.

    Args:
        peg2d: a trained 2D PEG (plain or separable).
        temporal_kernel: odd ``kT``.
        factorized: build the factorized PEG3d.
        num_prefix_tokens: defaults to ``peg2d.num_prefix_tokens``.
    """
    k = peg2d.kernel_size
    p = peg2d.num_prefix_tokens if num_prefix_tokens is None else num_prefix_tokens
    bias = peg2d.proj.bias is not None
    peg3d = PEG3d(peg2d.dim, (temporal_kernel, k, k), p, factorized=factorized, bias=bias)
    peg3d = peg3d.to(device=peg2d.proj.weight.device, dtype=peg2d.proj.weight.dtype)
    kernel = _dense_kernel2d(peg2d)  # (C, 1, k, k)
    centre = temporal_kernel // 2
    if factorized:
        peg3d.proj_s.weight.copy_(kernel.unsqueeze(2))
        peg3d.proj.weight.zero_()
        peg3d.proj.weight[:, :, centre] = 1.0
    else:
        peg3d.proj.weight.zero_()
        peg3d.proj.weight[:, :, centre] = kernel
    if bias:
        peg3d.proj.bias.copy_(peg2d.proj.bias)
    return peg3d
