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

import torch.nn.functional as F
from torch import Tensor, nn

from ..detr import MLP
from ..dfine.decoder import DFineDecoder, Gate, MSDeformableAttentionV2
from ..rtdetr.decoder import ACTIVATIONS, QueryAttention

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


class DEIMv2DecoderLayer(nn.Module):
    """One DEIMv2 decoder layer (module docstring); ``forward(x, pos, boxes, memory, shapes, blocked) -> x``.

    The self-attention and the deformable cross-attention are D-FINE's modules
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
        self.self_attn = QueryAttention(dim, num_heads, dropout)
        self.self_attn_layer_norm = nn.RMSNorm(dim, eps=rms_eps)
        self.encoder_attn = MSDeformableAttentionV2(dim, num_heads, num_points, offset_scale)
        self.gateway = RMSGate(dim, rms_eps) if use_gateway else None
        self.encoder_attn_layer_norm = None if use_gateway else nn.RMSNorm(dim, eps=rms_eps)
        self.mlp = SwiGLUFFN(dim, dim_feedforward)
        self.final_layer_norm = nn.RMSNorm(dim, eps=rms_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        pos: Tensor,
        boxes: Tensor,
        memory: Tensor,
        spatial_shapes: Sequence[tuple[int, int]],
        blocked: Tensor | None = None,
    ) -> Tensor:
        """``x``, ``pos`` ``(B, N, D)``, ``boxes`` ``(B, N, 4)``; ``blocked`` ``(N, N)``: True where a query may not attend."""
        x = self.self_attn_layer_norm(x + self.dropout(self.self_attn(x, pos, blocked)))
        a = self.dropout(self.encoder_attn(x + pos, boxes, memory, spatial_shapes))
        x = self.gateway(x, a) if self.gateway is not None else self.encoder_attn_layer_norm(x + a)
        return self.final_layer_norm(x + self.dropout(self.mlp(x)))


class DEIMv2Decoder(DFineDecoder):
    """D-FINE's query selection and FDR decoder (:class:`~peg_detr.models.dfine.decoder.DFineDecoder`) with DEIMv2's layers.

    What DEIMv2 changes, on top of D-FINE's constructor: the layers (:class:`DEIMv2DecoderLayer`),
    the query position head (``4 -> D -> D -> D`` with ``query_pos_act``; D-FINE: ``4 -> 2D -> D``,
    ReLU) and, with ``share_bbox_head``, one box head object in every ``bbox_embed`` slot (its keys
    repeat per layer, as in transformers' state dict).  Query selection, the FDR loop
    (:meth:`DFineDecoder.refine`), the LQE heads and the outputs are D-FINE's, unchanged.

    Args: those of :class:`DFineDecoder` (no ``activation``: the FFN is SwiGLU) plus ``use_gateway``
    (False: an RMSNorm residual after the cross-attention; atto / femto / pico), ``share_bbox_head``
    and ``query_pos_act`` (transformers' ``decoder_activation_function``).
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
        num_points: int | Sequence[int] = 4,
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
        use_gateway: bool = True,
        share_bbox_head: bool = False,
        query_pos_act: str = "relu",
    ) -> None:
        if query_pos_act not in ACTIVATIONS:
            raise ValueError(f"query_pos_act must be one of {sorted(ACTIVATIONS)}; got {query_pos_act!r}")
        # read by make_layer / make_query_pos_head, which D-FINE's constructor calls (plain values,
        # so they may be set before nn.Module's own __init__)
        self.use_gateway, self.query_pos_act = use_gateway, query_pos_act
        super().__init__(
            in_channels, hidden_dim, num_classes, num_queries=num_queries, num_layers=num_layers,
            num_heads=num_heads, dim_feedforward=dim_feedforward, dropout=dropout, num_points=num_points,
            offset_scale=offset_scale, eval_idx=eval_idx, max_num_bins=max_num_bins, reg_scale=reg_scale, up=up,
            lqe_k=lqe_k, lqe_hidden_dim=lqe_hidden_dim, lqe_layers=lqe_layers,
            learn_initial_query=learn_initial_query, layer_norm_eps=layer_norm_eps, batch_norm_eps=batch_norm_eps,
        )  # fmt: skip
        self.hparams.pop("activation", None)
        self.hparams.update(
            use_gateway=use_gateway, share_bbox_head=share_bbox_head, query_pos_act=query_pos_act
        )
        self.share_bbox_head = share_bbox_head
        if share_bbox_head:  # one module in every slot: DFineDecoder.refine indexes bbox_embed[i]
            self.bbox_embed = nn.ModuleList([self.bbox_embed[0]] * num_layers)

    def make_layer(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int,
        dropout: float,
        activation: str,
        num_points: list[int],
        offset_scale: float,
        layer_norm_eps: float,
    ) -> nn.Module:
        """DEIMv2's layer: RMSNorm, SwiGLU (no ``activation``), the gate or an RMSNorm residual."""
        return DEIMv2DecoderLayer(d_model, num_heads, dim_feedforward, num_points=num_points,
                                  offset_scale=offset_scale, dropout=dropout, use_gateway=self.use_gateway)  # fmt: skip

    def make_query_pos_head(self, d_model: int, activation: nn.Module) -> nn.Module:
        """DEIMv2's ``4 -> D -> D -> D`` head with ``query_pos_act`` (D-FINE: ``4 -> 2D -> D``, ReLU)."""
        return MLP(4, d_model, d_model, 3, ACTIVATIONS[self.query_pos_act]())
