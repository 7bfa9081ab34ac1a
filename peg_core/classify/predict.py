"""``predict``: the top-k classes of image files under a trained checkpoint."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..engine import BrokenSample, UserError, read_checkpoint
from .data import folder_transform, load_image
from .model import load_model

__all__ = ["Prediction", "predict_files"]


@dataclass
class Prediction:
    """The classes of one file, best first (``skipped`` says why a file was not classified)."""

    path: str
    top: list[tuple[str, float]] = field(default_factory=list)
    skipped: str | None = None

    def line(self) -> str:
        if self.skipped is not None:
            return f"{self.path}: skipped ({self.skipped})"
        return f"{self.path}: " + ", ".join(f"{name} {p:.3f}" for name, p in self.top)


@torch.no_grad()
def predict_files(
    checkpoint: str | os.PathLike,
    files: Sequence[str | os.PathLike],
    top_k: int = 5,
    img_size: int | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 32,
) -> list[Prediction]:
    """Classify ``files`` (resized + centre-cropped as in evaluation, at ``img_size`` or the training size).

    A missing file is a :class:`UserError` (before the model is read); a file that is not a
    readable image becomes a skipped :class:`Prediction`.
    """
    for f in files:
        if not Path(f).is_file():
            raise UserError("image not found", f)
    ckpt = read_checkpoint(checkpoint, "classify")
    model = load_model(ckpt, checkpoint).model.to(device)
    meta = ckpt["meta"]
    classes = meta["classes"]
    tf = folder_transform(
        img_size or int(meta["img_size"]), False, crop_ratio=float(meta.get("crop_ratio", 0.875)),
        mean=meta.get("mean", (0.5,) * 3), std=meta.get("std", (0.5,) * 3),
    )  # fmt: skip
    out = [Prediction(str(f)) for f in files]
    ready: list[tuple[Prediction, torch.Tensor]] = []
    for pred in out:
        try:
            ready.append((pred, tf(load_image(pred.path))))
        except BrokenSample as e:
            pred.skipped = e.reason
    k = min(top_k, len(classes))
    for i in range(0, len(ready), batch_size):
        chunk = ready[i : i + batch_size]
        probs = model(torch.stack([x for _, x in chunk]).to(device)).float().softmax(-1)
        values, indices = probs.topk(k, dim=-1)
        for (pred, _), v, idx in zip(chunk, values.tolist(), indices.tolist()):
            pred.top = [(classes[j], p) for j, p in zip(idx, v)]
    return out
