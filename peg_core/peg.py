"""PEG2d: the Positional Encoding Generator of CPVT (Chu et al., 2021).

A PEG turns the token sequence back into its grid, runs a depthwise k×k
convolution with zero padding over it and adds the result to the tokens.  The
zero padding is what lets the convolution tell a border token from a central
one, so the encoding carries absolute position while working at any grid size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import PositionEncoding

__all__ = ["PEG2d", "check_tokens", "grid_to_tokens", "peg2d_reference", "tokens_to_grid"]


def check_tokens(x: Tensor, size: tuple[int, ...], num_prefix_tokens: int, name: str = "x") -> None:
    """Raise a ``ValueError`` naming the shapes when ``x`` is not ``(B, P + prod(size), C)``."""
    if x.dim() != 3:
        raise ValueError(f"{name} must be tokens (B, N, C); got shape {tuple(x.shape)}")
    numel = 1
    for s in size:
        numel *= int(s)
    if x.shape[1] != num_prefix_tokens + numel:
        grid = "x".join(str(int(s)) for s in size)
        raise ValueError(
            f"{name} has N={x.shape[1]} tokens (shape {tuple(x.shape)}), but size={tuple(size)} "
            f"with num_prefix_tokens={num_prefix_tokens} needs N = {num_prefix_tokens} + {grid} "
            f"= {num_prefix_tokens + numel}"
        )


def tokens_to_grid(x: Tensor, size: tuple[int, int]) -> Tensor:
    """``(B, H*W, C)`` tokens -> ``(B, C, H, W)`` map as a *view* (channels-last strides, no copy)."""
    b, _, c = x.shape
    return x.reshape(b, size[0], size[1], c).permute(0, 3, 1, 2)


def grid_to_tokens(x: Tensor) -> Tensor:
    """``(B, C, H, W)`` map -> ``(B, H*W, C)`` tokens; free when the map is channels-last."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)


class PEG2d(PositionEncoding):
    """Positional Encoding Generator over a 2D token grid.

    ``out = x + DWConv(x)`` on the grid tokens; prefix tokens (class token,
    registers) pass through unchanged.

    Args:
        dim: channels ``C``.
        kernel_size: odd kernel size ``k`` (1, 3, 5, 7, ...); padding is ``k // 2``.
        num_prefix_tokens: tokens before the grid that are left as they are.
        separable: light variant, a ``1×k`` then a ``k×1`` depthwise conv.
        bias: add a learned per-channel bias to the conv output.
        zero_init: start the conv at zero, so ``out == x`` until it trains
            (for adding a PEG to a pretrained model).

    Shapes:
        ``forward(x, size, mask)`` with ``x`` tokens ``(B, P + H*W, C)`` and
        ``size=(H, W)``, or a feature map ``(B, C, H, W)`` (``size`` optional);
        ``mask`` ``(B, H, W)`` bool, True at padding (DETR's convention).
        Returns the same shape (and, for maps, the same memory format).

    The depthwise conv runs on a channels-last view of the tokens: no
    NCHW-contiguous copy is ever made (that layout is ~40x slower on CPU).
    As a :class:`~peg_core.PositionEncoding` it applies to ``"tokens"`` and
    its ``position`` is the conv output (zeros at prefix tokens and padding).
    """

    apply_to = "tokens"
    conditional = True

    def __init__(
        self,
        dim: int,
        kernel_size: int = 3,
        num_prefix_tokens: int = 0,
        separable: bool = False,
        bias: bool = True,
        zero_init: bool = False,
    ) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(
                f"kernel_size must be odd and >= 1 so the grid keeps its size; got {kernel_size}"
            )
        self.dim = dim
        self.kernel_size = kernel_size
        self.num_prefix_tokens = num_prefix_tokens
        self.separable = separable
        p = kernel_size // 2
        if separable:
            # The bias sits on the second conv only: a bias before the k×1 conv
            # would just be re-weighted by it, adding nothing but border effects.
            self.proj_w = nn.Conv2d(dim, dim, (1, kernel_size), padding=(0, p), groups=dim, bias=False)
            self.proj = nn.Conv2d(dim, dim, (kernel_size, 1), padding=(p, 0), groups=dim, bias=bias)
        else:
            self.proj = nn.Conv2d(dim, dim, kernel_size, padding=p, groups=dim, bias=bias)
        if zero_init:
            nn.init.zeros_(self.proj.weight)
            if self.proj.bias is not None:
                nn.init.zeros_(self.proj.bias)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, kernel_size={self.kernel_size}, num_prefix_tokens={self.num_prefix_tokens}, "
            f"separable={self.separable}"
        )

    def conv(self, grid: Tensor, keep: Tensor | None = None) -> Tensor:
        """Depthwise conv of a ``(B, C, H, W)`` map; ``keep`` ``(B, 1, H, W)`` zeroes padding before and after."""
        if keep is not None:
            grid = grid * keep
        if self.separable:
            grid = self.proj_w(grid)
            if keep is not None:
                grid = grid * keep
        out = self.proj(grid)
        if keep is not None:
            out = out * keep
        return out

    def forward(self, x: Tensor, size: tuple[int, int] | None = None, mask: Tensor | None = None) -> Tensor:
        if x.dim() == 4:
            return x + self._map_delta(x, size, mask)
        h, w = self._check(x, size)
        p = self.num_prefix_tokens
        tokens = x[:, p:]
        keep = self._keep(mask, x.shape[0], (h, w), x.dtype)
        delta = grid_to_tokens(self.conv(tokens_to_grid(tokens, (h, w)), keep))
        if p == 0:
            return x + delta
        return torch.cat([x[:, :p], tokens + delta], dim=1)

    def position(self, x: Tensor, size: tuple[int, int] | None = None, mask: Tensor | None = None) -> Tensor:
        """The conv output alone (``forward(x) - x`` computed directly), zeros at prefix tokens and padding."""
        if x.dim() == 4:
            return self._map_delta(x, size, mask)
        h, w = self._check(x, size)
        p = self.num_prefix_tokens
        keep = self._keep(mask, x.shape[0], (h, w), x.dtype)
        delta = grid_to_tokens(self.conv(tokens_to_grid(x[:, p:], (h, w)), keep))
        return delta if p == 0 else torch.cat([delta.new_zeros(x.shape[0], p, x.shape[2]), delta], dim=1)

    def _map_delta(self, x: Tensor, size: tuple[int, int] | None, mask: Tensor | None) -> Tensor:
        if size is not None and tuple(size) != tuple(x.shape[-2:]):
            raise ValueError(
                f"size={tuple(size)} does not match the feature map's (H, W)={tuple(x.shape[-2:])}"
            )
        if x.shape[1] != self.dim:
            raise ValueError(
                f"feature map has C={x.shape[1]} channels (shape {tuple(x.shape)}), PEG2d has dim={self.dim}"
            )
        return self.conv(x, self._keep(mask, x.shape[0], tuple(x.shape[-2:]), x.dtype))

    def _check(self, x: Tensor, size: tuple[int, int] | None) -> tuple[int, int]:
        if size is None:
            raise ValueError(f"tokens of shape {tuple(x.shape)} need size=(H, W)")
        h, w = int(size[0]), int(size[1])
        check_tokens(x, (h, w), self.num_prefix_tokens)
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x has C={x.shape[-1]} channels (shape {tuple(x.shape)}), PEG2d was built for dim={self.dim}"
            )
        return h, w

    @staticmethod
    def _keep(mask: Tensor | None, batch: int, size: tuple[int, int], dtype: torch.dtype) -> Tensor | None:
        if mask is None:
            return None
        if mask.shape != (batch, *size):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected (B, H, W) = {(batch, *size)}")
        return (~mask).unsqueeze(1).to(dtype)


def peg2d_reference(
    x: Tensor, weight: Tensor, bias: Tensor | None, size: tuple[int, int], num_prefix_tokens: int = 0
) -> Tensor:
    """Plain ``F.conv2d`` formulation of PEG2d, for tests and as the naive benchmark baseline."""
    p = num_prefix_tokens
    b, _, c = x.shape
    grid = x[:, p:].transpose(1, 2).reshape(b, c, size[0], size[1])
    out = F.conv2d(grid, weight, bias, padding=weight.shape[-1] // 2, groups=c)
    return torch.cat([x[:, :p], x[:, p:] + out.flatten(2).transpose(1, 2)], dim=1)
