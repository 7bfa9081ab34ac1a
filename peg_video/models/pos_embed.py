"""Space-time position encodings that are not conditional: a learned and a fixed sin-cos one.

Both are factorized the same way: the code of the tubelet at ``(t, h, w)``
is a spatial code of ``(h, w)`` plus a temporal code of ``t`` (TimeSformer's
separate space and time embeddings), so a 2D table trained on images drops
into the spatial part unchanged.  Prefix tokens (the class token) get zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core import PositionEncoding, check_tokens, resize_pos_embed, resize_pos_embed_1d, sincos_2d
from peg_core.encodings import _with_prefix  # zero codes for the prefix tokens, shared with 2D

__all__ = ["LearnedPositionEncoding3d", "SinCosPositionEncoding3d", "sincos_1d"]


def _space_plus_time(spatial: Tensor, temporal: Tensor) -> Tensor:
    """Spatial ``(H*W, C)`` and temporal ``(T, C)`` codes -> ``(1, T*H*W, C)``, frame-major."""
    return (temporal[:, None, :] + spatial[None, :, :]).reshape(1, -1, spatial.shape[-1])


def sincos_1d(length: int, dim: int, temperature: float = 10000.0, device=None) -> Tensor:
    """Fixed 1D sin-cos table ``(length, C)``: ``[sin(t·ω) | cos(t·ω)]`` with ``ω_k = T^(-k/(C/2))``, ``k < C/2``.

    The temporal companion of :func:`peg_core.sincos_2d` (same base, float64 math, float32 out).
    """
    if dim % 2:
        raise ValueError(f"temporal sin-cos encoding needs an even dim; got {dim}")
    half = dim // 2
    omega = temperature ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    angle = torch.arange(length, dtype=torch.float64, device=device)[:, None] * omega
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()


class SinCosPositionEncoding3d(PositionEncoding):
    """Fixed code ``sincos_2d(h, w) + sincos_1d(t)`` for any ``(T, H, W)``; added to the tokens.

    Args:
        dim: channels ``C`` (a multiple of 4).
        temperature: sin-cos base.
        num_prefix_tokens: leading tokens that get no code.
    """

    def __init__(self, dim: int, temperature: float = 10000.0, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(f"sincos encoding needs dim divisible by 4; got {dim}")
        self.dim = dim
        self.temperature = temperature
        self.num_prefix_tokens = num_prefix_tokens

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

        Under torch.export / ONNX / ``torch.compile(dynamic=True)`` the sizes are
        symbolic: ``resize_pos_embed`` would turn them into constants (``int()``),
        so the tables are interpolated directly, with the same modes and float32 math.
        """
        if torch.compiler.is_compiling() or any(isinstance(s, torch.SymInt) for s in size):
            return self._traced_tables(tuple(size))
        t, h, w = (int(s) for s in size)
        spatial = resize_pos_embed(
            self.spatial, (h, w), self.grid_size[1:], num_prefix_tokens=0, mode=self.interpolation
        )
        temporal = resize_pos_embed_1d(
            self.temporal, t, self.grid_size[0], num_prefix_tokens=0, mode=self.temporal_interpolation
        )
        return spatial, temporal

    def _traced_tables(self, size: tuple) -> tuple[Tensor, Tensor]:
        """:meth:`tables` for symbolic ``(T, H, W)``: ``F.interpolate`` with a traced output size."""
        t, h, w = size
        h0, w0 = self.grid_size[1:]
        compute = torch.float64 if self.spatial.dtype == torch.float64 else torch.float32
        spatial_mode = self.interpolation  # bicubic / bilinear / nearest / area: F.interpolate's names
        temporal_mode = (
            "linear" if self.temporal_interpolation in ("linear", "bilinear") else self.temporal_interpolation
        )
        grid = self.spatial.to(compute).reshape(1, h0, w0, self.dim).movedim(-1, 1)  # (1, C, H0, W0)
        kw = {"align_corners": False} if spatial_mode in ("bilinear", "bicubic") else {}
        grid = F.interpolate(grid, size=(h, w), mode=spatial_mode, **kw)
        spatial = grid.movedim(1, -1).reshape(1, -1, self.dim).to(self.spatial.dtype)  # (1, H*W, C)
        line = self.temporal.to(compute).movedim(-1, 1)  # (1, C, T0)
        kw = {"align_corners": False} if temporal_mode == "linear" else {}
        line = F.interpolate(line, size=(t,), mode=temporal_mode, **kw)
        return spatial, line.movedim(1, -1).to(self.temporal.dtype)  # (1, T, C)

    def position(self, x: Tensor, size: Sequence[int], mask: Tensor | None = None) -> Tensor:
        """Codes ``(1, P + T*H*W, C)`` in ``x``'s dtype."""
        t, h, w = size
        check_tokens(x, (t, h, w), self.num_prefix_tokens)
        spatial, temporal = self.tables((t, h, w))
        pos = _space_plus_time(spatial[0], temporal[0]).to(x.dtype)
        return _with_prefix(pos, self.num_prefix_tokens)
