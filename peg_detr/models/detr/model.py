"""The DETR detector: backbone, input projection, transformer, class and box heads."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from peg_core.interop.classes import ClassParam

from ...structures import ImageBatch
from ..common import to_image_batch
from ..layers import MLP
from .backbone import Joiner
from .transformer import Transformer

__all__ = ["DETR", "MLP"]


def _full_precision(x: Tensor) -> Tensor:
    """float16/bfloat16 -> float32; float32 and float64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class DETR(nn.Module):
    """DEtection TRansformer (Carion et al., 2020) with a pluggable encoder position encoding.

    Build it with :func:`peg_detr.build_detr`.  ``forward(samples)`` takes a
    list of ``(3, H_i, W_i)`` images (padded here, with a mask), an
    :class:`~peg_detr.structures.ImageBatch` or a ``(B, 3, H, W)`` tensor;
    images are expected normalised with the ImageNet mean/std.  It returns:

    * ``pred_logits`` ``(B, Q, num_classes + 1)``, the last one is no-object;
    * ``pred_boxes`` ``(B, Q, 4)`` cxcywh in ``[0, 1]`` relative to each image's
      real (unpadded) size;
    * ``aux_outputs``: a list of ``{"pred_logits", "pred_boxes"}`` for each earlier
      decoder layer (only when ``aux_loss``).
    """

    def __init__(
        self,
        backbone: Joiner,
        transformer: Transformer,
        num_classes: int,
        num_queries: int,
        aux_loss: bool = True,
    ) -> None:
        super().__init__()
        hidden = transformer.d_model
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.aux_loss = aux_loss
        self.transformer = transformer
        self.class_embed = nn.Linear(hidden, num_classes + 1)
        self.bbox_embed = MLP(hidden, hidden, 4, 3)
        self.query_embed = nn.Embedding(num_queries, hidden)
        self.input_proj = nn.Conv2d(backbone.num_channels, hidden, kernel_size=1)
        self.backbone = backbone

    def forward(self, samples: ImageBatch | Tensor | Sequence[Tensor]) -> dict:
        batch = to_image_batch(samples)
        features, mask = self.backbone(batch)
        hs = self.transformer(self.input_proj(features), mask, self.query_embed.weight)
        # The one float32 cast of the model, at its output (float64 stays float64): under bf16/fp16
        # autocast half precision resolves only ~0.002 around 0.5, coarser than the L1 loss cares
        # about, and the loss, matcher and post-processor then need no casts of their own.
        logits = _full_precision(self.class_embed(hs))
        boxes = _full_precision(self.bbox_embed(hs)).sigmoid()
        out: dict = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [
                {"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])
            ]
        return out

    def class_parameters(self) -> tuple[ClassParam, ...]:
        """The tensors with a row per class: ``class_embed`` (its last row is "no object", not a class)."""
        return (ClassParam("class_embed.weight", extra=1), ClassParam("class_embed.bias", extra=1))

    def no_weight_decay(self) -> set[str]:
        """Parameters trained without weight decay: the learned rotary frequencies (``rope-mixed``).

        DETR decays every other parameter, biases and norms included (its recipe).
        """
        return {name for name, _ in self.named_parameters() if name.endswith("rope.freqs")}
