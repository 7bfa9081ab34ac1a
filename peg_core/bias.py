"""Attention biases: a term added to the attention logits, computed from the token grid (the registry's ``bias`` kind).

An :class:`AttentionBias` is called with the grid size on every forward and returns one float
tensor that a model passes to ``F.scaled_dot_product_attention`` as ``attn_mask`` (SDPA adds a
float mask to ``q k^T / sqrt(d)``)::

    bias   AttentionBias(size, mask=None, num_prefix_tokens=P, dtype=, device=)
           -> (1, heads, P + N, P + N), N = prod(size) grid tokens, row-major

The bias is computed from the grid on every call (no cache, no training-size table), so any size,
aspect and clip length runs, and ``torch.export`` with dynamic sizes traces it.  Rows and columns
of the ``P`` prefix tokens (class / register tokens) are zero: prefix tokens are attended to and
attend without a bias.  A model computes the bias once per forward and gives block ``i``
``layer_bias(bias, i)``: the same tensor for every block, unless the bias has a per-layer schedule
(:class:`LookHereBias`'s ``layer_slopes``).  A learned bias such as :class:`FIREBias` shares its
parameters across layers, as FIRE does.

Padding: a padding ``mask`` ``(B, *size)`` (True = padding, at the end of each axis as the suite's
detection batches pad, bottom / right) is accepted and changes nothing: the biases here depend on
grid coordinates counted from the grid's origin (relative distances and directions, and FIRE's
query distance to the origin), which padding at the end of the axes does not move.  So one ``(1, heads, N, N)``
tensor serves the whole batch; a model keeps its own key-padding handling (DETR folds its padding
mask into the float mask as ``-inf`` columns, :func:`with_key_padding`).

Built-in biases (registered in :mod:`peg_core.registry`):

* :class:`ALiBiBias` (``alibi-2d``): ``-m_h * dist(p_i, p_j)``, ALiBi's per-head slopes ``m_h``
  (Press et al., ICLR 2022) on the Euclidean (or Manhattan) distance between token positions,
  over ``(h, w)`` for images and ``(t, h, w)`` for videos.
* :class:`FIREBias` (``fire``): ``f_theta(psi(r_ij) / psi(max(L, q_i)))`` with
  ``psi(x) = log(c x + 1)`` (FIRE, Li et al., ICLR 2024), ``r_ij`` the Euclidean distance between
  the positions and ``q_i`` the query's distance to the grid origin.
* :class:`LookHereBias` (``lookhere``, 2-D only): per head a direction (a half-plane, or a quadrant)
  outside of which keys are masked, and inside it ``-m_h * dist(p_i, p_j)`` (LookHere, Fuller et al.,
  NeurIPS 2024).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .rope import rope_coords

__all__ = [
    "ALiBiBias",
    "AttentionBias",
    "FIREBias",
    "LookHereBias",
    "alibi_slopes",
    "grid_distance",
    "with_key_padding",
]

METRICS = ("euclidean", "manhattan")


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's head slopes: ``2^(-8 i / H)``, ``i = 1..H`` for a power-of-two ``H``.

    Otherwise (ALiBi's rule): the slopes of the largest power of two ``n < H``, then every other
    slope of ``2n`` heads for the remaining ``H - n`` heads.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1; got {num_heads}")

    def power_of_2(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    n = 2 ** math.floor(math.log2(num_heads))
    if n == num_heads:
        return power_of_2(n)
    return power_of_2(n) + alibi_slopes(2 * n)[0::2][: num_heads - n]


def grid_distance(coords: Tensor, metric: str = "euclidean") -> Tensor:
    """Pairwise distance of token coordinates ``(N, k)`` -> ``(N, N)`` (Euclidean or Manhattan).

    Summed axis by axis, so no ``(N, N, k)`` intermediate is made.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")
    total = None
    for a in range(coords.shape[-1]):
        d = coords[:, a, None] - coords[None, :, a]
        d = d.abs() if metric == "manhattan" else d * d
        total = d if total is None else total + d
    return total if metric == "manhattan" else total.sqrt()


def with_key_padding(bias: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """A float SDPA mask: ``bias`` ``(1|B, heads, N, N)`` with ``-inf`` at padded keys.

    ``key_padding_mask`` ``(B, N)``, True = padding (``nn.MultiheadAttention``'s meaning) -> ``(B, heads, N, N)``;
    ``None`` returns ``bias`` unchanged.  A model calls it once per forward, not once per layer.
    """
    if key_padding_mask is None:
        return bias
    return bias.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))


class AttentionBias(nn.Module, ABC):
    """Base class of the ``bias`` kind: ``forward(size, mask=None, *, num_prefix_tokens=0, dtype, device)``.

    Subclasses implement :meth:`grid_bias` ``(size, coords (N, k), compute dtype) -> (heads, N, N)``;
    the base checks the size, builds the coordinates (integer indices, row-major), adds the zero
    prefix rows / columns and casts.  Attributes: ``num_heads``, ``ndim`` (the grid rank).
    """

    def __init__(self, num_heads: int, ndim: int) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1; got {num_heads}")
        if ndim not in (1, 2, 3):
            raise ValueError(f"ndim must be 1, 2 or 3; got {ndim}")
        self.num_heads = num_heads
        self.ndim = ndim

    @abstractmethod
    def grid_bias(self, coords: Tensor) -> Tensor:
        """Coordinates ``(N, k)`` in the compute dtype -> the bias of the grid tokens ``(heads, N, N)``."""

    def layer_bias(self, bias: Tensor, layer: int) -> Tensor:
        """The bias block ``layer`` adds, from the tensor :meth:`forward` returned this forward.

        A model calls it in every block (``layer`` counts from 0); the base returns ``bias`` itself,
        one tensor for every layer.  A bias with a per-layer schedule (:class:`LookHereBias`'s
        ``layer_slopes``) returns its layer's version; ``bias`` may carry ``-inf`` key padding.
        """
        return bias

    def _compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """float64 when asked for it (references), else float32: half precision only for the result."""
        return torch.float64 if dtype == torch.float64 else torch.float32

    def forward(
        self,
        size: Sequence[int],
        mask: Tensor | None = None,
        *,
        num_prefix_tokens: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """The bias ``(1, heads, P + N, P + N)`` in ``dtype`` for grid ``size`` (``N = prod(size)``).

        Args:
            size: the token grid ``(H, W)`` or ``(T, H, W)`` (``ndim`` axes).
            mask: ``(B, *size)`` bool padding mask, True at padding (end of each axis); checked, and
                it changes nothing (module docstring), so the result broadcasts over the batch.
            num_prefix_tokens: ``P`` tokens in front of the grid tokens; their rows and columns are 0.
            dtype: of the result (the attention's query dtype); computed in float32 (float64 when asked).
            device: of the result; default the mask's, else the module's parameters' / buffers', else CPU.
        """
        size = tuple(size)
        if len(size) != self.ndim:
            raise ValueError(f"grid size {size} has {len(size)} axes; this attention bias is {self.ndim}-D")
        if mask is not None:
            if mask.dtype != torch.bool or mask.dim() != len(size) + 1 or tuple(mask.shape[1:]) != size:
                raise ValueError(f"mask must be bool (B, {', '.join(map(str, size))}); got {mask.dtype} "
                                 f"{tuple(mask.shape)}")  # fmt: skip
            device = mask.device if device is None else device
        if device is None:
            ref = next(iter(self.parameters()), None)
            ref = next(iter(self.buffers()), None) if ref is None else ref
            device = None if ref is None else ref.device
        coords = rope_coords(size, device=device, dtype=self._compute_dtype(dtype))  # (N, k)
        bias = self.grid_bias(coords)
        if num_prefix_tokens:
            bias = F.pad(bias, (num_prefix_tokens, 0, num_prefix_tokens, 0))  # zero prefix rows / columns
        return bias.to(dtype).unsqueeze(0)


class ALiBiBias(AttentionBias):
    """ALiBi on a grid: ``bias[h, i, j] = -m_h * dist(p_i, p_j)`` (no parameters, no state-dict keys).

    ``m_h`` are ALiBi's slopes (:func:`alibi_slopes`); ``p_i`` the integer grid position of token
    ``i`` (``(h, w)``, or ``(t, h, w)`` for videos, one unit per patch / tubelet); ``metric``
    ``"euclidean"`` (default) or ``"manhattan"``.
    """

    def __init__(self, num_heads: int, ndim: int = 2, *, metric: str = "euclidean") -> None:
        super().__init__(num_heads, ndim)
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")
        self.metric = metric
        # non-persistent: the slopes follow from num_heads, so a checkpoint has no key for them
        self.register_buffer(
            "slopes", torch.tensor(alibi_slopes(num_heads), dtype=torch.float64), persistent=False
        )

    def grid_bias(self, coords: Tensor) -> Tensor:
        dist = grid_distance(coords, self.metric)  # (N, N)
        return -self.slopes.to(coords.dtype)[:, None, None] * dist

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, ndim={self.ndim}, metric={self.metric!r}"


#: FIRE's hidden layer is computed in row chunks of at most this many bytes (the whole ``(N, N, hidden)``
#: tensor at once when it fits): 256 MiB; the result ``(heads, N, N)`` is the largest tensor then
FIRE_CHUNK_BYTES = 256 * 2**20
#: at most this many chunks (a chunk's hidden layer stays ``hidden / (64 heads)`` of the result)
FIRE_MAX_CHUNKS = 64


class FIREBias(AttentionBias):
    """FIRE on a grid: ``bias[:, i, j] = f_theta(psi(r_ij) / psi(max(L, q_i)))``, ``psi(x) = log(|c x| + 1)``.

    As FIRE (Li et al., ICLR 2024, its reference code): ``f_theta`` is an MLP ``1 -> hidden -> heads``
    with a ReLU, ``c`` is learned (init ``init_c``), the threshold ``L = |s * L0|`` has a learned
    scale ``s`` (init 1) of a fixed ``L0`` (``init_threshold``), and ``eps`` is added to the
    normaliser.  One module serves every layer (FIRE shares ``f_theta`` across layers).

    ``r_ij`` is the Euclidean distance between the grid positions of tokens ``i`` and ``j``.  The
    query's extent ``q_i`` is its Euclidean distance to the grid origin (the first row / column /
    frame): the grid analogue of FIRE's causal ``i`` (the query's distance from the sequence
    start).  Chosen over the grid's extent because it depends on the query's own position only:
    padding at the end of the axes (detection batches) changes nothing, so one tensor serves a
    padded batch, and a query keeps its normaliser when the grid grows past it (FIRE's
    progressive interpolation: the ratio stays in the range seen in training for queries within
    ``L``).  Unlike causal FIRE the ratio can exceed 1 in a bidirectional grid (a key can lie
    farther than the origin); the MLP takes that value as it is.

    ``per_axis=True`` applies FIRE to each axis on its own and sums:
    ``bias = sum_a f_a(psi(|x_ia - x_ja|) / psi(max(L, x_ia)))``, one MLP ``f_a`` per axis (keys
    ``axis_mlps.{a}.*`` instead of ``mlp.*``; ``c`` and ``L`` shared), so a head can weigh rows and
    columns (and frames) apart, as RoPE's axial split does; ``ndim`` times the compute and memory.

    State-dict keys: ``mlp.0.{weight,bias}``, ``mlp.2.{weight,bias}``, ``c``, ``threshold_scale``,
    ``init_threshold``.  Memory: the MLP's hidden layer is an ``(N, N, hidden)`` float32 tensor
    (4096 grid tokens, a 1024-px ViT/16: 2 GiB at ``hidden=32``); above :data:`FIRE_CHUNK_BYTES`
    it is computed in row chunks (recomputed in the backward), so the largest tensor is the result
    ``(heads, N, N)``, as for ALiBi and LookHere.
    """

    def __init__(
        self,
        num_heads: int,
        ndim: int = 2,
        *,
        hidden: int = 32,
        init_c: float = 0.1,
        init_threshold: float = 8.0,
        eps: float = 1e-6,
        per_axis: bool = False,
    ) -> None:
        super().__init__(num_heads, ndim)
        if hidden < 1 or init_threshold <= 0:
            raise ValueError(f"hidden must be >= 1 and init_threshold > 0; got {hidden}, {init_threshold}")
        self.per_axis = per_axis

        def mlp() -> nn.Sequential:
            return nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, num_heads))

        if per_axis:
            self.axis_mlps = nn.ModuleList(mlp() for _ in range(ndim))
        else:
            self.mlp = mlp()
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_threshold", torch.tensor(float(init_threshold)))
        self.eps = eps

    def no_weight_decay(self) -> set[str]:
        """The scalar ``c`` and threshold scale (FIRE's position parameters)."""
        return {"c", "threshold_scale"}

    def grid_bias(self, coords: Tensor) -> Tensor:
        if not self.per_axis:  # the distance and the query's distance to the origin
            rel = grid_distance(coords)  # (N, N)
            return self._fire(rel, coords.square().sum(-1).sqrt(), self.mlp)
        out = None
        for a, mlp in enumerate(self.axis_mlps):  # each axis on its own: |x_ia - x_ja| and x_ia
            axis = coords[:, a]
            term = self._fire((axis[:, None] - axis[None, :]).abs(), axis, mlp)
            out = term if out is None else out + term
        return out

    def _fire(self, rel: Tensor, extent: Tensor, mlp: nn.Sequential) -> Tensor:
        """``f(psi(rel) / psi(max(L, extent)))``: distances ``(N, N)``, query extents ``(N,)`` -> ``(heads, N, N)``."""
        dt = rel.dtype
        c = self.c.to(dt)
        threshold = (self.threshold_scale.to(dt) * self.init_threshold.to(dt)).abs()
        norm = torch.log((c * torch.maximum(extent, threshold)).abs() + 1.0) + self.eps
        x = torch.log((c * rel).abs() + 1.0) / norm[:, None]  # (N, N)
        lin1, _, lin2 = mlp
        w1, b1, w2, b2 = lin1.weight.to(dt), lin1.bias.to(dt), lin2.weight.to(dt), lin2.bias.to(dt)

        def rows(x: Tensor) -> Tensor:  # (R, N) -> (heads, R, N)
            h = F.relu(F.linear(x.unsqueeze(-1), w1, b1))  # (R, N, hidden): the largest tensor
            return F.linear(h, w2, b2).permute(2, 0, 1)

        n = x.shape[0]
        hidden_bytes = x.numel() * w1.shape[0] * x.element_size()
        if hidden_bytes <= FIRE_CHUNK_BYTES or n < 2:
            return rows(x)
        # the (N, N, hidden) hidden layer in row chunks of at most FIRE_CHUNK_BYTES: with gradients, each
        # chunk is recomputed in the backward (activation checkpointing), so no chunk's hidden layer is kept
        from torch.utils.checkpoint import checkpoint

        # at most FIRE_MAX_CHUNKS chunks: past that size the (heads, N, N) result outweighs a chunk anyway
        step = max(
            FIRE_CHUNK_BYTES // (x.shape[1] * w1.shape[0] * x.element_size()), -(-n // FIRE_MAX_CHUNKS), 1
        )
        grad = torch.is_grad_enabled() and (x.requires_grad or w1.requires_grad)
        parts = [
            checkpoint(rows, x[i : i + step], use_reentrant=False) if grad else rows(x[i : i + step])
            for i in range(0, n, step)
        ]
        return torch.cat(parts, 1)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, ndim={self.ndim}, eps={self.eps}, per_axis={self.per_axis}"


#: LookHere's field-of-view options: 180 (its "halves": up, down, left, right) and 90 ("corners")
LOOKHERE_FOVS = (180, 90)
#: the value LookHere puts at masked positions (its code: bfloat16's largest finite value, negated)
LOOKHERE_MASKED = -torch.finfo(torch.bfloat16).max


class LookHereBias(AttentionBias):
    """LookHere's directed attention on a 2-D grid (Fuller et al., NeurIPS 2024; no parameters, no keys).

    Head ``h`` looks in direction ``h mod 4`` of its field of view and has the slope
    ``m_h = global_slope * 2^-(h // 4 + 1)`` (LookHere's ``get_slopes``: four directions per slope):

    * ``fov=180`` (LookHere's "halves"): up, down, left, right; the query sees the keys in its
      closed half-plane (``up``: key row <= query row; ``left``: key column <= query column...);
    * ``fov=90`` ("corners"): up-left, up-right, down-left, down-right (both half-planes).

    ``bias[h, i, j] = -m_h * |p_i - p_j|`` (Euclidean) for visible keys and ``LOOKHERE_MASKED``
    (``-max bfloat16``, LookHere's fill) outside the field of view; a query always sees itself.
    Prefix (class) tokens are neither masked nor penalised (LookHere's zero class row and column).

    Per-layer schedule (LookHere's ``layer_slopes``): block ``l`` of ``depth`` multiplies the
    penalties by ``s_l``, ``s`` linear from ``layer_slopes[0]`` (first block) to ``layer_slopes[1]``
    (last), masked keys staying masked: :meth:`forward` returns the bias at scale 1 and
    :meth:`layer_bias` scales it per block.  The default ``(1, 1)`` gives every block the same
    bias.  Not implemented: LookHere's 45-degree ("eighths" / "triangles") and mixed-head
    configurations.  Heads need not be a multiple of 4 (LookHere's configs use 4k heads): the
    directions simply cycle.
    """

    def __init__(
        self,
        num_heads: int,
        ndim: int = 2,
        *,
        fov: int = 180,
        global_slope: float = 1.0,
        layer_slopes: tuple[float, float] = (1.0, 1.0),
        depth: int = 1,
    ) -> None:
        super().__init__(num_heads, ndim)
        if ndim != 2:
            raise ValueError(f"LookHere's directions are 2-D; got ndim={ndim}")
        if fov not in LOOKHERE_FOVS:
            raise ValueError(f"fov must be one of {LOOKHERE_FOVS}; got {fov!r}")
        layer_slopes = tuple(float(v) for v in layer_slopes)
        if len(layer_slopes) != 2 or min(layer_slopes) < 0 or depth < 1:
            raise ValueError(
                f"layer_slopes must be two values >= 0 and depth >= 1; got {layer_slopes}, {depth}"
            )
        self.fov = fov
        self.global_slope = float(global_slope)
        self.layer_slopes = layer_slopes
        self.depth = depth
        slopes = [self.global_slope * 2.0 ** -(h // 4 + 1) for h in range(num_heads)]
        self.register_buffer("slopes", torch.tensor(slopes, dtype=torch.float64), persistent=False)
        # python floats, not a buffer: a constant per block under torch.export / ONNX
        a, b = layer_slopes
        self._layer_scale = [a + (b - a) * (i / (depth - 1) if depth > 1 else 0.0) for i in range(depth)]

    def grid_bias(self, coords: Tensor) -> Tensor:
        row, col = coords[:, 0], coords[:, 1]
        dr = row[None, :] - row[:, None]  # (N, N): key row - query row (negative: the key is above)
        dc = col[None, :] - col[:, None]
        up, down, left, right = dr <= 0, dr >= 0, dc <= 0, dc >= 0
        if self.fov == 180:
            views = (up, down, left, right)
        else:
            views = (up & left, up & right, down & left, down & right)
        visible = torch.stack([views[h % 4] for h in range(self.num_heads)])  # (heads, N, N)
        penalty = -self.slopes.to(coords.dtype)[:, None, None] * grid_distance(coords)
        return penalty.masked_fill(~visible, LOOKHERE_MASKED)

    def layer_bias(self, bias: Tensor, layer: int) -> Tensor:
        """``bias`` (from :meth:`forward`, layer scale 1) with block ``layer``'s scale ``s_layer``.

        Masked entries (``<= LOOKHERE_MASKED``, which includes ``-inf`` key padding) stay as they
        are: LookHere fills masked positions after scaling.  A scale of 1 returns ``bias`` itself.
        """
        if not 0 <= layer < self.depth:
            raise IndexError(f"layer {layer} of a {self.depth}-block LookHere schedule")
        scale = self._layer_scale[layer]
        if scale == 1.0:
            return bias
        return torch.where(bias <= LOOKHERE_MASKED, bias, bias * scale)

    def extra_repr(self) -> str:
        text = f"num_heads={self.num_heads}, fov={self.fov}, global_slope={self.global_slope}"
        if self.layer_slopes != (1.0, 1.0):
            text += f", layer_slopes={self.layer_slopes}, depth={self.depth}"
        return text
