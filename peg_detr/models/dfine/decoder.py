"""D-FINE's decoder: RT-DETR's query selection, gated deformable layers, fine-grained distribution refinement.

Given the hybrid encoder's maps ``(B, C_l, H_l, W_l)`` the decoder

1. projects them to ``hidden_dim`` (identity when the widths agree, as in D-FINE S-L) and flattens
   them into one memory ``(B, S, D)``;
2. selects the ``num_queries`` best cells with RT-DETR's query selection
   (:meth:`peg_detr.models.rtdetr.decoder.RTDETRDecoder.select_queries`): anchors and the valid
   mask are built for the ACTUAL ``H_l, W_l`` of this call, inside the graph, never cached from an
   ``eval_spatial_size``;
3. runs the layers: self-attention, multi-scale deformable cross-attention v2 (per-level point
   counts, no value / output projection) merged into the residual by a sigmoid gate, FFN;
4. layer 0's ``pre_bbox_head`` turns the selected anchors into the initial boxes ``ref0``; every
   layer ``i`` then predicts per-edge distributions over ``max_num_bins + 1`` bins
   (``corners_i = bbox_embed[i](x_i + x_{i-1}.detach()) + corners_{i-1}``: each layer refines
   the previous layer's logits), whose expectation under the weighting function
   (:mod:`.fdr`) moves ``ref0``'s edges;
5. scores each layer with its class head plus the localisation-quality estimate (LQE) of its
   distributions.

Module names are transformers' ``DFineDecoder`` / ``DFineModel`` ones (the FFN as ``fc1`` / ``fc2``
and the self-attention output as ``out_proj``, the names transformers writes to its files), so
:mod:`peg_detr.interop.hf_dfine` maps keys by prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import MLP, create_act
from ..rtdetr.decoder import (
    DecoderLayerBase,
    DecoderStart,
    DeformableAttentionBase,
    RTDETRDecoder,
    RTDETRDecoderSpec,
    inverse_sigmoid,
)
from .fdr import distance2bbox, integral, weighting_function

__all__ = [
    "LQE",
    "DFineDecoder",
    "DFineDecoderLayer",
    "DFineDecoderOutput",
    "DFineDecoderSpec",
    "Gate",
    "MSDeformableAttentionV2",
    "deformable_sample_v2",
]


def deformable_sample_v2(
    value: Tensor,
    spatial_shapes: Sequence[tuple[int, int]],
    sampling_locations: Tensor,
    attention_weights: Tensor,
    num_points: Sequence[int],
) -> Tensor:
    """Bilinear samples with a per-level number of points, weighted and summed (one ``grid_sample`` per level).

    Args:
        value: ``(B, S, M, Dh)`` the memory split in ``M`` heads, levels concatenated along ``S``.
        spatial_shapes: ``(H_l, W_l)`` per level.
        sampling_locations: ``(B, Q, M, P, 2)`` normalised ``(x, y)``, ``P = sum(num_points)``,
            the points of level 0 first.
        attention_weights: ``(B, Q, M, P)``, softmax over all ``P`` points of a head.
        num_points: points per level.
    Returns:
        ``(B, Q, M * Dh)``.
    """
    b, _, m, dh = value.shape
    q = sampling_locations.shape[1]
    values = value.split([h * w for h, w in spatial_shapes], dim=1)
    # grid_sample: [-1, 1] with align_corners=False (pixel centres at (i + 0.5) / size)
    grids = (2 * sampling_locations - 1).transpose(1, 2).flatten(0, 1).split(list(num_points), dim=2)
    weights = attention_weights.transpose(1, 2).reshape(b * m, 1, q, -1).split(list(num_points), dim=-1)
    out = value.new_zeros(b * m, dh, q)
    for level, (h, w) in enumerate(spatial_shapes):
        v = values[level].permute(0, 2, 3, 1).reshape(b * m, dh, h, w)
        sampled = F.grid_sample(v, grids[level], mode="bilinear", padding_mode="zeros", align_corners=False)
        out = out + (sampled * weights[level]).sum(-1)  # (B*M, Dh, Q)
    return out.view(b, m * dh, q).transpose(1, 2)


class MSDeformableAttentionV2(DeformableAttentionBase):
    """D-FINE's deformable cross-attention: per-level point counts, the memory sampled as is (no projections).

    Each query predicts, per head, ``sum(num_points)`` offsets and softmax weights; point ``p`` of
    level ``l`` samples at ``ref_xy + offset_p / P_l * ref_wh * offset_scale``.  ``num_points_scale``
    (``1 / P_l`` per point) is a buffer, as in transformers' state dict.  The offsets' and
    weights' heads and their init are the family's (:class:`DeformableAttentionBase`).
    """

    def __init__(
        self,
        d_model: int = 256,
        num_heads: int = 8,
        num_points: Sequence[int] = (4, 4, 4),
        offset_scale: float = 0.5,
    ) -> None:
        super().__init__(d_model, num_heads, num_points)
        self.num_points, self.offset_scale = self.level_points, offset_scale
        self.point_shape = (sum(self.num_points),)
        scale = [1.0 / p for p in self.num_points for _ in range(p)]
        self.register_buffer("num_points_scale", torch.tensor(scale, dtype=torch.float32))
        self.reset_parameters()

    def locations(self, query: Tensor, reference_boxes: Tensor, offsets: Tensor) -> Tensor:
        """``ref_xy + offset / P_l * ref_wh * offset_scale``, the same box on every head and point."""
        ref = reference_boxes[:, :, None, None, :]
        scale = self.num_points_scale.to(query.dtype).unsqueeze(-1)  # (P, 1)
        return ref[..., :2] + offsets * scale * ref[..., 2:] * self.offset_scale

    def sample(
        self, value: Tensor, spatial_shapes: Sequence[tuple[int, int]], locations: Tensor, weights: Tensor
    ) -> Tensor:
        return deformable_sample_v2(value, spatial_shapes, locations, weights, self.num_points)


class Gate(nn.Module):
    """``norm(g1 * residual + g2 * x)`` with ``(g1, g2) = sigmoid(gate([residual, x]))`` (D-FINE's gateway).

    Initialised at ``g1 = g2 = 0.5`` (zero weights, zero bias).  The norm has torch's default eps, as in D-FINE.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.gate = nn.Linear(2 * d_model, 2 * d_model)
        self.norm = nn.LayerNorm(d_model)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def forward(self, residual: Tensor, x: Tensor) -> Tensor:
        g1, g2 = self.gate(torch.cat([residual, x], dim=-1)).sigmoid().chunk(2, dim=-1)
        return self.norm(g1 * residual + g2 * x)


class LQE(nn.Module):
    """Localisation-quality estimation: class logits plus a score of how peaked the edge distributions are.

    ``forward(scores (B, N, C), corners (B, N, 4 * (max_num_bins + 1))) -> (B, N, C)``: the ``k``
    largest bin probabilities of each edge and their mean (``4 * (k + 1)`` numbers) go through
    ``reg_conf`` (an MLP to one logit, initialised at zero) added to every class.
    """

    def __init__(self, max_num_bins: int, k: int = 4, hidden_dim: int = 64, num_layers: int = 2) -> None:
        super().__init__()
        self.bins, self.k = max_num_bins + 1, k
        self.reg_conf = MLP(4 * (k + 1), hidden_dim, 1, num_layers)
        nn.init.zeros_(self.reg_conf.layers[-1].weight)
        nn.init.zeros_(self.reg_conf.layers[-1].bias)

    def forward(self, scores: Tensor, corners: Tensor) -> Tensor:
        prob = corners.unflatten(-1, (4, self.bins)).softmax(-1)
        top = prob.topk(self.k, dim=-1).values
        stat = torch.cat([top, top.mean(-1, keepdim=True)], dim=-1).flatten(-2)
        return scores + self.reg_conf(stat)


@dataclass(frozen=True, kw_only=True)
class DFineDecoderSpec(RTDETRDecoderSpec):
    """D-FINE's decoder settings: RT-DETR's (:class:`~peg_detr.models.rtdetr.decoder.RTDETRDecoderSpec`) and its own.

    ``in_channels``: each map gets a 1×1 conv + BN to ``hidden_dim`` unless every map already has
    ``hidden_dim`` channels (then none, as in D-FINE S-L).

    Attributes (grouped as the decoder uses them):
        max_num_bins, reg_scale, up: the edge distributions, each over ``max_num_bins + 1`` bins,
            and the weighting function's fixed parameters (buffers-like, not trained).
        num_points, offset_scale: deformable samples per head for each level (an int: the same for
            all levels; kept as one count per level) and the scale of their offsets (D-FINE 0.5).
        mlp_activation, lqe_k, lqe_hidden_dim, lqe_layers: the heads: the box / position heads'
            activation (D-FINE ReLU, DEIM SiLU), LQE's top-k and MLP.

    The other attributes are RT-DETR's.
    """

    max_num_bins: int = 32
    reg_scale: float = 4.0
    up: float = 0.5
    num_points: int | Sequence[int] = (3, 6, 3)
    offset_scale: float = 0.5
    mlp_activation: str = "relu"
    lqe_k: int = 4
    lqe_hidden_dim: int = 64
    lqe_layers: int = 2

    def __post_init__(self) -> None:
        levels = len(self.in_channels)
        points = self.num_points
        per_level = [int(points)] * levels if isinstance(points, int) else [int(p) for p in points]
        if len(per_level) != levels or min(per_level) < 1:
            raise ValueError(f"num_points must be >= 1 for each of the {levels} levels; got {points}")
        object.__setattr__(self, "num_points", tuple(per_level))
        super().__post_init__()

    def validate(self) -> None:
        """RT-DETR's checks, the bins' count and the heads' activation."""
        super().validate()
        if self.max_num_bins < 4 or self.max_num_bins % 2:
            raise ValueError(f"max_num_bins must be an even number >= 4; got {self.max_num_bins}")
        create_act(self.mlp_activation, "mlp_activation", optional=False)


class DFineDecoderLayer(DecoderLayerBase):
    """Self-attention (post-norm), gated deformable cross-attention, FFN (post-norm, clamped to float16's range).

    Built from the decoder's settings (:class:`DFineDecoderSpec`): ``hidden_dim``, ``num_heads``,
    ``dim_feedforward``, ``dropout``, ``activation``, ``num_points`` (per level), ``offset_scale``,
    ``layer_norm_eps``.
    """

    ffn_clamp = 65504.0

    def __init__(self, spec: DFineDecoderSpec) -> None:
        super().__init__()
        self.build_self_attention(spec, nn.LayerNorm(spec.hidden_dim, eps=spec.layer_norm_eps))
        self.encoder_attn = MSDeformableAttentionV2(
            spec.hidden_dim, spec.num_heads, spec.num_points, spec.offset_scale
        )
        self.build_ffn(spec)
        self.gateway = Gate(spec.hidden_dim)
        self.dropout = nn.Dropout(spec.dropout)

    def merge_cross(self, x: Tensor, cross: Tensor) -> Tensor:
        """D-FINE's gateway instead of a residual + norm."""
        return self.gateway(x, cross)


@dataclass
class DFineDecoderOutput:
    """What :class:`DFineDecoder` returns (denoising queries first along the query axis when used).

    Attributes:
        logits: ``(L', B, N, C)`` class logits (LQE included) of each layer that ran; in eval only
            the ``eval_idx`` layer (``L' = 1``).
        boxes: ``(L', B, N, 4)`` cxcywh boxes of those layers.
        corners: ``(L', B, N, 4 * (max_num_bins + 1))`` their edge-distribution logits.
        refs: ``(L', B, N, 4)`` the detached initial boxes ``ref0`` the corners are relative to.
        pre_logits, pre_boxes: ``(B, N, C)``, ``(B, N, 4)``: layer 0's class head (no LQE) and
            ``pre_bbox_head`` boxes.
        enc_logits, enc_boxes: ``(B, Q, C)``, ``(B, Q, 4)`` the selected encoder proposals.
    """

    logits: Tensor
    boxes: Tensor
    corners: Tensor
    refs: Tensor
    pre_logits: Tensor
    pre_boxes: Tensor
    enc_logits: Tensor
    enc_boxes: Tensor


class DFineDecoder(RTDETRDecoder):
    """Query selection and the D-FINE decoder (module docstring): RT-DETR's decoder with D-FINE's hooks.

    Args:
        num_classes: sigmoid classes.
        spec: the settings (:class:`DFineDecoderSpec`; None: its defaults).

    What is RT-DETR's (:class:`~peg_detr.models.rtdetr.decoder.RTDETRDecoder`), the same code: the
    constructor's order, the init (class biases at the ``prior_prob`` logit, box heads' last layers
    at zero) and the query selection (the projected maps, anchors for this call's sizes, top-K over
    all cells, the denoising queries in front).  D-FINE's: the input projections only where a width
    differs, the heads' activation, the layers, the heads (``pre_bbox_head``, distribution box
    heads, LQE, the weighting function's parameters) and :meth:`refine` (so ``forward`` returns a
    :class:`DFineDecoderOutput`).
    """

    spec_type = DFineDecoderSpec
    layer_type = DFineDecoderLayer
    spec: DFineDecoderSpec

    @property
    def max_num_bins(self) -> int:
        """``N``: each edge's distribution has ``N + 1`` bins (the criterion's ``reg_max``)."""
        return self.spec.max_num_bins

    def head_activation(self) -> nn.Module:
        """The box / position heads' (DEIM: SiLU), no parameters."""
        return create_act(self.spec.mlp_activation, "mlp_activation", optional=False)

    def make_input_proj(self) -> nn.ModuleList:
        """D-FINE projects only when a width differs (X: 384 -> 256); HF's ``decoder_input_proj``."""
        if all(c == self.hidden_dim for c in self.spec.in_channels):
            return nn.ModuleList(nn.Identity() for _ in self.spec.in_channels)
        return super().make_input_proj()

    def build_heads(self, activation: Callable[[Tensor], Tensor]) -> None:
        """``query_pos_head``, layer 0's ``pre_bbox_head``, per layer a class head, a distribution box head
        (``4 * (max_num_bins + 1)`` logits) and an LQE, then the weighting function's fixed ``up`` / ``reg_scale``."""
        spec, d, n = self.spec, self.hidden_dim, self.spec.num_layers
        self.query_pos_head = self.make_query_pos_head(activation)
        self.pre_bbox_head = MLP(d, d, 4, 3, activation)
        self.class_embed = nn.ModuleList(nn.Linear(d, self.num_classes) for _ in range(n))
        self.bbox_embed = nn.ModuleList(
            MLP(d, d, 4 * (spec.max_num_bins + 1), 3, activation) for _ in range(n)
        )
        self.lqe_layers = nn.ModuleList(
            LQE(spec.max_num_bins, spec.lqe_k, spec.lqe_hidden_dim, spec.lqe_layers) for _ in range(n)
        )
        # fixed parameters of the weighting function (HF: parameters with requires_grad=False)
        self.up = nn.Parameter(torch.tensor([float(spec.up)]), requires_grad=False)
        self.reg_scale = nn.Parameter(torch.tensor([float(spec.reg_scale)]), requires_grad=False)

    def box_heads(self) -> list[nn.Module]:
        """RT-DETR's box heads and layer 0's ``pre_bbox_head``: their last layers start at zero."""
        return [self.enc_bbox_head, self.pre_bbox_head, *self.bbox_embed]

    def project(self) -> Tensor:
        """The weighting function's bin offsets ``(max_num_bins + 1,)`` (:func:`.fdr.weighting_function`)."""
        return weighting_function(self.max_num_bins, self.up, self.reg_scale)

    def refine(self, start: DecoderStart) -> DFineDecoderOutput:  # type: ignore[override]
        """The layers with distribution refinement, from the selected queries and boxes ``start``.

        Returns ``logits``, ``boxes``, ``corners``, ``refs`` stacked over the layers that report
        (every layer in training, ``eval_idx`` in eval), ``pre_logits`` / ``pre_boxes`` of layer 0
        and ``start``'s encoder proposals.
        """
        x, ref = start.queries, start.ref_logits.sigmoid()
        project = self.project()
        logits, boxes, corners_out, refs = [], [], [], []
        prev_x: Tensor | float = 0.0  # the previous layer's output, detached
        prev_corners: Tensor | float = 0.0  # the previous layer's corners, with gradient
        ref0 = pre_logits = pre_boxes = None
        for i, layer in enumerate(self.layers):
            pos = self.query_pos_head(ref).clamp(min=-10, max=10)
            x = layer(x, pos, ref, start.memory, start.spatial_shapes, start.blocked)
            if i == 0:
                pre_boxes = (self.pre_bbox_head(x) + inverse_sigmoid(ref)).sigmoid()
                pre_logits = self.class_embed[0](x)
                ref0 = pre_boxes.detach()
            corners = self.bbox_embed[i](x + prev_x) + prev_corners
            box = distance2bbox(ref0, integral(corners, project), self.reg_scale)
            if self.training or i == self.eval_idx:
                logits.append(self.lqe_layers[i](self.class_embed[i](x), corners))
                boxes.append(box)
                corners_out.append(corners)
                refs.append(ref0)
                if not self.training:
                    break  # later layers only train
            prev_corners, prev_x, ref = corners, x.detach(), box.detach()
        stack = torch.stack
        return DFineDecoderOutput(
            stack(logits),
            stack(boxes),
            stack(corners_out),
            stack(refs),
            pre_logits,
            pre_boxes,
            enc_logits=start.enc_logits,
            enc_boxes=start.enc_boxes,
        )
