"""DEIMv2's decoder: D-FINE's decoder (:class:`peg_detr.models.dfine.decoder.DFineDecoder`) with DEIMv2's layers.

What is D-FINE's, reused as is: query selection, the FDR loop, the LQE heads, the deformable
cross-attention, the self-attention and the gate's arithmetic.  What is DEIMv2's: the layer's norms,
FFN and gate norm, the query position head and the optional shared box head (below).

Query selection (RT-DETR / D-FINE): every cell of the flattened encoder maps ``(B, S, D)`` gets an
anchor built for this call's sizes (:func:`peg_detr.models.rtdetr.decoder.generate_anchors`, never
cached), ``enc_output`` + ``enc_score_head`` / ``enc_bbox_head`` score it, and the ``Q`` best cells
give the initial queries (detached features) and reference boxes.

Each decoder layer (transformers' ``Deimv2DecoderLayer``; D-FINE's differences in brackets)::

    x = rmsnorm(x + self_attn(x, pos))                          [LayerNorm]
    a = deformable_attn(x + pos, boxes, memory)                 (D-FINE's: no value / output
                                                                 projections, per-level points)
    x = gate(x, a) = rmsnorm(g1 * x + g2 * a), g = sigmoid(W [x, a])      [LayerNorm in the gate]
        or, without the gateway (atto / femto / pico): rmsnorm(x + a)
    x = rmsnorm(x + swiglu(x))                                   [ReLU MLP, LayerNorm, clamp]

The query position head is a 3-layer MLP ``4 -> D -> D -> D`` (D-FINE: ``4 -> 2D -> D``).
After layer 0 the pre-box head gives the initial boxes; each layer ``i`` predicts per-edge
distributions ``bbox_embed[i](x + x_prev.detach()) + corners_prev`` over ``max_num_bins + 1`` bins,
their expectation under the weighting function (:mod:`peg_detr.models.dfine.fdr`) moves the
initial boxes' edges, and the class logits get the localisation-quality term of ``lqe_layers[i]``.
With ``share_bbox_head`` every layer uses one box head (one module in every ``bbox_embed`` slot).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..detr import MLP
from ..dfine.decoder import DFineDecoder, Gate, MSDeformableAttentionV2
from ..rtdetr.decoder import ACTIVATIONS, DecoderLayerBase

__all__ = ["DEIMv2Decoder", "DEIMv2DecoderLayer", "RMSGate", "SwiGLUFFN"]


class SwiGLUFFN(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with ``dim_feedforward // 2`` hidden units; ``(..., D) -> (..., D)``."""

    def __init__(self, dim: int, dim_feedforward: int) -> None:
        super().__init__()
        hidden = dim_feedforward // 2
        self.gate_proj = nn.Linear(dim, hidden)
        self.up_proj = nn.Linear(dim, hidden)
        self.down_proj = nn.Linear(hidden, dim)
        for lin in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RMSGate(Gate):
    """D-FINE's gateway (:class:`peg_detr.models.dfine.decoder.Gate`) with DEIMv2's RMSNorm: ``norm(g1 * residual + g2 * x)``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim)
        self.norm = nn.RMSNorm(dim, eps=eps)


class DEIMv2DecoderLayer(DecoderLayerBase):
    """One DEIMv2 decoder layer (module docstring); ``forward(x, pos, boxes, memory, shapes, blocked) -> x``.

    The forward is the family's (:class:`~peg_detr.models.rtdetr.decoder.DecoderLayerBase`); the
    self-attention and the deformable cross-attention are D-FINE's modules
    (:class:`~peg_detr.models.rtdetr.decoder.QueryAttention`,
    :class:`~peg_detr.models.dfine.decoder.MSDeformableAttentionV2`); the norms, the gate and the
    FFN are DEIMv2's.  Keys: ``self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm``,
    ``encoder_attn.*``, ``gateway.{gate,norm}`` or ``encoder_attn_layer_norm``,
    ``mlp.{gate,up,down}_proj``, ``final_layer_norm``.
    """

    def __init__(
        self,
        dim: int = 256,
        num_heads: int = 8,
        dim_feedforward: int = 1024,
        *,
        num_points: Sequence[int] = (4, 4, 4),
        offset_scale: float = 0.5,
        dropout: float = 0.0,
        use_gateway: bool = True,
        rms_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.build_self_attention(dim, num_heads, dropout, nn.RMSNorm(dim, eps=rms_eps))
        self.encoder_attn = MSDeformableAttentionV2(dim, num_heads, num_points, offset_scale)
        self.gateway = RMSGate(dim, rms_eps) if use_gateway else None
        self.encoder_attn_layer_norm = None if use_gateway else nn.RMSNorm(dim, eps=rms_eps)
        self.mlp = SwiGLUFFN(dim, dim_feedforward)
        self.final_layer_norm = nn.RMSNorm(dim, eps=rms_eps)
        self.dropout = nn.Dropout(dropout)

    def merge_cross(self, x: Tensor, cross: Tensor) -> Tensor:
        """The gate, or without it an RMSNorm residual (atto / femto / pico)."""
        return self.gateway(x, cross) if self.gateway is not None else self.encoder_attn_layer_norm(x + cross)

    def ffn(self, x: Tensor) -> Tensor:
        """SwiGLU (``mlp``) instead of D-FINE's ReLU MLP."""
        return self.mlp(x)


class DEIMv2Decoder(DFineDecoder):
    """D-FINE's query selection and FDR decoder (:class:`~peg_detr.models.dfine.decoder.DFineDecoder`) with DEIMv2's layers.

    What DEIMv2 changes, on top of D-FINE's constructor: the layers (:class:`DEIMv2DecoderLayer`),
    the query position head (``4 -> D -> D -> D`` with ``query_pos_act``; D-FINE: ``4 -> 2D -> D``,
    ReLU) and, with ``share_bbox_head``, one box head object in every ``bbox_embed`` slot (its keys
    repeat per layer, as in transformers' state dict).  Query selection, the FDR loop
    (:meth:`DFineDecoder.refine`), the LQE heads and the outputs are D-FINE's, unchanged.

    Args: those of :class:`DFineDecoder` (``options``: the same names and defaults, but ``num_points``
    4 and no ``activation`` / ``mlp_activation``: the FFN is SwiGLU) plus ``use_gateway``
    (False: an RMSNorm residual after the cross-attention; atto / femto / pico), ``share_bbox_head``
    and ``query_pos_act`` (transformers' ``decoder_activation_function``).
    """

    def __init__(
        self,
        in_channels: Sequence[int] = (256, 256, 256),
        hidden_dim: int = 256,
        num_classes: int = 80,
        *,
        num_points: int | Sequence[int] = 4,
        use_gateway: bool = True,
        share_bbox_head: bool = False,
        query_pos_act: str = "relu",
        **options: Any,
    ) -> None:
        if query_pos_act not in ACTIVATIONS:
            raise ValueError(f"query_pos_act must be one of {sorted(ACTIVATIONS)}; got {query_pos_act!r}")
        fixed = sorted(set(options) & {"activation", "mlp_activation"})
        if fixed:  # D-FINE's keywords DEIMv2 has no use for: SwiGLU FFN, query_pos_act
            raise TypeError(f"DEIMv2Decoder has no {', '.join(fixed)} (its FFN is SwiGLU; see query_pos_act)")
        # read by make_layer / make_query_pos_head, which D-FINE's constructor calls (plain values,
        # so they may be set before nn.Module's own __init__)
        self.use_gateway, self.query_pos_act = use_gateway, query_pos_act
        super().__init__(in_channels, hidden_dim, num_classes, num_points=num_points, **options)
        self.hparams.pop("activation", None)
        self.hparams.update(
            use_gateway=use_gateway, share_bbox_head=share_bbox_head, query_pos_act=query_pos_act
        )
        self.share_bbox_head = share_bbox_head
        if share_bbox_head:  # one module in every slot: DFineDecoder.refine indexes bbox_embed[i]
            self.bbox_embed = nn.ModuleList([self.bbox_embed[0]] * len(self.layers))

    def make_layer(self, **layer: Any) -> nn.Module:
        """DEIMv2's layer: RMSNorm, SwiGLU (``activation`` and ``layer_norm_eps`` unused), the gate or an RMSNorm residual."""
        return DEIMv2DecoderLayer(layer["d_model"], layer["num_heads"], layer["dim_feedforward"],
                                  num_points=layer["num_points"], offset_scale=layer["offset_scale"],
                                  dropout=layer["dropout"], use_gateway=self.use_gateway)  # fmt: skip

    def make_query_pos_head(self, d_model: int, activation: nn.Module) -> nn.Module:
        """DEIMv2's ``4 -> D -> D -> D`` head with ``query_pos_act`` (D-FINE: ``4 -> 2D -> D``, ReLU)."""
        return MLP(4, d_model, d_model, 3, ACTIVATIONS[self.query_pos_act]())
