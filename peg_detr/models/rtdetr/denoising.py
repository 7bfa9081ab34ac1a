"""RT-DETR's contrastive denoising groups: noised ground truth fed to the decoder as extra queries.

Each group holds two copies of every image's ground-truth boxes (padded to the batch's largest
count ``M``): *positives*, whose boxes are moved by less than half their size and which the
decoder must reconstruct, and *negatives*, moved by between one and two half-sizes, which it
must classify as background.  Labels of both are replaced by a random class with probability
``label_noise_ratio / 2``.  Layout along the query axis, per group ``g``::

    [g * 2M, g * 2M + M)        positives (the first n_b of them real, the rest padding)
    [g * 2M + M, (g + 1) * 2M)  negatives

and the ``Q`` matching queries follow all ``G * 2M`` denoising queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert

__all__ = ["DenoisingGroup", "contrastive_denoising_group"]

# torch.logit clamps to [eps, 1 - eps]: the boxes clipped to 0 or 1 stay finite (RT-DETR's 1e-5).
_LOGIT_EPS = 1e-5


@dataclass
class DenoisingGroup:
    """The decoder inputs and loss bookkeeping of one batch's denoising queries.

    * ``queries`` ``(B, N_dn, D)``: class embeddings of the noised labels (padding slots embed
      the padding index ``num_classes``);
    * ``ref_boxes_unact`` ``(B, N_dn, 4)``: ``logit`` of the noised normalised cxcywh boxes;
    * ``attn_mask`` ``(N_dn + Q, N_dn + Q)`` bool, ``True`` where the row query may NOT attend
      the column query: matching queries never see denoising queries, a group sees only itself
      (and the matching queries);
    * ``meta``: ``dn_positive_idx`` (list over the batch of int64 ``(n_b * G,)``: the query
      index of each positive, group-major, so entry ``g * n_b + j`` reconstructs target ``j``),
      ``dn_num_group`` (``G``) and ``dn_num_split`` (``[N_dn, Q]``, to split decoder outputs).
    """

    queries: Tensor
    ref_boxes_unact: Tensor
    attn_mask: Tensor
    meta: dict[str, Any] = field(default_factory=dict)


def contrastive_denoising_group(
    targets: list[dict[str, Tensor]],
    num_classes: int,
    num_queries: int,
    class_embed: nn.Embedding,
    *,
    num_denoising: int = 100,
    label_noise_ratio: float = 0.5,
    box_noise_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> DenoisingGroup | None:
    """Build RT-DETR's contrastive denoising queries for a batch of targets.

    ``targets[b]`` holds ``labels`` int64 ``(n_b,)`` in ``[0, num_classes)`` and ``boxes``
    ``(n_b, 4)`` normalised cxcywh.  With ``M = max(n_b)`` there are
    ``G = max(num_denoising // M, 1)`` groups and ``N_dn = 2 * M * G`` queries.
    ``class_embed`` has ``num_classes + 1`` rows (the last one for padding slots).
    Random draws come from ``generator`` (any device; its results are moved to the
    embedding's device), so a seeded generator makes the group reproducible.
    Returns ``None`` when ``num_denoising <= 0`` or no image has a box.
    """
    if class_embed.num_embeddings < num_classes + 1:
        raise ValueError(
            f"class_embed has {class_embed.num_embeddings} rows, denoising needs num_classes + 1 = "
            f"{num_classes + 1} (the last one embeds padding)"
        )
    sizes = [len(t["labels"]) for t in targets]
    if num_denoising <= 0 or not sizes or max(sizes) == 0:
        return None
    max_gt = max(sizes)
    num_group = max(num_denoising // max_gt, 1)
    device = class_embed.weight.device

    labels, boxes, valid = _pad_targets(targets, sizes, num_classes, device)
    # Tiled as [positives | negatives] per group: (B, 2 * G * M).
    reps = 2 * num_group
    labels, boxes, valid = labels.repeat(1, reps), boxes.repeat(1, reps, 1), valid.repeat(1, reps)
    negative = (torch.arange(reps * max_gt, device=device) // max_gt) % 2 == 1

    labels = _noise_labels(labels, valid, num_classes, label_noise_ratio, generator)
    boxes = _noise_boxes(boxes, negative, box_noise_scale, generator)
    num_dn = reps * max_gt
    return DenoisingGroup(
        queries=class_embed(labels),
        ref_boxes_unact=torch.logit(boxes, eps=_LOGIT_EPS),
        attn_mask=denoising_attn_mask(num_dn, num_queries, num_group, device),
        meta={
            "dn_positive_idx": _positive_indices(sizes, max_gt, num_group, device),
            "dn_num_group": num_group,
            "dn_num_split": [num_dn, num_queries],
        },
    )


def denoising_attn_mask(num_dn: int, num_queries: int, num_group: int, device: torch.device) -> Tensor:
    """Self-attention mask ``(num_dn + num_queries,) * 2``, ``True`` = may not attend.

    Matching queries (the last ``num_queries``) would otherwise learn from the ground truth
    hidden in the denoising queries; groups are kept apart so each is an independent task.
    """
    size = num_dn + num_queries
    mask = torch.zeros(size, size, dtype=torch.bool, device=device)
    mask[num_dn:, :num_dn] = True
    group = torch.arange(num_dn, device=device) // (num_dn // num_group)
    mask[:num_dn, :num_dn] = group[:, None] != group[None, :]
    return mask


def _pad_targets(
    targets: list[dict[str, Tensor]], sizes: list[int], num_classes: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """Labels ``(B, M)`` (padding ``num_classes``), boxes ``(B, M, 4)`` (padding 0), valid ``(B, M)``.

    The scatter positions come from the host-side sizes, so no device value is read.
    """
    batch, max_gt = len(sizes), max(sizes)
    count = torch.tensor(sizes)
    rows = torch.repeat_interleave(torch.arange(batch), count).to(device, non_blocking=True)
    cols = torch.cat([torch.arange(n) for n in sizes]).to(device, non_blocking=True)
    labels = torch.full((batch, max_gt), num_classes, dtype=torch.int64, device=device)
    boxes = torch.zeros(batch, max_gt, 4, device=device)
    labels[rows, cols] = torch.cat([t["labels"] for t in targets]).to(device, torch.int64)
    boxes[rows, cols] = torch.cat([t["boxes"] for t in targets]).to(device, boxes.dtype)
    valid = torch.arange(max_gt, device=device)[None, :] < count.to(device, non_blocking=True)[:, None]
    return labels, boxes, valid


def _rand(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Uniform ``[0, 1)`` drawn on the generator's device (a CPU generator on a GPU run), moved to ``device``."""
    where = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=where).to(device)


def _randint(
    high: int, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> Tensor:
    """Integers in ``[0, high)``, drawn like :func:`_rand`."""
    where = generator.device if generator is not None else device
    return torch.randint(high, shape, generator=generator, device=where).to(device)


def _noise_labels(
    labels: Tensor, valid: Tensor, num_classes: int, ratio: float, generator: torch.Generator | None
) -> Tensor:
    """Replace each real label by a uniformly random class with probability ``ratio / 2``."""
    if ratio <= 0:
        return labels
    flip = _rand(tuple(labels.shape), generator, labels.device) < ratio * 0.5
    new = _randint(num_classes, tuple(labels.shape), generator, labels.device)
    return torch.where(flip & valid, new, labels)


def _noise_boxes(boxes: Tensor, negative: Tensor, scale: float, generator: torch.Generator | None) -> Tensor:
    """Move each corner by ``u * scale * (w/2 or h/2)`` with a random sign; ``u`` in ``[0, 1)`` for
    positives, ``[1, 2)`` for negatives (so a negative lies outside its box's own extent);
    corners clipped to the image.  ``boxes`` ``(B, N, 4)`` cxcywh, ``negative`` ``(N,)`` bool."""
    if scale <= 0:
        return boxes
    shape = tuple(boxes.shape)
    half = boxes[..., 2:].repeat(1, 1, 2) * (0.5 * scale)
    sign = _randint(2, shape, generator, boxes.device).to(boxes.dtype) * 2 - 1
    part = _rand(shape, generator, boxes.device).to(boxes.dtype)
    part = part + negative[None, :, None].to(boxes.dtype)
    corners = box_convert(boxes, "cxcywh", "xyxy") + sign * part * half
    return box_convert(corners.clamp(0.0, 1.0), "xyxy", "cxcywh")


def _positive_indices(sizes: list[int], max_gt: int, num_group: int, device: torch.device) -> list[Tensor]:
    """Per image the query indices of its positives, group-major: ``g * 2M + j`` for ``j < n_b``."""
    starts = torch.arange(num_group) * (2 * max_gt)
    out = []
    for n in sizes:
        idx = (starts[:, None] + torch.arange(n)[None, :]).flatten()
        out.append(idx.to(device, non_blocking=True))
    return out
