"""RF-DETR's decoder: two-stage query selection per Group DETR group, a deformable decoder, the heads.

The decoder takes the projector's one map, flattened to a memory ``(B, S, D)`` (``S = h * w``),
and (LW-DETR / RF-DETR, as transformers' ``RfDetrModel`` computes it):

1. **Proposals.**  One box per memory cell, ``cx = (x + 0.5) / w``, ``cy = (y + 0.5) / h``,
   ``w = h = 0.05`` (cxcywh, not logits); a cell whose box leaves ``(0.01, 0.99)`` is invalid
   (memory and box zeroed, score ``-inf``), and so is a cell the caller's ``cell_mask`` marks as
   padding (:class:`~peg_detr.models.rfdetr.RFDETR` pads sides that are no multiple of the
   windows; transformers invalidates padded cells through its pixel mask the same way).
2. **Two-stage selection, per group.**  Group ``g`` has its own ``enc_output[g]`` (Linear +
   LayerNorm ``enc_output_norm[g]``), score head ``enc_out_class_embed[g]`` and box head
   ``enc_out_bbox_embed[g]``; its ``Q`` best cells (max class logit) give ``Q`` boxes
   ``refine(proposal, delta)`` (``cxcy + delta_xy * wh``, ``wh * exp(delta_wh)``), detached.
3. **Queries.**  The learned ``refpoint_embed`` rows are deltas on those boxes (the same
   ``refine``): the reference boxes; the learned ``query_feat`` rows are the content queries.
   The selected cells' features are NOT the queries (they only feed the encoder's auxiliary loss).
4. **Layers.**  Every layer uses the same reference boxes and the same query position
   ``ref_point_head(sine(ref))`` (LW-DETR's "lite" refinement: no box update between layers):
   self-attention (positions on queries and keys), deformable cross-attention with 4-d reference
   boxes, FFN, each post-norm; the output of layer ``l`` is ``norm(x_l)``.
5. **Heads** (shared by every layer): ``class_embed`` (sigmoid logits, no "no object") and
   ``bbox_embed`` (a delta refined onto the reference boxes as in 3).

**Group DETR.**  In training there are ``G = group_detr`` groups of ``Q`` queries (``G * Q`` rows
of ``query_feat`` / ``refpoint_embed``, step 2 once per group); self-attention stays inside a group
(the groups are folded into the batch), cross-attention and FFN are per query anyway, so the
groups are ``G`` weight-sharing decoders whose losses all train the same weights.  In eval only
group 0 runs (``Q`` queries), so inference costs one group.

Reused from the RT-DETR family: :class:`~peg_detr.models.rtdetr.decoder.RTDETRDecoderLayer` (its
self-attention, :class:`~peg_detr.models.rtdetr.decoder.MSDeformableAttention` with 4-d reference
boxes, post-norm FFN) and :class:`~peg_detr.models.detr.MLP`; the layer only adds the group fold
and separate head counts for self- and cross-attention (RF-DETR: 8 and 16).  The padding mask is
ignored (as the RT-DETR family here: batches are resized, not padded), so transformers'
``valid_ratios`` are 1 and its masks keep every cell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..detr import MLP
from ..rtdetr.decoder import MSDeformableAttention, RTDETRDecoderLayer, RTDETRDecoderSpec

__all__ = [
    "RFDETRDecoder",
    "RFDETRDecoderLayer",
    "RFDETRDecoderOutput",
    "RFDETRLayerSpec",
    "box_sine_embedding",
    "cell_proposals",
    "refine_boxes",
]


def refine_boxes(boxes: Tensor, deltas: Tensor) -> Tensor:
    """LW-DETR's box re-parameterisation: ``(cx, cy) + d_xy * (w, h)``, ``(w, h) * exp(d_wh)``; ``(..., 4)`` each."""
    return torch.cat(
        [boxes[..., :2] + deltas[..., :2] * boxes[..., 2:], boxes[..., 2:] * deltas[..., 2:].exp()], -1
    )


def box_sine_embedding(boxes: Tensor, num_feats: int, temperature: float = 10000.0) -> Tensor:
    """Sine codes of cxcywh boxes: ``(..., 4)`` -> ``(..., 4 * num_feats)`` in the order ``y, x, w, h``.

    Coordinate ``v`` gets ``num_feats`` features ``v * 2pi / T^(2 floor(i / 2) / num_feats)``,
    sine at even ``i`` and cosine at odd ``i`` (interleaved, DETR's convention, computed in float32);
    the ``y`` block comes before ``x`` as in DETR's ``[pos_y, pos_x]``.
    """
    i = torch.arange(num_feats, dtype=torch.float32, device=boxes.device)
    freq = temperature ** (2 * (i // 2) / num_feats)
    angles = boxes.float()[..., None] * (2 * math.pi) / freq  # (..., 4, F)
    codes = torch.stack([angles[..., 0::2].sin(), angles[..., 1::2].cos()], dim=-1).flatten(-2)
    cx, cy, w, h = codes.unbind(-2)
    return torch.cat([cy, cx, w, h], dim=-1).to(boxes.dtype)


def cell_proposals(
    spatial_shapes: Sequence[tuple[int, int]],
    *,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    cell_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One cxcywh box per cell of each level (``wh = 0.05 * 2**level``) and its validity.

    Returns ``proposals`` ``(1, S, 4)`` (zero where invalid) and ``valid`` ``(1, S, 1)`` bool: every
    coordinate inside ``(0.01, 0.99)`` and, when given, ``cell_mask`` ``(1, S, 1)`` bool true (a
    cell of the image, not of its padding).  Built for the sizes of this call (any input size).
    """
    levels = []
    for level, (h, w) in enumerate(spatial_shapes):
        ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) / h
        xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) / w
        cy, cx = torch.meshgrid(ys, xs, indexing="ij")
        wh = torch.full_like(cx, 0.05 * 2.0**level)
        levels.append(torch.stack([cx, cy, wh, wh], dim=-1).reshape(-1, 4))
    proposals = torch.cat(levels).unsqueeze(0)
    valid = ((proposals > 0.01) & (proposals < 0.99)).all(-1, keepdim=True)
    if cell_mask is not None:
        valid = valid & cell_mask
    return proposals * valid, valid


@dataclass(frozen=True)
class RFDETRLayerSpec:
    """The decoder layers' settings (transformers' ``decoder_*`` fields), one value for every layer.

    Attributes:
        self_heads, cross_heads: self- and deformable cross-attention heads (RF-DETR: 8, 16).
        dim_feedforward, dropout, activation: the FFN (and the dropout after each sub-layer).
        attention_dropout: on the self-attention probabilities (transformers: 0).
        num_points, num_levels: deformable sampling points per head and level; memory levels (1: P4).
        layer_norm_eps: the post-norms'.
    """

    self_heads: int = 8
    cross_heads: int = 16
    dim_feedforward: int = 2048
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation: str = "relu"
    num_points: int = 4
    num_levels: int = 1
    layer_norm_eps: float = 1e-5

    def rtdetr_layer(self, d_model: int) -> RTDETRDecoderSpec:
        """The settings of RT-DETR's layer these are (its heads: the self-attention's), at width ``d_model``.

        RT-DETR's layer reads its memory's levels from ``in_channels``: here ``num_levels`` maps of the
        projector's width ``d_model``.
        """
        return RTDETRDecoderSpec(
            in_channels=(d_model,) * self.num_levels,
            hidden_dim=d_model,
            num_heads=self.self_heads,
            dim_feedforward=self.dim_feedforward,
            dropout=self.dropout,
            activation=self.activation,
            num_points=self.num_points,
            layer_norm_eps=self.layer_norm_eps,
        )


class RFDETRDecoderLayer(RTDETRDecoderLayer):
    """RT-DETR's post-norm layer with Group DETR self-attention and its own cross-attention head count.

    ``forward(x, pos, ref, memory, shapes)`` is the family's; ``x``, ``pos`` ``(B, G*Q, D)``: in
    training (``G = group_detr`` groups of queries) the self-attention runs on ``(B*G, Q, D)`` (each
    group attends to itself only), in eval on the one group there is.
    """

    def __init__(self, d_model: int = 256, spec: RFDETRLayerSpec | None = None, group_detr: int = 1) -> None:
        spec = spec or RFDETRLayerSpec()
        super().__init__(spec.rtdetr_layer(d_model))
        self.group_detr = group_detr
        self.self_attn.dropout = spec.attention_dropout  # the attention probabilities' (transformers: 0)
        if spec.cross_heads != spec.self_heads:
            self.encoder_attn = MSDeformableAttention(
                d_model, spec.cross_heads, spec.num_levels, spec.num_points
            )

    def self_attention(self, x: Tensor, pos: Tensor, blocked: Tensor | None = None) -> Tensor:
        """Within each Group DETR group: ``(B, G*Q, D) -> (B*G, Q, D)`` in training (the decoder's groups)."""
        groups = self.group_detr if self.training else 1
        if groups == 1:
            return self.self_attn(x, pos, blocked)
        b, n, d = x.shape
        grouped = self.self_attn(
            x.reshape(b * groups, n // groups, d), pos.reshape(b * groups, n // groups, d)
        )
        return grouped.reshape(b, n, d)


@dataclass
class RFDETRDecoderOutput:
    """What :class:`RFDETRDecoder` returns (``N = G * Q`` in training, ``Q`` in eval).

    Attributes:
        logits: ``(L', B, N, C)`` class logits of every layer in training, the last one in eval.
        boxes: ``(L', B, N, 4)`` cxcywh in [0, 1], same layers.
        enc_logits: ``(B, N, C)`` the selected cells' scores (each group's own head).
        enc_boxes: ``(B, N, 4)`` their refined proposal boxes (with gradient).
        groups: ``G`` of this call (1 in eval).
    """

    logits: Tensor
    boxes: Tensor
    enc_logits: Tensor
    enc_boxes: Tensor
    groups: int


class RFDETRDecoder(nn.Module):
    """Query selection, decoder layers and heads (module docstring).

    Args:
        d_model: width ``D`` (the projector's output).
        num_classes: sigmoid classes ``C``.
        num_queries: ``Q`` per group (at most the cells of the smallest input).
        group_detr: ``G``, groups in training.
        num_layers: decoder layers.
        layer: the layers' settings (:class:`RFDETRLayerSpec`; default RF-DETR's).
    """

    def __init__(
        self,
        d_model: int = 256,
        num_classes: int = 80,
        *,
        num_queries: int = 300,
        group_detr: int = 13,
        num_layers: int = 3,
        layer: RFDETRLayerSpec | None = None,
    ) -> None:
        super().__init__()
        if group_detr < 1:
            raise ValueError(f"group_detr must be >= 1; got {group_detr}")
        d = d_model
        self.d_model, self.num_classes, self.num_queries, self.group_detr = (
            d,
            num_classes,
            num_queries,
            group_detr,
        )
        self.layers = nn.ModuleList(RFDETRDecoderLayer(d, layer, group_detr) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d)
        self.ref_point_head = MLP(2 * d, d, d, 2)
        self.query_feat = nn.Embedding(group_detr * num_queries, d)
        self.refpoint_embed = nn.Embedding(group_detr * num_queries, 4)
        self.enc_output = nn.ModuleList(nn.Linear(d, d) for _ in range(group_detr))
        self.enc_output_norm = nn.ModuleList(nn.LayerNorm(d) for _ in range(group_detr))
        self.enc_out_class_embed = nn.ModuleList(nn.Linear(d, num_classes) for _ in range(group_detr))
        self.enc_out_bbox_embed = nn.ModuleList(MLP(d, d, 4, 3) for _ in range(group_detr))
        self.class_embed = nn.Linear(d, num_classes)
        self.bbox_embed = MLP(d, d, 4, 3)
        self.reset_parameters()

    def reset_parameters(self, prior_prob: float = 0.01) -> None:
        """LW-DETR's init: class biases at the ``prior_prob`` logit, box heads' last layer and reference deltas zero."""
        bias = -math.log((1 - prior_prob) / prior_prob)
        for head in (self.class_embed, *self.enc_out_class_embed):
            nn.init.constant_(head.bias, bias)
        for mlp in (self.bbox_embed, *self.enc_out_bbox_embed):
            nn.init.zeros_(mlp.layers[-1].weight)
            nn.init.zeros_(mlp.layers[-1].bias)
        nn.init.zeros_(self.refpoint_embed.weight)

    def cell_scores(
        self,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        group: int = 0,
        cell_mask: Tensor | None = None,
    ) -> Tensor:
        """The score ``(B, S)`` of every memory cell in group ``group``'s query selection (max over classes,
        ``-inf`` for invalid cells, ``cell_mask`` as in :meth:`forward`): what the top-``Q`` reads."""
        _, valid = cell_proposals(
            spatial_shapes, device=memory.device, dtype=memory.dtype, cell_mask=cell_mask
        )
        cells = self.enc_output_norm[group](self.enc_output[group](memory * valid.to(memory.dtype)))
        return self.enc_out_class_embed[group](cells).masked_fill(~valid, float("-inf")).max(-1).values

    def select(
        self,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        groups: int,
        cell_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Two-stage selection for ``groups`` groups: ``(boxes (B, G*Q, 4) detached, enc_logits, enc_boxes)``."""
        proposals, valid = cell_proposals(
            spatial_shapes, device=memory.device, dtype=memory.dtype, cell_mask=cell_mask
        )
        memory = memory * valid.to(memory.dtype)
        proposals = proposals.expand(memory.shape[0], -1, -1)  # (B, S, 4)
        q = self.num_queries
        boxes, enc_logits, enc_boxes = [], [], []
        for g in range(groups):
            cells = self.enc_output_norm[g](self.enc_output[g](memory))  # (B, S, D)
            scores = self.enc_out_class_embed[g](cells).masked_fill(~valid, float("-inf"))
            # With untrained heads, near-equal scores make the order float-rounding dependent;
            # trained models (and random weights that are not all-equal) separate them.
            index = scores.max(-1).values.topk(q, dim=1).indices  # (B, Q)

            def take(t: Tensor, index: Tensor = index) -> Tensor:
                return t.gather(1, index.unsqueeze(-1).expand(-1, -1, t.shape[-1]))

            # the heads on the Q chosen cells only (per-cell heads: the same values as on all S
            # cells, then gathered, at Q / S of the cost, forward and backward: 13 groups in training)
            chosen_cells = take(cells)
            chosen = refine_boxes(take(proposals), self.enc_out_bbox_embed[g](chosen_cells))
            boxes.append(chosen.detach())
            enc_boxes.append(chosen)
            # the head on the chosen cells (not the gathered masked scores): finite even for a
            # chosen invalid cell, as transformers computes it
            enc_logits.append(self.enc_out_class_embed[g](chosen_cells))
        return torch.cat(boxes, 1), torch.cat(enc_logits, 1), torch.cat(enc_boxes, 1)

    def forward(
        self, memory: Tensor, spatial_shapes: Sequence[tuple[int, int]], cell_mask: Tensor | None = None
    ) -> RFDETRDecoderOutput:
        """``memory`` ``(B, S, D)`` (the projector's map flattened row-major), ``spatial_shapes`` ``[(h, w)]``.

        ``cell_mask`` ``(1, S, 1)`` bool (None: every cell): the cells of the image; the others (its
        padding) are never chosen as proposals while ``Q`` image cells are valid.
        """
        groups = self.group_detr if self.training else 1
        n = groups * self.num_queries
        b = memory.shape[0]
        selected, enc_logits, enc_boxes = self.select(memory, spatial_shapes, groups, cell_mask)
        ref = refine_boxes(selected, self.refpoint_embed.weight[:n].unsqueeze(0))  # (B, N, 4)
        x = self.query_feat.weight[:n].unsqueeze(0).expand(b, -1, -1)
        pos = self.ref_point_head(box_sine_embedding(ref, self.d_model // 2))
        logits, boxes = [], []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, pos, ref, memory, spatial_shapes)  # the layers fold the same groups (training)
            if self.training or i == last:  # eval: only the last layer's heads are read
                hs = self.norm(x)
                logits.append(self.class_embed(hs))
                boxes.append(refine_boxes(ref, self.bbox_embed(hs)))
        return RFDETRDecoderOutput(torch.stack(logits), torch.stack(boxes), enc_logits, enc_boxes, groups)
