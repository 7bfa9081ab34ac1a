"""RT-DETR's decoder: IoU-aware query selection, deformable cross-attention, iterative box refinement.

The decoder takes the hybrid encoder's three maps ``(B, C_l, H_l, W_l)`` (strides 8/16/32) and

1. projects each with a 1x1 conv + BN (``input_proj``) and flattens them into one memory
   ``(B, S, D)``, ``S = sum H_l W_l``;
2. builds one anchor box per memory cell for the ACTUAL sizes ``H_l, W_l`` of this call (inside the
   graph, never cached, so any input size and dynamic-shape export work), scores every cell with the
   encoder heads and keeps the ``num_queries`` best cells (their boxes are the initial reference
   boxes, their features the initial queries);
3. runs ``num_layers`` post-norm layers (self-attention, multi-scale deformable cross-attention,
   FFN); after each one a box head refines the reference boxes in logit space.

The math and the state-dict layout follow lyuwenyu/RT-DETR's ``rtdetr_decoder.py`` and transformers'
``RTDetrModel`` / ``RTDetrDecoder`` (module names inside a layer are transformers' file names, so
:mod:`peg_detr.interop.hf_rtdetr` maps keys by prefix only).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import LAYER_ACTIVATIONS, MLP, create_act
from .config import NUM_QUERIES

if TYPE_CHECKING:
    from .denoising import DenoisingGroup

__all__ = [
    "DecoderLayerBase",
    "DecoderOutput",
    "DecoderStart",
    "DeformableAttentionBase",
    "MSDeformableAttention",
    "RTDETRDecoder",
    "RTDETRDecoderLayer",
    "RTDETRDecoderSpec",
    "generate_anchors",
    "inverse_sigmoid",
    "multi_scale_deformable_attention",
]

#: the decoder layers' activations by name (:data:`peg_detr.models.layers.LAYER_ACTIVATIONS`)
ACTIVATIONS = LAYER_ACTIVATIONS


def inverse_sigmoid(x: Tensor, eps: float = 1e-5) -> Tensor:
    """``log(x / (1 - x))`` with ``x`` clamped to ``[0, 1]`` and both sides to at least ``eps`` (RT-DETR's)."""
    x = x.clamp(0, 1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def generate_anchors(
    spatial_shapes: Sequence[tuple[int, int]],
    grid_size: float = 0.05,
    *,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    eps: float = 1e-2,
) -> tuple[Tensor, Tensor]:
    """One anchor per feature cell of every level, in logit space, for the given sizes.

    Cell ``(y, x)`` of level ``l`` (``H_l x W_l``) gets the box ``cx = (x + 0.5) / W_l``,
    ``cy = (y + 0.5) / H_l``, ``w = h = grid_size * 2**l``.  Anchors with a coordinate outside
    ``(eps, 1 - eps)`` are invalid: their logits are set to the dtype's largest value and their
    memory cells are zeroed by the caller (RT-DETR's rule).

    Args:
        spatial_shapes: ``(H_l, W_l)`` per level (ints, or symbolic sizes while exporting).
    Returns:
        ``anchors`` ``(1, S, 4)`` cxcywh logits and ``valid`` ``(1, S, 1)`` bool, ``S = sum H_l W_l``.
    """
    levels = []
    for level, (h, w) in enumerate(spatial_shapes):
        ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) / h
        xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) / w
        cy, cx = torch.meshgrid(ys, xs, indexing="ij")
        wh = torch.full_like(cx, grid_size * 2.0**level)
        levels.append(torch.stack([cx, cy, wh, wh], dim=-1).reshape(-1, 4))
    anchors = torch.cat(levels).unsqueeze(0)
    valid = ((anchors > eps) & (anchors < 1 - eps)).all(-1, keepdim=True)
    logits = torch.log(anchors / (1 - anchors))
    return logits.masked_fill(~valid, torch.finfo(dtype).max), valid


def multi_scale_deformable_attention(
    value: Tensor,
    spatial_shapes: Sequence[tuple[int, int]],
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """Bilinear samples of every level, weighted and summed (pure PyTorch; one ``grid_sample`` per level).

    Args:
        value: ``(B, S, M, Dh)`` the memory split in ``M`` heads, levels concatenated in ``S``.
        spatial_shapes: ``(H_l, W_l)`` per level, ``sum H_l W_l = S``.
        sampling_locations: ``(B, Q, M, L, P, 2)`` normalised ``(x, y)`` in ``[0, 1]``.
        attention_weights: ``(B, Q, M, L, P)`` (softmax over ``L * P``).
    Returns:
        ``(B, Q, M * Dh)``.
    """
    b, _, m, dh = value.shape
    q, n_levels, n_points = (
        sampling_locations.shape[1],
        sampling_locations.shape[3],
        sampling_locations.shape[4],
    )
    values = value.split([h * w for h, w in spatial_shapes], dim=1)
    # grid_sample's grid is in [-1, 1] with align_corners=False: pixel centres at (i + 0.5) / size.
    grids = (2 * sampling_locations - 1).transpose(1, 2).flatten(0, 1)  # (B*M, Q, L, P, 2)
    weights = attention_weights.transpose(1, 2).reshape(b * m, 1, q, n_levels, n_points)
    out = value.new_zeros(b * m, dh, q)
    for level, (h, w) in enumerate(spatial_shapes):
        v = values[level].permute(0, 2, 3, 1).reshape(b * m, dh, h, w)
        sampled = F.grid_sample(
            v, grids[:, :, level], mode="bilinear", padding_mode="zeros", align_corners=False
        )
        out = out + (sampled * weights[..., level, :]).sum(-1)  # (B*M, Dh, Q)
    return out.view(b, m * dh, q).transpose(1, 2)


class DeformableAttentionBase(nn.Module, ABC):
    """Multi-scale deformable cross-attention with 4-d reference boxes: what RT-DETR's and D-FINE's share.

    Each query predicts, per head, an offset and a weight for every sample point of every level
    (``level_points[l]`` points on level ``l``, level 0's first; the weights a softmax over all of
    a head's points); the points sample the memory around the query's reference box.  A variant
    sets :attr:`point_shape` and chooses the value / output projections (:meth:`project_value`,
    :meth:`project_output`: none by default), how offsets become locations (:meth:`locations`) and
    the sampler (:meth:`sample`); it calls :meth:`reset_parameters` once its modules exist.
    """

    #: the sample points' axes after the head axis in :meth:`forward` (``(L, P)`` or ``(sum P_l,)``)
    point_shape: tuple[int, ...]

    def __init__(self, d_model: int, num_heads: int, level_points: Sequence[int]) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads, self.level_points = num_heads, [int(p) for p in level_points]
        total = sum(self.level_points)
        self.sampling_offsets = nn.Linear(d_model, num_heads * total * 2)
        self.attention_weights = nn.Linear(d_model, num_heads * total)

    def reset_parameters(self) -> None:
        """Deformable DETR's init: zero offset weights, biases pointing along ``M`` directions, point ``p`` of a level ``p + 1`` apart."""
        nn.init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([theta.cos(), theta.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True).values  # (M, 2)
        steps = torch.cat([torch.arange(1, p + 1, dtype=torch.float32) for p in self.level_points])
        with torch.no_grad():
            self.sampling_offsets.bias.copy_((grid[:, None, :] * steps[None, :, None]).flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)

    def project_value(self, memory: Tensor) -> Tensor:
        """The memory ``(B, S, D)`` as the values are taken from it (none: as is)."""
        return memory

    def project_output(self, x: Tensor) -> Tensor:
        """The sampled values ``(B, Q, D)`` as the attention returns them (none: as is)."""
        return x

    @abstractmethod
    def locations(self, query: Tensor, reference_boxes: Tensor, offsets: Tensor) -> Tensor:
        """Normalised ``(x, y)`` ``(B, Q, M, *point_shape, 2)`` of the ``offsets`` around ``reference_boxes`` ``(B, Q, 4)``."""

    @abstractmethod
    def sample(
        self, value: Tensor, spatial_shapes: Sequence[tuple[int, int]], locations: Tensor, weights: Tensor
    ) -> Tensor:
        """``value`` ``(B, S, M, Dh)`` sampled at ``locations`` and summed with ``weights`` ``(B, Q, M, *point_shape)`` -> ``(B, Q, M * Dh)``."""

    def forward(
        self,
        query: Tensor,
        reference_boxes: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
    ) -> Tensor:
        """``query`` ``(B, Q, D)``, ``reference_boxes`` ``(B, Q, 4)`` cxcywh in [0, 1], ``memory`` ``(B, S, D)`` -> ``(B, Q, D)``."""
        b, q, _ = query.shape
        m, points = self.num_heads, self.point_shape
        value = self.project_value(memory).unflatten(-1, (m, -1))
        offsets = self.sampling_offsets(query).view(b, q, m, *points, 2)
        weights = self.attention_weights(query).view(b, q, m, -1).softmax(-1).view(b, q, m, *points)
        locations = self.locations(query, reference_boxes, offsets)
        return self.project_output(self.sample(value, spatial_shapes, locations, weights))


class MSDeformableAttention(DeformableAttentionBase):
    """Multi-scale deformable attention (Deformable DETR) as in RT-DETR: ``P`` points on every level.

    Each query predicts ``P`` offsets per head and level, scaled by its reference box
    (``offset / P * wh * 0.5``), and softmax weights over the ``L * P`` samples; the values
    are projected (``value_proj``) and so is the output (``output_proj``).
    """

    def __init__(
        self, d_model: int = 256, num_heads: int = 8, num_levels: int = 3, num_points: int = 4
    ) -> None:
        super().__init__(d_model, num_heads, [num_points] * num_levels)
        self.num_levels, self.num_points = num_levels, num_points
        self.point_shape = (num_levels, num_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's offsets and weights (:class:`DeformableAttentionBase`), Xavier projections with zero biases."""
        super().reset_parameters()
        for lin in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def project_value(self, memory: Tensor) -> Tensor:
        return self.value_proj(memory)

    def project_output(self, x: Tensor) -> Tensor:
        return self.output_proj(x)

    def locations(self, query: Tensor, reference_boxes: Tensor, offsets: Tensor) -> Tensor:
        """``ref_xy + offset / P * ref_wh * 0.5``, the same box on every head, level and point."""
        ref = reference_boxes[:, :, None, None, None, :]
        return ref[..., :2] + offsets * (ref[..., 2:] * (0.5 / self.num_points))

    def sample(
        self, value: Tensor, spatial_shapes: Sequence[tuple[int, int]], locations: Tensor, weights: Tensor
    ) -> Tensor:
        return multi_scale_deformable_attention(value, spatial_shapes, locations, weights)


class QueryAttention(nn.Module):
    """Multi-head self-attention of the queries; positions added to queries and keys, not values.

    Separate ``q_proj / k_proj / v_proj / out_proj`` (transformers' layout) and
    ``F.scaled_dot_product_attention``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, pos: Tensor, blocked: Tensor | None = None) -> Tensor:
        """``x``, ``pos`` ``(B, N, D)``; ``blocked`` ``(N, N)`` bool, True where a query may NOT attend."""

        def heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # (B, M, N, Dh)

        qk = x + pos
        out = F.scaled_dot_product_attention(
            heads(self.q_proj(qk)),
            heads(self.k_proj(qk)),
            heads(self.v_proj(x)),
            attn_mask=None if blocked is None else ~blocked,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out_proj(out.transpose(1, 2).flatten(2))


@dataclass(frozen=True, kw_only=True)
class RTDETRDecoderSpec:
    """The RT-DETR family decoder's settings as one value: what the decoder and its layers are built from.

    :class:`RTDETRDecoder` takes one (D-FINE's and DEIMv2's decoders an extension of it:
    :class:`~peg_detr.models.dfine.decoder.DFineDecoderSpec`) and records it json-safe as its
    ``hparams``, where the Hugging Face exporters read it.  A value that cannot build a decoder is a
    ``ValueError`` here, before any weight is drawn.

    Attributes (grouped as the decoder uses them):
        in_channels, hidden_dim: channels of the encoder's maps, one input projection each (HF
            ``decoder_in_channels``), and the decoder's width ``D`` (HF ``d_model``).
        num_queries, learn_initial_query: ``Q``, cells kept by the query selection (at most ``S``
            of the smallest input), and initial queries from a learned table (HF ``weight_embedding``)
            instead of the selected cells' features.
        num_layers, eval_idx: the layers, and the one whose output is the prediction in eval
            (RT-DETR's; -1 = the last); layers after it are skipped in eval, all run in training.
        num_heads, num_points: the attentions' heads and the deformable samples per head and level.
        dim_feedforward, activation, dropout: the layers' FFN, and the dropout after each sub-layer.
        layer_norm_eps, batch_norm_eps: as in the HF config.
    """

    in_channels: Sequence[int] = (256, 256, 256)
    hidden_dim: int = 256
    num_queries: int = NUM_QUERIES
    learn_initial_query: bool = False
    num_layers: int = 6
    eval_idx: int = -1
    num_heads: int = 8
    num_points: int | Sequence[int] = 4
    dim_feedforward: int = 1024
    activation: str = "relu"
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    batch_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        # one form per value (a tuple), so specs compare equal whatever sequence they were given
        object.__setattr__(self, "in_channels", tuple(int(c) for c in self.in_channels))
        self.validate()

    def validate(self) -> None:
        """A ``ValueError`` naming the setting that cannot build a decoder (a variant adds its checks)."""
        if not -self.num_layers <= self.eval_idx < self.num_layers:
            raise ValueError(f"eval_idx {self.eval_idx} is not a layer index of {self.num_layers} layers")
        create_act(self.activation, optional=False)  # a wrong name fails before any weight

    @property
    def num_levels(self) -> int:
        """The memory's levels: one per encoder map."""
        return len(self.in_channels)

    def hparams(self) -> dict[str, Any]:
        """Every setting, json-safe (sequences as lists): the decoder's :attr:`RTDETRDecoder.hparams`."""
        return {
            f.name: list(value) if isinstance(value, (list, tuple)) else value
            for f in fields(self)
            for value in (getattr(self, f.name),)
        }


class DecoderLayerBase(nn.Module):
    """The RT-DETR family's decoder layer step (RT-DETR, D-FINE, DEIMv2): one forward, hooks for what differs.

    ``forward(x, pos, reference_boxes, memory, spatial_shapes, blocked) -> x``, all ``(B, N, D)``
    but ``reference_boxes`` ``(B, N, 4)``, ``memory`` ``(B, S, D)`` and ``blocked`` ``(N, N)``
    (True where a query may NOT attend)::

        x = self_attn_layer_norm(x + dropout(self_attention(x, pos, blocked)))
        x = merge_cross(x, dropout(encoder_attn(x + pos, reference_boxes, memory, spatial_shapes)))
        x = final_layer_norm(x + dropout(ffn(x)))      (clamped to +-ffn_clamp first when set)

    A layer builds those modules (:meth:`build_self_attention`, :meth:`build_ffn`) and overrides
    :meth:`self_attention` (default: ``self_attn``), :meth:`merge_cross` (default:
    ``encoder_attn_layer_norm(x + a)``, RT-DETR's) and :meth:`ffn`
    (default: ``fc2(dropout(activation(fc1(x))))``) where it differs.
    """

    #: D-FINE keeps the FFN's residual inside float16's range; None: no clamp
    ffn_clamp: float | None = None

    def build_self_attention(self, spec: RTDETRDecoderSpec, norm: nn.Module) -> None:
        """``self_attn`` (:class:`QueryAttention` of the settings' width, heads, dropout) and its post-norm ``norm``."""
        self.self_attn = QueryAttention(spec.hidden_dim, spec.num_heads, spec.dropout)
        self.self_attn_layer_norm = norm

    def build_ffn(self, spec: RTDETRDecoderSpec) -> None:
        """``fc1``, ``fc2``, ``activation`` and ``final_layer_norm`` (transformers' names) of the settings."""
        self.fc1 = nn.Linear(spec.hidden_dim, spec.dim_feedforward)
        self.fc2 = nn.Linear(spec.dim_feedforward, spec.hidden_dim)
        self.activation = create_act(spec.activation, optional=False)  # the settings checked the name
        self.final_layer_norm = nn.LayerNorm(spec.hidden_dim, eps=spec.layer_norm_eps)

    def self_attention(self, x: Tensor, pos: Tensor, blocked: Tensor | None = None) -> Tensor:
        """The queries' self-attention ``(B, N, D) -> (B, N, D)``, before its residual and norm."""
        return self.self_attn(x, pos, blocked)

    def merge_cross(self, x: Tensor, cross: Tensor) -> Tensor:
        """The cross-attention's output ``cross`` into the residual stream ``x`` (both ``(B, N, D)``)."""
        return self.encoder_attn_layer_norm(x + cross)

    def ffn(self, x: Tensor) -> Tensor:
        """The feed-forward block ``(B, N, D) -> (B, N, D)``, before its residual and norm."""
        return self.fc2(self.dropout(self.activation(self.fc1(x))))

    def forward(
        self,
        x: Tensor,
        pos: Tensor,
        reference_boxes: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        blocked: Tensor | None = None,
    ) -> Tensor:
        """``x``, ``pos`` ``(B, N, D)``, ``reference_boxes`` ``(B, N, 4)``, ``memory`` ``(B, S, D)`` -> ``(B, N, D)``."""
        x = self.self_attn_layer_norm(x + self.dropout(self.self_attention(x, pos, blocked)))
        x = self.merge_cross(
            x, self.dropout(self.encoder_attn(x + pos, reference_boxes, memory, spatial_shapes))
        )
        out = x + self.dropout(self.ffn(x))
        if self.ffn_clamp is not None:
            out = out.clamp(min=-self.ffn_clamp, max=self.ffn_clamp)
        return self.final_layer_norm(out)


class RTDETRDecoderLayer(DecoderLayerBase):
    """Post-norm decoder layer: self-attention, deformable cross-attention, FFN, each ``x = norm(x + f(x))``.

    Built from the decoder's settings (:class:`RTDETRDecoderSpec`): it reads ``hidden_dim``,
    ``num_heads``, ``dim_feedforward``, ``dropout``, ``activation``, ``num_points``,
    ``layer_norm_eps`` and the memory's levels ``len(in_channels)``.
    """

    def __init__(self, spec: RTDETRDecoderSpec) -> None:
        super().__init__()
        norm = partial(nn.LayerNorm, spec.hidden_dim, eps=spec.layer_norm_eps)  # the post-norms
        self.build_self_attention(spec, norm())
        self.encoder_attn = MSDeformableAttention(
            spec.hidden_dim, spec.num_heads, spec.num_levels, spec.num_points
        )
        self.encoder_attn_layer_norm = norm()
        self.build_ffn(spec)
        self.dropout = nn.Dropout(spec.dropout)


@dataclass
class DecoderOutput:
    """What :class:`RTDETRDecoder` returns (denoising queries first along the query axis when used).

    Attributes:
        logits: ``(L', B, N, C)`` class logits of each decoder layer that ran (in eval only the
            ``eval_idx`` layer: ``L' = 1``).
        boxes: ``(L', B, N, 4)`` cxcywh in [0, 1], same layers.
        enc_logits: ``(B, Q, C)`` the encoder head's logits of the selected cells.
        enc_boxes: ``(B, Q, 4)`` their boxes (sigmoid of anchor + predicted offset).
    """

    logits: Tensor
    boxes: Tensor
    enc_logits: Tensor
    enc_boxes: Tensor


@dataclass
class DecoderStart:
    """What the decoder layers start from (:meth:`RTDETRDecoder.prepare`), the denoising queries first.

    Attributes:
        memory: ``(B, S, D)`` the projected, flattened encoder maps.
        spatial_shapes: their ``(H_l, W_l)`` of this call.
        queries: ``(B, N, D)`` the initial queries.
        ref_logits: ``(B, N, 4)`` the initial reference boxes' logits, detached.
        blocked: ``(N, N)`` bool, True where a query may NOT attend (the denoising groups); None: none.
        enc_logits, enc_boxes: ``(B, Q, C)``, ``(B, Q, 4)`` the selected encoder proposals (with gradient).
    """

    memory: Tensor
    spatial_shapes: list[tuple[int, int]]
    queries: Tensor
    ref_logits: Tensor
    blocked: Tensor | None
    enc_logits: Tensor
    enc_boxes: Tensor


class RTDETRDecoder(nn.Module):
    """IoU-aware query selection over all levels and the refining decoder.

    Args:
        num_classes: sigmoid classes ``C`` (no "no object").
        spec: the settings (:class:`RTDETRDecoderSpec`; None: its defaults), kept as :attr:`spec`;
            :attr:`hparams` is their json-safe form, for writing the model back as an HF config.

    The constructor builds, in this order (the order the seeded init draws in), the input
    projections (:meth:`make_input_proj`), the encoder heads, the layers (:attr:`layer_type`) and
    the decoder heads (:meth:`build_heads`); a variant (D-FINE, DEIMv2) overrides those hooks.
    """

    #: the settings this decoder takes (a variant's decoder takes its extension)
    spec_type: ClassVar[type[RTDETRDecoderSpec]] = RTDETRDecoderSpec
    #: the decoder layer, built from the settings
    layer_type: ClassVar[type[nn.Module]] = RTDETRDecoderLayer

    def __init__(self, num_classes: int = 80, spec: RTDETRDecoderSpec | None = None) -> None:
        super().__init__()
        spec = self.spec_type() if spec is None else spec
        if not isinstance(spec, self.spec_type):
            raise TypeError(
                f"{type(self).__name__} takes a {self.spec_type.__name__}, not a {type(spec).__name__}"
            )
        d = spec.hidden_dim
        self.spec = spec
        self.hidden_dim, self.num_classes, self.num_queries = d, num_classes, spec.num_queries
        self.num_levels = spec.num_levels
        self.eval_idx = spec.eval_idx % spec.num_layers
        act = self.head_activation()  # no parameters: shared by the box and position heads
        self.input_proj = self.make_input_proj()
        self.enc_output = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d, eps=spec.layer_norm_eps))
        self.enc_score_head = nn.Linear(d, num_classes)
        self.enc_bbox_head = MLP(d, d, 4, 3, act)
        self.weight_embedding = nn.Embedding(spec.num_queries, d) if spec.learn_initial_query else None
        self.layers = nn.ModuleList(self.layer_type(spec) for _ in range(spec.num_layers))
        self.build_heads(act)
        self.reset_parameters()

    @property
    def hparams(self) -> dict[str, Any]:
        """The settings json-safe (:meth:`RTDETRDecoderSpec.hparams`): what the HF exporters read."""
        return self.spec.hparams()

    def head_activation(self) -> Callable[[Tensor], Tensor]:
        """The box and position heads' activation (RT-DETR: ReLU, :class:`MLP`'s)."""
        return F.relu

    def make_input_proj(self) -> nn.ModuleList:
        """A 1×1 conv + BN from each encoder map's width to ``hidden_dim`` (HF ``decoder_input_proj``)."""
        d, eps = self.hidden_dim, self.spec.batch_norm_eps
        return nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, d, 1, bias=False), nn.BatchNorm2d(d, eps=eps))
            for c in self.spec.in_channels
        )

    def make_query_pos_head(self, activation: Callable[[Tensor], Tensor]) -> nn.Module:
        """The reference boxes' position head ``(..., 4) -> (..., D)``: ``4 -> 2D -> D``."""
        return MLP(4, 2 * self.hidden_dim, self.hidden_dim, 2, activation)

    def build_heads(self, activation: Callable[[Tensor], Tensor]) -> None:
        """The heads after the layers (called by the constructor): ``query_pos_head``, one class and box head per layer."""
        d, n = self.hidden_dim, self.spec.num_layers
        self.query_pos_head = self.make_query_pos_head(activation)
        self.class_embed = nn.ModuleList(nn.Linear(d, self.num_classes) for _ in range(n))
        self.bbox_embed = nn.ModuleList(MLP(d, d, 4, 3, activation) for _ in range(n))

    def box_heads(self) -> list[nn.Module]:
        """The box heads (:class:`MLP` s) whose last layer starts at zero; a variant adds its own."""
        return [self.enc_bbox_head, *self.bbox_embed]

    def reset_parameters(self, prior_prob: float = 0.01) -> None:
        """RT-DETR's init: class biases at the ``prior_prob`` logit, box heads' last layer at zero."""
        bias = -math.log((1 - prior_prob) / prior_prob)
        for head in (self.enc_score_head, *self.class_embed):
            nn.init.xavier_uniform_(head.weight)
            nn.init.constant_(head.bias, bias)
        for mlp in self.box_heads():
            nn.init.zeros_(mlp.layers[-1].weight)
            nn.init.zeros_(mlp.layers[-1].bias)
        nn.init.xavier_uniform_(self.enc_output[0].weight)
        for lin in self.query_pos_head.layers:
            nn.init.xavier_uniform_(lin.weight)
        if self.weight_embedding is not None:
            nn.init.xavier_uniform_(self.weight_embedding.weight)

    def flatten_features(self, feats: Sequence[Tensor]) -> tuple[Tensor, list[tuple[int, int]]]:
        """Projected, flattened maps: memory ``(B, S, D)`` and the ``(H_l, W_l)`` of this call."""
        if len(feats) != self.num_levels:
            raise ValueError(f"the decoder takes {self.num_levels} feature maps, got {len(feats)}")
        maps = [proj(f) for proj, f in zip(self.input_proj, feats)]
        shapes = [(m.shape[-2], m.shape[-1]) for m in maps]
        return torch.cat([m.flatten(2).transpose(1, 2) for m in maps], dim=1), shapes

    def score_cells(
        self, memory: Tensor, spatial_shapes: Sequence[tuple[int, int]]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The encoder heads on every memory cell: ``(cells (B, S, D), logits (B, S, C), box logits (B, S, 4))``.

        Cells whose anchor is invalid are zeroed before ``enc_output``; box logits are the head's
        offsets plus the anchors of this call's ``spatial_shapes``.
        """
        anchors, valid = generate_anchors(spatial_shapes, device=memory.device, dtype=memory.dtype)
        cells = self.enc_output(memory * valid.to(memory.dtype))
        return cells, self.enc_score_head(cells), self.enc_bbox_head(cells) + anchors

    def select_queries(
        self, memory: Tensor, spatial_shapes: Sequence[tuple[int, int]]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """IoU-aware top-K selection over every cell of every level.

        Returns ``(queries (B, Q, D) detached, reference box logits (B, Q, 4) detached,
        enc_logits (B, Q, C), enc_boxes (B, Q, 4))``; the last two keep their gradients for the
        encoder-proposal loss.
        """
        cells, logits, box_logits = self.score_cells(memory, spatial_shapes)
        # Near-equal scores make the choice (and order) of cells depend on float rounding: a
        # backend that rounds differently (onnxruntime) then picks other cells.  Trained models
        # and real images separate them; invalid-anchor cells tie exactly but are identical.
        index = logits.max(-1).values.topk(self.num_queries, dim=1).indices  # (B, Q)

        def take(t: Tensor) -> Tensor:
            return t.gather(1, index.unsqueeze(-1).expand(-1, -1, t.shape[-1]))

        ref_logits = take(box_logits)
        if self.weight_embedding is not None:
            queries = self.weight_embedding.weight.unsqueeze(0).expand(memory.shape[0], -1, -1)
        else:
            queries = take(cells).detach()  # RT-DETR: the decoder's queries do not train the encoder head
        return queries, ref_logits.detach(), take(logits), ref_logits.sigmoid()

    def forward(self, feats: Sequence[Tensor], denoising: DenoisingGroup | None = None) -> DecoderOutput:
        """``feats``: the encoder's maps ``(B, C_l, H_l, W_l)``; ``denoising``: queries prepended in training."""
        return self.refine(self.prepare(feats, denoising))

    def prepare(self, feats: Sequence[Tensor], denoising: DenoisingGroup | None = None) -> DecoderStart:
        """What the layers start from (:class:`DecoderStart`), the denoising queries first."""
        memory, shapes = self.flatten_features(feats)
        queries, ref_logits, enc_logits, enc_boxes = self.select_queries(memory, shapes)
        blocked = None
        if denoising is not None:
            queries = torch.cat([denoising.queries.to(queries.dtype), queries], dim=1)
            ref_logits = torch.cat([denoising.ref_boxes_unact.to(ref_logits.dtype), ref_logits], dim=1)
            blocked = denoising.attn_mask
        return DecoderStart(memory, shapes, queries, ref_logits, blocked, enc_logits, enc_boxes)

    def refine(self, start: DecoderStart) -> DecoderOutput:
        """The decoder layers with iterative box refinement, from the selected queries and boxes ``start``.

        Each layer samples around, and its position head embeds, the previous boxes DETACHED; its
        box head predicts a logit-space offset to them.  In training the output box of layer
        ``i > 0`` adds the offset to the previous layer's boxes WITH their gradient (RT-DETR's
        ``dec_out_bboxes``), so each box loss also trains the previous box head; the values are the
        same.  Returns the layers' ``logits (L', B, N, C)``, ``boxes (L', B, N, 4)`` and ``start``'s
        encoder proposals.
        """
        x, ref = start.queries, start.ref_logits.sigmoid()
        logits, boxes = [], []
        prev = ref  # the previous layer's boxes, with gradient (training only)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.query_pos_head(ref), ref, start.memory, start.spatial_shapes, start.blocked)
            delta = self.bbox_embed[i](x)
            new_ref = (delta + inverse_sigmoid(ref)).sigmoid()
            if self.training:
                logits.append(self.class_embed[i](x))
                boxes.append(new_ref if i == 0 else (delta + inverse_sigmoid(prev)).sigmoid())
                prev = new_ref
            elif i == self.eval_idx:
                logits.append(self.class_embed[i](x))
                boxes.append(new_ref)
                break
            ref = new_ref.detach()
        return DecoderOutput(torch.stack(logits), torch.stack(boxes), start.enc_logits, start.enc_boxes)
