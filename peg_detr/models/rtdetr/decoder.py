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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import LAYER_ACTIVATIONS, MLP, create_act

if TYPE_CHECKING:
    from .denoising import DenoisingGroup

__all__ = [
    "DecoderLayerBase",
    "DecoderOutput",
    "MSDeformableAttention",
    "RTDETRDecoder",
    "RTDETRDecoderLayer",
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


class MSDeformableAttention(nn.Module):
    """Multi-scale deformable attention (Deformable DETR) with 4-d reference boxes, as in RT-DETR.

    Each query predicts ``P`` offsets per head and level, scaled by its reference box
    (``offset / P * wh * 0.5``), and softmax weights over the ``L * P`` samples.
    """

    def __init__(
        self, d_model: int = 256, num_heads: int = 8, num_levels: int = 3, num_points: int = 4
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads, self.num_levels, self.num_points = num_heads, num_levels, num_points
        self.sampling_offsets = nn.Linear(d_model, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(d_model, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's init: zero offsets weights, biases pointing along ``M`` directions, ``i + 1`` apart."""
        nn.init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([theta.cos(), theta.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True).values
        grid = grid.view(self.num_heads, 1, 1, 2).repeat(1, self.num_levels, self.num_points, 1)
        grid = grid * torch.arange(1, self.num_points + 1, dtype=torch.float32).view(1, 1, -1, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for lin in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(
        self,
        query: Tensor,
        reference_boxes: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
    ) -> Tensor:
        """``query`` ``(B, Q, D)``, ``reference_boxes`` ``(B, Q, 4)`` cxcywh in [0, 1], ``memory`` ``(B, S, D)`` -> ``(B, Q, D)``."""
        b, q, _ = query.shape
        m, n_l, n_p = self.num_heads, self.num_levels, self.num_points
        value = self.value_proj(memory).unflatten(-1, (m, -1))
        offsets = self.sampling_offsets(query).view(b, q, m, n_l, n_p, 2)
        weights = self.attention_weights(query).view(b, q, m, n_l * n_p).softmax(-1).view(b, q, m, n_l, n_p)
        ref = reference_boxes[:, :, None, None, None, :]  # the same box on every head, level and point
        locations = ref[..., :2] + offsets * (ref[..., 2:] * (0.5 / n_p))
        return self.output_proj(multi_scale_deformable_attention(value, spatial_shapes, locations, weights))


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


class DecoderLayerBase(nn.Module):
    """The RT-DETR family's decoder layer step (RT-DETR, D-FINE, DEIMv2): one forward, hooks for what differs.

    ``forward(x, pos, reference_boxes, memory, spatial_shapes, blocked) -> x``, all ``(B, N, D)``
    but ``reference_boxes`` ``(B, N, 4)``, ``memory`` ``(B, S, D)`` and ``blocked`` ``(N, N)``
    (True where a query may NOT attend)::

        x = self_attn_layer_norm(x + dropout(self_attn(x, pos, blocked)))
        x = merge_cross(x, dropout(encoder_attn(x + pos, reference_boxes, memory, spatial_shapes)))
        x = final_layer_norm(x + dropout(ffn(x)))      (clamped to +-ffn_clamp first when set)

    A layer builds those modules (:meth:`build_self_attention`, :meth:`build_ffn`) and overrides
    :meth:`merge_cross` (default: ``encoder_attn_layer_norm(x + a)``, RT-DETR's) and :meth:`ffn`
    (default: ``fc2(dropout(activation(fc1(x))))``) where it differs.
    """

    #: D-FINE keeps the FFN's residual inside float16's range; None: no clamp
    ffn_clamp: float | None = None

    def build_self_attention(self, d_model: int, num_heads: int, dropout: float, norm: nn.Module) -> None:
        """``self_attn`` (:class:`QueryAttention`) and its post-norm ``self_attn_layer_norm``."""
        self.self_attn = QueryAttention(d_model, num_heads, dropout)
        self.self_attn_layer_norm = norm

    def build_ffn(
        self, d_model: int, dim_feedforward: int, activation: nn.Module, layer_norm_eps: float
    ) -> None:
        """``fc1``, ``fc2``, ``activation`` and ``final_layer_norm`` (transformers' names)."""
        self.fc1 = nn.Linear(d_model, dim_feedforward)
        self.fc2 = nn.Linear(dim_feedforward, d_model)
        self.activation = activation
        self.final_layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)

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
        x = self.self_attn_layer_norm(x + self.dropout(self.self_attn(x, pos, blocked)))
        x = self.merge_cross(
            x, self.dropout(self.encoder_attn(x + pos, reference_boxes, memory, spatial_shapes))
        )
        out = x + self.dropout(self.ffn(x))
        if self.ffn_clamp is not None:
            out = out.clamp(min=-self.ffn_clamp, max=self.ffn_clamp)
        return self.final_layer_norm(out)


class RTDETRDecoderLayer(DecoderLayerBase):
    """Post-norm decoder layer: self-attention, deformable cross-attention, FFN, each ``x = norm(x + f(x))``."""

    def __init__(
        self,
        d_model: int = 256,
        num_heads: int = 8,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        activation: str = "relu",
        num_levels: int = 3,
        num_points: int = 4,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        activation_module = create_act(activation, optional=False)  # a wrong name fails before any weight
        self.build_self_attention(d_model, num_heads, dropout, nn.LayerNorm(d_model, eps=layer_norm_eps))
        self.encoder_attn = MSDeformableAttention(d_model, num_heads, num_levels, num_points)
        self.encoder_attn_layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.build_ffn(d_model, dim_feedforward, activation_module, layer_norm_eps)
        self.dropout = nn.Dropout(dropout)


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


class RTDETRDecoder(nn.Module):
    """IoU-aware query selection over all levels and the refining decoder.

    Args:
        in_channels: channels of the encoder's maps (one input projection each; HF ``decoder_in_channels``).
        hidden_dim: the decoder's width ``D`` (HF ``d_model``).
        num_classes: sigmoid classes ``C`` (no "no object").
        num_queries: ``Q``, cells kept by the query selection (at most ``S`` of the smallest input).
        num_layers, num_heads, dim_feedforward, dropout, activation: the layers'.
        num_points: deformable samples per head and level.
        eval_idx: the layer whose output is the prediction in eval (RT-DETR's; -1 = the last);
            layers after it are skipped in eval, all run in training.
        learn_initial_query: initial queries from a learned table (HF ``weight_embedding``) instead
            of the selected cells' features.
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
        num_points: int = 4,
        eval_idx: int = -1,
        learn_initial_query: bool = False,
        layer_norm_eps: float = 1e-5,
        batch_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if not -num_layers <= eval_idx < num_layers:
            raise ValueError(f"eval_idx {eval_idx} is not a layer index of {num_layers} layers")
        d = hidden_dim
        self.hidden_dim, self.num_classes, self.num_queries = d, num_classes, num_queries
        # the constructor's settings, for writing the model back as an HF config (export-hf)
        self.hparams = {
            "in_channels": list(in_channels), "hidden_dim": d, "num_layers": num_layers, "num_heads": num_heads,
            "dim_feedforward": dim_feedforward, "dropout": dropout, "activation": activation,
            "num_points": num_points, "eval_idx": eval_idx, "learn_initial_query": learn_initial_query,
            "layer_norm_eps": layer_norm_eps, "batch_norm_eps": batch_norm_eps,
        }  # fmt: skip
        self.num_levels = len(in_channels)
        self.eval_idx = eval_idx % num_layers
        self.input_proj = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, d, 1, bias=False), nn.BatchNorm2d(d, eps=batch_norm_eps))
            for c in in_channels
        )
        self.enc_output = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d, eps=layer_norm_eps))
        self.enc_score_head = nn.Linear(d, num_classes)
        self.enc_bbox_head = MLP(d, d, 4, 3)
        self.weight_embedding = nn.Embedding(num_queries, d) if learn_initial_query else None
        self.layers = nn.ModuleList(
            RTDETRDecoderLayer(
                d,
                num_heads,
                dim_feedforward,
                dropout,
                activation,
                self.num_levels,
                num_points,
                layer_norm_eps,
            )
            for _ in range(num_layers)
        )
        self.query_pos_head = MLP(4, 2 * d, d, 2)
        self.class_embed = nn.ModuleList(nn.Linear(d, num_classes) for _ in range(num_layers))
        self.bbox_embed = nn.ModuleList(MLP(d, d, 4, 3) for _ in range(num_layers))
        self.reset_parameters()

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
        memory, shapes, queries, ref_logits, enc, blocked = self.prepare(feats, denoising)
        logits, boxes = self.refine(queries, ref_logits.sigmoid(), memory, shapes, blocked)
        return DecoderOutput(logits, boxes, *enc)

    def prepare(
        self, feats: Sequence[Tensor], denoising: DenoisingGroup | None = None
    ) -> tuple[Tensor, list[tuple[int, int]], Tensor, Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """What the layers start from: ``(memory (B, S, D), shapes, queries (B, N, D), reference box logits
        (B, N, 4), (enc_logits, enc_boxes), blocked (N, N) | None)``, the denoising queries first."""
        memory, shapes = self.flatten_features(feats)
        queries, ref_logits, enc_logits, enc_boxes = self.select_queries(memory, shapes)
        blocked = None
        if denoising is not None:
            queries = torch.cat([denoising.queries.to(queries.dtype), queries], dim=1)
            ref_logits = torch.cat([denoising.ref_boxes_unact.to(ref_logits.dtype), ref_logits], dim=1)
            blocked = denoising.attn_mask
        return memory, shapes, queries, ref_logits, (enc_logits, enc_boxes), blocked

    def refine(
        self,
        x: Tensor,
        ref: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        blocked: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The decoder layers with iterative box refinement; ``x`` ``(B, N, D)``, ``ref`` ``(B, N, 4)`` detached.

        Each layer samples around, and its position head embeds, the previous boxes DETACHED; its
        box head predicts a logit-space offset to them.  In training the output box of layer
        ``i > 0`` adds the offset to the previous layer's boxes WITH their gradient (RT-DETR's
        ``dec_out_bboxes``), so each box loss also trains the previous box head; the values are the
        same.  Returns ``(logits (L', B, N, C), boxes (L', B, N, 4))``.
        """
        logits, boxes = [], []
        prev = ref  # the previous layer's boxes, with gradient (training only)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.query_pos_head(ref), ref, memory, spatial_shapes, blocked)
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
        return torch.stack(logits), torch.stack(boxes)
