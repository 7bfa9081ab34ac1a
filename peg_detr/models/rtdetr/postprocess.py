"""From RT-DETR outputs (sigmoid classes) to detections in original-image pixels."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert

from ..common import mask_unnamed

__all__ = ["RTDETRPostProcess"]


class RTDETRPostProcess(nn.Module):
    """``forward(outputs, target_sizes)`` -> one dict per image (the call of :class:`peg_detr.models.PostProcess`).

    Scores are per (query, class) sigmoids, so one query may give several detections: the
    ``num_top_queries`` best pairs over all ``Q * C`` are kept (fewer when ``Q * C`` is smaller),
    best first.  ``target_sizes`` ``(B, 2)`` holds each original image's ``(h, w)``.  Returns
    ``{"scores": (K,), "labels": (K,) int64, "boxes": (K, 4) xyxy pixels}`` per image.
    ``named`` ``(C,)`` bool (None: all): classes without a category are masked before the top-k.
    """

    def __init__(self, num_top_queries: int = 300) -> None:
        super().__init__()
        if num_top_queries < 1:
            raise ValueError(f"num_top_queries must be positive, got {num_top_queries}")
        self.num_top_queries = num_top_queries
        self.named: Tensor | None = None

    @torch.no_grad()
    def forward(self, outputs: dict[str, Tensor], target_sizes: Tensor) -> list[dict[str, Tensor]]:
        logits, boxes = outputs["pred_logits"].float(), outputs["pred_boxes"].float()
        b, _, c = logits.shape
        target_sizes = torch.as_tensor(target_sizes, device=boxes.device)
        if target_sizes.shape != (b, 2):
            raise ValueError(
                f"target_sizes has shape {tuple(target_sizes.shape)}, expected (B, 2) = ({b}, 2) "
                "as (h, w) of the original images"
            )
        flat = mask_unnamed(logits, self.named).sigmoid().flatten(1)  # (B, Q*C), index = query * C + class
        pairs = flat.shape[1] if self.named is None else logits.shape[1] * int(self.named.sum())
        scores, index = flat.topk(min(self.num_top_queries, pairs), dim=1)
        labels = index % c
        query = index // c
        h, w = target_sizes.float().unbind(1)
        scale = torch.stack([w, h, w, h], dim=1)[:, None, :]
        xyxy = box_convert(boxes, "cxcywh", "xyxy") * scale
        xyxy = xyxy.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
        return [{"scores": s, "labels": lab, "boxes": bx} for s, lab, bx in zip(scores, labels, xyxy)]
