"""The RF-DETR detector: windowed DINOv2 ViT, LW-DETR's projector, Group DETR two-stage decoder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from peg_core.interop.classes import ClassParam

from ...structures import ImageBatch
from ..common import to_image_batch
from .backbone import ScaleProjector, WindowedViTBackbone
from .decoder import RFDETRDecoder

__all__ = ["RFDETR"]


def _full_precision(x: Tensor) -> Tensor:
    """float16/bfloat16 -> float32 (the losses, matcher and post-processor run in float32)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _heads(logits: Tensor, boxes: Tensor) -> list[dict[str, Tensor]]:
    """``(L, B, N, C)``, ``(L, B, N, 4)`` -> one ``{"pred_logits", "pred_boxes"}`` per layer."""
    return [{"pred_logits": lg, "pred_boxes": bx} for lg, bx in zip(logits, boxes)]


class RFDETR(nn.Module):
    """RF-DETR (Robinson et al., 2025, "RF-DETR: Neural Architecture Search for Real-Time Detection Transformers").

    ``forward(samples, targets=None)`` takes what the suite's detectors take (a ``(B, 3, H, W)``
    tensor of ``[0, 1]`` pixels, a list of same-size images, an :class:`ImageBatch`; the padding
    mask is ignored) and returns float32, as :class:`~peg_detr.models.rtdetr.RTDETR` does:

    * ``pred_logits`` ``(B, N, C)`` sigmoid logits (no "no object" class) and ``pred_boxes``
      ``(B, N, 4)`` normalised cxcywh of the last decoder layer; ``N = Q`` in eval (group 0) and
      ``G * Q`` in training (all Group DETR groups, group ``g`` at rows ``g*Q:(g+1)*Q``);
    * in training with ``aux_loss``: ``aux_outputs`` (the earlier layers, all groups) and
      ``enc_aux_outputs`` (one dict: every group's ``Q`` selected cells with that group's score
      and box heads);
    * in training: ``num_groups`` ``G``, so a criterion matches each group of ``Q`` queries to the
      targets on its own (Group DETR: one-to-one within a group, ``G`` matches per image).

    ``targets`` are accepted for the suite's calling convention; RF-DETR has no denoising queries,
    so they change nothing here.  Sides must be multiples of ``patch_size * num_windows``
    (:meth:`check_input_size`: an :class:`~peg_core.errors.InputError` otherwise).
    """

    def __init__(
        self,
        backbone: WindowedViTBackbone,
        projector: ScaleProjector,
        decoder: RFDETRDecoder,
        *,
        aux_loss: bool = True,
    ) -> None:
        super().__init__()
        self.backbone, self.projector, self.decoder = backbone, projector, decoder
        self.num_classes, self.num_queries = decoder.num_classes, decoder.num_queries
        self.group_detr = decoder.group_detr
        self.aux_loss = aux_loss

    def class_parameters(self) -> tuple[ClassParam, ...]:
        """The tensors with a row per class: the decoder's score head and every group's encoder score head."""
        heads = ["decoder.class_embed"] + [f"decoder.enc_out_class_embed.{g}" for g in range(self.group_detr)]
        return tuple(ClassParam(f"{h}.{p}") for h in heads for p in ("weight", "bias"))

    @property
    def feature_strides(self) -> list[int]:
        """The stride of the one map the decoder reads (the ViT's patch)."""
        return [self.backbone.patch_size]

    def check_input_size(self, height: int, width: int) -> None:
        """:class:`~peg_core.errors.InputError` unless both sides are multiples of ``patch_size * num_windows``."""
        self.backbone.check_input_size(height, width)

    def forward(
        self, samples: ImageBatch | Tensor | Sequence[Tensor], targets: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        images = to_image_batch(samples).tensors
        feat = self.projector(self.backbone(images))  # (B, D, h, w)
        shapes = [(feat.shape[-2], feat.shape[-1])]
        dec = self.decoder(feat.flatten(2).transpose(1, 2), shapes)
        logits, boxes = _full_precision(dec.logits), _full_precision(dec.boxes)
        out: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.training:
            out["num_groups"] = dec.groups
            if self.aux_loss:
                out["aux_outputs"] = _heads(logits[:-1], boxes[:-1])
                out["enc_aux_outputs"] = _heads(
                    _full_precision(dec.enc_logits)[None], _full_precision(dec.enc_boxes)[None]
                )
        return out
