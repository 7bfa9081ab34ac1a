"""``predict``: the top-k classes of images under a trained checkpoint (:class:`Predictor`).

    from peg_core.classify.predict import Predictor
    predictor = Predictor.from_checkpoint("runs/classify/checkpoint.pth", device="cpu", top_k=3)
    print(predictor.predict_files(["a.png", "b.png"])[0].line())

Inputs are image files, PIL images, numpy arrays ``(H, W, C)`` or tensors ``(C, H, W)`` (uint8,
or float in ``[0, 1]``; grey, RGBA and 16-bit images converted: see :mod:`peg_core.engine.predictor`);
each is resized and centre-cropped as in evaluation, at ``img_size`` or the training size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ..engine import MAX_IMAGE_SIDE, UserError
from ..engine.predictor import ClassPrediction, FilePredictor, check_int, resolve_device
from .data import folder_transform, load_image
from .model import load_model

__all__ = ["Prediction", "Predictor", "predict_files"]

#: the classifier's result: ``top`` = ``[(class name, probability), ...]``, best first
Prediction = ClassPrediction


class Predictor(FilePredictor):
    """A classifier restored from a ``peg_core train`` checkpoint; ``predictor(inputs) -> list[Prediction]``.

    Bad options are a ``TypeError`` / ``ValueError`` naming them, and a device this machine lacks
    one ``ValueError``, before the checkpoint is read.
    """

    input_kind = "image"  # paths, PIL images, arrays and tensors: peg_core.engine.predictor.as_image

    def __init__(
        self,
        checkpoint: str | os.PathLike,
        device: str | torch.device = "cpu",
        top_k: int = 5,
        img_size: int | None = None,
        batch_size: int = 32,
    ) -> None:
        self.device = resolve_device(device)
        top_k = check_int(top_k, "top_k")
        self.batch_size = check_int(batch_size, "batch_size")
        if img_size is not None:
            img_size = check_int(img_size, "img_size", 1, MAX_IMAGE_SIDE)
        loaded = load_model(checkpoint)
        self.model = loaded.model.to(self.device).eval()
        self.classes = loaded.classes
        self.top_k = min(top_k, len(self.classes))
        meta = loaded.meta
        self.img_size = img_size or int(meta["img_size"])
        self.transform = folder_transform(
            self.img_size, False, crop_ratio=float(meta.get("crop_ratio", 0.875)),
            mean=meta.get("mean", (0.5,) * 3), std=meta.get("std", (0.5,) * 3),
        )  # fmt: skip

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, device: str | torch.device = "cpu", **options: Any
    ) -> Predictor:
        """``options``: ``top_k`` (5), ``img_size`` (the training size), ``batch_size`` (32)."""
        return cls(path, device, **options)

    def read(self, path: str) -> Any:
        return load_image(path)

    def prepare(self, item: Any) -> torch.Tensor:
        """An RGB PIL image or a ``(3, H, W)`` tensor (:meth:`normalise`'s) -> ``(3, S, S)`` normalised float32."""
        return self.transform(item)

    def run(self, paths: list[str | None], items: list[torch.Tensor]) -> list[Prediction]:
        probs = self.model(torch.stack(items).to(self.device)).float().softmax(-1)
        values, indices = probs.topk(self.top_k, dim=-1)
        return [
            Prediction(path, top=[(self.classes[j], p) for j, p in zip(idx, v)])
            for path, v, idx in zip(paths, values.tolist(), indices.tolist())
        ]

    def skipped(self, path: str, reason: str) -> Prediction:
        return Prediction(path, skipped=reason)


def predict_files(
    checkpoint: str | os.PathLike,
    files: Sequence[str | os.PathLike],
    top_k: int = 5,
    img_size: int | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 32,
) -> list[Prediction]:
    """Classify ``files`` (:class:`Predictor`); a missing file is a :class:`UserError` before the model is read.

    A file that is not a readable image becomes a skipped :class:`Prediction`.
    """
    check_files_exist(files)
    predictor = Predictor(checkpoint, device, top_k=top_k, img_size=img_size, batch_size=batch_size)
    return predictor.predict_files(files)


def check_files_exist(files: Sequence[str | os.PathLike]) -> None:
    """A missing image is a mistyped path: one line before any work (an unreadable one is only skipped)."""
    for f in files:
        if not os.path.isfile(f):
            raise UserError("image not found", f)
