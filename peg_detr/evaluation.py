"""COCO bbox evaluation (faster-coco-eval by default, pycocotools as reference), merged across processes.

Each process adds the post-processed detections of the images it saw;
:meth:`CocoEvaluator.summarize` gathers them with
``peg_core.engine.distributed.all_gather_object``, keeps one copy per ``image_id`` (a
``DistributedSampler`` pads the last batch with repeated images), runs
``COCOeval`` and returns the 12 standard numbers.  Only the images that were
read are evaluated: a broken image (skipped by the data loader) is left out of
``imgIds`` rather than counted as all-missed, and :func:`evaluate_coco` reports
how many images the numbers cover.

Two backends compute the same 12 numbers: ``"faster"`` (faster-coco-eval's
C++ ``COCOeval_faster``, the default) and ``"pycocotools"`` (the reference
implementation).  The ground truth is always a pycocotools ``COCO`` (the data
set checks its json through it); the faster backend indexes a copy of its
``dataset`` dict once per :class:`CocoEvaluator`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from torchvision.ops import box_convert

from peg_core.engine import RunContext
from peg_core.engine.distributed import all_gather_object, is_main_process
from peg_core.errors import NonFiniteError, require

from .labels import LabelMap
from .structures import to_float

# Required dependencies of peg-detr: a broken installation says which package to install.
faster_coco_eval = require("faster_coco_eval", None, "faster-coco-eval", what="peg_detr")
COCO = require("pycocotools.coco", None, "pycocotools", what="peg_detr").COCO
COCOeval = require("pycocotools.cocoeval", None, "pycocotools", what="peg_detr").COCOeval

__all__ = [
    "BACKENDS",
    "STAT_NAMES",
    "CocoEvaluator",
    "coco_stats",
    "evaluate_coco",
    "faster_ground_truth",
    "to_coco_results",
]

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


#: COCO evaluation backends; the first is the default.
BACKENDS: tuple[str, ...] = ("faster", "pycocotools")
Backend = Literal["faster", "pycocotools"]


def faster_ground_truth(coco_gt: COCO | faster_coco_eval.COCO) -> faster_coco_eval.COCO:
    """The faster-coco-eval index of a ground truth (a copy of ``coco_gt.dataset``; the original is untouched)."""
    if isinstance(coco_gt, faster_coco_eval.COCO):
        return coco_gt
    # One level of copying is enough (the index adds keys to the dicts, it does not edit nested
    # values) and far cheaper than deepcopy; use_deepcopy=False also stops loadRes deep-copying results.
    dataset = {k: [dict(x) for x in v] if isinstance(v, list) else v for k, v in coco_gt.dataset.items()}
    with contextlib.redirect_stdout(io.StringIO()):
        return faster_coco_eval.COCO(dataset, use_deepcopy=False)


def to_coco_results(
    predictions: Mapping[int, Mapping[str, Tensor]], label_map: LabelMap | None = None
) -> list[dict[str, Any]]:
    """``{image_id: {"scores" (n,), "labels" (n,), "boxes" (n, 4) xyxy abs}}`` -> COCO results list.

    ``label_map`` turns labels into category ids; without one labels are the category ids
    (DETR's convention).  A contiguous label past the last category has none and is left out.
    Boxes become ``[x, y, w, h]`` floats.
    """
    results: list[dict[str, Any]] = []
    for image_id, pred in predictions.items():
        boxes = box_convert(pred["boxes"].detach().float().cpu().reshape(-1, 4), "xyxy", "xywh").tolist()
        scores = pred["scores"].detach().float().cpu().tolist()
        labels = pred["labels"].detach().cpu()
        ids = (labels if label_map is None else label_map.category_ids_of(labels)).tolist()
        results.extend(
            {"image_id": int(image_id), "category_id": int(c), "bbox": b, "score": float(s)}
            for b, s, c in zip(boxes, scores, ids)
            if label_map is None or c >= 0
        )
    return results


def coco_stats(
    coco_gt: COCO | faster_coco_eval.COCO,
    results: list[dict[str, Any]],
    image_ids: list[int],
    verbose: bool = True,
    backend: Backend = "faster",
) -> dict[str, float]:
    """Run the bbox evaluation over ``image_ids``; return ``{name: value}`` for the 12 numbers.

    Args:
        coco_gt: ground truth, a pycocotools ``COCO`` (or, for ``backend="faster"``, an index
            from :func:`faster_ground_truth`, which saves re-indexing on repeated calls).
        results: COCO results list (``image_id``, ``category_id``, ``bbox`` xywh, ``score``); not modified.
        image_ids: the images evaluated (those without detections count as all-missed).
        verbose: print the summary table.
        backend: ``"faster"`` (faster-coco-eval) or ``"pycocotools"`` (reference); same numbers.

    With no detections at all every number is 0 (pycocotools cannot load an
    empty result list).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown COCO evaluation backend {backend!r} (expected one of {BACKENDS})")
    if not results:
        if verbose:
            print("COCO eval: no detections; all metrics are 0")
        return dict.fromkeys(STAT_NAMES, 0.0)
    if backend == "pycocotools" and not isinstance(coco_gt, COCO):
        raise TypeError("the pycocotools backend needs a pycocotools COCO ground truth")
    with contextlib.redirect_stdout(io.StringIO()):  # loadRes/evaluate/accumulate print progress lines
        # loadRes adds keys (area, id, iscrowd, segmentation) to the dicts it gets: give it copies.
        results = [dict(r) for r in results]
        if backend == "faster":
            gt = faster_ground_truth(coco_gt)
            coco_dt = gt.loadRes(results)
            # print_function: its summary table goes to stdout like pycocotools' (default: a logger)
            ev = faster_coco_eval.COCOeval_faster(gt, coco_dt, iouType="bbox", print_function=print)
        else:
            coco_dt = coco_gt.loadRes(results)
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
    stats = np.asarray(ev.stats, dtype=np.float64)[: len(STAT_NAMES)]
    return {k: float(v) for k, v in zip(STAT_NAMES, stats.tolist())}


class CocoEvaluator:
    """Collects detections per image and evaluates them against a COCO ground truth.

    Args:
        coco_gt: the ground truth (``dataset.coco`` of a :class:`~peg_detr.data.CocoDetr`).
        backend: ``"faster"`` (faster-coco-eval, default) or ``"pycocotools"`` (reference).
        label_map: predicted labels -> category ids (default: labels are the ids).
    """

    def __init__(self, coco_gt: COCO, backend: Backend = "faster", label_map: LabelMap | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown COCO evaluation backend {backend!r} (expected one of {BACKENDS})")
        self.coco_gt = coco_gt
        self.backend = backend
        self.label_map = label_map
        self._faster_gt: faster_coco_eval.COCO | None = None  # built on first use, reused
        self.predictions: dict[int, dict[str, Tensor]] = {}
        self.evaluated_ids: list[int] = []  #: image ids of the last summarize (all ranks)

    def update(self, predictions: Mapping[int, Mapping[str, Tensor]]) -> None:
        """Add ``{image_id: {"scores", "labels", "boxes" xyxy abs}}`` (post-processor output)."""
        for image_id, pred in predictions.items():
            self.predictions[int(image_id)] = {k: v.detach().cpu() for k, v in pred.items()}

    def gather(self) -> tuple[list[dict[str, Any]], list[int]]:
        """COCO results and image ids of all processes, one entry per image id."""
        merged: dict[int, list[dict[str, Any]]] = {}
        mine = {i: to_coco_results({i: p}, self.label_map) for i, p in self.predictions.items()}
        for part in all_gather_object(mine):
            merged.update(part)  # a padded duplicate carries the same image, same detections
        image_ids = sorted(merged)
        return [r for i in image_ids for r in merged[i]], image_ids

    def summarize(self, verbose: bool = True) -> dict[str, float]:
        """Gather, evaluate and return the 12 numbers (same on every rank).

        A NaN/inf score or box (a diverged model) is a :class:`~peg_core.errors.NonFiniteError`,
        raised on every rank alike (it is found in the gathered results): the COCO code would
        otherwise fail on it or score it silently.
        """
        results, image_ids = self.gather()
        if not image_ids:
            raise RuntimeError("CocoEvaluator.summarize: no image was evaluated (empty validation set?)")
        bad = next((r for r in results if not all(map(math.isfinite, (r["score"], *r["bbox"])))), None)
        if bad is not None:
            raise NonFiniteError(
                f"the model's detections are not finite (image {bad['image_id']}: score {bad['score']}, "
                f"box {bad['bbox']})"
            )
        self.evaluated_ids = image_ids
        gt: COCO | faster_coco_eval.COCO = self.coco_gt
        if self.backend == "faster":
            if self._faster_gt is None:
                self._faster_gt = faster_ground_truth(self.coco_gt)
            gt = self._faster_gt
        return coco_stats(gt, results, image_ids, verbose=verbose, backend=self.backend)

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
    backend: Backend = "faster",
    label_map: LabelMap | None = None,
) -> dict[str, float]:
    """COCO bbox numbers of ``model`` on ``loader`` (merged over ranks), plus ``images``: how many were evaluated.

    ``loader`` yields :class:`~peg_core.engine.SampleBatch` es of ``(ImageBatch, targets)``; broken
    images are logged under ``split`` by ``ctx.batches`` and left out of the evaluation.  Boxes are
    rescaled to each image's ``orig_size``, so the numbers do not depend on the evaluation
    resolution's coordinate frame.  ``backend`` picks the COCO evaluation code (same numbers);
    ``label_map`` turns the predicted labels into category ids (default: they are the ids).
    """
    model.eval()
    evaluator = CocoEvaluator(coco_gt, backend, label_map)
    for samples, targets in ctx.batches(loader, split, total=total):
        with ctx.autocast():
            outputs = model(samples.to(ctx.device))
        sizes = torch.stack([t["orig_size"] for t in targets]).to(ctx.device)
        results = postprocessor(to_float(outputs), sizes)
        evaluator.update({int(t["image_id"]): r for t, r in zip(targets, results)})
    stats: dict[str, float] = evaluator.summarize(verbose=False)
    return {**stats, "images": len(evaluator.evaluated_ids)}
