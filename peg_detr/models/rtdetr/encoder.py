"""RT-DETR's hybrid encoder (AIFI + CCFM), with the AIFI position encoding chosen by name.

Data flow for the three backbone maps ``C3, C4, C5`` (strides 8/16/32)::

    input_proj[l]   1×1 conv + BN to ``hidden_dim``            (HF ``model.encoder_input_proj``)
    aifi            transformer layer(s) on the stride-32 map  (AIFI: intra-scale interaction)
    CCFM top-down   lateral_convs[i] (1×1) -> nearest 2× up -> cat with the finer map -> fpn_blocks[i]
    CCFM bottom-up  downsample_convs[i] (3×3, stride 2) -> cat with the coarser FPN map -> pan_blocks[i]

``fpn_blocks`` / ``pan_blocks`` are CSP layers of RepVGG blocks (3×3 + 1×1 branches summed).
Module names follow transformers' ``RTDetrHybridEncoder``, so this module's state dict is HF's
``model.encoder.*`` plus ``input_proj.*`` = HF's ``model.encoder_input_proj.*``
(:mod:`peg_detr.interop.hf_rtdetr`).

Where position information enters (``pos_enc``), all inside AIFI, on the stride-32 tokens:

* ``sincos``: RT-DETR's fixed 2-D table (:class:`RTDetrSinCos2d`), added to the queries and keys
  of every AIFI layer.  It is computed for the actual feature size on every call, in the graph,
  never cached: no ``eval_spatial_size`` exists, so any input size (and a dynamic-shape export)
  works with the same formula.
* ``learned``: a learned ``(H0, W0)`` table (:class:`peg_core.LearnedPositionEncoding2d`,
  default 20×20 = a 640-px input) resized to the actual size, added to queries and keys.
* ``peg``: a zero-initialised :class:`peg_core.PEG2d` added to the token stream (default: on
  the AIFI input, ``peg_at=(-1,)``; ``i`` = after AIFI layer ``i``).  At zero it adds nothing,
  so a ``peg`` encoder computes exactly what the ``none`` encoder computes until its weights
  move (loading RT-DETR weights and fine-tuning starts from the ``none`` model).
* ``rope-axial`` / ``rope-mixed`` / ``rope-dinov3``: :mod:`peg_core.rope` rotates each head's
  queries and keys after their projections (values unrotated); ``peg+rope-axial`` /
  ``peg+rope-mixed`` combine both.
* ``alibi-2d`` / ``fire`` / ``lookhere``: a :class:`peg_core.bias.AttentionBias` (key ``attn_bias`` for FIRE's MLP,
  shared by the AIFI layers) gives one ``(1, heads, N, N)`` bias per forward, added to every AIFI
  layer's attention logits; ``peg+alibi-2d`` / ``peg+fire`` add the PEG too.
* ``none``: nothing; the CCFM convolutions' zero padding is then the only source of position.

The CCFM upsamples each map to the size of the finer one (``size=``, nearest): for sides that
are multiples of 32 this is RT-DETR's 2× nearest upsampling exactly, and other input sizes
(where ``ceil`` halvings make the finer side odd) run too.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core import PositionEncoding, check_tokens, sincos_2d
from peg_core.bias import AttentionBias
from peg_core.peg import PegOptions
from peg_core.registry import EncodingContext, EncodingSupport, build_encoding_parts, parse_pos_enc
from peg_core.rope import RotaryEmbedding, apply_rope

from ..layers import ConvNormLayer, FeedForward, create_act

__all__ = [
    "AIFI",
    "AIFI_ENCODINGS",
    "AIFILayer",
    "CSPOptions",
    "CSPRepLayer",
    "ConvNormLayer",
    "HybridEncoder",
    "HybridEncoderBase",
    "RTDetrSinCos2d",
    "RepVggBlock",
    "TokenPositions",
    "rtdetr_sincos_2d",
]

#: What AIFI builds from a ``pos_enc`` (:mod:`peg_core.registry`): a table on every layer's queries
#: and keys (``sincos`` is RT-DETR's own layout of it, :class:`RTDetrSinCos2d`), PEGs (or another
#: conditional encoding) after the layers of ``peg_at``, a rotary encoding or an attention bias; one
#: of them, or a conditional encoding with a rotary one or with an attention bias.  DETR's mask-aware
#: ``sine`` has no place: RT-DETR has no mask.
AIFI_ENCODINGS = EncodingSupport(
    "RT-DETR's AIFI encoder", 2, slots=("table", "conditional", "rotary", "bias"),
    combos=(("conditional", "rotary"), ("conditional", "bias")), exclude=("sine",),
    examples=("peg+rope-mixed", "peg+alibi-2d"),
)  # fmt: skip


class RTDetrSinCos2d(PositionEncoding):
    """RT-DETR's fixed 2-D sin-cos encoding of the queries and keys, computed for the actual grid on every call.

    :meth:`table` for grid ``(H, W)``: token ``i*W + j`` (row ``i``, column ``j``) gets
    ``[sin(i·ω) | cos(i·ω) | sin(j·ω) | cos(j·ω)]`` with ``ω_k = T^(-k/(C/4))``, ``k < C/4``: HF's
    ``build_2d_sinusoidal_position_embedding`` (row half first; on square grids also lyuwenyu's
    ``build_2d_sincos_position_embedding``, whose ``meshgrid(w, h)`` order only differs on
    non-square grids).  That is :func:`peg_core.sincos_2d` (MAE, column half first) with its two
    halves swapped, computed in float64.  ``position(x (B, H*W, C), (H, W)) -> (1, H*W, C)`` in
    ``x``'s dtype; the mask is ignored (RT-DETR has none).  No state, no cache.
    """

    def __init__(self, dim: int, temperature: float = 10000.0) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(f"the sincos encoding needs hidden_dim divisible by 4; got {dim}")
        self.dim = dim
        self.temperature = temperature
        self._set_apply_to("qk")

    def table(self, size: tuple[int, int], like: Tensor | None = None) -> Tensor:
        """``(H*W, C)`` on ``like``'s device and in its dtype (float64 without ``like``)."""
        device = None if like is None else like.device
        table = sincos_2d(tuple(size), self.dim, self.temperature, device=device, dtype=torch.float64)
        table = table.roll(self.dim // 2, dims=1)
        return table if like is None else table.to(like.dtype)

    def position(self, x: Tensor, size: tuple[int, int], mask: Tensor | None = None) -> Tensor:
        check_tokens(x, tuple(size), 0)
        return self.table(size, x).unsqueeze(0)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, temperature={self.temperature}"


def rtdetr_sincos_2d(
    size: tuple[int, int], dim: int, temperature: float = 10000.0, like: Tensor | None = None
) -> Tensor:
    """RT-DETR's sin-cos table ``(H*W, C)`` for grid ``size`` (:meth:`RTDetrSinCos2d.table`)."""
    return RTDetrSinCos2d(dim, temperature).table(size, like)


class RepVggBlock(nn.Module):
    """``act(BN(conv3x3(x)) + BN(conv1x1(x)))`` (RepVGG's training form), channels kept."""

    def __init__(self, channels: int, act: str | None = "silu", eps: float = 1e-5) -> None:
        super().__init__()
        self.conv1 = ConvNormLayer(channels, channels, 3, eps=eps)
        self.conv2 = ConvNormLayer(channels, channels, 1, eps=eps)
        self.activation = create_act(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.conv1(x) + self.conv2(x))


@dataclass(frozen=True)
class CSPOptions:
    """What every CSP layer of an encoder's fusion shares, as one value (RT-DETR's, D-FINE's and DEIMv2's CSP layers).

    Attributes:
        num_blocks: RepVGG blocks per CSP layer (``round(3 * depth_mult)``).
        expansion: the hidden width factor (HF ``hidden_expansion``).
        act: the convolutions' activation (``silu``; None: none).
        eps: the batch norms' eps.
    """

    num_blocks: int = 3
    expansion: float = 1.0
    act: str | None = "silu"
    eps: float = 1e-5


class CSPRepLayer(nn.Module):
    """Cross-stage-partial layer: ``conv3(blocks(conv1(x)) + conv2(x))``, ``(B, cin, H, W) -> (B, cout, H, W)``.

    ``conv1`` / ``conv2`` are 1×1 to ``int(cout * expansion)`` channels; ``conv3`` (1×1 back to
    ``cout``) exists only when the expansion changes the width (otherwise identity, no keys).
    ``options``: the blocks, expansion, activation and eps (:class:`CSPOptions`; None: its defaults).
    """

    def __init__(self, cin: int, cout: int, options: CSPOptions | None = None) -> None:
        super().__init__()
        opt = options or CSPOptions()
        act, eps = opt.act, opt.eps
        hidden = int(cout * opt.expansion)
        self.conv1 = ConvNormLayer(cin, hidden, 1, act=act, eps=eps)
        self.conv2 = ConvNormLayer(cin, hidden, 1, act=act, eps=eps)
        self.bottlenecks = nn.Sequential(*[RepVggBlock(hidden, act, eps) for _ in range(opt.num_blocks)])
        self.conv3 = ConvNormLayer(hidden, cout, 1, act=act, eps=eps) if hidden != cout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


class TokenPositions(NamedTuple):
    """What AIFI gives a layer's attention about the tokens' positions (each None where the encoding has none).

    Attributes:
        pos: ``(1|B, N, C)`` added to the query / key input only.
        rope: ``(sin, cos)`` (apply form, broadcastable to ``(B, heads, N, C/heads)``) rotating the
            projected queries and keys.
        bias: float, broadcastable to ``(B, heads, N, N)``, added to the attention logits.
    """

    pos: Tensor | None = None
    rope: tuple[Tensor, Tensor] | None = None
    bias: Tensor | None = None


#: no position input at all (the ``none`` encoding, and the PEG's, which acts on the tokens instead)
NO_POSITIONS = TokenPositions()


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate ``q_proj/k_proj/v_proj/o_proj`` (HF's layout).

    ``forward(x (B, N, C), pos, rope, bias) -> (B, N, C)``, each position input as
    :class:`TokenPositions` describes it (the other families' attentions take them the same way):
    ``pos`` added to the query / key input, ``rope`` rotating the projected queries and keys,
    ``bias`` added to the logits.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0, *, rope_half: bool = False) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"hidden_dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.rope_half = rope_half
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)
        # nn.MultiheadAttention's init (RT-DETR's original layer): Xavier over the packed (3C, C)
        # input projection, zero biases.
        bound = math.sqrt(6.0 / (4 * dim))
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.zeros_(lin.bias)
        nn.init.zeros_(self.o_proj.bias)

    def _heads(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        return x.view(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)  # (B, h, N, d)

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        qk = x if pos is None else x + pos
        q, k, v = self._heads(self.q_proj(qk)), self._heads(self.k_proj(qk)), self._heads(self.v_proj(x))
        if rope is not None:
            sin, cos = rope
            q = apply_rope(q, sin, cos, half=self.rope_half)
            k = apply_rope(k, sin, cos, half=self.rope_half)
        p = self.dropout if self.training else 0.0
        if bias is not None:  # a float mask in the queries' dtype (SDPA's rule)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p)
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class AIFILayer(nn.Module):
    """One transformer encoder layer (post-norm unless ``normalize_before``): attention, then MLP.

    Keys ``self_attn.{q,k,v,o}_proj``, ``self_attn_layer_norm``, ``mlp.fc1``, ``mlp.fc2``,
    ``final_layer_norm`` (HF's ``RTDetrEncoderLayer``).  ``forward(x (B, N, C), positions) -> (B, N, C)``
    (:class:`TokenPositions`, for the attention).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        act: str = "gelu",
        *,
        normalize_before: bool = False,
        eps: float = 1e-5,
        rope_half: bool = False,
    ) -> None:
        super().__init__()
        self.normalize_before = normalize_before
        self.self_attn = SelfAttention(dim, num_heads, dropout, rope_half=rope_half)
        self.self_attn_layer_norm = nn.LayerNorm(dim, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.mlp = FeedForward(dim, dim_feedforward, act, dropout)
        self.final_layer_norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: Tensor, positions: TokenPositions = NO_POSITIONS) -> Tensor:
        if self.normalize_before:
            x = x + self.dropout(self.self_attn(self.self_attn_layer_norm(x), *positions))
            return x + self.mlp(self.final_layer_norm(x))
        x = self.self_attn_layer_norm(x + self.dropout(self.self_attn(x, *positions)))
        return self.final_layer_norm(x + self.mlp(x))


class AIFI(nn.Module):
    """Attention-based intra-scale feature interaction: encoder layers on one map, with ``pos_enc``.

    ``forward(x (B, C, H, W)) -> (B, C, H, W)`` in ``x``'s memory format.  Position modules (keys):
    ``pos`` (``learned``: ``pos.pos_embed``; ``sincos``: none), ``pegs.{i}`` (``peg``:
    ``pegs.-1.proj.*`` before layer 0, ``pegs.i.*`` after layer ``i``), ``rope`` (``rope-mixed``:
    ``rope.freqs``, one set per layer and head), ``attn_bias`` (``fire``: ``attn_bias.mlp.*``, ``attn_bias.c``...,
    shared by the layers; ``alibi-2d``: none).  ``layer_options``: :class:`AIFILayer`'s
    keywords (``dim_feedforward``, ``dropout``, ``act``, ``normalize_before``, ``eps``); the other
    options: see :class:`HybridEncoder`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        num_layers: int = 1,
        layer_options: dict | None = None,
        pos_enc: str = "sincos",
        temperature: float = 10000.0,
        peg_at: Sequence[int] | str = (-1,),
        peg: PegOptions | None = None,
        learned_grid: tuple[int, int] = (20, 20),
        pos_interpolation: str = "bicubic",
    ) -> None:
        super().__init__()
        spec = parse_pos_enc(pos_enc, AIFI_ENCODINGS)
        # the PEG always starts at zero: a peg encoder computes what the none encoder computes until it trains
        peg = replace(PegOptions.of(peg), zero_init=True)
        ctx = EncodingContext(dim, tuple(learned_grid), apply_to="qk", interpolation=pos_interpolation,
                              num_heads=num_heads, depth=num_layers, peg=peg)  # fmt: skip
        # the rotary part first (the layers rotate in its pair layout), then the layers, then the rest:
        # the order the parameters were always drawn from the RNG in
        self.rope: RotaryEmbedding | None = build_encoding_parts(spec, ctx, order=("rotary",)).rotary
        half = self.rope is not None and self.rope.half
        options = {**(layer_options or {}), "rope_half": half}
        self.layers = nn.ModuleList(AIFILayer(dim, num_heads, **options) for _ in range(num_layers))
        # sincos is RT-DETR's layout of the table (HF parity), not MAE's
        own = {"sincos": lambda c: RTDetrSinCos2d(c.dim, temperature)}
        parts = build_encoding_parts(
            spec, ctx, peg_at=peg_at, own=own, order=("table", "conditional", "bias")
        )
        self.pos: PositionEncoding | None = parts.table
        # An empty ModuleDict has no keys, so the non-PEG encoders keep HF's exact state dict.
        self.pegs = parts.peg_modules()
        self.attn_bias: AttentionBias | None = parts.bias

    def _rope_table(self, size: tuple[int, int]) -> tuple[Tensor, Tensor] | None:
        return None if self.rope is None else self.rope(size)

    def _peg(self, i: int, tokens: Tensor, size: tuple[int, int]) -> Tensor:
        if str(i) not in self.pegs:
            return tokens
        return self.pegs[str(i)](tokens, size)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        size = (h, w)
        tokens = x.flatten(2).transpose(1, 2)  # (B, H*W, C); a view for channels-last maps
        pos = None if self.pos is None else self.pos.position(tokens, size)
        # Fixed kinds: (N, d); mixed: (layers, heads, N, d), one slice per layer.
        rope = self._rope_table(size)
        # (1, heads, N, N), one for every layer
        bias = (
            None if self.attn_bias is None else self.attn_bias(size, dtype=tokens.dtype, device=tokens.device)
        )
        tokens = self._peg(-1, tokens, size)
        for i, layer in enumerate(self.layers):
            table = None if rope is None else (rope[0][i], rope[1][i]) if self.rope.learned else rope
            layer_bias = None if bias is None else self.attn_bias.layer_bias(bias, i)
            out = layer(tokens, TokenPositions(pos, table, layer_bias))
            tokens = self._peg(i, out, size)
        out = tokens.transpose(1, 2).reshape(b, c, h, w)  # channels-last strides
        if x.is_contiguous(memory_format=torch.channels_last):
            return out
        return out.contiguous()


class HybridEncoderBase(nn.Module, ABC):
    """What RT-DETR's and D-FINE's hybrid encoders share: the constructor, the input projections, AIFI, the fusion loop.

    The constructor (its arguments: :class:`HybridEncoder`'s) checks the levels and builds the
    input projections (:meth:`make_input_proj`) and the AIFI layers (in that order, transformers'
    module order), then calls :meth:`build_fusion`, where the subclass builds its ``lateral_convs``,
    ``fpn_blocks``, ``downsample_convs`` and ``pan_blocks`` from :attr:`hparams`; :meth:`fuse` runs
    them top-down then bottom-up, joining two maps with :meth:`merge`.
    """

    def __init__(
        self,
        in_channels: Sequence[int] = (512, 1024, 2048),
        hidden_dim: int = 256,
        *,
        num_heads: int = 8,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        act: str = "gelu",
        conv_act: str | None = "silu",
        expansion: float = 1.0,
        depth_mult: float = 1.0,
        num_layers: int = 1,
        use_encoder_idx: Sequence[int] = (2,),
        pos_enc: str = "sincos",
        temperature: float = 10000.0,
        normalize_before: bool = False,
        layer_norm_eps: float = 1e-5,
        batch_norm_eps: float = 1e-5,
        peg_at: Sequence[int] | str = (-1,),
        peg: PegOptions | Mapping[str, Any] | None = None,
        learned_grid: tuple[int, int] = (20, 20),
        pos_interpolation: str = "bicubic",
    ) -> None:
        super().__init__()
        self._build_input_and_aifi({k: v for k, v in locals().items() if k not in ("self", "__class__")})
        self.build_fusion()

    @abstractmethod
    def build_fusion(self) -> None:
        """The subclass's FPN / PAN modules, from :attr:`hparams` (called by the constructor)."""

    def _build_input_and_aifi(self, hparams: dict) -> None:
        """From the constructor's arguments ``hparams`` (kept json-safe as :attr:`hparams`)."""
        peg = PegOptions.of(hparams["peg"])
        hparams = {**hparams, "peg": dataclasses.asdict(peg)}
        self.hparams = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in hparams.items()}
        in_channels, hidden_dim = hparams["in_channels"], hparams["hidden_dim"]
        use_encoder_idx = hparams["use_encoder_idx"]
        levels = len(in_channels)
        if levels < 2:
            raise ValueError(f"the hybrid encoder fuses >= 2 levels; got in_channels={list(in_channels)}")
        if any(not -levels <= i < levels for i in use_encoder_idx):
            raise ValueError(f"use_encoder_idx={list(use_encoder_idx)} out of range for {levels} levels")
        self.in_channels = list(in_channels)
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = [i % levels for i in use_encoder_idx]
        self.out_channels = [hidden_dim] * levels
        self.pos_enc = hparams["pos_enc"]
        self.input_proj = self.make_input_proj()
        layer = dict(dim_feedforward=hparams["dim_feedforward"], dropout=hparams["dropout"], act=hparams["act"],
                     normalize_before=hparams["normalize_before"], eps=hparams["layer_norm_eps"])  # fmt: skip
        aifi = dict(num_layers=hparams["num_layers"], layer_options=layer, pos_enc=self.pos_enc,
                    temperature=hparams["temperature"], peg_at=hparams["peg_at"], peg=peg,
                    learned_grid=hparams["learned_grid"], pos_interpolation=hparams["pos_interpolation"])  # fmt: skip
        self.aifi = nn.ModuleList(
            AIFI(hidden_dim, hparams["num_heads"], **aifi) for _ in self.use_encoder_idx
        )

    def make_input_proj(self) -> nn.ModuleList:
        """A 1×1 conv + BN from each backbone map's width to ``hidden_dim`` (called by the constructor).

        HF keeps these BNs at torch's default eps (its ``encoder_input_proj`` ignores ``batch_norm_eps``).
        """
        d = self.hidden_dim
        return nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, d, 1, bias=False), nn.BatchNorm2d(d)) for c in self.in_channels
        )

    def merge(self, a: Tensor, b: Tensor) -> Tensor:
        """Two ``(B, C, H, W)`` maps into one fusion block's input: concatenated (RT-DETR, D-FINE)."""
        return torch.cat([a, b], dim=1)

    def project(self, feats: Sequence[Tensor]) -> list[Tensor]:
        """The per-level input projections (HF ``encoder_input_proj``) alone."""
        if len(feats) != len(self.input_proj):
            raise ValueError(f"the encoder takes {len(self.input_proj)} maps; got {len(feats)}")
        return [proj(f) for proj, f in zip(self.input_proj, feats)]

    def fuse(self, maps: list[Tensor]) -> list[Tensor]:
        """AIFI + FPN / PAN on already projected maps ``(B, hidden_dim, H_l, W_l)`` (HF ``model.encoder``)."""
        maps = list(maps)
        for aifi, idx in zip(self.aifi, self.use_encoder_idx):
            maps[idx] = aifi(maps[idx])
        # Top-down: inner[0] is the running coarse map; each step adds one finer level.
        inner = [maps[-1]]
        for i, (lateral, block) in enumerate(zip(self.lateral_convs, self.fpn_blocks)):
            finer = maps[-2 - i]
            top = lateral(inner[0])
            inner[0] = top
            up = F.interpolate(top, size=finer.shape[-2:], mode="nearest")
            inner.insert(0, block(self.merge(up, finer)))
        # Bottom-up: outs[-1] is the running fine map; each step adds one coarser level.
        outs = [inner[0]]
        for i, (down, block) in enumerate(zip(self.downsample_convs, self.pan_blocks)):
            outs.append(block(self.merge(down(outs[-1]), inner[i + 1])))
        return outs

    def forward(self, feats: Sequence[Tensor]) -> list[Tensor]:
        return self.fuse(self.project(feats))


class HybridEncoder(HybridEncoderBase):
    """RT-DETR's hybrid encoder: input projections, AIFI on the coarsest map, CCFM fusion.

    Args:
        in_channels: channels of the backbone maps, finest first (R50vd: ``(512, 1024, 2048)``).
        hidden_dim: width of every encoder map (HF ``encoder_hidden_dim``).
        num_heads, dim_feedforward, dropout, act: AIFI's attention heads, MLP width, dropout
            (attention, residual and MLP) and MLP activation (``gelu``).
        conv_act: activation of the CCFM convolutions and RepVGG blocks (``silu``).
        expansion: width factor of the CSP / RepVGG hidden channels (HF ``hidden_expansion``;
            RT-DETR R18: 0.5).
        depth_mult: RepVGG blocks per CSP layer ``round(3 * depth_mult)``.
        num_layers: AIFI layers (HF ``encoder_layers``, 1).
        use_encoder_idx: which levels get an AIFI (HF ``encode_proj_layers``, ``(2,)``: stride 32).
        pos_enc: what :data:`AIFI_ENCODINGS` accepts (module docstring).
        temperature: sin-cos temperature (``sincos``).
        normalize_before: pre-norm AIFI layers (RT-DETR: False).
        layer_norm_eps, batch_norm_eps: norms' eps (HF ``layer_norm_eps``, ``batch_norm_eps``).
        peg_at: PEG positions in AIFI (:func:`peg_core.peg.resolve_peg_at`; ``-1`` = on the AIFI
            input, the default, so the attention sees position).
        peg: the PEG's options as one value (:class:`peg_core.peg.PegOptions`, or a mapping of its
            fields): :class:`peg_core.PEG2d`'s kernel, 1×k + k×1 factorisation, border mode and
            dynamic kernel bank; the PEG always starts at zero.  Stored configs' loose ``peg_*``
            keywords fold into it through :func:`peg_core.peg.fold_peg_keys`.
        learned_grid, pos_interpolation: the learned table's ``(H0, W0)`` and resize mode.

    ``forward(feats: list of (B, in_channels[l], H_l, W_l)) -> list of (B, hidden_dim, H_l, W_l)``,
    finest first (the PAN outputs).  Maps keep the input's memory format where the ops allow.
    :attr:`hparams` holds every constructor argument (json-safe).
    """

    def build_fusion(self) -> None:
        """RT-DETR's CCFM: 1×1 lateral convs and CSP blocks top-down, 3×3 stride-2 convs and CSP blocks bottom-up."""
        hp = self.hparams
        hidden_dim, conv_act, batch_norm_eps = hp["hidden_dim"], hp["conv_act"], hp["batch_norm_eps"]
        csp = CSPOptions(round(3 * hp["depth_mult"]), hp["expansion"], conv_act, batch_norm_eps)
        n = len(hp["in_channels"]) - 1
        self.lateral_convs = nn.ModuleList(
            ConvNormLayer(hidden_dim, hidden_dim, 1, act=conv_act, eps=batch_norm_eps) for _ in range(n)
        )
        self.fpn_blocks = nn.ModuleList(CSPRepLayer(2 * hidden_dim, hidden_dim, csp) for _ in range(n))
        self.downsample_convs = nn.ModuleList(
            ConvNormLayer(hidden_dim, hidden_dim, 3, 2, act=conv_act, eps=batch_norm_eps) for _ in range(n)
        )
        self.pan_blocks = nn.ModuleList(CSPRepLayer(2 * hidden_dim, hidden_dim, csp) for _ in range(n))
