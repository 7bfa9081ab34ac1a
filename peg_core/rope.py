"""Rotary position encodings (RoPE) for 1/2/3-D token grids, applied to attention queries and keys.

One formulation covers the axial (naver rope-vit / timm), mixed (learned), DINOv3 (normalised
coordinates) and 3-D (V-JEPA 2 channel split) variants: every token gets coordinates ``c``
(one per grid axis), every rotary pair ``j`` of a head gets one frequency per axis ``F[a, j]``,
and the pair is rotated by the angle ``theta_j = sum_a c_a * F[a, j]``.

* axial (:class:`RoPEAxial`): the pairs are split into one section per axis, section ``a``
  uses axis ``a`` only, with frequencies ``temperature ** (-i / n)`` (``n`` pairs per section);
  pairs left over (``head_dim / 2`` not a multiple of the number of axes) are not rotated;
* mixed (:class:`RoPEMixed`): ``F`` is learned, one per layer and head (naver's init);
* DINOv3 (:class:`RoPEDinoV3`): axial sections with frequencies ``2 pi / period`` on
  coordinates normalised to ``[-1, 1]``;
* 3-D (``build_rope("rope-3d", ...)``): axial over ``(T, H, W)``, sections of
  ``(head_dim // 3) // 2`` pairs each (V-JEPA 2's ``2 * ((head_dim // 3) // 2)`` channels), base 10000.
  ``layout="vjepa2"`` is V-JEPA 2's exact channel layout (:class:`RoPEAxial`): within a section of
  ``2n`` channels, channel ``c`` turns at frequency ``w[c mod n]`` while the rotation still pairs
  ``(2j, 2j+1)``, so the two members of a pair can turn by different angles.

Shapes (``D`` = head dim, even; ``J = D / 2`` pairs; grid ``size`` with ``N = prod(size)``
tokens, row-major; ``P`` prefix tokens (class, registers) in front, never rotated)::

    coordinates  rope_coords(size, mask)     (N, k)  or (B, N, k) with a padding mask (B, *size)
    table        RotaryEmbedding(size, mask, num_prefix_tokens=P) -> (sin, cos), each
                   fixed kinds:  (P + N, D)                  mask: (B, 1, P + N, D)
                   mixed:        (depth, heads, P + N, D)    mask: (depth, B, heads, P + N, D)
    rotation     apply_rope(x, sin, cos)     x (..., P + N, D) -> same shape and dtype

The table is in *apply form*: for a rotary pair ``(a, b)`` (``(2j, 2j+1)`` interleaved, the
naver/timm layout; ``(j, j + J)`` with ``half=True``, the DINOv3 layout) ``cos[a] = cos[b] =
cos(theta_j)``, ``sin[a] = -sin(theta_j)``, ``sin[b] = +sin(theta_j)``, so the rotation is
``x * cos + swap(x) * sin`` with ``swap`` exchanging the two members of every pair (one fused
multiply-add, no negation per call).  Prefix rows are the identity (``sin = 0``, ``cos = 1``),
so attention rotates the whole sequence in one pass.  Tables are at least float32 (float64 when
the frequencies are); :func:`apply_rope` computes in the promoted dtype and returns ``x``'s.

Padding (DETR batches): with a mask ``(B, *size)`` (True = padding) a token's coordinates are its
integer offset from the first real row / column of its image, and normalised coordinates use
the extent of the real region, so a token's rotation does not depend on how much padding the
batch added.  The modules keep no per-size cache: tables are computed from ``size`` on every
call (a few small kernels), which keeps ``torch.compile(fullgraph=True)`` and ``torch.export``
with dynamic sizes working.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "ROPE_KINDS",
    "ROTARY_KINDS",
    "RoPEAxial",
    "RoPEDinoV3",
    "RoPEMixed",
    "RotaryEmbedding",
    "RotaryKind",
    "apply_rope",
    "build_rope",
    "rope_coords",
    "rotary_kind",
]

NORMALIZE = ("separate", "min", "max")


def _check_size(size: Sequence[int], ndim: int) -> tuple[int, ...]:
    size = tuple(size)
    if len(size) != ndim:
        raise ValueError(f"grid size {size} has {len(size)} axes; this rotary encoding is {ndim}-D")
    return size


def _real_extents(mask: Tensor, ndim: int) -> tuple[list[Tensor], list[Tensor]]:
    """Per image and axis: index of the first real cell ``(B,)`` and the real extent ``(B,)`` (at least 1)."""
    real = ~mask
    starts, extents = [], []
    for a in range(ndim):
        other = [d for d in range(1, ndim + 1) if d != a + 1]
        line = real.any(dim=other) if other else real  # (B, size_a): the axis has a real cell there
        n = line.shape[1]
        first = line.int().argmax(1)  # first True (0 when none)
        last = n - 1 - line.flip(1).int().argmax(1)
        starts.append(first)
        extents.append((last - first + 1).clamp(min=1))
    return starts, extents


def rope_coords(
    size: Sequence[int],
    mask: Tensor | None = None,
    *,
    normalize: str | None = None,
    indexing: str = "ij",
    offset: float = 0.0,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Token coordinates on a grid: ``(N, k)``, or ``(B, N, k)`` with a padding mask ``(B, *size)``.

    Args:
        size: the grid ``(S1, ..., Sk)``, ``k`` in 1..3; tokens are row-major.
        mask: True at padding; coordinates are then counted from each image's first real cell.
        normalize: ``None``: integer indices (``+ offset``); ``"separate"`` / ``"min"`` / ``"max"``:
            DINOv3's ``2 * (i + 0.5 + offset) / extent - 1`` with each axis' extent, or the
            smallest / largest extent for all axes (the real region's extent under a mask).
        indexing: ``"ij"`` (channels in ``size`` order) or ``"xy"`` (2-D only: channel 0 is the
            column index, channel 1 the row index; the naver / timm rope-vit layout).
    """
    size = tuple(size)
    k = len(size)
    if not 1 <= k <= 3:
        raise ValueError(f"rotary encodings take 1-3 grid axes; got size {size}")
    if indexing not in ("ij", "xy"):
        raise ValueError(f"indexing must be 'ij' or 'xy'; got {indexing!r}")
    if indexing == "xy" and k != 2:
        raise ValueError(f"indexing='xy' is for 2-D grids; got size {size}")
    if normalize is not None and normalize not in NORMALIZE:
        raise ValueError(f"normalize must be None or one of {NORMALIZE}; got {normalize!r}")
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() != k + 1 or tuple(mask.shape[1:]) != size:
            raise ValueError(
                f"mask must be bool (B, {', '.join(map(str, size))}); got {mask.dtype} {tuple(mask.shape)}"
            )
        device = mask.device
    axes = [torch.arange(s, device=device, dtype=dtype) for s in size]
    if mask is None:
        if normalize is not None:  # python (symbolic) extents: no host value is baked into an export
            ext = {"min": functools.reduce(torch.sym_min, size), "max": functools.reduce(torch.sym_max, size)}
            axes = [2.0 * (t + 0.5 + offset) / ext.get(normalize, s) - 1.0 for t, s in zip(axes, size)]
        elif offset:
            axes = [t + offset for t in axes]
        coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, k)  # (N, k) row-major
    else:
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, k)
        starts, extents = _real_extents(mask, k)
        start = torch.stack(starts, -1).to(dtype)[:, None, :]  # (B, 1, k)
        extent = torch.stack(extents, -1).to(dtype)[:, None, :]
        coords = grid[None] - start + offset  # (B, N, k)
        if normalize is not None:
            if normalize == "min":
                extent = extent.amin(-1, keepdim=True)
            elif normalize == "max":
                extent = extent.amax(-1, keepdim=True)
            coords = 2.0 * (coords + 0.5) / extent - 1.0
    if indexing == "xy":
        coords = coords.flip(-1)
    return coords


def _apply_form(sin: Tensor, cos: Tensor, half: bool) -> tuple[Tensor, Tensor]:
    """Pair values ``(..., J)`` -> full-width apply-form tables ``(..., 2J)`` (see the module docstring)."""
    if half:
        return torch.cat([-sin, sin], -1), torch.cat([cos, cos], -1)
    return torch.stack([-sin, sin], -1).flatten(-2), torch.stack([cos, cos], -1).flatten(-2)


def _channel_form(sin: Tensor, cos: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel values ``(..., D)`` -> apply-form tables: ``sin`` negated on the first member of each pair."""
    sign = torch.ones(sin.shape[-1], dtype=sin.dtype, device=sin.device)
    sign[0::2] = -1.0
    return sin * sign, cos


def _with_prefix(sin: Tensor, cos: Tensor, p: int) -> tuple[Tensor, Tensor]:
    """Identity rows (``sin = 0``, ``cos = 1``) for ``p`` prefix tokens in front of the grid rows."""
    if not p:
        return sin, cos
    return F.pad(sin, (0, 0, p, 0)), F.pad(cos, (0, 0, p, 0), value=1.0)


def apply_rope(x: Tensor, sin: Tensor, cos: Tensor, num_prefix_tokens: int = 0, half: bool = False) -> Tensor:
    """Rotate queries or keys ``x`` ``(..., N, D)`` by an apply-form table; same shape and dtype as ``x``.

    Args:
        x: ``(B, heads, N, D)`` (any leading dims), ``N = P + grid tokens``.
        sin, cos: tables broadcastable to ``x`` with ``N`` rows (prefix rows included, as
            :class:`RotaryEmbedding` returns them with ``num_prefix_tokens``) or ``N - num_prefix_tokens``
            rows (the first ``num_prefix_tokens`` tokens are then left unrotated).
        num_prefix_tokens: tokens in front that the table has no rows for.
        half: the pair layout the table was built with (``(j, j + D/2)`` pairs instead of ``(2j, 2j+1)``).
    """
    n, d = x.shape[-2], x.shape[-1]
    if sin.shape != cos.shape:
        raise ValueError(f"sin {tuple(sin.shape)} and cos {tuple(cos.shape)} differ")
    if d % 2 or sin.shape[-1] != d:
        raise ValueError(
            f"rotary table has width {sin.shape[-1]}; x {tuple(x.shape)} needs an even width {d}"
        )
    rows = sin.shape[-2]
    if rows != n:
        if rows + num_prefix_tokens != n:
            raise ValueError(
                f"rotary table has {rows} rows; x {tuple(x.shape)} has {n} tokens "
                f"({num_prefix_tokens} prefix tokens)"
            )
        sin, cos = _with_prefix(sin, cos, num_prefix_tokens)
    if half:
        swapped = torch.cat([x[..., d // 2 :], x[..., : d // 2]], -1)
    else:
        swapped = torch.stack([x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    out = x * cos
    return torch.addcmul(out, swapped.to(out.dtype), sin.to(out.dtype)).to(x.dtype)


class RotaryEmbedding(nn.Module, ABC):
    """Base of the rotary encodings: coordinates x frequencies -> the apply-form ``(sin, cos)`` table.

    Subclasses define :meth:`frequencies` ``(k, L, heads, J)`` (``L = heads = 1`` when shared by all
    layers and heads).  ``forward(size, mask=None, num_prefix_tokens=0)`` returns the table for
    the grid (shapes in the module docstring); it has no state besides the frequencies.

    Args:
        head_dim: ``D``, even.
        ndim: grid axes ``k`` (1, 2 or 3).
        half: DINOv3's ``(j, j + D/2)`` pairs instead of interleaved ``(2j, 2j+1)``.
        normalize, indexing, offset: coordinates as :func:`rope_coords`.
        shift_coords, jitter_coords, rescale_coords: training-time augmentation of the
            coordinates (DINOv3), one draw per call shared by all tokens: a uniform shift in
            ``[-s, s]`` per axis, a log-uniform scale in ``[1/J, J]`` per axis, a log-uniform
            scale in ``[1/R, R]`` shared by the axes.  Off in eval mode.
    """

    learned: bool = False
    #: :meth:`frequencies` gives one frequency per channel ``(k, L, heads, D)`` instead of per pair
    per_channel: bool = False

    def __init__(
        self,
        head_dim: int,
        ndim: int = 2,
        *,
        half: bool = False,
        normalize: str | None = None,
        indexing: str = "ij",
        offset: float = 0.0,
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
    ) -> None:
        super().__init__()
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"rotary encodings need an even head_dim; got {head_dim}")
        if ndim not in (1, 2, 3):
            raise ValueError(f"ndim must be 1, 2 or 3; got {ndim}")
        if indexing == "xy" and ndim != 2:
            raise ValueError(f"indexing='xy' is for 2-D grids; got ndim={ndim}")
        if indexing not in ("ij", "xy"):
            raise ValueError(f"indexing must be 'ij' or 'xy'; got {indexing!r}")
        if normalize is not None and normalize not in NORMALIZE:
            raise ValueError(f"normalize must be None or one of {NORMALIZE}; got {normalize!r}")
        for name, value, low in (("shift_coords", shift_coords, 0.0), ("jitter_coords", jitter_coords, 1.0),
                                 ("rescale_coords", rescale_coords, 1.0)):  # fmt: skip
            if value is not None and (isinstance(value, bool) or not math.isfinite(value) or value < low):
                raise ValueError(f"{name} must be a finite number >= {low:g} or None; got {value!r}")
        self.head_dim = head_dim
        self.ndim = ndim
        self.half = half
        self.normalize = normalize
        self.indexing = indexing
        self.offset = offset
        self.shift_coords = shift_coords
        self.jitter_coords = jitter_coords
        self.rescale_coords = rescale_coords

    @property
    def num_pairs(self) -> int:
        return self.head_dim // 2

    @abstractmethod
    def frequencies(self) -> Tensor:
        """``(k, L, heads, J)``: the angle of pair ``j`` is ``sum_a coord_a * F[a, l, h, j]``."""

    def _augment(self, coords: Tensor) -> Tensor:
        k, dev, dt = coords.shape[-1], coords.device, coords.dtype
        if self.shift_coords is not None:
            coords = coords + torch.empty(k, device=dev, dtype=dt).uniform_(
                -self.shift_coords, self.shift_coords
            )
        if self.jitter_coords is not None:
            j = math.log(self.jitter_coords)
            coords = coords * torch.empty(k, device=dev, dtype=dt).uniform_(-j, j).exp()
        if self.rescale_coords is not None:
            r = math.log(self.rescale_coords)
            coords = coords * torch.empty(1, device=dev, dtype=dt).uniform_(-r, r).exp()
        return coords

    def angles(self, size: Sequence[int], mask: Tensor | None = None) -> Tensor:
        """Rotation angles ``(L, B or 1, heads, N, J)`` for the grid tokens."""
        size = _check_size(size, self.ndim)
        freq = self.frequencies()
        compute = torch.promote_types(freq.dtype, torch.float32)
        freq = freq.to(compute)
        coords = rope_coords(size, mask, normalize=self.normalize, indexing=self.indexing, offset=self.offset,
                             device=freq.device, dtype=compute)  # fmt: skip
        if self.training and (self.shift_coords or self.jitter_coords or self.rescale_coords):
            coords = self._augment(coords)
        if coords.dim() == 2:
            coords = coords[None]  # (Bc, N, k)
        k, layers, heads, j = freq.shape
        out = None
        for a in range(k):  # k <= 3: unrolled, one broadcast multiply-add per axis
            term = coords[None, :, None, :, a, None] * freq[a].reshape(layers, 1, heads, 1, j)
            out = term if out is None else out + term
        return out

    def forward(
        self, size: Sequence[int], mask: Tensor | None = None, num_prefix_tokens: int = 0
    ) -> tuple[Tensor, Tensor]:
        """The apply-form ``(sin, cos)`` table for grid ``size`` (shapes in the module docstring)."""
        ang = self.angles(size, mask)
        if self.per_channel:
            sin, cos = _channel_form(ang.sin(), ang.cos())
        else:
            sin, cos = _apply_form(ang.sin(), ang.cos(), self.half)
        sin, cos = _with_prefix(sin, cos, num_prefix_tokens)
        if not self.learned:
            sin, cos = sin[0], cos[0]  # (Bc, 1, P + N, D)
            if mask is None:
                sin, cos = sin[0, 0], cos[0, 0]  # (P + N, D)
        elif mask is None:
            sin, cos = sin[:, 0], cos[:, 0]  # (L, heads, P + N, D)
        return sin, cos

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, ndim={self.ndim}, half={self.half}, indexing={self.indexing!r}"


class _FixedFrequencies(RotaryEmbedding):
    """Axial sections with fixed frequencies, kept as a non-persistent buffer of at least float32."""

    @abstractmethod
    def _make(self) -> Tensor:
        """The fixed frequencies of the subclass's formulation."""

    def _sections(self, per_pair: Tensor) -> Tensor:
        """``(n,)`` frequencies of one section -> ``(k, 1, 1, J)``, section ``a`` on axis ``a``, rest 0."""
        k, n = self.ndim, per_pair.numel()
        freq = torch.zeros(k, 1, 1, self.num_pairs, dtype=per_pair.dtype)
        for a in range(k):
            freq[a, 0, 0, a * n : (a + 1) * n] = per_pair
        return freq

    def _register(self) -> None:
        self.register_buffer("inv_freq", self._make().float(), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        # rebuild from the float64 formula after a cast: .double() gets exact values, .half() /
        # .bfloat16() keep float32 (angles grow with the position; rounded frequencies would not do)
        module = super()._apply(fn, *args, **kwargs)
        dtype = torch.promote_types(self.inv_freq.dtype, torch.float32)
        self.inv_freq = self._make().to(self.inv_freq.device, dtype)
        return module

    def frequencies(self) -> Tensor:
        return self.inv_freq


class RoPEAxial(_FixedFrequencies):
    """Axial RoPE (naver rope-vit's ``compute_axial_cis``, timm's ``RotaryEmbeddingCat``).

    Pairs ``[a*n, (a+1)*n)`` rotate with axis ``a`` (``n = (head_dim // 2) // ndim``) at frequencies
    ``temperature ** (-i / n)``, ``i < n``; integer patch indices.  2-D naver / timm: ``temperature=100``,
    ``indexing="xy"`` (first section on the column index x).  3-D ``temperature=10000`` is V-JEPA 2's split.

    ``layout``: ``"pairs"`` (default: both members of pair ``i`` of a section turn at ``w_i``) or
    ``"vjepa2"`` (V-JEPA 2 / transformers' ``VJEPA2RopeAttention``: the section's ``2n`` channels
    take frequencies ``[w_0 .. w_{n-1}, w_0 .. w_{n-1}]`` channel by channel, paired ``(2j, 2j+1)``
    for the rotation); not with ``half``.
    """

    LAYOUTS = ("pairs", "vjepa2")

    def __init__(
        self, head_dim: int, ndim: int = 2, *, temperature: float = 100.0, layout: str = "pairs", **kwargs
    ) -> None:
        super().__init__(head_dim, ndim, **kwargs)
        if self.num_pairs // ndim < 1:
            raise ValueError(f"head_dim={head_dim} is too small for {ndim} axes (needs >= {2 * ndim})")
        if layout not in self.LAYOUTS:
            raise ValueError(f"layout must be one of {self.LAYOUTS}; got {layout!r}")
        if layout == "vjepa2" and self.half:
            raise ValueError("layout='vjepa2' pairs channels (2j, 2j+1); it does not combine with half=True")
        self.temperature = float(temperature)
        self.layout = layout
        self.per_channel = layout == "vjepa2"
        self._register()

    def _make(self) -> Tensor:
        n = self.num_pairs // self.ndim
        per_pair = self.temperature ** (-torch.arange(n, dtype=torch.float64) / n)
        if not self.per_channel:
            return self._sections(per_pair)
        freq = torch.zeros(self.ndim, 1, 1, self.head_dim, dtype=per_pair.dtype)
        for a in range(self.ndim):  # section a: channels [2an, 2(a+1)n), the n frequencies twice
            freq[a, 0, 0, 2 * a * n : 2 * (a + 1) * n] = per_pair.repeat(2)
        return freq


class RoPEDinoV3(_FixedFrequencies):
    """DINOv3 RoPE: coordinates in ``[-1, 1]`` (0.5-centred), frequencies ``2 pi / period``, half layout.

    Periods ``temperature ** (i / n)`` (``n = head_dim // 4`` per axis), or ``min_period *
    (max_period / min_period) ** linspace(0, 1, n)`` when both are given.  Coordinate augmentation
    (``shift_coords``, ``jitter_coords``, ``rescale_coords``) as DINOv3 trains, in training mode only.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        temperature: float | None = 100.0,
        min_period: float | None = None,
        max_period: float | None = None,
        normalize: str = "separate",
        half: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(head_dim, 2, half=half, normalize=normalize, **kwargs)
        if (min_period is None) != (max_period is None):
            raise ValueError("give both min_period and max_period, or neither")
        if min_period is None and temperature is None:
            raise ValueError("RoPEDinoV3 needs temperature or min_period / max_period")
        if head_dim < 4:
            raise ValueError(f"head_dim={head_dim} is too small for 2 axes (needs >= 4)")
        self.temperature = None if temperature is None else float(temperature)
        self.min_period, self.max_period = min_period, max_period
        self._register()

    def _make(self) -> Tensor:
        n = self.num_pairs // 2
        if self.min_period is not None:
            period = self.min_period * (self.max_period / self.min_period) ** torch.linspace(
                0, 1, n, dtype=torch.float64
            )
        else:
            period = self.temperature ** (torch.arange(n, dtype=torch.float64) / n)
        return self._sections(2 * math.pi / period)


class RoPEMixed(RotaryEmbedding):
    """RoPE-Mixed (naver rope-vit): learnable frequencies per layer and head, ``freqs`` ``(2, depth, heads, J)``.

    Init (naver's ``init_random_2d_freqs``): magnitudes ``temperature ** (-4 i / head_dim)``, ``i <
    head_dim / 4``, along a random direction per layer and head for the first half of the pairs
    and the orthogonal direction for the second half.  State-dict key ``freqs`` (timm's
    ``rope.freqs`` layout, so weights copy one to one); exclude it from weight decay.
    """

    learned = True

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        depth: int,
        *,
        temperature: float = 10.0,
        indexing: str = "xy",
        **kwargs,
    ) -> None:
        super().__init__(head_dim, 2, indexing=indexing, **kwargs)
        if head_dim % 4:
            raise ValueError(f"RoPEMixed needs head_dim divisible by 4; got {head_dim}")
        self.num_heads, self.depth, self.temperature = num_heads, depth, float(temperature)
        self.freqs = nn.Parameter(torch.empty(2, depth, num_heads, self.num_pairs))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        d = self.head_dim
        mag = self.temperature ** (-torch.arange(0, d, 4, dtype=torch.float32) / d)  # (D/4,)
        angle = torch.rand(self.depth, self.num_heads, 1) * 2 * math.pi
        fx = torch.cat([mag * torch.cos(angle), mag * torch.cos(angle + math.pi / 2)], -1)
        fy = torch.cat([mag * torch.sin(angle), mag * torch.sin(angle + math.pi / 2)], -1)
        self.freqs.copy_(torch.stack([fx, fy]).to(self.freqs))

    def frequencies(self) -> Tensor:
        return self.freqs

    def no_weight_decay(self) -> set[str]:
        return {"freqs"}


@dataclass(frozen=True)
class RotaryKind:
    """One rotary encoding by name: how :func:`build_rope` builds it, its grid ranks, one line of help.

    ``build(head_dim, *, num_heads, depth, temperature, **options)``; ``temperature=None`` is the
    kind's default.  :func:`rotary_kind` adds one to :data:`ROTARY_KINDS`, the one list of rotary
    names (:mod:`peg_core.registry` registers an encoding of kind ``"rotate"`` for each).
    """

    name: str
    build: Callable[..., RotaryEmbedding]
    dims: tuple[int, ...] = (2,)
    description: str = "rotary"


#: name -> :class:`RotaryKind`, in registration order (``--pos-enc`` lists them in that order)
ROTARY_KINDS: dict[str, RotaryKind] = {}


def rotary_kind(name: str, dims: tuple[int, ...] = (2,), description: str = "rotary") -> Callable:
    """Decorator: register the decorated builder as the rotary kind ``name`` (:class:`RotaryKind`)."""

    def register(fn: Callable[..., RotaryEmbedding]) -> Callable[..., RotaryEmbedding]:
        ROTARY_KINDS[name] = RotaryKind(name, fn, dims, description)
        return fn

    return register


def _default(temperature: float | None, value: float) -> float:
    return value if temperature is None else temperature


@rotary_kind("rope-axial", description="rotary, axial frequencies (naver / timm rope ViTs)")
def _axial(head_dim: int, *, num_heads=None, depth=None, temperature=None, **kwargs) -> RotaryEmbedding:
    kwargs.setdefault("indexing", "xy")
    return RoPEAxial(head_dim, 2, temperature=_default(temperature, 100.0), **kwargs)


@rotary_kind("rope-mixed", description="rotary, learned mixed frequencies per layer and head")
def _mixed(head_dim: int, *, num_heads=None, depth=None, temperature=None, **kwargs) -> RotaryEmbedding:
    if num_heads is None or depth is None:
        raise ValueError("rope-mixed needs num_heads and depth (one set of frequencies per layer and head)")
    return RoPEMixed(head_dim, num_heads, depth, temperature=_default(temperature, 10.0), **kwargs)


@rotary_kind("rope-dinov3", description="rotary, DINOv3's normalised coordinates")
def _dinov3(head_dim: int, *, num_heads=None, depth=None, temperature=None, **kwargs) -> RotaryEmbedding:
    return RoPEDinoV3(head_dim, temperature=_default(temperature, 100.0), **kwargs)


@rotary_kind("rope-3d", dims=(3,), description="rotary over (T, H, W) (V-JEPA 2)")
def _rope_3d(head_dim: int, *, num_heads=None, depth=None, temperature=None, **kwargs) -> RotaryEmbedding:
    return RoPEAxial(head_dim, 3, temperature=_default(temperature, 10000.0), **kwargs)


#: the rotary names, in :data:`ROTARY_KINDS` order (kept for callers of the tuple)
ROPE_KINDS = tuple(ROTARY_KINDS)


def build_rope(
    kind: str,
    head_dim: int,
    *,
    num_heads: int | None = None,
    depth: int | None = None,
    temperature: float | None = None,
    **kwargs,
) -> RotaryEmbedding:
    """A rotary encoding by name (:data:`ROTARY_KINDS`); ``temperature=None`` takes the kind's default.

    ``rope-axial``: 2-D :class:`RoPEAxial`, temperature 100, ``indexing="xy"`` (naver / timm);
    ``rope-mixed``: :class:`RoPEMixed` (needs ``num_heads`` and ``depth``), temperature 10;
    ``rope-dinov3``: :class:`RoPEDinoV3`, temperature 100; ``rope-3d``: 3-D :class:`RoPEAxial`
    over ``(T, H, W)``, temperature 10000.  Other keywords go to the class.
    """
    if kind not in ROTARY_KINDS:
        raise ValueError(f"unknown rotary encoding {kind!r}; choose from {tuple(ROTARY_KINDS)}")
    return ROTARY_KINDS[kind].build(
        head_dim, num_heads=num_heads, depth=depth, temperature=temperature, **kwargs
    )
