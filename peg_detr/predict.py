"""Inference with a trained DETR: :class:`Predictor` and the work of ``python -m peg_detr predict``.

    python -m peg_detr predict a.jpg b.png --checkpoint runs/detr/checkpoint.pth --threshold 0.7 --output-dir preds

(the parser is in :mod:`peg_detr.cli`).  For each input ``NAME.ext`` the output folder gets ``NAME.png`` with the boxes
and ``label score`` captions drawn by ``torchvision.utils.draw_bounding_boxes``,
and ``detections.json`` maps each input path to its detections
(``label``, ``name``, ``score``, ``box`` as ``[x0, y0, x1, y1]`` pixels).
A single unreadable image is an error; among several, unreadable ones are
skipped and listed in ``report.json`` (``broken``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.transforms.v2 import functional as F
from torchvision.utils import draw_bounding_boxes

from peg_core.engine import BrokenLog, BrokenSample, UserError, write_json

from .data import make_val_transforms, read_rgb, scaled_max_size
from .model import load_model

__all__ = ["Predictor", "predict_images"]


class Predictor:
    """A model restored from a ``peg_detr`` training checkpoint, ready for inference.

    Args:
        checkpoint: ``checkpoint.pth`` written by ``python -m peg_detr train``.
        size: evaluation short side (default: the training run's ``--val-size``).
        device: torch device string.
    """

    def __init__(self, checkpoint: str | Path, size: int | None = None, device: str = "cpu") -> None:
        loaded = load_model(checkpoint)
        model, self.postprocessor, meta = loaded.model, loaded.postprocess, loaded.meta
        self.device = torch.device(device)
        self.model: nn.Module = model.to(self.device).eval()
        self.names = {int(c["id"]): str(c["name"]) for c in meta.get("categories", [])}
        size = size or int(meta.get("val_size") or 800)
        self.transform = make_val_transforms(size, scaled_max_size(size), with_boxes=False)

    @torch.no_grad()
    def __call__(self, image: Tensor, threshold: float = 0.7) -> dict[str, Tensor]:
        """Detections on a uint8 ``(3, H, W)`` image: ``scores`` (n,), ``labels`` (n,), ``boxes`` (n, 4) xyxy px."""
        x = self.transform(image).to(self.device)
        outputs = self.model([x])
        sizes = torch.tensor([image.shape[-2:]], device=self.device)
        result = self.postprocessor(outputs, sizes)[0]
        keep = result["scores"] > threshold
        return {k: v[keep].cpu() for k, v in result.items()}

    def label_name(self, label: int) -> str:
        return self.names.get(label, str(label))


def _draw(image: Tensor, det: dict[str, Tensor], predictor: Predictor) -> Tensor:
    if len(det["boxes"]) == 0:
        return image
    captions = [
        f"{predictor.label_name(int(lb))} {float(s):.2f}" for lb, s in zip(det["labels"], det["scores"])
    ]
    return draw_bounding_boxes(image, det["boxes"], labels=captions, colors="yellow", width=2)


def _detections(det: dict[str, Tensor], predictor: Predictor) -> list[dict[str, Any]]:
    """JSON rows ``{label, name, score, box}`` of one image's detections."""
    return [
        {"label": int(lb), "name": predictor.label_name(int(lb)), "score": float(s), "box": b.tolist()}
        for lb, s, b in zip(det["labels"], det["scores"], det["boxes"])
    ]


def predict_images(
    images: list[Path], checkpoint: Path, output_dir: Path, threshold: float = 0.7, size: int | None = None,
    device: str = "cpu",
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Annotated ``NAME.png`` per image, ``detections.json`` and ``report.json`` in ``output_dir``.

    Returns ``{image path: detections}``.  One unreadable image alone is a :class:`UserError`;
    among several, unreadable ones are skipped and listed in ``report.json``.
    """
    predictor = Predictor(checkpoint, size=size, device=device)
    broken = BrokenLog("predict", len(images), max_fraction=1.0)
    detections: dict[str, list[dict[str, Any]]] = {}
    for path in images:
        try:
            image = F.pil_to_tensor(read_rgb(path))
        except BrokenSample as e:
            if len(images) == 1:
                raise UserError(e.reason, e.path) from None
            print(f"skipped {e.path}: {e.reason}")
            broken.add([(e.path, e.reason)])
            continue
        det = predictor(image, threshold)
        F.to_pil_image(_draw(image, det, predictor)).save(output_dir / f"{path.stem}.png")
        detections[str(path)] = _detections(det, predictor)
        print(f"{path}: {len(detections[str(path)])} detection(s)")
    broken.check(nothing_read=not detections)
    (output_dir / "detections.json").write_text(json.dumps(detections, indent=2) + "\n")
    report = {"task": "detect", "command": "predict", "checkpoint": str(checkpoint), "images": len(detections),
              "broken": {"predict": broken.report()}, "output_dir": str(output_dir)}  # fmt: skip
    write_json(output_dir / "report.json", report)
    return detections
