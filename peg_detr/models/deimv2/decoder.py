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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..detr import MLP
from ..dfine.decoder import DFineDecoder, DFineDecoderSpec, Gate, MSDeformableAttentionV2
from ..rtdetr.decoder import ACTIVATIONS, DecoderLayerBase

__all__ = ["DEIMv2Decoder", "DEIMv2DecoderLayer", "DEIMv2DecoderSpec", "RMSGate", "SwiGLUFFN"]


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


@dataclass(frozen=True, kw_only=True)
class DEIMv2DecoderSpec(DFineDecoderSpec):
    """DEIMv2's decoder settings: D-FINE's (:class:`~peg_detr.models.dfine.decoder.DFineDecoderSpec`) and its own.

    The same names and defaults as D-FINE's, but ``num_points`` 4; ``activation`` and
    ``mlp_activation`` stay at their defaults (the FFN is SwiGLU, the box heads ReLU; see
    ``query_pos_act``), and ``hparams`` records no ``activation``.

    Attributes:
        use_gateway: the gate after the cross-attention (False: an RMSNorm residual; atto / femto / pico).
        share_bbox_head: one box head object for every layer.
        query_pos_act: the query position head's activation (transformers' ``decoder_activation_function``).
    """

    num_points: int | Sequence[int] = 4
    use_gateway: bool = True
    share_bbox_head: bool = False
    query_pos_act: str = "relu"

    def validate(self) -> None:
        """D-FINE's checks; D-FINE's activations DEIMv2 has no use for refused; ``query_pos_act``'s name."""
        super().validate()
        fixed = [name for name in ("activation", "mlp_activation") if getattr(self, name) != "relu"]
        if fixed:  # SwiGLU FFN, ReLU box heads, query_pos_act
            raise ValueError(
                f"DEIMv2's decoder has no {', '.join(fixed)} (its FFN is SwiGLU; see query_pos_act)"
            )
        if self.query_pos_act not in ACTIVATIONS:
            raise ValueError(
                f"query_pos_act must be one of {sorted(ACTIVATIONS)}; got {self.query_pos_act!r}"
            )

    def hparams(self) -> dict[str, Any]:
        """D-FINE's, without ``activation`` (DEIMv2's FFN is SwiGLU)."""
        found = super().hparams()
        del found["activation"]
        return found


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

    def __init__(self, spec: DEIMv2DecoderSpec, rms_eps: float = 1e-6) -> None:
        super().__init__()
        d = spec.hidden_dim
        self.build_self_attention(spec, nn.RMSNorm(d, eps=rms_eps))
        self.encoder_attn = MSDeformableAttentionV2(d, spec.num_heads, spec.num_points, spec.offset_scale)
        self.gateway = RMSGate(d, rms_eps) if spec.use_gateway else None
        self.encoder_attn_layer_norm = None if spec.use_gateway else nn.RMSNorm(d, eps=rms_eps)
        self.mlp = SwiGLUFFN(d, spec.dim_feedforward)
        self.final_layer_norm = nn.RMSNorm(d, eps=rms_eps)
        self.dropout = nn.Dropout(spec.dropout)

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

    Args:
        num_classes: sigmoid classes.
        spec: the settings (:class:`DEIMv2DecoderSpec`; None: its defaults).
    """

    spec_type = DEIMv2DecoderSpec
    layer_type = DEIMv2DecoderLayer
    spec: DEIMv2DecoderSpec

    def __init__(self, num_classes: int = 80, spec: DEIMv2DecoderSpec | None = None) -> None:
        super().__init__(num_classes, spec)
        if self.share_bbox_head:  # one module in every slot: DFineDecoder.refine indexes bbox_embed[i]
            self.bbox_embed = nn.ModuleList([self.bbox_embed[0]] * len(self.layers))

    @property
    def share_bbox_head(self) -> bool:
        """One box head object in every ``bbox_embed`` slot (the settings')."""
        return self.spec.share_bbox_head

    def make_query_pos_head(self, activation: Callable[[Tensor], Tensor]) -> nn.Module:
        """DEIMv2's ``4 -> D -> D -> D`` head with ``query_pos_act`` (D-FINE: ``4 -> 2D -> D``, ReLU)."""
        return MLP(4, self.hidden_dim, self.hidden_dim, 3, ACTIVATIONS[self.spec.query_pos_act]())
