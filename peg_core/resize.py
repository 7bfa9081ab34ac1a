"""Resizing learned position tables to a new grid (1D, 2D or 3D).

A table trained for one grid (``14×14`` patches at 224 px, say) is reshaped
back to that grid, interpolated to the new one and flattened again.  Prefix
tokens (class token, registers) have no place on the grid and are kept aside.

Two entry points share the interpolation:

* :func:`resize_pos_embed` checks every argument (one-line ``ValueError`` s) and returns
  the table itself when the grid does not change;
* :func:`resize_pos_embed_traceable` is its export-safe path: no Python branch on the
  sizes (which may be ``torch.SymInt`` under ``torch.export`` / ONNX /
  ``torch.compile(dynamic=True)``), so no guard freezes the example's grid.  The
  models call it whenever :func:`is_tracing` says so; nothing is patched at run time.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .peg import check_size

__all__ = [
    "INTERPOLATION_MODES",
    "infer_grid",
    "is_tracing",
    "resize_pos_embed",
    "resize_pos_embed_1d",
    "resize_pos_embed_3d",
    "resize_pos_embed_traceable",
]

#: grid rank -> accepted mode name -> ``F.interpolate`` mode
INTERPOLATION_MODES = {
    1: {"nearest": "nearest", "linear": "linear", "bilinear": "linear", "area": "area"},
    2: {"nearest": "nearest", "bilinear": "bilinear", "bicubic": "bicubic", "area": "area"},
    3: {"nearest": "nearest", "trilinear": "trilinear", "bilinear": "trilinear", "area": "area"},
}


def _as_size(size: int | Sequence[int], name: str, rank: int | None = None) -> tuple[int, ...]:
    """``size`` (an int means ``rank`` equal sides, 2 by default) as positive ints.

    ``ValueError`` naming ``name`` and the value for zero, negative or
    fractional entries: ``int()`` would silently truncate ``2.5`` to ``2``.
    """
    scalar = not hasattr(size, "__len__")
    try:
        return tuple(int(s) for s in check_size((size,) * (rank or 2) if scalar else size, name))
    except ValueError:
        what = "a positive integer" if scalar else "positive integers"
        raise ValueError(f"{name} must be {what}; got {size!r}") from None


def infer_grid(num_tokens: int, rank: int = 2) -> tuple[int, ...]:
    """The square (or cubic) grid holding ``num_tokens`` tokens; ``ValueError`` if there is none."""
    if num_tokens < 1:
        # A negative count has a complex root, and round() would raise a TypeError about it.
        raise ValueError(f"a grid needs at least one token; got {num_tokens} grid tokens")
    side = round(num_tokens ** (1.0 / rank))
    for s in (side - 1, side, side + 1):
        if s > 0 and s**rank == num_tokens:
            return (s,) * rank
    shape = "square" if rank == 2 else ("cubic" if rank == 3 else "1D")
    raise ValueError(
        f"old_size=None means a {shape} grid, but the table has {num_tokens} grid tokens, which is not "
        f"a perfect {'square' if rank == 2 else 'power'}; pass old_size=(...) with the grid it was trained for"
    )


def resize_pos_embed(
    posemb: Tensor,
    new_size: int | Sequence[int],
    old_size: int | Sequence[int] | None = None,
    num_prefix_tokens: int = 1,
    mode: str = "bicubic",
    antialias: bool = False,
    align_corners: bool = False,
) -> Tensor:
    """Resize a flattened position table to a new grid of any rank (1, 2 or 3).

    Args:
        posemb: ``(1, P + prod(old_size), C)`` (or ``(P + prod(old_size), C)``).
        new_size: target grid, ``(H, W)``; ``(T,)`` or ``(T, H, W)`` for video;
            an int means a square 2D grid.  Sizes must be positive ints: zero,
            negative or fractional entries raise a ``ValueError`` naming them.
        old_size: grid the table was trained for; ``None`` means square (cubic
            for rank 3) and the error says so when the token count is not one.
        num_prefix_tokens: ``P`` leading tokens kept aside and put back as they are.
        mode: ``nearest``, ``bilinear``, ``bicubic``, ``area`` (1D: ``linear``;
            3D: ``trilinear``; ``bilinear`` maps to the rank's linear mode).
        antialias: anti-aliased down-sampling (bilinear / bicubic only).
        align_corners: passed to ``F.interpolate`` for the (bi/tri)linear and bicubic modes.

    Returns:
        ``(1, P + prod(new_size), C)`` (or ``(P + prod(new_size), C)`` for a
        2D input) in the input's dtype, computed in float32 (float64 inputs in
        float64), or ``posemb`` itself when the grid does not change.  A grid
        that only keeps its token count (``(2, 8)`` -> ``(4, 4)``) is resized.
    """
    original = posemb
    squeeze = posemb.dim() == 2
    if squeeze:
        posemb = posemb.unsqueeze(0)
    if posemb.dim() != 3:
        raise ValueError(f"posemb must be (1, N, C) or (N, C); got shape {tuple(posemb.shape)}")
    new = _as_size(new_size, "new_size")
    rank = len(new)
    if rank not in INTERPOLATION_MODES:
        raise ValueError(f"new_size must have 1, 2 or 3 dimensions; got {new}")
    n = posemb.shape[1]
    try:
        p = -1 if isinstance(num_prefix_tokens, bool) else operator.index(num_prefix_tokens)
    except TypeError:
        p = -1
    if p < 0:
        raise ValueError(f"num_prefix_tokens must be an int >= 0; got {num_prefix_tokens!r}")
    num_prefix_tokens = p
    if num_prefix_tokens >= n:
        raise ValueError(
            f"num_prefix_tokens={num_prefix_tokens} exceeds the {n} tokens of the table "
            f"(shape {tuple(posemb.shape)}); at least one grid token must be left"
        )
    n_grid = n - num_prefix_tokens
    old = infer_grid(n_grid, rank) if old_size is None else _as_size(old_size, "old_size", rank)
    if len(old) != rank:
        raise ValueError(f"old_size={old} and new_size={new} have different ranks")
    if math.prod(old) != n_grid:
        raise ValueError(
            f"posemb of shape {tuple(posemb.shape)} has {n_grid} grid tokens after {num_prefix_tokens} prefix "
            f"tokens, but old_size={old} holds {math.prod(old)}"
        )
    if mode not in INTERPOLATION_MODES[rank]:
        raise ValueError(
            f"mode={mode!r} is not available for a {rank}D grid; choose from {sorted(INTERPOLATION_MODES[rank])}"
        )
    torch_mode = INTERPOLATION_MODES[rank][mode]
    if antialias and torch_mode not in ("bilinear", "bicubic"):
        raise ValueError(
            f"antialias=True only works with mode='bilinear' or 'bicubic' on 2D grids; mode={mode!r} "
            f"on a {rank}D grid has no anti-aliased version (pass antialias=False)"
        )
    interpolating = torch_mode in ("linear", "bilinear", "bicubic", "trilinear")
    if align_corners and not interpolating:
        raise ValueError(
            f"align_corners=True only applies to the (bi/tri)linear and bicubic modes, not {mode!r}"
        )
    if old == new:
        return original
    out = _interpolate(posemb, new, old, num_prefix_tokens, torch_mode, antialias, align_corners)
    return out.squeeze(0) if squeeze else out


def _interpolate(
    posemb: Tensor,
    new: Sequence[int | torch.SymInt],
    old: Sequence[int],
    num_prefix_tokens: int,
    torch_mode: str,
    antialias: bool,
    align_corners: bool,
) -> Tensor:
    """The resize itself: ``(B, P + prod(old), C)`` -> ``(B, P + prod(new), C)`` with ``F.interpolate``.

    Traced ops only (slicing, reshape, interpolate with ``size=new``, cat), so it runs
    with symbolic ``new`` too.  Half precision is interpolated in float32 (float64 stays).
    """
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    b, _, c = grid.shape
    compute = torch.float64 if posemb.dtype == torch.float64 else torch.float32
    # (B, N, C) -> (B, C, *old): interpolate works channel-first.
    grid = grid.to(compute).reshape(b, *old, c).movedim(-1, 1)
    kwargs = {}
    if torch_mode in ("linear", "bilinear", "bicubic", "trilinear"):
        kwargs["align_corners"] = align_corners
    if antialias:
        kwargs["antialias"] = True
    grid = F.interpolate(grid, size=tuple(new), mode=torch_mode, **kwargs)
    grid = grid.movedim(1, -1).reshape(b, -1, c).to(posemb.dtype)
    return torch.cat([prefix, grid], dim=1)


def is_tracing(size: Sequence[int | torch.SymInt] = ()) -> bool:
    """True under ``torch.export`` / ONNX export / ``torch.compile``, or when ``size`` holds a ``SymInt``.

    Then a model resizes its table with :func:`resize_pos_embed_traceable`: the checks and the
    same-size shortcut of :func:`resize_pos_embed` are Python branches on the size, which
    tracing would freeze into guards on the example's grid (or an ``int()`` would make constant).
    """
    return torch.compiler.is_compiling() or any(isinstance(s, torch.SymInt) for s in size)


def resize_pos_embed_traceable(
    posemb: Tensor,
    new_size: Sequence[int | torch.SymInt],
    old_size: Sequence[int],
    num_prefix_tokens: int = 0,
    mode: str = "bicubic",
    antialias: bool = False,
    align_corners: bool = False,
) -> Tensor:
    """:func:`resize_pos_embed` for tracing and export: always interpolates, no checks on the sizes.

    Args:
        posemb: ``(1, P + prod(old_size), C)``.
        new_size: target grid of rank 1, 2 or 3; entries may be ``torch.SymInt`` (symbolic sizes).
        old_size: the table's grid (plain ints: it is a property of the weights).
        num_prefix_tokens, mode, antialias, align_corners: as for :func:`resize_pos_embed`.

    Returns:
        ``(1, P + prod(new_size), C)``.  To the same grid, ``align_corners=False`` reads every
        cell at its own centre (weights 0 and 1), so the values are the table's own; other
        grids give exactly :func:`resize_pos_embed`'s values.
    """
    torch_mode = INTERPOLATION_MODES[len(new_size)][mode]
    return _interpolate(
        posemb, new_size, tuple(old_size), num_prefix_tokens, torch_mode, antialias, align_corners
    )


def resize_pos_embed_1d(
    posemb: Tensor,
    new_len: int,
    old_len: int | None = None,
    num_prefix_tokens: int = 0,
    mode: str = "linear",
    **kw,
) -> Tensor:
    """Temporal table ``(1, P + T, C)`` resized to ``new_len`` (see :func:`resize_pos_embed`)."""
    new = _as_size(new_len, "new_len", 1)
    if old_len is None:
        old = (posemb.shape[-2] - num_prefix_tokens,)  # checked against the table by resize_pos_embed
    else:
        old = _as_size(old_len, "old_len", 1)
    return resize_pos_embed(posemb, new, old, num_prefix_tokens=num_prefix_tokens, mode=mode, **kw)


def resize_pos_embed_3d(
    posemb: Tensor,
    new_size: Sequence[int],
    old_size: Sequence[int] | None = None,
    num_prefix_tokens: int = 0,
    mode: str = "trilinear",
    **kw,
) -> Tensor:
    """Space-time table ``(1, P + T*H*W, C)`` resized to ``(T, H, W)`` (see :func:`resize_pos_embed`)."""
    new = _as_size(new_size, "new_size", 3)
    old = None if old_size is None else _as_size(old_size, "old_size", 3)
    if len(new) != 3:
        raise ValueError(f"new_size must be (T, H, W); got {new_size!r}")
    return resize_pos_embed(posemb, new, old, num_prefix_tokens=num_prefix_tokens, mode=mode, **kw)
