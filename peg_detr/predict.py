"""Run a trained DETR on image files; write annotated images and a JSON of detections.

    python -m peg_detr predict a.jpg b.png --checkpoint runs/detr/checkpoint.pth --threshold 0.7 --out preds/

For each input ``NAME.ext`` the output folder gets ``NAME.png`` with the boxes
and ``label score`` captions drawn by ``torchvision.utils.draw_bounding_boxes``,
and ``detections.json`` maps each input path to its detections
(``label``, ``name``, ``score``, ``box`` as ``[x0, y0, x1, y1]`` pixels).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor, nn
from torchvision.transforms.v2 import functional as F
from torchvision.utils import draw_bounding_boxes

from peg_core.utils import load_checkpoint

from .data import make_val_transforms, scaled_max_size
from .train import build_model_from_args

__all__ = ["Predictor", "main"]


class Predictor:
    """A model restored from a ``peg_detr`` training checkpoint, ready for inference.

    Args:
        checkpoint: ``checkpoint.pth`` written by ``python -m peg_detr train``.
        size: evaluation short side (default: the training run's ``--val-size``).
        device: torch device string.
    """

    def __init__(self, checkpoint: str | Path, size: int | None = None, device: str = "cpu") -> None:
        ckpt = load_checkpoint(checkpoint)
        if "model_kwargs" not in ckpt or "model" not in ckpt:
            raise KeyError(
                f"{checkpoint} is not a peg_detr training checkpoint (no 'model_kwargs'/'model'); "
                "official DETR files go through `--pretrained` of `python -m peg_detr train`"
            )
        self.device = torch.device(device)
        model, _, self.postprocessor = build_model_from_args(dict(ckpt["model_kwargs"]))
        model.load_state_dict(ckpt["model"])
        self.model: nn.Module = model.to(self.device).eval()
        self.names = {int(c["id"]): str(c["name"]) for c in ckpt.get("categories", [])}
        size = size or int(ckpt.get("args", {}).get("val_size", 800))
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


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    p = argparse.ArgumentParser(prog="python -m peg_detr predict", description=__doc__)
    p.add_argument("images", nargs="+", type=Path)
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--threshold", type=float, default=0.7, help="keep detections scoring above this")
    p.add_argument("--out", type=Path, default=Path("predictions"))
    p.add_argument("--size", type=int, help="short side at inference (default: the run's --val-size)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.images if not f.is_file()]
    if missing:
        raise SystemExit(f"image file(s) not found: {', '.join(missing)}")

    predictor = Predictor(args.checkpoint, size=args.size, device=args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, list[dict[str, Any]]] = {}
    for path in args.images:
        with Image.open(path) as pil:
            image = F.pil_to_tensor(pil.convert("RGB"))
        det = predictor(image, args.threshold)
        F.to_pil_image(_draw(image, det, predictor)).save(args.out / f"{path.stem}.png")
        report[str(path)] = [
            {"label": int(lb), "name": predictor.label_name(int(lb)), "score": float(s), "box": b.tolist()}
            for lb, s, b in zip(det["labels"], det["scores"], det["boxes"])
        ]
        print(f"{path}: {len(report[str(path)])} detection(s)")
    (args.out / "detections.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
