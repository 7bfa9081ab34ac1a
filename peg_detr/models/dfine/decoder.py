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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import MLP, create_act
from ..rtdetr.decoder import DecoderLayerBase, RTDETRDecoder, inverse_sigmoid
from .fdr import distance2bbox, integral, weighting_function

if TYPE_CHECKING:
    from ..rtdetr.denoising import DenoisingGroup

__all__ = [
    "LQE",
    "DFineDecoder",
    "DFineDecoderLayer",
    "DFineDecoderOutput",
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


class MSDeformableAttentionV2(nn.Module):
    """D-FINE's deformable cross-attention: per-level point counts, the memory sampled as is (no projections).

    Each query predicts, per head, ``sum(num_points)`` offsets and softmax weights; point ``p`` of
    level ``l`` samples at ``ref_xy + offset_p / P_l * ref_wh * offset_scale``.  ``num_points_scale``
    (``1 / P_l`` per point) is a buffer, as in transformers' state dict.
    """

    def __init__(
        self,
        d_model: int = 256,
        num_heads: int = 8,
        num_points: Sequence[int] = (4, 4, 4),
        offset_scale: float = 0.5,
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads, self.num_points, self.offset_scale = (
            num_heads,
            [int(p) for p in num_points],
            offset_scale,
        )
        total = sum(self.num_points)
        self.sampling_offsets = nn.Linear(d_model, num_heads * total * 2)
        self.attention_weights = nn.Linear(d_model, num_heads * total)
        scale = [1.0 / p for p in self.num_points for _ in range(p)]
        self.register_buffer("num_points_scale", torch.tensor(scale, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's init: zero offset weights, biases pointing along ``M`` directions, ``p + 1`` apart per level."""
        nn.init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([theta.cos(), theta.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True).values
        steps = torch.cat([torch.arange(1, p + 1, dtype=torch.float32) for p in self.num_points])
        grid = grid[:, None, :] * steps[None, :, None]  # (M, P, 2)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)

    def forward(
        self,
        query: Tensor,
        reference_boxes: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
    ) -> Tensor:
        """``query`` ``(B, Q, D)``, ``reference_boxes`` ``(B, Q, 4)`` cxcywh, ``memory`` ``(B, S, D)`` -> ``(B, Q, D)``."""
        b, q, _ = query.shape
        m, total = self.num_heads, self.num_points_scale.shape[0]
        value = memory.unflatten(-1, (m, -1))
        offsets = self.sampling_offsets(query).view(b, q, m, total, 2)
        weights = self.attention_weights(query).view(b, q, m, total).softmax(-1)
        ref = reference_boxes[:, :, None, None, :]  # the same box on every head and point
        scale = self.num_points_scale.to(query.dtype).unsqueeze(-1)  # (P, 1)
        locations = ref[..., :2] + offsets * scale * ref[..., 2:] * self.offset_scale
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


class DFineDecoderLayer(DecoderLayerBase):
    """Self-attention (post-norm), gated deformable cross-attention, FFN (post-norm, clamped to float16's range)."""

    ffn_clamp = 65504.0

    def __init__(
        self,
        d_model: int = 256,
        num_heads: int = 8,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        activation: str = "relu",
        num_points: Sequence[int] = (4, 4, 4),
        offset_scale: float = 0.5,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        activation_module = create_act(activation, optional=False)  # a wrong name fails before any weight
        self.build_self_attention(d_model, num_heads, dropout, nn.LayerNorm(d_model, eps=layer_norm_eps))
        self.encoder_attn = MSDeformableAttentionV2(d_model, num_heads, num_points, offset_scale)
        self.build_ffn(d_model, dim_feedforward, activation_module, layer_norm_eps)
        self.gateway = Gate(d_model)
        self.dropout = nn.Dropout(dropout)

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


class DFineDecoder(nn.Module):
    """Query selection and the D-FINE decoder (module docstring).

    Args:
        in_channels: channels of the encoder's maps; each gets a 1×1 conv + BN to ``hidden_dim``
            unless every map already has ``hidden_dim`` channels (then none, as in D-FINE S-L).
        hidden_dim: the decoder's width ``D`` (HF ``d_model``).
        num_classes, num_queries: sigmoid classes and selected queries.
        num_layers, num_heads, dim_feedforward, dropout, activation: the layers'.
        mlp_activation: the box / position heads' activation (D-FINE ReLU, DEIM SiLU).
        num_points: deformable samples per head for each level (an int: the same for all levels).
        offset_scale: scale of the sampling offsets (D-FINE 0.5).
        eval_idx: the layer whose output is the prediction in eval (-1 = the last); the layers
            after it run in training only.
        max_num_bins: ``N``; each edge is a distribution over ``N + 1`` bins.
        reg_scale, up: the weighting function's fixed parameters (buffers-like, not trained).
        lqe_k, lqe_hidden_dim, lqe_layers: LQE's top-k and MLP.
        learn_initial_query: initial queries from a learned table instead of the selected cells.
        layer_norm_eps, batch_norm_eps: as in the HF config.
    """

    def __init__(
        self,
        in_channels: Sequence[int] = (256, 256, 256),
        hidden_dim: int = 256,
        num_classes: int = 80,
        *,
        num_queries: int = 300,
        num_layers: int = 6,
        num_heads: int = 8,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        activation: str = "relu",
        mlp_activation: str = "relu",
        num_points: int | Sequence[int] = (3, 6, 3),
        offset_scale: float = 0.5,
        eval_idx: int = -1,
        max_num_bins: int = 32,
        reg_scale: float = 4.0,
        up: float = 0.5,
        lqe_k: int = 4,
        lqe_hidden_dim: int = 64,
        lqe_layers: int = 2,
        learn_initial_query: bool = False,
        layer_norm_eps: float = 1e-5,
        batch_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if not -num_layers <= eval_idx < num_layers:
            raise ValueError(f"eval_idx {eval_idx} is not a layer index of {num_layers} layers")
        levels = len(in_channels)
        points = [int(num_points)] * levels if isinstance(num_points, int) else [int(p) for p in num_points]
        if len(points) != levels or min(points) < 1:
            raise ValueError(f"num_points must be >= 1 for each of the {levels} levels; got {num_points}")
        if max_num_bins < 4 or max_num_bins % 2:
            raise ValueError(f"max_num_bins must be an even number >= 4; got {max_num_bins}")
        d = hidden_dim
        self.hidden_dim, self.num_classes, self.num_queries = d, num_classes, num_queries
        self.num_levels, self.max_num_bins = levels, max_num_bins
        self.eval_idx = eval_idx % num_layers
        self.hparams = {
            "in_channels": list(in_channels), "hidden_dim": d, "num_layers": num_layers, "num_heads": num_heads,
            "dim_feedforward": dim_feedforward, "dropout": dropout, "activation": activation,
            "mlp_activation": mlp_activation, "num_points": points,
            "offset_scale": offset_scale, "eval_idx": eval_idx, "max_num_bins": max_num_bins,
            "reg_scale": reg_scale, "up": up, "lqe_k": lqe_k, "lqe_hidden_dim": lqe_hidden_dim,
            "lqe_layers": lqe_layers, "learn_initial_query": learn_initial_query,
            "layer_norm_eps": layer_norm_eps, "batch_norm_eps": batch_norm_eps,
        }  # fmt: skip
        # D-FINE projects only when a width differs (X: 384 -> 256); HF's decoder_input_proj
        same = all(c == d for c in in_channels)
        self.input_proj = nn.ModuleList(
            nn.Identity()
            if same
            else nn.Sequential(nn.Conv2d(c, d, 1, bias=False), nn.BatchNorm2d(d, eps=batch_norm_eps))
            for c in in_channels
        )
        # query selection: RT-DETR's heads (same names, same math)
        self.enc_output = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d, eps=layer_norm_eps))
        self.enc_score_head = nn.Linear(d, num_classes)
        # the box / position heads' (DEIM: SiLU), no parameters
        act = create_act(mlp_activation, "mlp_activation", optional=False)
        self.enc_bbox_head = MLP(d, d, 4, 3, act)
        self.weight_embedding = nn.Embedding(num_queries, d) if learn_initial_query else None
        layer = dict(d_model=d, num_heads=num_heads, dim_feedforward=dim_feedforward, dropout=dropout,
                     activation=activation, num_points=points, offset_scale=offset_scale,
                     layer_norm_eps=layer_norm_eps)  # fmt: skip
        self.layers = nn.ModuleList(self.make_layer(**layer) for _ in range(num_layers))
        self.query_pos_head = self.make_query_pos_head(d, act)
        self.pre_bbox_head = MLP(d, d, 4, 3, act)
        self.class_embed = nn.ModuleList(nn.Linear(d, num_classes) for _ in range(num_layers))
        self.bbox_embed = nn.ModuleList(MLP(d, d, 4 * (max_num_bins + 1), 3, act) for _ in range(num_layers))
        self.lqe_layers = nn.ModuleList(
            LQE(max_num_bins, lqe_k, lqe_hidden_dim, lqe_layers) for _ in range(num_layers)
        )
        # fixed parameters of the weighting function (HF: parameters with requires_grad=False)
        self.up = nn.Parameter(torch.tensor([float(up)]), requires_grad=False)
        self.reg_scale = nn.Parameter(torch.tensor([float(reg_scale)]), requires_grad=False)
        self.reset_parameters()

    def make_layer(self, **layer: Any) -> nn.Module:
        """One decoder layer (called by the constructor) from :class:`DFineDecoderLayer`'s keywords
        (``d_model``, ``num_heads``, ``dim_feedforward``, ``dropout``, ``activation``, ``num_points``,
        ``offset_scale``, ``layer_norm_eps``): D-FINE's; a variant's decoder overrides it."""
        return DFineDecoderLayer(**layer)

    def make_query_pos_head(self, d_model: int, activation: nn.Module) -> nn.Module:
        """The reference boxes' position head ``(..., 4) -> (..., D)`` (called by the constructor)."""
        return MLP(4, 2 * d_model, d_model, 2, activation)

    def box_heads(self) -> list[nn.Module]:
        """RT-DETR's box heads and layer 0's ``pre_bbox_head``: their last layers start at zero."""
        return [self.enc_bbox_head, self.pre_bbox_head, *self.bbox_embed]

    # RT-DETR's init (class biases at the prior_prob logit, box heads' last layers at zero), the same code
    reset_parameters = RTDETRDecoder.reset_parameters

    # RT-DETR's query selection, the same code: the projected maps, anchors for this call's sizes,
    # top-K over all cells, the denoising queries in front
    flatten_features = RTDETRDecoder.flatten_features
    score_cells = RTDETRDecoder.score_cells
    select_queries = RTDETRDecoder.select_queries
    prepare = RTDETRDecoder.prepare

    def project(self) -> Tensor:
        """The weighting function's bin offsets ``(max_num_bins + 1,)`` (:func:`.fdr.weighting_function`)."""
        return weighting_function(self.max_num_bins, self.up, self.reg_scale)

    def forward(self, feats: Sequence[Tensor], denoising: DenoisingGroup | None = None) -> DFineDecoderOutput:
        """``feats``: the encoder's maps ``(B, C_l, H_l, W_l)``; ``denoising``: queries prepended in training."""
        memory, shapes, queries, ref_logits, (enc_logits, enc_boxes), blocked = self.prepare(feats, denoising)
        out = self.refine(queries, ref_logits.sigmoid(), memory, shapes, blocked)
        return DFineDecoderOutput(*out, enc_logits=enc_logits, enc_boxes=enc_boxes)

    def refine(
        self,
        x: Tensor,
        ref: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        blocked: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The layers with distribution refinement; ``x`` ``(B, N, D)`` queries, ``ref`` ``(B, N, 4)`` detached boxes.

        Returns ``(logits, boxes, corners, refs)`` stacked over the layers that report (every
        layer in training, ``eval_idx`` in eval) and ``(pre_logits, pre_boxes)`` of layer 0.
        """
        project = self.project()
        logits, boxes, corners_out, refs = [], [], [], []
        prev_x: Tensor | float = 0.0  # the previous layer's output, detached
        prev_corners: Tensor | float = 0.0  # the previous layer's corners, with gradient
        ref0 = pre_logits = pre_boxes = None
        for i, layer in enumerate(self.layers):
            pos = self.query_pos_head(ref).clamp(min=-10, max=10)
            x = layer(x, pos, ref, memory, spatial_shapes, blocked)
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
        return stack(logits), stack(boxes), stack(corners_out), stack(refs), pre_logits, pre_boxes
