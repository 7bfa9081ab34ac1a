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
    """Raise a ``ValueError`` naming the shapes when ``x`` is not ``(B, P + prod(size), C)``.

    ``size`` may hold Python ints or symbolic sizes (``torch.compile`` /
    ``torch.export``); they are not forced to ints so the shapes stay dynamic.
    """
    if x.dim() != 3:
        raise ValueError(f"{name} must be tokens (B, N, C); got shape {tuple(x.shape)}")
    numel = 1
    for s in size:
        numel = numel * s
    if x.shape[1] != num_prefix_tokens + numel:
        grid = "x".join(str(s) for s in size)
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
    """``(B, C, H, W)`` map -> ``(B, H*W, C)`` tokens; a free view when the map is channels-last."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)


def _check_mask(mask: Tensor, batch: int, size: tuple[int, int]) -> None:
    """``mask`` must be ``(B, H, W)`` bool (True = padding)."""
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = padding); got dtype {mask.dtype}")
    if tuple(mask.shape) != (batch, size[0], size[1]):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected (B, H, W) = ({batch}, {size[0]}, {size[1]})"
        )


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
        Returns the same shape; a feature map keeps its memory format.

    With a mask, padded positions are zeroed before the conv (and between the
    two convs of the separable variant) and left unchanged after it, so an
    image's real positions get the same output whatever padding its batch has
    (the padding must sit at the bottom/right, as DETR pads).

    The depthwise conv runs on a channels-last view of the tokens: no
    NCHW-contiguous copy is made, and the residual add goes into the conv's
    own output buffer (one fresh ``(B, N, C)`` tensor per call without prefix
    tokens or mask; prefix tokens add a channels-last copy of the grid and a
    concatenation).  As a :class:`~peg_core.PositionEncoding` it applies to
    ``"tokens"`` and its ``position`` is the conv output (zeros at prefix
    tokens and padding).
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
        if dim < 1 or num_prefix_tokens < 0:
            raise ValueError(f"need dim >= 1 and num_prefix_tokens >= 0; got {dim}, {num_prefix_tokens}")
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
        """Depthwise conv of a ``(B, C, H, W)`` map, in the map's memory format.

        ``keep`` ``(B, 1, H, W)`` (1 = real, 0 = padding) zeroes the padding
        before the conv, between the two separable convs and after it.  The
        multiplies after a conv are in place: a conv's backward needs its
        input, never its output.
        """
        if keep is not None:
            grid = grid * keep
        if self.separable:
            grid = self.proj_w(grid)
            if keep is not None:
                grid = grid.mul_(keep)
        out = self.proj(grid)
        if keep is not None:
            out = out.mul_(keep)
        return out

    def forward(self, x: Tensor, size: tuple[int, int] | None = None, mask: Tensor | None = None) -> Tensor:
        """``x`` plus the conv of its grid; see the class docstring for shapes."""
        if x.dim() == 4:
            return _residual(self._map_delta(x, size, mask), x)
        h, w = self._check(x, size)
        p = self.num_prefix_tokens
        if p == 0:
            return _residual(self._token_delta(x, (h, w), mask), x)
        tokens = x[:, p:]
        return torch.cat([x[:, :p], _residual(self._token_delta(tokens, (h, w), mask), tokens)], dim=1)

    def position(self, x: Tensor, size: tuple[int, int] | None = None, mask: Tensor | None = None) -> Tensor:
        """The conv output alone (``forward(x) - x`` computed directly), zeros at prefix tokens and padding."""
        if x.dim() == 4:
            return self._map_delta(x, size, mask)
        h, w = self._check(x, size)
        p = self.num_prefix_tokens
        delta = self._token_delta(x[:, p:], (h, w), mask)
        return delta if p == 0 else torch.cat([delta.new_zeros(x.shape[0], p, x.shape[2]), delta], dim=1)

    def _token_delta(self, tokens: Tensor, size: tuple[int, int], mask: Tensor | None) -> Tensor:
        """Conv output for grid tokens ``(B, H*W, C)`` -> ``(B, H*W, C)``."""
        if not tokens.is_contiguous():
            # Behind prefix tokens the grid slice has a batch stride of
            # (P + H*W) * C, which the conv kernels would copy anyway; copy it
            # once here, straight into channels-last order (never NCHW).
            tokens = tokens.contiguous()
        keep = self._keep(mask, tokens.shape[0], size, tokens.dtype)
        return grid_to_tokens(self.conv(tokens_to_grid(tokens, size), keep))

    def _map_delta(self, x: Tensor, size: tuple[int, int] | None, mask: Tensor | None) -> Tensor:
        if size is not None and tuple(size) != tuple(x.shape[-2:]):
            raise ValueError(
                f"size={tuple(size)} does not match the feature map's (H, W)={tuple(x.shape[-2:])}"
            )
        if x.shape[1] != self.dim:
            raise ValueError(
                f"feature map has C={x.shape[1]} channels (shape {tuple(x.shape)}), PEG2d has dim={self.dim}"
            )
        return self.conv(x, self._keep(mask, x.shape[0], (x.shape[2], x.shape[3]), x.dtype))

    def _check(self, x: Tensor, size: tuple[int, int] | None) -> tuple[int, int]:
        if size is None:
            raise ValueError(f"tokens of shape {tuple(x.shape)} need size=(H, W)")
        if len(size) != 2:
            raise ValueError(f"size must be (H, W); got {tuple(size)}")
        h, w = size
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
        _check_mask(mask, batch, size)
        return (~mask).unsqueeze(1).to(dtype)


def _residual(delta: Tensor, x: Tensor) -> Tensor:
    """``x + delta``, added into ``delta``'s fresh buffer when the dtypes agree (saves an allocation).

    Under autocast the conv output is half precision while ``x`` is not; then
    the out-of-place add keeps the residual stream in ``x``'s dtype.
    """
    if delta.dtype == x.dtype:
        return delta.add_(x)
    return x + delta


def peg2d_reference(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    size: tuple[int, int],
    num_prefix_tokens: int = 0,
    mask: Tensor | None = None,
) -> Tensor:
    """The naive formulation: transpose to an NCHW-contiguous grid, ``F.conv2d``, add, cat.

    ``x`` ``(B, P + H*W, C)``, ``weight`` ``(C, 1, k, k)``, ``mask`` ``(B, H, W)``
    (True = padding, zeroed before the conv and left unchanged after it).
    Kept as the baseline of ``tools/bench_core.py``.
    """
    p = num_prefix_tokens
    b, _, c = x.shape
    grid = x[:, p:].transpose(1, 2).reshape(b, c, size[0], size[1])
    keep = None if mask is None else (~mask).unsqueeze(1).to(x.dtype)
    if keep is not None:
        grid = grid * keep
    out = F.conv2d(grid, weight, bias, padding=weight.shape[-1] // 2, groups=c)
    if keep is not None:
        out = out * keep
    return torch.cat([x[:, :p], x[:, p:] + out.flatten(2).transpose(1, 2)], dim=1)
