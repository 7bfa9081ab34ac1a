"""PEG3d: the Positional Encoding Generator over a space-time token grid.

The video counterpart of :class:`peg_core.PEG2d`: the ``T*H*W`` patch tokens
are viewed as their ``(T, H, W)`` grid, a depthwise 3D convolution with zero
padding runs over it and its output is added to the tokens.  As in 2D, the
zero padding lets the conv tell border tubelets (first/last frame, image
edges) from inner ones, so the codes carry absolute position at any clip
length or resolution.  UniFormer's "dynamic position embedding" is the same
module applied before every block.

:func:`inflate_peg2d` starts one from a trained :class:`peg_core.PEG2d`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from peg_core import PEG2d, PositionEncoding, check_tokens

__all__ = ["PEG3d", "grid3d_to_tokens", "inflate_peg2d", "tokens_to_grid3d"]


def tokens_to_grid3d(x: Tensor, size: tuple[int, int, int]) -> Tensor:
    """``(B, T*H*W, C)`` tokens -> ``(B, C, T, H, W)`` map as a *view* (channels-last-3d strides, no copy)."""
    b, _, c = x.shape
    return x.reshape(b, size[0], size[1], size[2], c).permute(0, 4, 1, 2, 3)


def grid3d_to_tokens(x: Tensor) -> Tensor:
    """``(B, C, T, H, W)`` map -> ``(B, T*H*W, C)`` tokens; free when the map is channels-last-3d."""
    return x.permute(0, 2, 3, 4, 1).flatten(1, 3)


def _triple(kernel_size: int | tuple[int, int, int]) -> tuple[int, int, int]:
    k = (kernel_size,) * 3 if isinstance(kernel_size, int) else tuple(int(s) for s in kernel_size)
    if len(k) != 3 or any(s < 1 or s % 2 == 0 for s in k):
        raise ValueError(
            f"kernel_size must be an odd int or three odd ints (kT, kH, kW) so the grid keeps its size; "
            f"got {kernel_size}"
        )
    return k


class PEG3d(PositionEncoding):
    """Positional Encoding Generator over a ``(T, H, W)`` token grid.

    ``out = x + DWConv3d(x)`` on the grid tokens; prefix tokens (class token)
    pass through unchanged.

    Args:
        dim: channels ``C``.
        kernel_size: odd ``k`` or ``(kT, kH, kW)``; padding is ``k // 2`` per axis.
        num_prefix_tokens: tokens before the grid that are left as they are.
        factorized: a ``(1, kH, kW)`` spatial depthwise conv followed by a
            ``(kT, 1, 1)`` temporal one (``kH*kW + kT`` instead of
            ``kT*kH*kW`` weights per channel).
        bias: per-channel bias on the (last) conv.
        zero_init: start the conv at zero, so ``out == x`` until it trains.

    Shapes:
        ``forward(x, size)`` with ``x`` tokens ``(B, P + T*H*W, C)`` (frame-major:
        ``t`` slowest, ``w`` fastest) and ``size=(T, H, W)``, or a feature map
        ``(B, C, T, H, W)`` (``size`` optional).  Returns the same shape.

    The conv runs on a channels-last-3d *view* of the tokens, as in
    :class:`peg_core.PEG2d`: no NCDHW-contiguous copy is made.
    """

    apply_to = "tokens"
    conditional = True

    def __init__(
        self,
        dim: int,
        kernel_size: int | tuple[int, int, int] = (3, 3, 3),
        num_prefix_tokens: int = 0,
        factorized: bool = False,
        bias: bool = True,
        zero_init: bool = False,
    ) -> None:
        super().__init__()
        kt, kh, kw = _triple(kernel_size)
        self.dim = dim
        self.kernel_size = (kt, kh, kw)
        self.num_prefix_tokens = num_prefix_tokens
        self.factorized = factorized
        if factorized:
            # As PEG2d(separable=True): the bias only on the last conv, where it is not re-weighted.
            self.proj_s = nn.Conv3d(
                dim, dim, (1, kh, kw), padding=(0, kh // 2, kw // 2), groups=dim, bias=False
            )
            self.proj = nn.Conv3d(dim, dim, (kt, 1, 1), padding=(kt // 2, 0, 0), groups=dim, bias=bias)
        else:
            self.proj = nn.Conv3d(
                dim, dim, (kt, kh, kw), padding=(kt // 2, kh // 2, kw // 2), groups=dim, bias=bias
            )
        if zero_init:
            nn.init.zeros_(self.proj.weight)
            if self.proj.bias is not None:
                nn.init.zeros_(self.proj.bias)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, kernel_size={self.kernel_size}, num_prefix_tokens={self.num_prefix_tokens}, "
            f"factorized={self.factorized}"
        )

    def conv(self, grid: Tensor) -> Tensor:
        """Depthwise conv(s) of a ``(B, C, T, H, W)`` map, same shape out."""
        if self.factorized:
            grid = self.proj_s(grid)
        return self.proj(grid)

    def forward(
        self, x: Tensor, size: tuple[int, int, int] | None = None, mask: Tensor | None = None
    ) -> Tensor:
        if x.dim() == 5:
            return x + self._map_delta(x, size, mask)
        size = self._check(x, size, mask)
        p = self.num_prefix_tokens
        tokens = x[:, p:]
        delta = grid3d_to_tokens(self.conv(tokens_to_grid3d(tokens, size)))
        if p == 0:
            return x + delta
        return torch.cat([x[:, :p], tokens + delta], dim=1)

    def position(
        self, x: Tensor, size: tuple[int, int, int] | None = None, mask: Tensor | None = None
    ) -> Tensor:
        """The conv output alone (``forward(x) - x`` computed directly), zeros at the prefix tokens."""
        if x.dim() == 5:
            return self._map_delta(x, size, mask)
        size = self._check(x, size, mask)
        p = self.num_prefix_tokens
        delta = grid3d_to_tokens(self.conv(tokens_to_grid3d(x[:, p:], size)))
        return delta if p == 0 else torch.cat([delta.new_zeros(x.shape[0], p, x.shape[2]), delta], dim=1)

    def _map_delta(self, x: Tensor, size: tuple[int, int, int] | None, mask: Tensor | None) -> Tensor:
        self._no_mask(mask)
        if size is not None and tuple(size) != tuple(x.shape[-3:]):
            raise ValueError(
                f"size={tuple(size)} does not match the feature map's (T, H, W)={tuple(x.shape[-3:])}"
            )
        if x.shape[1] != self.dim:
            raise ValueError(
                f"feature map has C={x.shape[1]} channels (shape {tuple(x.shape)}), PEG3d has dim={self.dim}"
            )
        return self.conv(x)

    def _check(
        self, x: Tensor, size: tuple[int, int, int] | None, mask: Tensor | None
    ) -> tuple[int, int, int]:
        self._no_mask(mask)
        if size is None or len(size) != 3:
            raise ValueError(
                f"tokens of shape {tuple(x.shape)} need size=(T, H, W); got {size!r} "
                f"(a (B, C, T, H, W) map needs no size)"
            )
        t, h, w = (int(s) for s in size)
        check_tokens(x, (t, h, w), self.num_prefix_tokens)
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x has C={x.shape[-1]} channels (shape {tuple(x.shape)}), PEG3d was built for dim={self.dim}"
            )
        return t, h, w

    @staticmethod
    def _no_mask(mask: Tensor | None) -> None:
        # Clips are cropped to a common size, so there is no padding to mask.
        if mask is not None:
            raise ValueError("PEG3d takes no padding mask (clips share one size); pass mask=None")


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
