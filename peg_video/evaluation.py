"""The Kinetics multi-view evaluator.

Each test video is seen as ``num_clips × num_crops`` views.  The evaluator collects one score
vector per view, merges the views of all processes (``DistributedSampler`` pads the last
shard with repeated videos: duplicates are removed by ``(video index, view index)``), fuses
the views of each video and reports

* ``top1`` / ``top5``: video-level accuracy of the fused scores,
* ``mean_class_accuracy``: video-level top-1 averaged over the classes present,
* ``clip_top1``: accuracy of the single views,
* ``num_videos`` / ``num_views``.

:func:`evaluate_views` runs a model over a loader of multi-view batches; the engine
(``ctx.batches``) counts and lists the broken videos.

Fusion (``reduction``): ``"mean"`` of softmax probabilities (the usual protocol), ``"sum"``
of probabilities, element-wise ``"max"`` of probabilities, or ``"logits"`` (mean of the raw
logits).

NaN/inf scores (a diverged model) are a :class:`~peg_core.errors.NonFiniteError`, not numbers:
ranking them would give an accuracy that looks like one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from peg_core.engine import RunContext
from peg_core.engine.distributed import all_gather_object
from peg_core.errors import NonFiniteError

__all__ = ["REDUCTIONS", "KineticsEvaluator", "evaluate_views"]

REDUCTIONS = ("mean", "sum", "max", "logits")


class KineticsEvaluator:
    """Accumulate per-view scores; :meth:`summarize` merges ranks and computes the metrics."""

    def __init__(self, num_classes: int, reduction: str = "mean", topk: tuple[int, ...] = (1, 5)) -> None:
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.num_classes = num_classes
        self.reduction = reduction
        self.topk = topk
        self._views: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}

    def update(
        self, logits: torch.Tensor, labels: torch.Tensor, video_index: torch.Tensor, view_index: torch.Tensor
    ) -> None:
        """Add views.  ``logits`` ``(N, K)``; ``labels``, ``video_index``, ``view_index`` ``(N,)``."""
        if logits.ndim != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits must be (N, {self.num_classes}), got {tuple(logits.shape)}")
        n = logits.shape[0]
        for name, t in (("labels", labels), ("video_index", video_index), ("view_index", view_index)):
            if t.shape != (n,):
                raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
        logits = logits.detach().float().cpu()
        for row, lab, vid, view in zip(logits, labels.tolist(), video_index.tolist(), view_index.tolist()):
            self._views[(int(vid), int(view))] = (row, int(lab))

    def _merged(self) -> dict[tuple[int, int], tuple[torch.Tensor, int]]:
        views: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}
        for rank_views in all_gather_object(self._views):
            views.update(rank_views)  # same key twice = a padded duplicate: identical scores
        return views

    def summarize(self) -> dict[str, Any]:
        """Metrics over all processes (call on every rank: it gathers)."""
        views = self._merged()
        result: dict[str, Any] = {"num_videos": 0, "num_views": len(views)}
        if not views:
            result.update({f"top{k}": float("nan") for k in self.topk})
            result.update(mean_class_accuracy=float("nan"), clip_top1=float("nan"))
            return result
        keys = sorted(views)
        scores = torch.stack([views[k][0] for k in keys])  # (V, K) logits
        finite = torch.isfinite(scores).all(dim=1)
        if not finite.all():  # the merged views: every rank raises alike
            video, view = keys[int((~finite).nonzero()[0])]
            raise NonFiniteError(f"the model's scores are not finite (video {video}, view {view})")
        view_labels = torch.tensor([views[k][1] for k in keys])
        video_ids = torch.tensor([k[0] for k in keys])
        videos, inverse = torch.unique(video_ids, return_inverse=True)
        probs = scores if self.reduction == "logits" else scores.softmax(dim=1)
        fused = torch.zeros(len(videos), self.num_classes)
        if self.reduction == "max":
            fused.fill_(float("-inf")).scatter_reduce_(0, inverse[:, None].expand_as(probs), probs, "amax")
        else:
            fused.index_add_(0, inverse, probs)
            if self.reduction != "sum":
                fused /= torch.bincount(inverse, minlength=len(videos))[:, None].float()
        labels = torch.empty(len(videos), dtype=torch.long)
        labels[inverse] = view_labels
        ranked = fused.argsort(dim=1, descending=True)
        hits = ranked == labels[:, None]
        for k in self.topk:
            result[f"top{k}"] = hits[:, : min(k, self.num_classes)].any(dim=1).float().mean().item()
        correct = hits[:, 0].float()
        present = labels.unique()
        result["mean_class_accuracy"] = (
            torch.stack([correct[labels == c].mean() for c in present]).mean().item()
        )
        result["clip_top1"] = (scores.argmax(dim=1) == view_labels).float().mean().item()
        result["num_videos"] = len(videos)
        return result


@torch.no_grad()
def evaluate_views(
    model: nn.Module,
    loader: Iterable[Any],
    ctx: RunContext,
    num_classes: int,
    num_videos: int,
    reduction: str = "mean",
    split: str = "val",
    view_chunk: int = 16,
) -> dict[str, Any]:
    """Multi-view evaluation of ``model``; returns :meth:`KineticsEvaluator.summarize` (merged over ranks).

    ``loader`` yields :class:`~peg_core.engine.SampleBatch` of dicts (see
    :func:`peg_video.data.collate_clips`): ``video`` ``(B, V, C, T, S, S)``, ``label``, ``index``
    and optionally ``view_offset``.  Views run through the model ``view_chunk`` at a time.
    Broken videos are counted under ``split`` (out of ``num_videos``) by the engine, which
    stops with one line when too many, or all of them, are broken.
    """
    model.eval()
    evaluator = KineticsEvaluator(num_classes, reduction=reduction)
    for batch in ctx.batches(loader, split, total=num_videos):
        video = batch["video"]  # (B, V, C, T, H, W)
        b, v = video.shape[:2]
        with ctx.autocast():
            logits = [
                model(chunk.to(ctx.device, non_blocking=True))
                for chunk in video.flatten(0, 1).split(view_chunk)
            ]
        offset = batch.get("view_offset", torch.zeros(b, dtype=torch.long))
        view_index = (offset[:, None] + torch.arange(v)[None, :]).flatten()
        evaluator.update(
            torch.cat(logits).float().cpu(),
            batch["label"].repeat_interleave(v),
            batch["index"].repeat_interleave(v),
            view_index,
        )
    return evaluator.summarize()
