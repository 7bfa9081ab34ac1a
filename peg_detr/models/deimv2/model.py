"""The DEIMv2 detector: backbone (DINOv3 + STA, or HGNetv2), encoder (hybrid or lite), DEIMv2 decoder.

D-FINE's detector class does the rest (size checks, denoising groups, the issue-27 output
contract), so D-FINE's criterion applies unchanged.
"""

from __future__ import annotations

from ..dfine.model import DFINE

__all__ = ["DEIMv2"]


class DEIMv2(DFINE):
    """DEIMv2 (Huang et al., 2025): D-FINE's detector (:class:`~peg_detr.models.dfine.model.DFINE`) with DEIMv2's parts.

    ``DEIMv2(backbone, encoder, decoder, num_classes=..., num_queries=..., num_denoising=...,
    label_noise_ratio=..., box_noise_scale=..., aux_loss=...)`` as RT-DETR / D-FINE: the backbone is
    :class:`~peg_detr.models.deimv2.backbone.DINOv3STABackbone` or D-FINE's HGNetv2, the encoder
    :class:`~peg_detr.models.deimv2.encoder.DEIMv2HybridEncoder` or
    :class:`~peg_detr.models.deimv2.encoder.LiteEncoder`, the decoder
    :class:`~peg_detr.models.deimv2.decoder.DEIMv2Decoder`.  ``forward`` and its outputs are
    D-FINE's (issue 27's contract: ``pred_logits``, ``pred_boxes``; in training ``pred_corners``,
    ``ref_points``, ``up``, ``reg_scale``, ``aux_outputs``, ``pre_outputs``, ``enc_aux_outputs``,
    ``enc_meta``, ``dn_outputs``, ``dn_pre_outputs``, ``dn_meta``), so D-FINE's criterion applies.
    """

    family = "DEIMv2"

    @property
    def feature_strides(self) -> list[int]:
        """Strides of the decoder's maps: the backbone's, plus 32 after a lite encoder's stride-16 map."""
        strides = super().feature_strides
        while len(strides) < self.decoder.num_levels:  # the lite encoder adds a stride-2 level
            strides.append(strides[-1] * 2)
        return strides[-self.decoder.num_levels :]
