"""Inference with a trained DETR: :class:`Predictor` and the work of ``python -m peg_detr predict``.

    from peg_detr.predict import Predictor
    predictor = Predictor.from_checkpoint("runs/detr/checkpoint.pth", device="cpu", threshold=0.5)
    print(predictor.predict_files(["a.jpg"])[0].line())

``predictor(inputs)`` takes image files, PIL images, numpy arrays ``(H, W, C)`` or tensors
``(C, H, W)`` (uint8, or float in ``[0, 1]``; see :mod:`peg_core.engine.predictor`) and returns one
:class:`Prediction` per input: :class:`Detection` s (``label``, ``name``, ``score``, ``box`` as
``[x0, y0, x1, y1]`` pixels of the input) above the threshold, or the reason it was skipped.

``python -m peg_detr predict a.jpg b.png --checkpoint CKPT --output-dir preds`` (the parser is in
:mod:`peg_detr.cli`) writes ``NAME.png`` per input with the boxes and ``label score`` captions
(:func:`draw_detections`: at least 512 px on the long side, captions on a filled background;
inputs of the same name get distinct pictures, ``a_x.png`` and ``b_x.png``), ``detections.json``
mapping each input path to its detections, and ``report.json``.  A missing or unreadable image is
skipped and listed in ``report.json`` (``broken``); none readable is an error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor, nn
from torchvision.transforms.v2 import functional as F

from peg_core.engine import BrokenSample, output_names
from peg_core.engine.checkpoint import LoadedModel
from peg_core.engine.cli import MAX_IMAGE_SIDE
from peg_core.engine.predict_cli import missing_reason
from peg_core.engine.predictor import FilePredictor, check_fraction, check_int, resolve_device
from peg_core.engine.predictor import Prediction as _Base
from peg_core.errors import InputError
from peg_core.interop.resolve import resolve_weights

from .archs import arch_named
from .data import (
    LabelMap,
    make_rtdetr_val_transforms,
    make_val_transforms,
    read_rgb,
    scaled_max_size,
)
from .model import load_hf_model, load_model
from .models.rtdetr import RTDETR

__all__ = ["MIN_CANVAS", "Detection", "Prediction", "Predictor", "draw_detections", "predict_images"]

#: the annotated PNG's long side is at least this many pixels (small inputs are upscaled)
MIN_CANVAS = 512
#: caption font height as a fraction of the canvas's long side (about 14 px at 512 px)
FONT_FRACTION = 1 / 36
#: one colour per class id (cycled), readable with black caption text
PALETTE = ((255, 214, 0), (0, 200, 255), (255, 96, 160), (120, 230, 90), (255, 150, 40), (190, 140, 255))


@dataclass
class Detection:
    """One detected object: category id, its name, score and box ``[x0, y0, x1, y1]`` in input pixels.

    ``label`` is the annotation file's category id whatever the run's ``--labels`` (a
    ``contiguous`` model's label is mapped back through the checkpoint's label map).
    """

    label: int
    name: str
    score: float
    box: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "score": self.score, "box": self.box}


@dataclass
class Prediction(_Base):
    """The detections of one input, best score first (``skipped``: why there are none)."""

    detections: list[Detection] = field(default_factory=list)

    def result_text(self) -> str:
        shown = ", ".join(f"{d.name} {d.score:.2f}" for d in self.detections)
        n = len(self.detections)
        return f"{n} detection{'' if n == 1 else 's'}" + (f" ({shown})" if shown else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "detections": [d.to_json() for d in self.detections],
            "skipped": self.skipped,
        }


class Predictor(FilePredictor):
    """A model restored from a ``peg_detr`` training checkpoint, ready for inference.

    The input pipeline is the one the checkpoint's evaluation used: for DETR (``arch`` ``detr``) a
    short-side resize and ImageNet normalisation, for RT-DETR (``arch`` ``rtdetr``) a square resize
    to ``size`` x ``size`` and pixels in ``[0, 1]``; the post-processor is the checkpoint's own
    (DETR's softmax, RT-DETR's sigmoid top-K over query x class pairs).

    Args:
        checkpoint: ``checkpoint.pth`` written by ``python -m peg_detr train``, or a Hugging Face
            DETR / RT-DETR folder or hub id (its ``id2label`` names the labels).
        size: evaluation short side, or RT-DETR's square side (default: the training run's ``--val-size``).
        device: torch device string.
        threshold: detections scoring at most this are left out.

    Bad options are a ``TypeError`` / ``ValueError`` naming them (``threshold="0.5"``), and a device
    this machine lacks one ``ValueError``, before the checkpoint is read.  An image too elongated
    for the model's input (a 1 x 400 px strip, whose short side DETR's resize would make 0 px)
    is a skipped prediction for a file (:meth:`load` raises :class:`BrokenSample`), a ``ValueError``
    for an in-memory input.
    """

    input_kind = "image"  # paths, PIL images, arrays and tensors: peg_core.engine.predictor.as_image

    def __init__(
        self, checkpoint: str | Path, size: int | None = None, device: str = "cpu", threshold: float = 0.7
    ) -> None:
        self.device = resolve_device(device)
        self.threshold = check_fraction(threshold, "threshold")
        if size is not None:
            size = check_int(size, "size", 1, MAX_IMAGE_SIDE)
        loaded = _load(checkpoint)
        model, self.postprocessor, meta = loaded.model, loaded.postprocess, loaded.meta
        self.model: nn.Module = model.to(self.device).eval()
        # label -> category id and name (the run's --labels); detections carry the category ids
        self.label_map = LabelMap.from_meta(meta)
        self.arch = str(loaded.config.get("arch", "detr"))
        self.size = size or _run_val_size(meta, loaded.args, self.arch)
        self.transform = _input_transform(self.arch, self.size)
        if isinstance(model, RTDETR):  # too few encoder cells for its queries: an InputError, not every image
            model.check_input_size(self.size, self.size, f"size {self.size}")

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device: str = "cpu", **options: Any) -> Predictor:
        """``options``: ``threshold`` (0.7), ``size`` (the run's ``--val-size``).

        ``path`` may also be a Hugging Face DETR / RT-DETR folder or hub id (``"PekingU/rtdetr_r50vd"``,
        fetched once into the hub cache): :func:`~peg_detr.model.load_hf_model`.
        """
        return cls(path, device=device, **options)

    def read(self, path: str) -> Tensor:
        """The uint8 ``(3, H, W)`` pixels of ``path``; :class:`BrokenSample` when unreadable."""
        return F.pil_to_tensor(read_rgb(path))

    def prepare(self, item: Tensor | Image.Image) -> Tensor:
        """:meth:`normalise`'s RGB PIL image or ``(3, H, W)`` tensor -> a ``(3, H, W)`` tensor :meth:`detect` takes."""
        image = F.pil_to_tensor(item) if isinstance(item, Image.Image) else item
        self._check_fits(image)
        return image

    def _check_fits(self, image: Tensor) -> None:
        """An :class:`InputError` when DETR's resize would leave ``image`` without a pixel on its short side."""
        if arch_named(self.arch).square_inputs:  # a square resize: any image fits
            return
        h, w = image.shape[-2:]
        short, long = min(h, w), max(h, w)
        max_size = scaled_max_size(self.size)
        # torchvision's Resize(size, max_size) (_compute_resized_output_size): the short side to size,
        # unless the long side would pass max_size
        new_long = int(self.size * long / short)
        new_short = self.size if new_long <= max_size else int(max_size * self.size / new_long)
        if new_short < 1:
            raise InputError(
                f"a {w} x {h} px image is too elongated for the model's input: its short side would be "
                f"0 px at size {self.size} (long side at most {max_size})"
            )

    @torch.no_grad()
    def detect(self, image: Tensor, threshold: float | None = None) -> dict[str, Tensor]:
        """Raw detections on a uint8 ``(3, H, W)`` image: ``scores`` (n,), ``labels`` (n,), ``boxes`` (n, 4) xyxy px."""
        threshold = self.threshold if threshold is None else check_fraction(threshold, "threshold")
        x = self.transform(image).to(self.device)
        outputs = self.model([x])
        sizes = torch.tensor([image.shape[-2:]], device=self.device)
        result = self.postprocessor(outputs, sizes)[0]
        keep = result["scores"] > threshold
        order = result["scores"][keep].argsort(descending=True)
        return {k: v[keep][order].cpu() for k, v in result.items()}

    def run(self, paths: list[str | None], items: list[Tensor]) -> list[Prediction]:
        return [self._prediction(path, self.detect(image)) for path, image in zip(paths, items)]

    def skipped(self, path: str, reason: str) -> Prediction:
        return Prediction(path, skipped=reason)

    def label_name(self, label: int) -> str:
        """The category name of a predicted ``label`` (its number when no category has it)."""
        return self.label_map.name(label) or str(label)

    def _prediction(self, path: str | None, det: dict[str, Tensor]) -> Prediction:
        # a contiguous label past the last category (a larger --num-classes) has no category: left out
        ids = self.label_map.category_ids_of(det["labels"])
        found = [
            Detection(int(c), self.label_name(int(lb)), float(s), b.tolist())
            for lb, c, s, b in zip(det["labels"], ids, det["scores"], det["boxes"])
            if c >= 0
        ]
        return Prediction(path, detections=found)


def _load(checkpoint: str | os.PathLike) -> LoadedModel:
    """A training checkpoint (:func:`load_model`), or a Hugging Face folder / hub id (:func:`load_hf_model`)."""
    path = resolve_weights(checkpoint, kind="folder").path  # a Path or an existing path stays itself
    if path.is_dir() and (path / "config.json").is_file():
        return load_hf_model(path)
    return load_model(checkpoint)


def _run_val_size(meta: dict[str, Any], args: dict[str, Any], arch: str) -> int:
    """The training run's ``--val-size`` (its ``meta``, else its ``args``), else the architecture's default."""
    for source in (meta, args):
        if source.get("val_size"):
            return int(source["val_size"])
    return arch_named(arch).eval_size


def _input_transform(arch: str, size: int) -> Callable[[Tensor], Tensor]:
    """A uint8 ``(3, H, W)`` image -> the float model input its architecture evaluates on (no boxes)."""
    if arch_named(arch).square_inputs:
        return make_rtdetr_val_transforms(size, with_boxes=False)  # (3, size, size) in [0, 1]
    return make_val_transforms(size, scaled_max_size(size), with_boxes=False)


# ------------------------------------------------------------------------------------------ drawing


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """PIL's bundled font at ``size`` px (Pillow >= 10.1); the fixed bitmap font before that."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: no size argument
        return ImageFont.load_default()


def caption_height(canvas_side: int) -> int:
    """Height in pixels of a caption's filled background on a canvas whose long side is ``canvas_side``."""
    font_px = max(11, round(canvas_side * FONT_FRACTION))
    return font_px + 2 * max(2, font_px // 5)


def draw_detections(image: Tensor | Image.Image, detections: list[Detection]) -> Image.Image:
    """The image with its boxes and ``name score`` captions, upscaled to at least :data:`MIN_CANVAS` px.

    Boxes, line width and font scale with the canvas, so a 64 px input and a 1333 px one get the
    same proportions; each caption sits on a filled box of its class colour above its box (inside
    it when there is no room above).
    """
    pil = F.to_pil_image(image) if isinstance(image, Tensor) else image.convert("RGB")
    scale = max(1.0, MIN_CANVAS / max(pil.size))
    canvas = pil.resize((round(pil.width * scale), round(pil.height * scale)), Image.Resampling.BICUBIC)
    side = max(canvas.size)
    width = max(2, round(side / 256))
    text_h = caption_height(side)
    pad = max(2, (text_h - round(side * FONT_FRACTION)) // 2)
    font = _font(text_h - 2 * pad)
    draw = ImageDraw.Draw(canvas)
    for d in detections:
        color = PALETTE[d.label % len(PALETTE)]
        x0, y0, x1, y1 = (v * scale for v in d.box)
        draw.rectangle([x0, y0, x1, y1], outline=color, width=width)
        text = f"{d.name} {d.score:.2f}"
        bx0, by0, bx1, by1 = draw.textbbox((0, 0), text, font=font)  # the glyphs' own extent
        text_w = math.ceil(bx1 - bx0) + 2 * pad
        top = y0 - text_h if y0 >= text_h else y0  # above the box, else inside its top edge
        left = min(max(0.0, x0), max(0.0, canvas.width - text_w))
        draw.rectangle([left, top, left + text_w, top + text_h - 1], fill=color)
        # centred in the band, descenders included, so no glyph spills onto the box
        draw.text((left + pad - bx0, top + (text_h - (by1 - by0)) / 2 - by0), text, fill=(0, 0, 0), font=font)
    return canvas


# ------------------------------------------------------------------------------- the predict verb


def predict_images(
    images: Sequence[str | os.PathLike], checkpoint: str | os.PathLike, output_dir: str | os.PathLike,
    threshold: float = 0.7, size: int | None = None, device: str = "cpu", names: Sequence[str] | None = None,
    max_memory: int | None = None,
) -> list[Prediction]:  # fmt: skip
    """The detections of each image, in order, with its annotated copy and ``detections.json`` in ``output_dir``.

    ``names[i]`` is the picture of ``images[i]`` (default :func:`peg_core.engine.output_names`:
    ``NAME.png``, distinct for inputs of the same name); ``detections.json`` maps each image read
    to its detections.  A missing or unreadable image is a skipped :class:`Prediction` (no
    picture), never an exception.  The verb (``python -m peg_detr predict``) checks the outputs
    before and writes the report after (:mod:`peg_core.engine.predict_cli`).  With ``size``, a side whose
    largest tensor exceeds ``max_memory`` bytes (default: the machine's memory) is refused first.
    """
    output_dir = Path(output_dir)
    names = list(names) if names is not None else output_names(images, ".png")
    predictor = Predictor(checkpoint, size=size, device=device, threshold=threshold)
    if size is not None:  # a side whose largest tensor cannot fit: refused before any image is read
        from .task import check_side_memory

        limit = argparse.Namespace(max_memory=max_memory)
        check_side_memory(predictor.model, predictor.arch, [size], "--size", 1, limit, device)
    preds: list[Prediction] = []
    detections: dict[str, list[dict[str, Any]]] = {}
    for path, name in zip(images, names, strict=True):
        why = missing_reason(path)
        if why is not None:  # in the words of every predict verb
            preds.append(predictor.skipped(str(path), why))
            continue
        try:  # read here, not by predict_files: the pixels are drawn on too
            image = predictor.load(str(path))
        except BrokenSample as e:
            preds.append(predictor.skipped(str(path), e.reason))
            continue
        (pred,) = predictor.run([str(path)], [image])
        draw_detections(image, pred.detections).save(output_dir / name)
        detections[str(path)] = [d.to_json() for d in pred.detections]
        preds.append(pred)
    (output_dir / "detections.json").write_text(json.dumps(detections, indent=2) + "\n")
    return preds
