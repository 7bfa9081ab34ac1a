"""COCO bbox evaluation on pycocotools ``COCOeval``, merged across processes.

Each process adds the post-processed detections of the images it saw;
:meth:`CocoEvaluator.summarize` gathers them with
``peg_core.utils.all_gather_object``, keeps one copy per ``image_id`` (a
``DistributedSampler`` pads the last batch with repeated images), runs
``COCOeval`` and returns the 12 standard numbers.  Only the images that were
read are evaluated: a broken image (skipped by the data loader) is left out of
``imgIds`` rather than counted as all-missed, and :func:`evaluate_coco` reports
how many images the numbers cover.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor, nn
from torchvision.ops import box_convert

from peg_core.engine import RunContext
from peg_core.utils import all_gather_object, is_main_process

from .structures import to_float

__all__ = ["STAT_NAMES", "CocoEvaluator", "coco_stats", "evaluate_coco", "to_coco_results"]

# The order of COCOeval.stats for iouType="bbox".
STAT_NAMES: tuple[str, ...] = (
    "ap",
    "ap50",
    "ap75",
    "ap_s",
    "ap_m",
    "ap_l",
    "ar1",
    "ar10",
    "ar100",
    "ar_s",
    "ar_m",
    "ar_l",
)


def to_coco_results(predictions: Mapping[int, Mapping[str, Tensor]]) -> list[dict[str, Any]]:
    """``{image_id: {"scores" (n,), "labels" (n,), "boxes" (n, 4) xyxy abs}}`` -> COCO results list.

    Labels are used as category ids (DETR's convention).  Boxes become
    ``[x, y, w, h]`` floats.
    """
    results: list[dict[str, Any]] = []
    for image_id, pred in predictions.items():
        boxes = box_convert(pred["boxes"].detach().float().cpu().reshape(-1, 4), "xyxy", "xywh").tolist()
        scores = pred["scores"].detach().float().cpu().tolist()
        labels = pred["labels"].detach().cpu().tolist()
        results.extend(
            {"image_id": int(image_id), "category_id": int(c), "bbox": b, "score": float(s)}
            for b, s, c in zip(boxes, scores, labels)
        )
    return results


def coco_stats(coco_gt: COCO, results: list[dict[str, Any]], image_ids: list[int], verbose: bool = True):
    """Run ``COCOeval`` (bbox) over ``image_ids``; return ``{name: value}`` for the 12 numbers.

    With no detections at all every number is 0 (pycocotools cannot load an
    empty result list).
    """
    if not results:
        if verbose:
            print("COCO eval: no detections; all metrics are 0")
        return dict.fromkeys(STAT_NAMES, 0.0)
    with contextlib.redirect_stdout(io.StringIO()):  # loadRes/evaluate/accumulate print progress lines
        coco_dt = coco_gt.loadRes(copy.deepcopy(results))  # loadRes adds keys to the dicts it gets
        ev = COCOeval(coco_gt, coco_dt, iouType="bbox")
        ev.params.imgIds = sorted(image_ids)
        ev.evaluate()
        ev.accumulate()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ev.summarize()
    if verbose:
        print(out.getvalue(), end="")
    # COCOeval reports -1 where a category/area has no ground truth; keep it (the user sees why).
    return {k: float(v) for k, v in zip(STAT_NAMES, np.asarray(ev.stats).tolist())}


class CocoEvaluator:
    """Collects detections per image and evaluates them against a COCO ground truth.

    Args:
        coco_gt: the ground truth (``dataset.coco`` of a :class:`~peg_detr.data.CocoDetr`).
    """

    def __init__(self, coco_gt: COCO) -> None:
        self.coco_gt = coco_gt
        self.predictions: dict[int, dict[str, Tensor]] = {}
        self.evaluated_ids: list[int] = []  #: image ids of the last summarize (all ranks)

    def update(self, predictions: Mapping[int, Mapping[str, Tensor]]) -> None:
        """Add ``{image_id: {"scores", "labels", "boxes" xyxy abs}}`` (post-processor output)."""
        for image_id, pred in predictions.items():
            self.predictions[int(image_id)] = {k: v.detach().cpu() for k, v in pred.items()}

    def gather(self) -> tuple[list[dict[str, Any]], list[int]]:
        """COCO results and image ids of all processes, one entry per image id."""
        merged: dict[int, list[dict[str, Any]]] = {}
        for part in all_gather_object({i: to_coco_results({i: p}) for i, p in self.predictions.items()}):
            merged.update(part)  # a padded duplicate carries the same image, same detections
        image_ids = sorted(merged)
        return [r for i in image_ids for r in merged[i]], image_ids

    def summarize(self, verbose: bool = True) -> dict[str, float]:
        """Gather, evaluate and return the 12 numbers (same on every rank)."""
        results, image_ids = self.gather()
        if not image_ids:
            raise RuntimeError("CocoEvaluator.summarize: no image was evaluated (empty validation set?)")
        self.evaluated_ids = image_ids
        return coco_stats(self.coco_gt, results, image_ids, verbose=verbose)

    def write_results(self, path: str | Path) -> Path:
        """Write the gathered detections as a COCO results json (call on every rank; rank 0 writes)."""
        results, _ = self.gather()
        path = Path(path)
        if not is_main_process():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results))
        return path


@torch.no_grad()
def evaluate_coco(
    model: nn.Module,
    postprocessor: nn.Module,
    loader: Any,
    coco_gt: COCO,
    ctx: RunContext,
    split: str,
    total: int,
) -> dict[str, float]:
    """COCO bbox numbers of ``model`` on ``loader`` (merged over ranks), plus ``images``: how many were evaluated.

    ``loader`` yields :class:`~peg_core.engine.SampleBatch` es of ``(ImageBatch, targets)``; broken
    images are logged under ``split`` by ``ctx.batches`` and left out of the evaluation.  Boxes are
    rescaled to each image's ``orig_size``, so the numbers do not depend on the evaluation
    resolution's coordinate frame.
    """
    model.eval()
    evaluator = CocoEvaluator(coco_gt)
    for samples, targets in ctx.batches(loader, split, total=total):
        with ctx.autocast():
            outputs = model(samples.to(ctx.device))
        sizes = torch.stack([t["orig_size"] for t in targets]).to(ctx.device)
        results = postprocessor(to_float(outputs), sizes)
        evaluator.update({int(t["image_id"]): r for t, r in zip(targets, results)})
    stats: dict[str, float] = evaluator.summarize(verbose=False)
    return {**stats, "images": len(evaluator.evaluated_ids)}
