"""PEG: the Positional Encoding Generator of CPVT (Chu et al., 2021), over 1D, 2D or 3D grids.

A PEG turns the token sequence back into its grid, runs a depthwise
convolution with zero padding over it and adds the result to the tokens.  The
zero padding is what lets the convolution tell a border token from a central
one, so the encoding carries absolute position while working at any grid size.

:class:`PEGNd` holds the one implementation for ``N = 1, 2, 3`` grid dimensions;
:class:`PEG2d` (images) and :class:`PEG3d` (video, ``(T, H, W)``) are thin
subclasses fixing ``N`` and their parameter names.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import PositionEncoding

__all__ = [
    "PADDING_MODES",
    "PEG2d",
    "PEG3d",
    "PEGNd",
    "PegOptions",
    "check_mask",
    "check_size",
    "check_tokens",
    "fold_peg_keys",
    "grid_to_tokens",
    "peg2d_reference",
    "resolve_peg_at",
    "tokens_to_grid",
]

_CONVS: dict[int, type[nn.Module]] = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_CONV_FNS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
#: ``padding_mode`` values: ``zeros`` (CPVT), ``circular`` (wraps around: no absolute position), ``replicate``
PADDING_MODES = ("zeros", "circular", "replicate")


def resolve_peg_at(peg_at: Sequence[int] | str, depth: int) -> tuple[int, ...]:
    """Where PEGs go in a stack of ``depth`` blocks: sorted, unique block indices.

    One meaning in every model of the suite: index ``i >= 0`` is a PEG after block ``i``
    (CPVT: ``(0,)``), ``-1`` a PEG before block 0, and ``"all"`` a PEG after every block
    (``0 .. depth - 1``).  ``ValueError`` for an empty list, another string, or an index
    outside ``-1 .. depth - 1``.
    """
    if isinstance(peg_at, str):
        if peg_at != "all":
            raise ValueError(f"peg_at must be 'all' or block indices; got {peg_at!r}")
        return tuple(range(depth))
    positions = tuple(sorted({int(i) for i in peg_at}))
    if not positions:
        raise ValueError("peg_at needs at least one block index (or 'all')")
    bad = [i for i in positions if not -1 <= i < depth]
    if bad:
        raise ValueError(
            f"peg_at={list(positions)} has indices {bad} outside -1 (before block 0) .. {depth - 1} "
            f"({depth} blocks)"
        )
    return positions


@dataclass(frozen=True)
class PegOptions:
    """The PEG's options as one value: what every family passes to its conditional encoding's builder.

    Attributes:
        kernel_size: the depthwise kernel, an odd int or one odd int per grid axis (CPVT: 3).
        separable: 2-D only: ``1 x k`` then ``k x 1`` (:class:`PEG2d` ``separable``); a 3-D family
            chooses ``peg3d-factorized`` by name instead.
        padding_mode: the conv's border, one of :data:`PADDING_MODES`.
        dynamic: per-sample kernels mixed from a bank (:class:`PEGNd` ``dynamic``).
        num_kernels: that bank's size; ``None``: not given (4).  A family may refuse a size given
            without ``dynamic``.
        zero_init: start the (last) conv at zero, so the PEG adds nothing until it trains (a PEG
            added to a pre-trained model).

    Configs and checkpoints written before this value store the options as loose keywords
    (``peg_kernel_size``, ``peg_separable``, ``peg_padding``, ``peg_dynamic``, ``peg_num_kernels``,
    ``peg_zero_init``: :data:`LEGACY_KEYS`, also the command line's destinations);
    :func:`fold_peg_keys` is the one place that reads them.
    """

    kernel_size: int | tuple[int, ...] = 3
    separable: bool = False
    padding_mode: str = "zeros"
    dynamic: bool = False
    num_kernels: int | None = None
    zero_init: bool = False

    #: the loose keyword of configs, checkpoints and command-line destinations -> the field
    LEGACY_KEYS: ClassVar[dict[str, str]] = {
        "peg_kernel_size": "kernel_size",
        "peg_separable": "separable",
        "peg_padding": "padding_mode",
        "peg_dynamic": "dynamic",
        "peg_num_kernels": "num_kernels",
        "peg_zero_init": "zero_init",
    }

    def __post_init__(self) -> None:
        if isinstance(self.kernel_size, list):  # a JSON config's (kT, kH, kW)
            object.__setattr__(self, "kernel_size", tuple(self.kernel_size))

    @classmethod
    def of(cls, value: PegOptions | Mapping[str, Any] | None) -> PegOptions:
        """``value`` as a :class:`PegOptions`: itself, the defaults for ``None``, or built from a mapping of fields."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise TypeError(
                    f"PegOptions has no field {', '.join(map(repr, unknown))}; fields: {sorted(known)}"
                )
            return cls(**value)
        raise TypeError(f"peg must be a PegOptions or a mapping of its fields; got {type(value).__name__}")

    def class_options(self, ndim: int = 2) -> dict[str, Any]:
        """The keywords of the PEG class for an ``ndim``-D grid (:class:`PEG2d`, :class:`PEG3d`).

        ``separable`` is a 2-D keyword (given to a 3-D class only when set, which it refuses);
        ``num_kernels`` is 4 when not given.
        """
        out: dict[str, Any] = {
            "kernel_size": self.kernel_size,
            "padding_mode": self.padding_mode,
            "dynamic": self.dynamic,
            "num_kernels": 4 if self.num_kernels is None else self.num_kernels,
            "zero_init": self.zero_init,
        }
        if ndim == 2 or self.separable:
            out["separable"] = self.separable
        return out

    def as_config(self) -> dict[str, Any]:
        """The loose ``peg_*`` keywords of this value (what configs and checkpoints store), JSON-safe."""
        out: dict[str, Any] = {}
        for key, name in self.LEGACY_KEYS.items():
            value = getattr(self, name)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out


def fold_peg_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its loose ``peg_*`` keywords folded into one ``peg`` :class:`PegOptions`.

    The one reader of the keywords configs and checkpoints store (:attr:`PegOptions.LEGACY_KEYS`),
    so a stored config builds a model that takes ``peg=PegOptions(...)``.  ``None`` values are
    "not given" (the field's default); a ``peg`` entry already there (a :class:`PegOptions` or a
    mapping of its fields) is the base the loose keywords override.
    """
    out = dict(config)
    loose = {PegOptions.LEGACY_KEYS[k]: out.pop(k) for k in list(out) if k in PegOptions.LEGACY_KEYS}
    loose = {k: v for k, v in loose.items() if v is not None}
    if not loose and "peg" not in out:
        return out
    base = PegOptions.of(out.get("peg"))
    out["peg"] = PegOptions(**{**{f.name: getattr(base, f.name) for f in fields(PegOptions)}, **loose})
    return out


# permute orders (B, *grid, C) -> (B, C, *grid) by grid rank, and back by map rank; precomputed since
# they run on every call and building them from ranges costs about a microsecond each time
_TO_GRID = {n: (0, n + 1, *range(1, n + 1)) for n in _CONVS}
_TO_TOKENS = {n + 2: (0, *range(2, n + 2), 1) for n in _CONVS}


def _axis_names(ndim: int) -> tuple[str, ...]:
    """Letters for error messages: ``(L,)``, ``(H, W)``, ``(T, H, W)``, else ``(D1, ..., DN)``."""
    return {1: ("L",), 2: ("H", "W"), 3: ("T", "H", "W")}.get(ndim) or tuple(f"D{i + 1}" for i in range(ndim))


def _axes(ndim: int, batch: bool = False, channels: bool = False) -> str:
    """``"(H, W)"``, ``"(B, T, H, W)"``, ``"(B, C, H, W)"`` ... for messages."""
    return "(" + ", ".join(("B",) * batch + ("C",) * channels + _axis_names(ndim)) + ")"


def check_size(size: Any, name: str = "size") -> tuple[int | torch.SymInt, ...]:
    """``size`` as a tuple of positive ints; ``ValueError`` naming ``name`` and the value otherwise.

    Zero, negative, fractional (``2.5``) and bool entries are refused.  Symbolic
    sizes (``torch.SymInt`` under ``torch.compile`` / ``torch.export``) are kept
    as they are, unchecked, so they are not specialised to ints; integer-like
    objects (numpy ints, 0-dim integer tensors) become Python ints.
    """
    try:
        dims = tuple(size)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of positive integers; got {size!r}") from None
    for s in dims:
        # Fast path for plain ints (every call of every PEG); ``type`` also rules out bool.
        if type(s) is not int or s < 1:
            return _check_size_slow(dims, name)
    return dims


def _check_size_slow(dims: tuple[Any, ...], name: str) -> tuple[int | torch.SymInt, ...]:
    """:func:`check_size` for entries that are not plain positive ints: SymInts, int-likes, errors."""
    out: list[int | torch.SymInt] = []
    for s in dims:
        if isinstance(s, torch.SymInt):
            out.append(s)  # symbolic: left as it is, so the graph stays dynamic
            continue
        try:
            v = 0 if isinstance(s, bool) else operator.index(s)  # a bool is not a size
        except TypeError:  # 2.5, None, a float tensor
            v = 0
        if v < 1:
            raise ValueError(f"{name} must be positive integers; got {dims}")
        out.append(v)
    return tuple(out)


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


def tokens_to_grid(x: Tensor, size: Sequence[int]) -> Tensor:
    """``(B, prod(size), C)`` tokens -> ``(B, C, *size)`` map as a *view* (channels-last strides, no copy).

    ``size`` is ``(H, W)`` for images, ``(T, H, W)`` for video, any rank >= 1;
    the tokens are row-major over it (last axis fastest).
    """
    b, _, c = x.shape
    n = len(size)
    return x.reshape(b, *size, c).permute(*(_TO_GRID.get(n) or (0, n + 1, *range(1, n + 1))))


def grid_to_tokens(x: Tensor) -> Tensor:
    """``(B, C, *size)`` map -> ``(B, prod(size), C)`` tokens; a free view when the map is channels-last."""
    d = x.dim()
    return x.permute(*(_TO_TOKENS.get(d) or (0, *range(2, d), 1))).flatten(1, d - 2)


def check_mask(mask: Tensor, batch: int, size: tuple[int, ...]) -> None:
    """``mask`` must be ``(B, *size)`` bool (True = padding)."""
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = padding); got dtype {mask.dtype}")
    if tuple(mask.shape) != (batch, *size):
        want = ", ".join(str(s) for s in (batch, *size))
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected {_axes(len(size), batch=True)} = ({want})"
        )


def _kernel_tuple(kernel_size: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    """An odd int, or ``ndim`` odd ints, as a tuple; ``ValueError`` otherwise."""
    sides = kernel_size if isinstance(kernel_size, Sequence) else (kernel_size,) * ndim
    try:
        k = tuple(operator.index(s) for s in sides)
    except TypeError:  # 3.0, "3", None: not a kernel size
        k = ()
    if len(k) != ndim or any(s < 1 or s % 2 == 0 for s in k):
        names = "(" + ", ".join("k" + a for a in _axis_names(ndim)) + ")"
        raise ValueError(
            f"kernel_size must be an odd int or {ndim} odd ints {names} so the grid keeps its size; "
            f"got {kernel_size}"
        )
    return k


class PEGNd(PositionEncoding):
    """Positional Encoding Generator over a token grid of ``N = len(kernel_size)`` dimensions.

    ``out = x + DWConv(x)`` on the grid tokens; prefix tokens (class token,
    registers) pass through unchanged.  :class:`PEG2d` and :class:`PEG3d` are
    this class with ``N`` fixed; use it directly for other ranks (``N = 1``:
    a sequence; only tokens then, since a ``(B, C, L)`` map looks like tokens).

    Args:
        dim: channels ``C``.
        kernel_size: ``N`` odd sizes ``(k1, ..., kN)``; padding is ``k // 2`` per axis.
        num_prefix_tokens: tokens before the grid that are left as they are.
        factorized: a depthwise conv over the last ``N - 1`` axes (kernel
            ``(1, k2, ..., kN)``) followed by one over the first axis
            (``(k1, 1, ..., 1)``): ``k1 + k2*...*kN`` weights per channel
            instead of ``k1*...*kN``.  Needs ``N >= 2``.
        bias: add a learned per-channel bias to the (last) conv output.
        zero_init: start the (last) conv at zero, so ``out == x`` until it
            trains (for adding a PEG to a pretrained model); with ``dynamic``
            the whole kernel bank and its biases are zeroed.
        padding_mode: ``"zeros"`` (CPVT: the border tells absolute position),
            ``"circular"`` (the grid wraps around, so the PEG is exactly
            translation-equivariant on the torus and carries no absolute
            position: CPVT's "without zero padding" ablation) or
            ``"replicate"``.  Masks need ``"zeros"``.
        dynamic: a per-sample kernel (dynamic convolution / CondConv): the mean
            of the sample's real grid tokens ``(B, C)`` goes through ``route``
            (``Linear(C, K)``) and a softmax to ``K`` weights that mix a bank
            of ``K`` depthwise kernels (and biases); all samples then run as one
            grouped conv with ``groups = B*C``.  Not with ``factorized``.
        num_kernels: ``K``, the size of the kernel bank (``dynamic`` only).

    State dict: ``proj.weight`` ``(C, 1, *k)``, ``proj.bias`` ``(C,)`` (plus the
    first factorized conv); with ``dynamic``: ``route.weight`` ``(K, C)``,
    ``route.bias`` ``(K,)``, ``weight`` ``(K, C, 1, *k)``, ``bias`` ``(K, C)``.

    Shapes:
        ``forward(x, size, mask)`` with ``x`` tokens ``(B, P + prod(size), C)``
        (row-major over the grid, last axis fastest) and ``size`` the grid
        ``(D1, ..., DN)``, or a feature map ``(B, C, D1, ..., DN)`` (``size``
        optional; ``N >= 2``); ``mask`` ``(B, D1, ..., DN)`` bool, True at
        padding.  Returns the same shape; a feature map keeps its memory format.

    With a mask, padded positions are zeroed before the conv (and between the
    two factorized convs) and left unchanged after it, so a sample's real
    positions get the same output whatever padding its batch has (the padding
    must sit at the end of each axis, as DETR pads).

    The depthwise conv runs on a channels-last view of the tokens: no
    channels-first (NCHW / NCDHW) copy is ever made, which on CPU is tens of
    times slower for a depthwise conv.  Behind prefix tokens the grid slice is
    copied once, straight into channels-last order, and the residual add goes
    into the conv's own fresh output buffer when it is channels-last.  As a
    :class:`~peg_core.PositionEncoding` it applies to ``"tokens"`` and its
    ``position`` is the conv output (zeros at prefix tokens and padding).
    """

    apply_to = "tokens"
    conditional = True
    #: attribute name of the first conv of the factorized variant (kept per subclass for state dicts)
    _pre_name: ClassVar[str] = "proj_pre"

    def __init__(
        self,
        dim: int,
        kernel_size: Sequence[int],
        num_prefix_tokens: int = 0,
        factorized: bool = False,
        bias: bool = True,
        zero_init: bool = False,
        *,
        padding_mode: str = "zeros",
        dynamic: bool = False,
        num_kernels: int = 4,
    ) -> None:
        super().__init__()
        if not isinstance(kernel_size, Sequence) or len(kernel_size) not in _CONVS:
            raise ValueError(
                f"kernel_size must be 1, 2 or 3 odd ints, one per grid axis; got {kernel_size!r}"
            )
        ndim = len(kernel_size)
        ks = _kernel_tuple(kernel_size, ndim)
        if dim < 1 or num_prefix_tokens < 0:
            raise ValueError(f"need dim >= 1 and num_prefix_tokens >= 0; got {dim}, {num_prefix_tokens}")
        if factorized and ndim < 2:
            raise ValueError("factorized=True needs a grid of 2 or more dimensions")
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {PADDING_MODES}; got {padding_mode!r}")
        if dynamic and factorized:
            raise ValueError("dynamic=True does not combine with factorized=True (separable); choose one")
        if dynamic and (isinstance(num_kernels, bool) or not isinstance(num_kernels, int) or num_kernels < 1):
            raise ValueError(f"num_kernels must be an int >= 1; got {num_kernels!r}")
        self.dim = dim
        self.ndim = ndim
        self.kernel_size: int | tuple[int, ...] = ks
        # rank of a feature-map input; for N = 1 a (B, C, L) map has the rank of tokens, so none
        self._map_rank = ndim + 2 if ndim > 1 else -1
        self.num_prefix_tokens = num_prefix_tokens
        self._factorized = factorized
        self.padding_mode = padding_mode
        self.dynamic = dynamic
        self.num_kernels = num_kernels if dynamic else 0
        conv = _CONVS[ndim]
        pad = tuple(k // 2 for k in ks)
        if dynamic:
            self.route = nn.Linear(dim, num_kernels)
            # Each bank entry is initialised as nn.Conv would initialise a depthwise kernel.
            self.weight = nn.Parameter(torch.empty(num_kernels, dim, 1, *ks))
            self.register_parameter("bias", nn.Parameter(torch.empty(num_kernels, dim)) if bias else None)
            bound = 1 / math.prod(ks) ** 0.5  # a depthwise kernel's fan-in is its volume
            nn.init.uniform_(self.weight, -bound, bound)
            if self.bias is not None:
                nn.init.uniform_(self.bias, -bound, bound)
            if zero_init:
                nn.init.zeros_(self.weight)
                if self.bias is not None:
                    nn.init.zeros_(self.bias)
            return
        if factorized:
            # The bias sits on the second conv only: a bias before it would just
            # be re-weighted by it, adding nothing but border effects.  Registered
            # first so state dicts list it before ``proj``.
            pre_k, post_k = (1, *ks[1:]), (ks[0],) + (1,) * (ndim - 1)
            pre = conv(
                dim, dim, pre_k, padding=(0, *pad[1:]), groups=dim, bias=False, padding_mode=padding_mode
            )
            setattr(self, self._pre_name, pre)
            self.proj = conv(dim, dim, post_k, padding=(pad[0],) + (0,) * (ndim - 1), groups=dim, bias=bias,
                             padding_mode=padding_mode)  # fmt: skip
        else:
            self.proj = conv(dim, dim, ks, padding=pad, groups=dim, bias=bias, padding_mode=padding_mode)
        if zero_init:
            nn.init.zeros_(self.proj.weight)
            if self.proj.bias is not None:
                nn.init.zeros_(self.proj.bias)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, kernel_size={self.kernel_size}, num_prefix_tokens={self.num_prefix_tokens}, "
            f"factorized={self._factorized}" + self._variant_repr()
        )

    def _variant_repr(self) -> str:
        """``", padding_mode=..., dynamic=True, num_kernels=K"`` for the non-default variants only."""
        text = "" if self.padding_mode == "zeros" else f", padding_mode={self.padding_mode!r}"
        return text + (f", dynamic=True, num_kernels={self.num_kernels}" if self.dynamic else "")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # A PEG2d / PEG3d pickled whole (torch.save(model)) before this base class
        # existed lacks its private attributes; rebuild them from the public ones.
        if "_map_rank" not in self.__dict__:
            self.ndim = self.proj.weight.dim() - 2
            self._map_rank = self.ndim + 2 if self.ndim > 1 else -1
            self._factorized = bool(getattr(self, "separable", getattr(self, "factorized", False)))
        # pickled before the padding modes and the dynamic kernel existed
        self.__dict__.setdefault("padding_mode", "zeros")
        self.__dict__.setdefault("dynamic", False)
        self.__dict__.setdefault("num_kernels", 0)

    def conv(self, grid: Tensor, keep: Tensor | None = None) -> Tensor:
        """Depthwise conv of a ``(B, C, D1, ..., DN)`` map, same shape, in the map's memory format.

        ``keep`` ``(B, 1, D1, ..., DN)`` (1 = real, 0 = padding) zeroes the
        padding before the conv, between the two factorized convs and after
        it.  The multiplies after a conv are in place: a conv's backward needs
        its input, never its output.
        """
        if keep is not None and self.padding_mode != "zeros":
            # a wrapped / replicated border would read another sample's padding, breaking invariance
            raise ValueError(f"padding masks need padding_mode='zeros'; this PEG has {self.padding_mode!r}")
        if self.dynamic:
            return self._dynamic_conv(grid, keep)
        if keep is not None:
            grid = grid * keep
        if self._factorized:
            grid = self._modules[self._pre_name](grid)
            if keep is not None:
                grid = grid.mul_(keep)
        out = self.proj(grid)
        if keep is not None:
            out = out.mul_(keep)
        return out

    def kernels(self, grid: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Per-sample depthwise kernels of the dynamic PEG: ``(B, C, 1, *k)`` and biases ``(B, C)`` (or ``None``).

        ``grid`` ``(B, C, D1, ..., DN)``, already zeroed at padding; ``keep``
        ``(B, 1, D1, ..., DN)``.  The routing input is the mean over the real
        positions only, so padding never changes a sample's kernel.
        """
        dims = tuple(range(2, grid.dim()))
        if keep is None:
            pooled = grid.mean(dims)
        else:
            pooled = grid.sum(dims) / keep.sum(dims).clamp_min(1)  # (B, C) / (B, 1)
        mix = self.route(pooled).softmax(-1)  # (B, K)
        weight = (mix @ self.weight.flatten(1)).unflatten(1, self.weight.shape[1:])
        bias = None if self.bias is None else mix @ self.bias
        return weight, bias

    def _dynamic_conv(self, grid: Tensor, keep: Tensor | None) -> Tensor:
        """:meth:`conv` with per-sample kernels: one grouped conv over a ``(1, B*C, D1, ..., DN)`` view."""
        if keep is not None:
            grid = grid * keep
        weight, bias = self.kernels(grid, keep)
        b, c, *spatial = grid.shape
        n = len(spatial)
        # The batch is folded into channels in channels-last order (memory (D1, ..., DN, B, C)):
        # one copy of the tokens, and the conv keeps its channels-last kernel (an NCHW fold is
        # 1.1-2.2x slower in tools/bench_core.py).  Built by a full-rank reshape, not unsqueeze(0):
        # with the short batch stride unsqueeze leaves, oneDNN takes a ~20x slower path on CPU.
        flat = grid.permute(*range(2, n + 2), 0, 1).reshape(1, *spatial, b * c)
        flat = flat.permute(0, n + 1, *range(1, n + 1))  # (1, B*C, *spatial), channels-last strides
        pad = [k // 2 for k in self.kernel_tuple]
        if self.padding_mode != "zeros":
            flat = F.pad(flat, [q for p in reversed(pad) for q in (p, p)], mode=self.padding_mode)
            pad = [0] * n
        w = weight.reshape(b * c, 1, *weight.shape[3:])
        out = _CONV_FNS[n](flat, w, None if bias is None else bias.reshape(b * c), padding=pad, groups=b * c)
        out = out.reshape(b, c, *out.shape[2:])  # a view for channels-last and contiguous outputs alike
        if keep is not None:
            out = out.mul_(keep)
        return out

    @property
    def kernel_tuple(self) -> tuple[int, ...]:
        """The kernel size as ``N`` ints (``kernel_size`` is an int for :class:`PEG2d`)."""
        k = self.kernel_size
        return (k,) * self.ndim if isinstance(k, int) else tuple(k)

    def forward(self, x: Tensor, size: Sequence[int] | None = None, mask: Tensor | None = None) -> Tensor:
        """``x`` plus the conv of its grid; see the class docstring for shapes."""
        if x.dim() == self._map_rank:
            return _residual(self._map_delta(x, size, mask), x)
        size = self._check(x, size)
        p = self.num_prefix_tokens
        if p == 0:
            return _residual(self._token_delta(x, size, mask), x, tokens=True)
        tokens = x[:, p:]
        delta = self._token_delta(tokens, size, mask)
        return torch.cat([x[:, :p], _residual(delta, tokens, tokens=True)], dim=1)

    def position(self, x: Tensor, size: Sequence[int] | None = None, mask: Tensor | None = None) -> Tensor:
        """The conv output alone (``forward(x) - x`` computed directly), zeros at prefix tokens and padding."""
        if x.dim() == self._map_rank:
            return self._map_delta(x, size, mask)
        size = self._check(x, size)
        p = self.num_prefix_tokens
        delta = self._token_delta(x[:, p:], size, mask)
        return delta if p == 0 else torch.cat([delta.new_zeros(x.shape[0], p, x.shape[2]), delta], dim=1)

    def _token_delta(self, tokens: Tensor, size: tuple[int, ...], mask: Tensor | None) -> Tensor:
        """Conv output for grid tokens ``(B, prod(size), C)`` -> ``(B, prod(size), C)``."""
        keep = self._keep(mask, tokens.shape[0], size, tokens.dtype)
        if keep is None and not self.dynamic and not tokens.is_contiguous():
            # Behind prefix tokens the grid slice has a batch stride of
            # (P + prod(size)) * C, which the conv kernels would copy anyway;
            # copy it once here, straight into channels-last order (never
            # channels-first).  With a mask, ``grid * keep`` is that copy; the dynamic PEG makes
            # its own (batch folded into channels).
            tokens = tokens.contiguous()
        return grid_to_tokens(self.conv(tokens_to_grid(tokens, size), keep))

    def _map_delta(self, x: Tensor, size: Sequence[int] | None, mask: Tensor | None) -> Tensor:
        grid = tuple(x.shape[2:])
        if size is not None and check_size(size) != grid:
            raise ValueError(f"size={tuple(size)} does not match the feature map's {_axes(self.ndim)}={grid}")
        if x.shape[1] != self.dim:
            raise ValueError(
                f"feature map has C={x.shape[1]} channels (shape {tuple(x.shape)}), "
                f"{type(self).__name__} has dim={self.dim}"
            )
        return self.conv(x, self._keep(mask, x.shape[0], grid, x.dtype))

    def _check(self, x: Tensor, size: Sequence[int] | None) -> tuple[int, ...]:
        if size is None or not hasattr(size, "__len__") or len(size) != self.ndim:
            hint = ""
            if self.ndim > 1:
                hint = f" (a {_axes(self.ndim, batch=True, channels=True)} map needs no size)"
            raise ValueError(
                f"tokens of shape {tuple(x.shape)} need size={_axes(self.ndim)}; got {size!r}{hint}"
            )
        size = check_size(size)
        check_tokens(x, size, self.num_prefix_tokens)
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x has C={x.shape[-1]} channels (shape {tuple(x.shape)}), "
                f"{type(self).__name__} was built for dim={self.dim}"
            )
        return size

    @staticmethod
    def _keep(mask: Tensor | None, batch: int, size: tuple[int, ...], dtype: torch.dtype) -> Tensor | None:
        """``(B, *size)`` padding mask -> ``(B, 1, *size)`` multiplier (1 = real), or ``None``."""
        if mask is None:
            return None
        check_mask(mask, batch, size)
        return (~mask).unsqueeze(1).to(dtype)


class PEG2d(PEGNd):
    """Positional Encoding Generator over a 2D token grid.

    ``out = x + DWConv(x)`` on the grid tokens; prefix tokens (class token,
    registers) pass through unchanged.

    Args:
        dim: channels ``C``.
        kernel_size: odd kernel size ``k`` (1, 3, 5, 7, ...); padding is ``k // 2``.
        num_prefix_tokens: tokens before the grid that are left as they are.
        separable: light variant, a ``1×k`` (``proj_w``) then a ``k×1``
            (``proj``) depthwise conv.
        bias: add a learned per-channel bias to the conv output.
        zero_init: start the conv at zero, so ``out == x`` until it trains
            (for adding a PEG to a pretrained model).
        padding_mode, dynamic, num_kernels: ``"zeros"`` / ``"circular"`` /
            ``"replicate"`` borders and the per-sample (dynamic) kernel; see
            :class:`PEGNd`.

    Shapes:
        ``forward(x, size, mask)`` with ``x`` tokens ``(B, P + H*W, C)`` and
        ``size=(H, W)``, or a feature map ``(B, C, H, W)`` (``size`` optional);
        ``mask`` ``(B, H, W)`` bool, True at padding (DETR's convention).
        Returns the same shape; a feature map keeps its memory format.

    With a mask, padded positions are zeroed before the conv (and between the
    two convs of the separable variant) and left unchanged after it, so an
    image's real positions get the same output whatever padding its batch has
    (the padding must sit at the bottom/right, as DETR pads).  Layout and
    allocations: see :class:`PEGNd`.
    """

    _pre_name = "proj_w"

    def __init__(
        self,
        dim: int,
        kernel_size: int = 3,
        num_prefix_tokens: int = 0,
        separable: bool = False,
        bias: bool = True,
        zero_init: bool = False,
        *,
        padding_mode: str = "zeros",
        dynamic: bool = False,
        num_kernels: int = 4,
    ) -> None:
        try:
            k = operator.index(kernel_size)
        except TypeError:
            k = 0
        if k < 1 or k % 2 == 0:
            raise ValueError(
                f"kernel_size must be odd and >= 1 so the grid keeps its size; got {kernel_size}"
            )
        super().__init__(
            dim, (k, k), num_prefix_tokens, separable, bias, zero_init,
            padding_mode=padding_mode, dynamic=dynamic, num_kernels=num_kernels,
        )  # fmt: skip
        self.kernel_size = k  # the int k, not the base's (k, k)
        self.separable = separable

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, kernel_size={self.kernel_size}, num_prefix_tokens={self.num_prefix_tokens}, "
            f"separable={self.separable}" + self._variant_repr()
        )


class PEG3d(PEGNd):
    """Positional Encoding Generator over a ``(T, H, W)`` token grid.

    ``out = x + DWConv3d(x)`` on the grid tokens; prefix tokens (class token)
    pass through unchanged.  The zero padding lets the conv tell border
    tubelets (first/last frame, image edges) from inner ones, so the codes
    carry absolute position at any clip length or resolution.  UniFormer's
    "dynamic position embedding" is the same module applied before every block.

    Args:
        dim: channels ``C``.
        kernel_size: odd ``k`` or ``(kT, kH, kW)``; padding is ``k // 2`` per axis.
        num_prefix_tokens: tokens before the grid that are left as they are.
        factorized: a ``(1, kH, kW)`` spatial depthwise conv (``proj_s``)
            followed by a ``(kT, 1, 1)`` temporal one (``proj``): ``kH*kW + kT``
            instead of ``kT*kH*kW`` weights per channel.
        bias: per-channel bias on the (last) conv.
        zero_init: start the (last) conv at zero, so ``out == x`` until it trains.
        padding_mode, dynamic, num_kernels: see :class:`PEGNd`.

    Shapes:
        ``forward(x, size, mask)`` with ``x`` tokens ``(B, P + T*H*W, C)``
        (frame-major: ``t`` slowest, ``w`` fastest) and ``size=(T, H, W)``, or
        a feature map ``(B, C, T, H, W)`` (``size`` optional); ``mask``
        ``(B, T, H, W)`` bool, True at padding (clips padded at the end of
        each axis to share one batch).  Returns the same shape.

    The conv runs on a channels-last-3d view of the tokens, as in
    :class:`PEG2d`: no NCDHW-contiguous copy is made; see :class:`PEGNd`.
    """

    _pre_name = "proj_s"

    def __init__(
        self,
        dim: int,
        kernel_size: int | tuple[int, int, int] = (3, 3, 3),
        num_prefix_tokens: int = 0,
        factorized: bool = False,
        bias: bool = True,
        zero_init: bool = False,
        *,
        padding_mode: str = "zeros",
        dynamic: bool = False,
        num_kernels: int = 4,
    ) -> None:
        super().__init__(
            dim, _kernel_tuple(kernel_size, 3), num_prefix_tokens, factorized, bias, zero_init,
            padding_mode=padding_mode, dynamic=dynamic, num_kernels=num_kernels,
        )  # fmt: skip
        self.factorized = factorized


def _residual(delta: Tensor, x: Tensor, tokens: bool = False) -> Tensor:
    """``x + delta``, added into ``delta``'s fresh buffer when that is safe and keeps the layout.

    Under autocast the conv output is half precision while ``x`` is not; then
    the out-of-place add keeps the residual stream in ``x``'s dtype.  For
    ``tokens`` ``(B, N, C)`` the in-place add also needs ``delta`` dense in
    token order, i.e. a channels-last conv output; a conv that answers
    channels-first (CPU float64 conv3d, conv1d) gets the out-of-place add, so
    the result is laid out like ``x`` and not as a strided view.
    """
    if delta.dtype == x.dtype and (not tokens or delta.is_contiguous()):
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
