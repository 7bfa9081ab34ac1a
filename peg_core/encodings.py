"""The fixed and learned position encodings in 2D and 3D, and the 2D by-name builder.

All of them implement :class:`peg_core.PositionEncoding`, so a model swaps
one for another by name (:func:`build_position_encoding`).

* 2D: DETR's mask-aware sine, MAE's sin-cos, a learned table (timm/DeiT layout), none;
* 3D (video, ``(T, H, W)`` tubelet grids): a fixed sin-cos and a learned code, both
  factorized as a spatial code of ``(h, w)`` plus a temporal code of ``t``
  (TimeSformer's separate space and time embeddings), so a 2D table trained on images
  drops into the spatial part unchanged.  Prefix tokens (the class token) get zeros.

Learned tables resize with :func:`peg_core.resize_pos_embed`; under tracing / export
(:func:`peg_core.resize.is_tracing`) with its export-safe path
:func:`peg_core.resize.resize_pos_embed_traceable`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import PositionEncoding
from .peg import check_mask, check_tokens
from .resize import (
    INTERPOLATION_MODES,
    is_tracing,
    resize_pos_embed,
    resize_pos_embed_1d,
    resize_pos_embed_traceable,
)

__all__ = [
    "LearnedPositionEncoding2d",
    "LearnedPositionEncoding3d",
    "NoPositionEncoding",
    "SinCosPositionEncoding2d",
    "SinCosPositionEncoding3d",
    "SinePositionEncoding2d",
    "sincos_1d",
    "sincos_2d",
]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _with_prefix(pos: Tensor, num_prefix_tokens: int) -> Tensor:
    """Prepend zero codes for the prefix tokens: ``(B, HW, C) -> (B, P + HW, C)``."""
    if num_prefix_tokens == 0:
        return pos
    return torch.cat([pos.new_zeros(pos.shape[0], num_prefix_tokens, pos.shape[2]), pos], dim=1)


class SinePositionEncoding2d(PositionEncoding):
    """DETR's mask-aware 2D sine encoding.

    Row and column coordinates are counted over the *real* pixels only
    (cumulative sum of the not-padding mask), optionally normalised to
    ``(0, scale]`` per image, and each is expanded into ``C/2`` features
    ``sin(p / T^(2i/(C/2))), cos(p / T^(2i/(C/2)))`` interleaved; the ``y``
    half comes first, then ``x``.  Used on attention queries/keys (``"qk"``).

    Args:
        dim: channels ``C``, a multiple of 4.
        temperature: ``T`` (10000 in DETR).
        normalize: divide the coordinates by the image's extent (DETR: True).
        scale: range after normalisation (``2π`` in DETR).
    """

    def __init__(
        self,
        dim: int,
        temperature: float = 10000.0,
        normalize: bool = True,
        scale: float | None = None,
        num_prefix_tokens: int = 0,
        apply_to: str = "qk",
    ) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(
                f"sine encoding needs dim divisible by 4 (two halves of sin/cos pairs); got {dim}"
            )
        if scale is not None and not normalize:
            raise ValueError("scale only applies with normalize=True")
        self.dim = dim
        self.temperature = temperature
        self.normalize = normalize
        self.scale = 2 * math.pi if scale is None else scale
        self.num_prefix_tokens = num_prefix_tokens
        self._set_apply_to(apply_to)

    def grid(self, mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Codes for a ``(B, H, W)`` padding mask (True = padding), as a ``(B, H, W, C)`` tensor.

        Computed in ``dtype`` (float32, or float64 for float64 callers).  With
        ``normalize`` each image is divided by its own real height/width (the
        last value of its cumulative sum), so its codes ignore the padding.
        """
        not_mask = (~mask).to(dtype)
        y = not_mask.cumsum(1)
        x = not_mask.cumsum(2)
        if self.normalize:
            eps = 1e-6
            y = y / (y[:, -1:, :] + eps) * self.scale
            x = x / (x[:, :, -1:] + eps) * self.scale
        half = self.dim // 2
        i = torch.arange(half, dtype=dtype, device=mask.device)
        dim_t = self.temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / half)
        px = x[..., None] / dim_t
        py = y[..., None] / dim_t
        # sin on even features, cos on odd ones, interleaved as in DETR.
        px = torch.stack((px[..., 0::2].sin(), px[..., 1::2].cos()), dim=-1).flatten(-2)
        py = torch.stack((py[..., 0::2].sin(), py[..., 1::2].cos()), dim=-1).flatten(-2)
        return torch.cat((py, px), dim=-1)

    def position(self, x: Tensor, size: tuple[int, int], mask: Tensor | None = None) -> Tensor:
        """``(B, P + H*W, C)`` codes (``(1, ...)`` without a mask), zeros at prefix tokens."""
        h, w = size
        check_tokens(x, (h, w), self.num_prefix_tokens)
        if mask is None:
            mask = torch.zeros(1, h, w, dtype=torch.bool, device=x.device)
        else:
            check_mask(mask, x.shape[0], (h, w))
        pos = self.grid(mask, _compute_dtype(x.dtype)).flatten(1, 2).to(x.dtype)
        return _with_prefix(pos, self.num_prefix_tokens)


def sincos_2d(
    size: tuple[int, int],
    dim: int,
    temperature: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Fixed 2D sin-cos table ``(H*W, C)`` in MAE's layout, for any ``(H, W)``.

    Token ``i*W + j`` (row ``i``, column ``j``) gets
    ``[sin(j·ω) | cos(j·ω) | sin(i·ω) | cos(i·ω)]`` with ``ω_k = T^(-k/(C/4))``,
    ``k < C/4``: the column (x) half first, as MAE's ``meshgrid(w, h)`` does,
    so a square table equals MAE's.  Computed in float64, returned in ``dtype``.
    """
    if dim % 4:
        raise ValueError(f"sincos encoding needs dim divisible by 4; got {dim}")
    h, w = size
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64, device=device) / quarter)
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float64, device=device),
        torch.arange(w, dtype=torch.float64, device=device),
        indexing="ij",
    )
    oy = ys.reshape(-1, 1) * omega
    ox = xs.reshape(-1, 1) * omega
    return torch.cat([ox.sin(), ox.cos(), oy.sin(), oy.cos()], dim=1).to(dtype)


class SinCosPositionEncoding2d(PositionEncoding):
    """Fixed 2D sin-cos encoding for any grid (see :func:`sincos_2d`); added to the tokens by default.

    Positions count from the top-left corner, so padding at the bottom/right
    does not change the codes of real positions.
    """

    def __init__(
        self, dim: int, temperature: float = 10000.0, num_prefix_tokens: int = 0, apply_to: str = "tokens"
    ) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(f"sincos encoding needs dim divisible by 4; got {dim}")
        self.dim = dim
        self.temperature = temperature
        self.num_prefix_tokens = num_prefix_tokens
        self._set_apply_to(apply_to)

    def position(self, x: Tensor, size: tuple[int, int], mask: Tensor | None = None) -> Tensor:
        """``(1, P + H*W, C)`` codes, zeros at prefix tokens; the mask is not needed (see class doc)."""
        h, w = size
        check_tokens(x, (h, w), self.num_prefix_tokens)
        if mask is not None:
            check_mask(mask, x.shape[0], (h, w))
        pos = sincos_2d((h, w), self.dim, self.temperature, device=x.device, dtype=x.dtype).unsqueeze(0)
        return _with_prefix(pos, self.num_prefix_tokens)


class LearnedPositionEncoding2d(PositionEncoding):
    """A learned table ``(1, P + H0*W0, C)`` (timm/DeiT layout, trunc-normal std 0.02 init).

    For a grid other than ``(H0, W0)`` the grid part is resized with
    :func:`peg_core.resize_pos_embed` (``interpolation`` mode, prefix entries
    kept).  With a padding mask each image's table is resized to its own real
    extent and placed top-left, so real positions do not depend on the batch.

    Args:
        dim: channels ``C``.
        grid_size: ``(H0, W0)`` the table is built for.
        num_prefix_tokens: table entries for the prefix tokens (class token).
        interpolation: ``nearest`` / ``bilinear`` / ``bicubic`` / ``area``.
        antialias: anti-aliased down-sizing.
    """

    def __init__(
        self,
        dim: int,
        grid_size: int | tuple[int, int] = 14,
        num_prefix_tokens: int = 0,
        interpolation: str = "bicubic",
        antialias: bool = False,
        apply_to: str = "tokens",
    ) -> None:
        super().__init__()
        gs = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(int(g) for g in grid_size)
        if interpolation not in INTERPOLATION_MODES[2]:
            raise ValueError(f"interpolation={interpolation!r}; choose from {sorted(INTERPOLATION_MODES[2])}")
        self.dim = dim
        self.grid_size = gs
        self.num_prefix_tokens = num_prefix_tokens
        self.interpolation = interpolation
        self.antialias = antialias
        self._set_apply_to(apply_to)
        self.pos_embed = nn.Parameter(torch.zeros(1, num_prefix_tokens + gs[0] * gs[1], dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def table(self, size: tuple[int, int], mode: str | None = None) -> Tensor:
        """The table for grid ``size``: ``(1, P + H*W, C)`` (export-safe path while tracing)."""
        resize = resize_pos_embed_traceable if is_tracing(size) else resize_pos_embed
        return resize(
            self.pos_embed,
            tuple(size),
            self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens,
            mode=mode or self.interpolation,
            antialias=self.antialias,
        )

    def position(self, x: Tensor, size: tuple[int, int], mask: Tensor | None = None) -> Tensor:
        """``(1, P + H*W, C)`` table, or ``(B, P + H*W, C)`` per-image tables under a mask.

        Under a mask, ``bilinear``/``bicubic`` tables (no antialias) are resampled
        on the device with ``grid_sample`` (no host copy of the extents, one graph
        for torch.compile / ONNX); ``nearest``/``area``/antialiased tables fall
        back to one ``resize_pos_embed`` per image, which reads the extents on the host.
        """
        h, w = size
        check_tokens(x, (h, w), self.num_prefix_tokens)
        if mask is None:
            return self.table((h, w)).to(x.dtype)
        check_mask(mask, x.shape[0], (h, w))
        if self.interpolation in ("bilinear", "bicubic") and not self.antialias:
            return self._masked_tables(mask).to(x.dtype)
        return self._masked_tables_host(x, (int(h), int(w)), mask)

    def _extents(self, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Per-image real extents ``(B,)``: rows / columns with at least one real pixel, at least 1."""
        real = ~mask
        return real.any(2).sum(1).clamp(min=1), real.any(1).sum(1).clamp(min=1)

    def _masked_tables(self, mask: Tensor) -> Tensor:
        """Each image's table resized to its real extent, top-left, zeros elsewhere: ``(B, P + h*w, C)``.

        ``F.interpolate(align_corners=False)`` reads output cell ``j`` of a side
        of length ``n`` at input coordinate ``(j + 0.5) * n0 / n - 0.5``;
        ``grid_sample(align_corners=False)`` maps the normalised coordinate
        ``(2j + 1) / n - 1`` to exactly that, and its ``border`` padding clamps
        the taps as ``interpolate`` does, so the values agree (to rounding).
        """
        b, h, w = mask.shape
        p = self.num_prefix_tokens
        compute = _compute_dtype(self.pos_embed.dtype)
        heights, widths = (e.to(compute) for e in self._extents(mask))  # (B,)
        rows = torch.arange(h, device=mask.device, dtype=compute)
        cols = torch.arange(w, device=mask.device, dtype=compute)
        gy = (2 * rows + 1)[None, :] / heights[:, None] - 1  # (B, h)
        gx = (2 * cols + 1)[None, :] / widths[:, None] - 1  # (B, w)
        grid = torch.stack(
            (gx[:, None, :].expand(b, h, w), gy[:, :, None].expand(b, h, w)), dim=-1
        )  # (B, h, w, 2) as (x, y)
        h0, w0 = self.grid_size
        table = self.pos_embed[:, p:].to(compute).reshape(1, h0, w0, self.dim).movedim(-1, 1)
        out = F.grid_sample(
            table.expand(b, -1, -1, -1),
            grid,
            mode=self.interpolation,
            padding_mode="border",
            align_corners=False,
        )  # (B, C, h, w)
        # Cells beyond the image's real extent (the padding) get no code.
        inside = (rows[None, :, None] < heights[:, None, None]) & (
            cols[None, None, :] < widths[:, None, None]
        )
        out = out.movedim(1, -1) * inside[..., None].to(compute)  # (B, h, w, C)
        prefix = self.pos_embed[:, :p].to(compute).expand(b, -1, -1)
        return torch.cat([prefix, out.flatten(1, 2)], dim=1)

    def _masked_tables_host(self, x: Tensor, size: tuple[int, int], mask: Tensor) -> Tensor:
        """:meth:`_masked_tables` for the modes ``grid_sample`` lacks: one resize per image (reads extents)."""
        h, w = size
        heights, widths = (e.tolist() for e in self._extents(mask))
        p = self.num_prefix_tokens
        out = x.new_zeros(x.shape[0], p + h * w, self.dim)
        for b, (hb, wb) in enumerate(zip(heights, widths)):
            tab = self.table((hb, wb)).to(x.dtype)
            out[b, p:].view(h, w, self.dim)[:hb, :wb] = tab[0, p:].view(hb, wb, self.dim)
            out[b, :p] = tab[0, :p]
        return out


class NoPositionEncoding(PositionEncoding):
    """No position information: the model is permutation-equivariant over the tokens."""

    apply_to = "none"

    def __init__(self, dim: int | None = None, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.num_prefix_tokens = num_prefix_tokens

    def position(self, x: Tensor, size: tuple[int, ...] | None = None, mask: Tensor | None = None) -> None:
        return None


def _space_plus_time(spatial: Tensor, temporal: Tensor) -> Tensor:
    """Spatial ``(H*W, C)`` and temporal ``(T, C)`` codes -> ``(1, T*H*W, C)``, frame-major."""
    return (temporal[:, None, :] + spatial[None, :, :]).reshape(1, -1, spatial.shape[-1])


def sincos_1d(length: int, dim: int, temperature: float = 10000.0, device=None) -> Tensor:
    """Fixed 1D sin-cos table ``(length, C)``: ``[sin(t·ω) | cos(t·ω)]`` with ``ω_k = T^(-k/(C/2))``, ``k < C/2``.

    The temporal companion of :func:`sincos_2d` (same base, float64 math, float32 out).
    """
    if dim % 2:
        raise ValueError(f"temporal sin-cos encoding needs an even dim; got {dim}")
    half = dim // 2
    omega = temperature ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    angle = torch.arange(length, dtype=torch.float64, device=device)[:, None] * omega
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()


class SinCosPositionEncoding3d(SinCosPositionEncoding2d):
    """Fixed code ``sincos_2d(h, w) + sincos_1d(t)`` for any ``(T, H, W)``; added to the tokens.

    The 2D encoding's settings (and checks) with a temporal code added; no parameters, no buffers.

    Args:
        dim: channels ``C`` (a multiple of 4).
        temperature: sin-cos base.
        num_prefix_tokens: leading tokens that get no code.
    """

    def position(self, x: Tensor, size: Sequence[int], mask: Tensor | None = None) -> Tensor:
        """Codes ``(1, P + T*H*W, C)`` in ``x``'s dtype."""
        t, h, w = (int(s) for s in size)
        check_tokens(x, (t, h, w), self.num_prefix_tokens)
        spatial = sincos_2d((h, w), self.dim, self.temperature, device=x.device)
        temporal = sincos_1d(t, self.dim, self.temperature, device=x.device)
        return _with_prefix(_space_plus_time(spatial, temporal).to(x.dtype), self.num_prefix_tokens)


class LearnedPositionEncoding3d(PositionEncoding):
    """Learned spatial ``(1, H0*W0, C)`` and temporal ``(1, T0, C)`` tables, summed per tubelet.

    For another grid the spatial table is resized with
    :func:`peg_core.resize_pos_embed` (``interpolation``) and the temporal one
    with :func:`peg_core.resize_pos_embed_1d` (``temporal_interpolation``), so
    the same weights run at 8, 16 or 32 frames and 224 or 288 pixels.

    Args:
        dim: channels ``C``.
        grid_size: the ``(T0, H0, W0)`` tubelet grid the tables are built for.
        num_prefix_tokens: leading tokens that get no code (the class token).
        interpolation: spatial resize mode (``bicubic``, ``bilinear``, ``nearest``, ``area``).
        temporal_interpolation: temporal resize mode (``linear``, ``nearest``, ``area``).
    """

    def __init__(
        self,
        dim: int,
        grid_size: Sequence[int],
        num_prefix_tokens: int = 0,
        interpolation: str = "bicubic",
        temporal_interpolation: str = "linear",
    ) -> None:
        super().__init__()
        t, h, w = (int(s) for s in grid_size)
        self.dim = dim
        self.grid_size = (t, h, w)
        self.num_prefix_tokens = num_prefix_tokens
        self.interpolation = interpolation
        self.temporal_interpolation = temporal_interpolation
        self.spatial = nn.Parameter(torch.zeros(1, h * w, dim))
        self.temporal = nn.Parameter(torch.zeros(1, t, dim))
        nn.init.trunc_normal_(self.spatial, std=0.02)
        nn.init.trunc_normal_(self.temporal, std=0.02)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid_size={self.grid_size}, num_prefix_tokens={self.num_prefix_tokens}"

    def tables(self, size: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Spatial ``(1, H*W, C)`` and temporal ``(1, T, C)`` tables resized to ``size=(T, H, W)``.

        Under torch.export / ONNX / ``torch.compile(dynamic=True)`` the sizes are symbolic:
        ``resize_pos_embed`` would turn them into constants (``int()``), so the tables go
        through its export-safe path :func:`~peg_core.resize.resize_pos_embed_traceable`
        (same modes, same float32 math).
        """
        if is_tracing(size):
            t, h, w = size
            spatial = resize_pos_embed_traceable(
                self.spatial, (h, w), self.grid_size[1:], mode=self.interpolation
            )
            temporal = resize_pos_embed_traceable(
                self.temporal, (t,), self.grid_size[:1], mode=self.temporal_interpolation
            )
            return spatial, temporal
        t, h, w = (int(s) for s in size)
        spatial = resize_pos_embed(
            self.spatial, (h, w), self.grid_size[1:], num_prefix_tokens=0, mode=self.interpolation
        )
        temporal = resize_pos_embed_1d(
            self.temporal, t, self.grid_size[0], num_prefix_tokens=0, mode=self.temporal_interpolation
        )
        return spatial, temporal

    def position(self, x: Tensor, size: Sequence[int], mask: Tensor | None = None) -> Tensor:
        """Codes ``(1, P + T*H*W, C)`` in ``x``'s dtype."""
        t, h, w = size
        check_tokens(x, (t, h, w), self.num_prefix_tokens)
        spatial, temporal = self.tables((t, h, w))
        pos = _space_plus_time(spatial[0], temporal[0]).to(x.dtype)
        return _with_prefix(pos, self.num_prefix_tokens)
