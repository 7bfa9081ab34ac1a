"""Helpers every detector family shares: the input batch, the targets' checks and device indices, label masking.

They were DETR's (the first family) and sat in its modules; the RT-DETR family, D-FINE, DEIMv2
and RF-DETR import them from here, so no family imports another's modules for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from peg_core.dist import get_world_size, reduce_sum

from ..structures import IMAGENET_MEAN, IMAGENET_STD, ImageBatch, pad_images

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MatchedTargets",
    "box_normaliser",
    "check_targets",
    "coef_weights",
    "concat_targets",
    "device_indices",
    "loss_weights",
    "mask_unnamed",
    "num_boxes_of",
    "to_image_batch",
]


def to_image_batch(samples: ImageBatch | Tensor | Sequence[Tensor]) -> ImageBatch:
    """Accept an :class:`ImageBatch`, a ``(B, 3, H, W)`` tensor (no padding) or a list of ``(3, H_i, W_i)`` images."""
    if isinstance(samples, ImageBatch):
        batch = samples
    elif isinstance(samples, Tensor):
        if samples.dim() != 4:
            raise ValueError(
                f"a tensor input must be a batch (B, 3, H, W); got shape {tuple(samples.shape)} "
                "(pass a list for images of different sizes)"
            )
        mask = torch.zeros(samples.shape[0], *samples.shape[-2:], dtype=torch.bool, device=samples.device)
        batch = ImageBatch(samples, mask)
    elif isinstance(samples, Sequence) and all(isinstance(s, Tensor) for s in samples):
        batch = pad_images(list(samples))
    else:
        raise TypeError(
            f"expected an ImageBatch, a (B, 3, H, W) tensor or a list of images; got {type(samples)}"
        )
    t, m = batch
    if t.dim() != 4 or t.shape[1] != 3 or m.shape != (t.shape[0], *t.shape[-2:]):
        raise ValueError(
            f"images {tuple(t.shape)} / mask {tuple(m.shape)}: expected (B, 3, H, W) images and a (B, H, W) mask"
        )
    return batch


def check_targets(targets: list[dict[str, Tensor]], batch_size: int) -> None:
    """One target per image, each with ``boxes (M, 4)`` and ``labels (M,)``; shapes only.

    The label range is checked on the host by the matcher (its one transfer): no sync here.
    """
    if len(targets) != batch_size:
        raise ValueError(f"{len(targets)} targets for a batch of {batch_size} images")
    for i, t in enumerate(targets):
        labels, boxes = t["labels"], t["boxes"]
        if boxes.dim() != 2 or boxes.shape[-1] != 4 or boxes.shape[0] != labels.shape[0]:
            raise ValueError(
                f"target {i}: boxes {tuple(boxes.shape)} and labels {tuple(labels.shape)} must be (M, 4), (M,)"
            )


def device_indices(
    per_layer: list[list[tuple[Tensor, Tensor]]], targets: list[dict[str, Tensor]], device: torch.device
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Host matches -> per layer ``(batch_idx, query_idx, target_idx)`` on ``device``, ``target_idx``
    into the concatenated targets; all layers go in one non-blocking host-to-device copy."""
    offsets = [0]
    for t in targets[:-1]:
        offsets.append(offsets[-1] + len(t["labels"]))
    rows = []
    for indices in per_layer:
        for b, (q, j) in enumerate(indices):
            rows.append(torch.stack([torch.full_like(q, b), q, j + offsets[b]]))
    counts = [sum(len(q) for q, _ in indices) for indices in per_layer]
    flat = torch.cat(rows, dim=1) if rows else torch.empty(3, 0, dtype=torch.int64)
    flat = flat.to(device, non_blocking=True)
    return [tuple(part.unbind(0)) for part in flat.split(counts, dim=1)]


def concat_targets(targets: list[dict[str, Tensor]], device: torch.device) -> tuple[Tensor, Tensor]:
    """The batch's targets in image order: ``labels`` ``(M,)`` int64 and ``boxes`` ``(M, 4)`` float32, on ``device``."""
    labels = torch.cat([t["labels"] for t in targets]).to(device)
    boxes = torch.cat([t["boxes"] for t in targets]).to(device=device, dtype=torch.float32)
    return labels, boxes


class MatchedTargets(NamedTuple):
    """What one output's losses are computed against, built once per output by the criterion.

    Attributes:
        labels: ``(M,)`` int64, ``boxes``: ``(M, 4)`` float32 normalised cxcywh: all the batch's
            targets (:func:`concat_targets`).
        index: ``(batch_idx, query_idx, target_idx)``, each ``(K,)`` int64 on the device: the
            output's matched queries and the target of each, ``target_idx`` into ``labels`` /
            ``boxes`` (:func:`device_indices`).
        num_boxes: ``()`` what the losses' sums are divided by.
    """

    labels: Tensor
    boxes: Tensor
    index: tuple[Tensor, Tensor, Tensor]
    num_boxes: Tensor

    @property
    def matched_labels(self) -> Tensor:
        """``(K,)`` the label of each matched query's target."""
        return self.labels[self.index[2]]

    @property
    def matched_boxes(self) -> Tensor:
        """``(K, 4)`` the box of each matched query's target."""
        return self.boxes[self.index[2]]


def loss_weights(
    defaults: Mapping[str, float], weights: Mapping[str, float], family: str
) -> dict[str, float]:
    """A family's loss weights ``{loss key: weight}``: its published ``defaults`` with ``weights`` on top.

    A key of ``weights`` that names none of the family's losses is a ``ValueError``: a misspelt
    key would otherwise weigh nothing.
    """
    unknown = sorted(set(weights) - set(defaults))
    if unknown:
        raise ValueError(
            f"{family} has no loss {', '.join(unknown)} to weigh; its losses: {', '.join(defaults)}"
        )
    return {**defaults, **weights}


def coef_weights(config: Any, *names: str) -> dict[str, float]:
    """A typed config's ``<name>_loss_coef`` fields as loss weights ``{"loss_<name>": value}``."""
    return {f"loss_{name}": getattr(config, f"{name}_loss_coef") for name in names}


def mask_unnamed(logits: Tensor, named: Tensor | None, fill: float = float("-inf")) -> Tensor:
    """``logits`` ``(..., C[+1])`` with the classes that name no category at ``-inf`` (``named`` ``(C,)`` bool).

    A label of an id no category uses (``--labels ids`` on COCO: 11 of 91) or past the categories is
    then never a detection's label (sigmoid 0, softmax 0: DETR's softmax is then renormalised over
    the named classes, which is what an exported graph or folder computes).  A trailing "no object" logit (DETR's
    ``C + 1``-th) is left as it is; ``named`` None: nothing is masked.  ``fill``: the masked value
    (an exported graph uses the dtype's lowest finite value, so that outputs compare as numbers).
    """
    if named is None:
        return logits
    keep = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[: named.numel()] = named.to(logits.device)
    return logits.masked_fill(~keep, fill)


def box_normaliser(count: int, device: torch.device) -> Tensor:
    """``count`` summed over processes / world size, at least 1: a loss normaliser ``()`` on ``device``.

    A device fill, not a host copy, and kept a tensor: the normalisation adds no synchronisation.
    """
    value = torch.full((), float(count), device=device)
    return torch.clamp(reduce_sum(value) / get_world_size(), min=1)


def num_boxes_of(
    targets: list[dict[str, Tensor]], device: torch.device, num_boxes: Tensor | None = None
) -> Tensor:
    """The box normaliser of a criterion's call: ``num_boxes`` when given, else this batch's boxes over processes.

    ``num_boxes`` is given under gradient accumulation: the optimizer step's boxes (over processes /
    world size) times the micro-batch's share of the step's samples (:func:`peg_detr.task.step_num_boxes`).
    """
    if num_boxes is not None:
        return num_boxes
    return box_normaliser(sum(len(t["labels"]) for t in targets), device)


class DetectionCriterion(nn.Module, ABC):
    """What every family's criterion shares: ``forward(outputs, targets, num_boxes=None) -> {name: loss}``
    and :meth:`total`, the weighted sum by :attr:`weight_dict` (set by the subclass).

    A family implements :meth:`check` (the outputs and targets fit) and :meth:`compute` (its losses
    with the box normaliser), or overrides :meth:`forward` when it normalises otherwise.
    """

    weight_dict: dict[str, float]

    def forward(
        self, outputs: dict[str, Any], targets: list[dict[str, Tensor]], num_boxes: Tensor | None = None
    ) -> dict[str, Tensor]:
        """The family's losses of ``outputs`` against ``targets``, each a scalar.

        ``num_boxes``: the box normaliser to use instead of this batch's count over processes
        (:func:`num_boxes_of`; gradient accumulation gives the step's).
        """
        self.check(outputs, targets)
        return self.compute(outputs, targets, num_boxes_of(targets, outputs["pred_logits"].device, num_boxes))

    @abstractmethod
    def check(self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]) -> None:
        """A ``ValueError`` when ``outputs`` and ``targets`` do not fit this criterion."""

    @abstractmethod
    def compute(
        self, outputs: dict[str, Any], targets: list[dict[str, Tensor]], num_boxes: Tensor
    ) -> dict[str, Tensor]:
        """The losses, normalised by ``num_boxes`` ``()`` (the boxes over processes, at least 1)."""

    def total(self, losses: dict[str, Tensor]) -> Tensor:
        """Weighted sum of the losses that have a weight: a scalar to call ``backward`` on."""
        return sum(losses[k] * w for k, w in self.weight_dict.items() if k in losses)
