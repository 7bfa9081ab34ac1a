"""From DETR outputs to COCO-style detections in original-image pixels."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert

__all__ = ["PostProcess"]


class PostProcess(nn.Module):
    """``forward(outputs, target_sizes)`` -> one dict per image.

    ``target_sizes`` ``(B, 2)`` holds each ORIGINAL image's ``(h, w)``; the
    predicted boxes are relative to the (resized) image's real extent, so
    scaling by the original size undoes the resize.  For every query: softmax
    over the classes, the no-object class dropped, the best remaining class
    kept.  Returns ``{"scores": (Q,), "labels": (Q,) int64, "boxes": (Q, 4)}``
    with boxes ``xyxy`` in absolute pixels.

    ``named`` ``(C,)`` bool (None: all): the classes that name a category; the others' probabilities
    are zeroed before the best class is taken, so no detection has an id without a category while
    the kept scores are the model's softmax (the reference's).
    """

    def __init__(self) -> None:
        super().__init__()
        self.named: Tensor | None = None

    @torch.no_grad()
    def forward(self, outputs: dict[str, Tensor], target_sizes: Tensor) -> list[dict[str, Tensor]]:
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        target_sizes = torch.as_tensor(target_sizes, device=boxes.device)
        if target_sizes.shape != (logits.shape[0], 2):
            raise ValueError(
                f"target_sizes has shape {tuple(target_sizes.shape)}, expected (B, 2) = ({logits.shape[0]}, 2) "
                "as (h, w) of the original images"
            )
        prob = logits.float().softmax(-1)[..., :-1]
        if self.named is not None:  # after the softmax: the scores stay the model's (DETR's reference)
            prob = prob.masked_fill(~self.named.to(prob.device), 0.0)
        scores, labels = prob.max(-1)
        h, w = target_sizes.float().unbind(1)
        scale = torch.stack([w, h, w, h], dim=1)[:, None, :]
        xyxy = box_convert(boxes.float(), "cxcywh", "xyxy") * scale
        return [{"scores": s, "labels": lab, "boxes": b} for s, lab, b in zip(scores, labels, xyxy)]
