"""A ViT for video clips whose position information comes from a space-time PEG (or a named alternative).

Layout (DeiT/timm parameter names, as :class:`peg_core.models.CPVT`, so 2D
checkpoints map onto it key for key)::

    clip (B, 3, T, H, W) -> patch_embed.proj (Conv3d, tubelet t×p×p, stride = tubelet)
      -> tokens (B, T'*H'*W', C), frame-major [+ cls_token in front for global_pool="token"]
      -> [pos_enc ("learned", "sincos"): added once here]
      -> [rope ("rope-3d"): one (sin, cos) table per forward, q and k rotated in every attention]
      -> [attn_bias ("alibi-2d", "fire"): one (1, heads, N, N) bias per forward, added to every attention's logits]
      -> [pos_blocks.-1] -> blocks.0 -> [pos_blocks.0 (PEG3d)] -> blocks.1 -> ... -> blocks.{depth-1}
      -> [pos_blocks.{depth-1}] -> norm -> pool ("avg": mean of the grid tokens; "token": the class token;
         "first": the first grid token; "attentive": pool.*, a learned query's cross-attention) -> head

Tokens stay ``(B, N, C)`` from end to end; a PEG3d views them as a
channels-last-3d grid without copying.

``rope-3d`` (V-JEPA 2's 3-D RoPE, :func:`peg_core.rope.build_rope`): the head's rotary pairs
are split into three sections rotated by the tubelet's integer ``t``, ``h`` and ``w`` indices
(base 10000; pairs left over are not rotated); the class token is not rotated.  The table is
built from the input's grid on every forward, so any clip length and crop runs.  In divided
attention the temporal attention rotates by ``t`` (its table is the grid ``(T, 1, 1)``: the
``h`` / ``w`` sections are the identity) and the spatial attention by ``(h, w)`` (grid
``(1, H, W)``), which are exactly the offsets each attention sees.  ``peg3d+rope-3d`` adds the
PEG3d of ``peg3d`` as well.  No state-dict key is added (the frequencies are not persistent).
``rope_layout="vjepa2"`` takes V-JEPA 2's channel layout (:func:`peg_core.rope.build_rope`).

Attention biases (``alibi-2d``, ``fire``: :class:`peg_core.bias.AttentionBias` on the 3-D grid,
key ``attn_bias.*`` for FIRE's MLP, shared by every block): joint attention adds the bias of the
``(T, H, W)`` grid (distances over ``(t, h, w)``; the class token's row and column are zero).  In
divided attention, as for ``rope-3d``, the temporal attention adds the bias of the grid
``(T, 1, 1)`` (distances ``|t_i - t_j|``) and the spatial attention the bias of ``(1, H, W)``
(distances over ``(h, w)``, class token unbiased): each attention gets the part of the 3-D bias
for the offsets it sees.  ``peg3d+alibi-2d`` / ``peg3d+fire`` add the PEG3d as well.

``pos_enc`` is read by the position-encoding registry (:mod:`peg_core.registry`) against
:data:`VIDEO_ENCODINGS`: one table (added once at the input), one conditional encoding (after the
blocks of ``peg_at``) or one rotary encoding, or a conditional and a rotary one together.  Each
part is built by its registered builder from an :class:`~peg_core.registry.EncodingContext`, so
an encoding registered from outside (a 3-D one, or one for 2-D and 3-D grids) runs here by name.
``sinusoid-1d`` is registered by this module (peg_video's own table, the in-package plugin).

Options for pre-trained encoders (:mod:`peg_video.interop.hf`; the defaults keep the keys and outputs of
every earlier config): ``pos_enc="sinusoid-1d"`` (VideoMAE's fixed table over the flattened
token index, :class:`SinusoidTable3d`), ``qkv_bias="qv"`` (query and value biases, no key bias:
``attn.qkv.q_bias`` / ``attn.qkv.v_bias``), ``norm_eps``, ``fc_norm_eps`` (a LayerNorm after the
pooling instead of one over the tokens), ``global_pool="first"`` (the first grid token, VideoMAE
without mean pooling), ``temporal_fc`` (TimeSformer's extra projection after the temporal
attention), ``peg=PegOptions(zero_init=True)`` (PEG3ds that start as the identity) and ``global_pool="attentive"``
(V-JEPA 2's attentive-pooler head, ``pool_depth`` / ``pool_mlp_ratio``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core import check_tokens
from peg_core.base import PositionEncoding
from peg_core.encodings import sincos_1d
from peg_core.models.layers import Attention, Block, init_vit_weights, vit_lr_layer_id
from peg_core.peg import PegOptions
from peg_core.registry import (
    Encoding,
    EncodingContext,
    EncodingSupport,
    build_encoding_parts,
    parse_pos_enc,
    register_encoding,
)
from peg_core.resize import is_tracing, resize_pos_embed_3d, resize_pos_embed_traceable

from .pool import AttentivePool

__all__ = [
    "ATTENTIONS",
    "SINUSOID_1D",
    "VIDEO_ENCODINGS",
    "DividedBlock",
    "QVBiasLinear",
    "SinusoidTable3d",
    "TubeletEmbed",
    "VideoTransformer",
    "sinusoid_table",
    "tubelet_misfits",
]

#: What the video ViT builds from a ``pos_enc`` (:mod:`peg_core.registry`): a table added once at the
#: input, a conditional encoding (PEG3d) after the blocks of ``peg_at``, or a rotary encoding of every
#: attention's queries and keys; one of them, or a conditional and a rotary one together.
VIDEO_ENCODINGS = EncodingSupport(
    "the video ViT", 3, slots=("table", "conditional", "rotary", "bias"),
    combos=(("conditional", "rotary"), ("conditional", "bias")), examples=("peg3d+rope-3d", "peg3d+alibi-2d"),
)  # fmt: skip
ATTENTIONS = ("joint", "divided")
GLOBAL_POOLS = ("avg", "token", "first", "attentive")
TEMPORAL_INTERPOLATIONS = ("linear", "nearest", "area")


def _triple(x: int | Sequence[int]) -> tuple[int, int, int]:
    return (int(x),) * 3 if isinstance(x, int) else tuple(int(s) for s in x)


def tubelet_misfits(sizes: Sequence[int], tubelet: Sequence[int]) -> list[tuple[str, int, int]]:
    """The one tubelet rule: ``(axis, size, k)`` for each of ``T, H, W`` that ``k`` does not divide.

    ``sizes`` is a clip's ``(T, H, W)`` and ``tubelet`` its ``(t, p, p)``; an empty list means the
    clip splits into tubelets.  Every check of the rule (the model, the command line, a Hugging Face
    config, a run's clip) words its own message from this list.
    """
    # sizes stay as given (a traced clip's symbolic sizes must not be turned into constants)
    return [(axis, s, k) for axis, s, k in zip("THW", sizes, tubelet, strict=True) if s % k]


def sinusoid_table(length: int, dim: int) -> Tensor:
    """Transformer sinusoid ``(1, length, dim)``: channel ``2k`` is ``sin(i w_k)``, ``2k+1`` ``cos(i w_k)``.

    ``w_k = 10000 ** (-k / (dim / 2))`` for token index ``i`` (the interleaved layout of
    VideoMAE's table; :func:`peg_core.encodings.sincos_1d` is the same values as ``[sin | cos]``).
    """
    flat = sincos_1d(length, dim)  # (length, dim): [sin | cos], float64 math
    half = dim // 2
    return torch.stack([flat[:, :half], flat[:, half:]], dim=-1).reshape(1, length, dim)


class SinusoidTable3d(PositionEncoding):
    """VideoMAE's fixed table: a 1-D sinusoid over the flattened ``T*H*W`` token index, frame-major.

    Built for ``grid_size`` (the training clip's tubelet grid) as a non-persistent buffer (no
    state-dict key, as in transformers); another grid reads it as a ``(T, H, W)`` grid and resizes
    it (:func:`peg_core.resize.resize_pos_embed_3d`, ``interpolation``), so any clip runs.
    Prefix tokens get no code.
    """

    def __init__(
        self, dim: int, grid_size: Sequence[int], num_prefix_tokens: int = 0, interpolation: str = "trilinear"
    ) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"the sinusoid table needs an even dim; got {dim}")
        self.dim = dim
        self.grid_size = _triple(grid_size)
        self.num_prefix_tokens = num_prefix_tokens
        self.interpolation = interpolation
        self.register_buffer("table", sinusoid_table(math.prod(self.grid_size), dim), persistent=False)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid_size={self.grid_size}, num_prefix_tokens={self.num_prefix_tokens}"

    def position(self, x: Tensor, size: Sequence[int], mask: Tensor | None = None) -> Tensor:
        """Codes ``(1, P + T*H*W, C)`` in ``x``'s dtype."""
        check_tokens(x, tuple(size), self.num_prefix_tokens)
        mode = self.interpolation
        if is_tracing(size):
            pos = resize_pos_embed_traceable(self.table, tuple(size), self.grid_size, mode=mode)
        else:
            pos = resize_pos_embed_3d(self.table, tuple(int(s) for s in size), self.grid_size, mode=mode)
        pos = pos.to(x.dtype)
        if self.num_prefix_tokens:
            pos = torch.cat([pos.new_zeros(1, self.num_prefix_tokens, self.dim), pos], dim=1)
        return pos


def _sinusoid_1d(ctx: EncodingContext) -> SinusoidTable3d:
    """``sinusoid-1d``'s builder: the table for the training grid, resized trilinearly at another one.

    VideoMAE's table is resized over three axes, so the 2-D modes a model names (``bicubic``,
    ``bilinear``) mean ``trilinear`` here; ``nearest`` / ``area`` are taken as given.
    """
    mode = "trilinear" if ctx.interpolation in ("bicubic", "bilinear") else ctx.interpolation
    return SinusoidTable3d(ctx.dim, ctx.grid_size, ctx.num_prefix_tokens, interpolation=mode)


#: VideoMAE's fixed table, peg_video's own encoding: registered here, as a plugin package would
SINUSOID_1D = register_encoding(
    Encoding(
        "sinusoid-1d", "add", _sinusoid_1d, dims=(3,),
        description="VideoMAE's fixed sinusoid over the flattened token index",
    )
)  # fmt: skip


class QVBiasLinear(nn.Linear):
    """The fused ``qkv`` projection with query and value biases and no key bias (BEiT / VideoMAE).

    ``weight`` ``(3C, C)``; ``q_bias`` and ``v_bias`` ``(C,)``; the bias applied is
    ``cat(q_bias, 0, v_bias)``.  ``(B, N, C) -> (B, N, 3C)``.
    """

    def __init__(self, dim: int) -> None:
        super().__init__(dim, 3 * dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim))
        self.v_bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        bias = torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])
        return F.linear(x, self.weight, bias)


def _use_qv_bias(attn: Attention) -> None:
    """Swap ``attn.qkv`` (built without a bias) for a :class:`QVBiasLinear` with the same weight."""
    qkv = QVBiasLinear(attn.qkv.in_features)
    with torch.no_grad():
        qkv.weight.copy_(attn.qkv.weight)
    attn.qkv = qkv


class TubeletEmbed(nn.Module):
    """Non-overlapping ``t×p×p`` Conv3d: clip ``(B, 3, T, H, W)`` -> tokens ``(B, T/t * H/p * W/p, C)``."""

    def __init__(self, tubelet: Sequence[int] = (2, 16, 16), in_chans: int = 3, embed_dim: int = 768) -> None:
        super().__init__()
        self.tubelet = _triple(tubelet)
        self.in_chans = in_chans
        self.proj = nn.Conv3d(in_chans, embed_dim, self.tubelet, stride=self.tubelet)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
        if x.dim() != 5 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected clips (B, {self.in_chans}, T, H, W); got shape {tuple(x.shape)}")
        bad = tubelet_misfits(x.shape[2:], self.tubelet)
        if bad:
            raise ValueError(
                f"clip of shape {tuple(x.shape)} does not split into tubelets {self.tubelet}: "
                + ", ".join(f"{n}={s} is not a multiple of {k}" for n, s, k in bad)
            )
        x = self.proj(x)  # (B, C, T', H', W')
        size = (x.shape[2], x.shape[3], x.shape[4])
        return x.flatten(2).transpose(1, 2), size


class DividedBlock(Block):
    """TimeSformer's divided space-time block: temporal attention, then spatial attention, then the MLP.

    ``norm1``/``attn`` (the spatial attention), ``norm2``/``mlp`` keep the
    DeiT names; the temporal branch adds ``norm_t``/``attn_t``.  Its output
    projection ``attn_t.proj`` starts at zero (:meth:`reset_temporal`), so a
    fresh or 2D-initialised block acts on each frame as the image block does.

    The class token takes no part in temporal attention; in spatial attention
    every frame sees its own copy and the copies' outputs are averaged.

    ``temporal_fc=True`` adds TimeSformer's ``temporal_fc`` (``Linear(C, C)``) after the
    temporal attention's output projection (transformers' ``temporal_dense``), applied after the
    branch's stochastic depth as TimeSformer does.
    """

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float = 4.0, *, temporal_fc: bool = False, **kwargs
    ) -> None:
        super().__init__(dim, num_heads, mlp_ratio, **kwargs)
        self.norm_t = nn.LayerNorm(dim, eps=self.norm1.eps)
        self.attn_t = Attention(dim, num_heads, qkv_bias=self.attn.qkv.bias is not None)
        self.temporal_fc = nn.Linear(dim, dim) if temporal_fc else None

    @torch.no_grad()
    def reset_temporal(self) -> None:
        """Zero the temporal branch's output projection."""
        nn.init.zeros_(self.attn_t.proj.weight)
        nn.init.zeros_(self.attn_t.proj.bias)

    def forward(
        self,
        x: Tensor,
        size: tuple[int, int, int],
        num_prefix_tokens: int = 0,
        rope: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
        bias: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """``x`` ``(B, P + T*H*W, C)`` frame-major, ``size=(T, H, W)`` -> same shape.

        ``rope``: ``(temporal, spatial)`` apply-form tables, ``(T, D)`` for the temporal attention
        and ``(P + H*W, D)`` for the spatial one (prefix rows: identity), or None.
        ``bias``: ``(temporal, spatial)`` attention biases, ``(1, heads, T, T)`` and
        ``(1, heads, P + H*W, P + H*W)`` (prefix rows / columns zero), or None.
        """
        rope_t, rope_s = (None, None) if rope is None else rope
        bias_t, bias_s = (None, None) if bias is None else bias
        b, _, c = x.shape
        t, hw, p = size[0], size[1] * size[2], num_prefix_tokens
        check_tokens(x, size, p)

        # Temporal: each spatial location attends over its T tubelets, (B*HW, T, C).
        xt = x[:, p:].reshape(b, t, hw, c).transpose(1, 2).reshape(b * hw, t, c)
        xt = (
            self.attn_t(self.norm_t(xt), rope_t, bias_t)
            .reshape(b, hw, t, c)
            .transpose(1, 2)
            .reshape(b, t * hw, c)
        )
        if p:
            xt = torch.cat([xt.new_zeros(b, p, c), xt], dim=1)
        if self.temporal_fc is None:
            x = x + self.drop_path(xt)
        else:  # the prefix rows must stay untouched, so the projection skips them
            xt = self.drop_path(xt)
            x = torch.cat([x[:, :p], x[:, p:] + self.temporal_fc(xt[:, p:])], dim=1)

        # Spatial: each frame attends over its HW tubelets plus a copy of the prefix, (B*T, P + HW, C).
        prefix, tokens = x[:, :p], x[:, p:]
        xs = tokens.reshape(b * t, hw, c)
        if p:
            xs = torch.cat([prefix.unsqueeze(1).expand(b, t, p, c).reshape(b * t, p, c), xs], dim=1)
        xs = self.attn(self.norm1(xs), rope_s, bias_s)
        delta = xs[:, p:].reshape(b, t * hw, c)
        if p:
            delta = torch.cat([xs[:, :p].reshape(b, t, p, c).mean(1), delta], dim=1)
        x = x + self.drop_path(delta)
        return x + self.drop_path(self.mlp(self.norm2(x)))


def _check_options(
    *, attention: str, global_pool: str, qkv_bias: bool | str, temporal_fc: bool,
    pool_depth: int, pool_mlp_ratio: float, pos_temporal_interpolation: str, peg: PegOptions,
    embed_dim: int, num_heads: int,
) -> None:  # fmt: skip
    """:class:`VideoTransformer`'s options that exclude each other: a ``ValueError`` naming them.

    ``pos_enc`` is checked by :func:`peg_core.registry.parse_pos_enc` when the model reads it.
    """
    for name, value, allowed in (
        ("attention", attention, ATTENTIONS),
        ("global_pool", global_pool, GLOBAL_POOLS),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
    if pos_temporal_interpolation not in TEMPORAL_INTERPOLATIONS:
        raise ValueError(f"pos_temporal_interpolation must be one of {TEMPORAL_INTERPOLATIONS}; "
                         f"got {pos_temporal_interpolation!r}")  # fmt: skip
    if qkv_bias not in (True, False, "qv"):
        raise ValueError(f"qkv_bias must be True, False or 'qv'; got {qkv_bias!r}")
    if temporal_fc and attention != "divided":
        raise ValueError("temporal_fc is a projection of divided attention's temporal branch; "
                         f"got attention={attention!r}")  # fmt: skip
    if global_pool != "attentive" and (pool_depth, pool_mlp_ratio) != (1, 4.0):
        raise ValueError("pool_depth and pool_mlp_ratio size global_pool='attentive'; "
                         f"got global_pool={global_pool!r}")  # fmt: skip
    if peg.num_kernels is not None and not peg.dynamic:
        raise ValueError("peg_num_kernels sizes the kernel bank of peg_dynamic=True; got peg_dynamic=False")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")


class VideoTransformer(nn.Module):
    """Video ViT with a conditional (PEG3d) or other space-time position encoding.

    Args:
        embed_dim, depth, num_heads, mlp_ratio: transformer size.
        qkv_bias: biases of the fused ``qkv`` projection: True, False, or ``"qv"`` (query and
            value only, :class:`QVBiasLinear`; VideoMAE / BEiT).
        norm_eps: eps of every LayerNorm of the blocks and of the final norm.
        num_classes: classifier outputs (0: no head, :meth:`forward` returns pooled features).
        num_frames, img_size: training clip length and crop; they only size the
            learned tables (any multiple of the tubelet runs).
        tubelet: ``(t, p, p)`` of the Conv3d tubelet embedding.
        pos_enc: ``"peg3d"`` (default), ``"peg3d-factorized"``, ``"learned"``
            (spatial + temporal tables), ``"sincos"`` (fixed), ``"none"``, ``"rope-3d"``
            (3-D rotary q/k, module docstring), ``"peg3d+rope-3d"`` (both),
            ``"sinusoid-1d"`` (VideoMAE's fixed table, :class:`SinusoidTable3d`), ``"alibi-2d"`` /
            ``"fire"`` (attention biases on the 3-D grid, module docstring), or any
            name or combination :data:`VIDEO_ENCODINGS` accepts from the registry.
        rope_layout: channel layout of ``rope-3d``: ``"pairs"`` (default) or ``"vjepa2"``
            (V-JEPA 2's, :func:`peg_core.rope.build_rope`).
        peg_at: block indices after which a PEG3d runs; ``-1`` means before
            block 0 (:func:`peg_core.peg.resolve_peg_at`, the meaning of every
            model of the suite).  Default ``(0,)`` as CPVT; ``"all"`` is
            ``(0, ..., depth-1)``, after every block.  A PEG at the input of
            every block (UniFormer's dynamic position embedding) is
            ``(-1, 0, ..., depth-2)``; checkpoints written when ``"all"`` meant
            that are read as such (:func:`peg_video.model.checkpoint_run`).
        peg: the PEG3d's options as one value (:class:`peg_core.peg.PegOptions`, or a mapping of
            its fields): ``kernel_size`` (odd int or ``(kT, kH, kW)``), ``padding_mode``
            (``"zeros"``: absolute position from the border, ``"circular"`` or ``"replicate"``),
            ``dynamic`` (per-clip kernels mixed from a bank of ``num_kernels``, default 4; not with
            ``"peg3d-factorized"``), ``zero_init`` (start every PEG3d's last conv at zero, so it is
            the identity until it trains: a PEG3d added to a pre-trained model).  A stored config's
            loose ``peg_kernel_size``... keywords build through :func:`peg_core.peg.fold_peg_keys`
            (:func:`~peg_video.models.build_video_model`).
        attention: ``"joint"`` space-time attention over all tokens (default) or
            ``"divided"`` (temporal then spatial attention per block, TimeSformer).
        temporal_fc: divided attention only: TimeSformer's extra ``Linear(C, C)`` after the
            temporal attention (:class:`DividedBlock`).
        global_pool: ``"avg"`` (mean of the grid tokens; default: the CPVT-GAP
            choice, no class token, works best with PEG), ``"token"`` (class token),
            ``"first"`` (the first grid token: VideoMAE without mean pooling) or
            ``"attentive"`` (a learned query reads the normed tokens by cross-attention,
            V-JEPA 2's classifier head: :class:`~peg_video.models.pool.AttentivePool`, keys
            ``pool.*``).
        pool_depth: ``global_pool="attentive"`` only: self-attention blocks the pool runs over
            the tokens before its cross-attention (V-JEPA 2's ``num_pooler_layers``).
        pool_mlp_ratio: ``global_pool="attentive"`` only: the MLP width of the pool's blocks.
        fc_norm_eps: ``None`` (default): a LayerNorm ``norm`` over the tokens before pooling; a
            float: no token norm, and a LayerNorm ``fc_norm`` with this eps on the pooled
            features (MAE / VideoMAE's mean-pooling head).
        drop_path_rate: stochastic depth, increasing linearly over the blocks.
        drop_rate: dropout before the head.
        pos_interpolation: spatial resize mode of the learned table; the ``sinusoid-1d`` table
            is resized trilinearly (``align_corners=False``; ``"nearest"`` / ``"area"`` as given).
        pos_temporal_interpolation: resize mode of the learned temporal table: ``"linear"``
            (default), ``"nearest"`` (TimeSformer's, with ``pos_interpolation="nearest"``) or
            ``"area"``.

    Shapes: ``forward`` takes clips ``(B, C, T, H, W)`` with ``T, H, W``
    multiples of the tubelet and returns logits ``(B, num_classes)``.
    """

    def __init__(
        self,
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        *,
        num_classes: int = 400,
        num_frames: int = 16,
        img_size: int | Sequence[int] = 224,
        tubelet: int | Sequence[int] = (2, 16, 16),
        in_chans: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool | str = True,
        norm_eps: float = 1e-6,
        pos_enc: str = "peg3d",
        rope_layout: str = "pairs",
        peg_at: Sequence[int] | str = (0,),
        peg: PegOptions | Mapping[str, Any] | None = None,
        attention: str = "joint",
        temporal_fc: bool = False,
        global_pool: str = "avg",
        pool_depth: int = 1,
        pool_mlp_ratio: float = 4.0,
        fc_norm_eps: float | None = None,
        drop_path_rate: float = 0.0,
        drop_rate: float = 0.0,
        pos_interpolation: str = "bicubic",
        pos_temporal_interpolation: str = "linear",
    ) -> None:
        super().__init__()
        spec = parse_pos_enc(pos_enc, VIDEO_ENCODINGS)
        peg = PegOptions.of(peg)
        _check_options(
            attention=attention, global_pool=global_pool, qkv_bias=qkv_bias,
            temporal_fc=temporal_fc, pool_depth=pool_depth, pool_mlp_ratio=pool_mlp_ratio,
            pos_temporal_interpolation=pos_temporal_interpolation, peg=peg, embed_dim=embed_dim,
            num_heads=num_heads,
        )  # fmt: skip
        tub = _triple(tubelet)
        hw = (img_size, img_size) if isinstance(img_size, int) else tuple(int(s) for s in img_size)
        sizes = (num_frames, *hw)
        if tubelet_misfits(sizes, tub):
            raise ValueError(f"num_frames={num_frames}, img_size={hw} must be multiples of the tubelet {tub}")
        self.embed_dim = embed_dim
        self.num_classes = num_classes
        self.num_frames = num_frames
        self.img_size = hw
        self.tubelet = tub
        self.grid_size = tuple(s // k for s, k in zip(sizes, tub))
        self.pos_enc_kind = pos_enc
        self.attention = attention
        self.global_pool = global_pool
        self.num_prefix_tokens = p = 1 if global_pool == "token" else 0
        self.patch_embed = TubeletEmbed(tub, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if p else None
        ctx = EncodingContext(embed_dim, self.grid_size, num_prefix_tokens=p, interpolation=pos_interpolation,
                              temporal_interpolation=pos_temporal_interpolation, num_heads=num_heads, depth=depth,
                              peg=peg)  # fmt: skip
        # rotary first, as it always was (the parameters are drawn from the RNG in creation order; the
        # rotary kinds of videos draw nothing); PEG3ds keyed by block index as CPVT's pos_blocks, so
        # "pos_blocks.0" inflates from the 2D "pos_blocks.0"; one attention bias for every block
        parts = build_encoding_parts(spec, ctx, peg_at=peg_at, rotary_options={"layout": rope_layout},
                                     order=("rotary", "table", "conditional", "bias"))  # fmt: skip
        self.rope = parts.rotary
        self.pos_enc = parts.table
        self.peg_at = parts.peg_at
        self.pos_blocks = parts.peg_modules()
        self.attn_bias = parts.bias
        self.blocks = self._make_blocks(
            embed_dim, depth, num_heads, mlp_ratio, qkv_bias, norm_eps, drop_path_rate, temporal_fc
        )
        # with fc_norm the final LayerNorm moves behind the pooling; "norm" stays a key-less Identity
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps) if fc_norm_eps is None else nn.Identity()
        self.fc_norm = None if fc_norm_eps is None else nn.LayerNorm(embed_dim, eps=fc_norm_eps)
        # the attentive pool reads the normed tokens (V-JEPA 2 pools after the encoder's final norm)
        self.pool = (
            AttentivePool(embed_dim, num_heads, pool_depth, pool_mlp_ratio, norm_eps)
            if global_pool == "attentive"
            else None
        )
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

        init_vit_weights(self)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        if self.pool is not None:
            nn.init.trunc_normal_(self.pool.query, std=0.02)
        for blk in self.blocks:
            if isinstance(blk, DividedBlock):
                blk.reset_temporal()

    def _make_blocks(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool | str,
        norm_eps: float,
        drop_path_rate: float,
        temporal_fc: bool,
    ) -> nn.ModuleList:
        """``depth`` joint or divided blocks with stochastic depth rising linearly to ``drop_path_rate``."""
        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        extra = {"temporal_fc": True} if temporal_fc else {}
        block = DividedBlock if self.attention == "divided" else Block
        opts = {"qkv_bias": qkv_bias is True, "norm_eps": norm_eps, **extra}
        blocks = nn.ModuleList(
            block(dim, num_heads, mlp_ratio, drop_path=dpr[i], **opts) for i in range(depth)
        )
        if qkv_bias == "qv":
            for blk in blocks:
                for attn in (blk.attn, getattr(blk, "attn_t", None)):
                    if attn is not None:
                        _use_qv_bias(attn)
        return blocks

    def no_weight_decay(self) -> set[str]:
        """Parameter names conventionally trained without weight decay."""
        names = {"cls_token", "pos_enc.spatial", "pos_enc.temporal"}
        if self.attn_bias is not None and hasattr(self.attn_bias, "no_weight_decay"):
            names |= {f"attn_bias.{n}" for n in self.attn_bias.no_weight_decay()}
        return names | {"pool.query"} if self.pool is not None else names

    def num_lr_layers(self) -> int:
        """Blocks counted by layer-wise lr decay (:class:`peg_core.engine.LayerDecayModel`)."""
        return len(self.blocks)

    def lr_layer_id(self, name: str) -> int:
        """0: embeddings (a PEG3d before block 0 too), ``i + 1``: block ``i`` and the PEG3d after it,
        ``depth + 1``: final norm, pool and head."""
        return vit_lr_layer_id(name, len(self.blocks))

    def _peg(self, x: Tensor, index: int, size: tuple[int, int, int]) -> Tensor:
        key = str(index)
        return self.pos_blocks[key](x, size) if key in self.pos_blocks else x

    def _rope_tables(self, size: tuple[int, int, int]):
        """The rotary tables of a grid: ``(P + N, D)`` (joint), ``((T, D), (P + H*W, D))`` (divided), or None."""
        if self.rope is None:
            return None
        p = self.num_prefix_tokens
        if self.attention == "divided":
            return self.rope((size[0], 1, 1)), self.rope((1, size[1], size[2]), num_prefix_tokens=p)
        return self.rope(size, num_prefix_tokens=p)

    def _attn_biases(self, size: tuple[int, int, int], like: Tensor):
        """The attention biases of a grid: ``(1, heads, P + N, P + N)`` (joint), ``((1, heads, T, T),
        (1, heads, P + H*W, P + H*W))`` (divided), or None; in ``like``'s dtype and device."""
        if self.attn_bias is None:
            return None
        p, kw = self.num_prefix_tokens, {"dtype": like.dtype, "device": like.device}
        if self.attention == "divided":
            return self.attn_bias((size[0], 1, 1), **kw), self.attn_bias(
                (1, size[1], size[2]), num_prefix_tokens=p, **kw
            )
        return self.attn_bias(size, num_prefix_tokens=p, **kw)

    def forward_features(self, x: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
        """Clip ``(B, C, T, H, W)`` -> (normed tokens ``(B, P + T'*H'*W', C)``, grid ``(T', H', W')``)."""
        x, size = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_enc is not None:
            x = self.pos_enc(x, size)
        x = self._peg(x, -1, size)
        p = self.num_prefix_tokens
        rope = self._rope_tables(size)
        bias = self._attn_biases(size, x)
        for i, blk in enumerate(self.blocks):
            if bias is not None:
                if isinstance(blk, DividedBlock):  # (time, space) biases
                    x = blk(x, size, p, rope, tuple(self.attn_bias.layer_bias(b, i) for b in bias))
                else:
                    x = blk(x, rope, self.attn_bias.layer_bias(bias, i))
            else:
                x = blk(x, size, p, rope) if isinstance(blk, DividedBlock) else blk(x, rope)
            x = self._peg(x, i, size)
        return self.norm(x), size

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens ``(B, P + N, C)`` -> logits ``(B, num_classes)`` (or pooled features ``(B, C)``)."""
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(1)
        elif self.pool is not None:  # "attentive" (there is no prefix)
            x = self.pool(x)
        else:  # "token": the class token; "first": the first grid token (there is no prefix)
            x = x[:, 0]
        if self.fc_norm is not None:
            x = self.fc_norm(x)
        return x if pre_logits else self.head(self.head_drop(x))

    def forward(self, x: Tensor) -> Tensor:
        """Clips ``(B, C, T, H, W)`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x)[0])
