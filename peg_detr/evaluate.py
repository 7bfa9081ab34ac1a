"""Evaluate a DETR training checkpoint (COCO box AP), at one or several input sizes.

    python -m peg_detr eval --checkpoint runs/peg/checkpoint.pth --coco-path /data/coco --eval-sizes 512,800,1024

The model is rebuilt from the checkpoint; ``--coco-path``, ``--val-json`` and
``--val-size`` default to the training run's.  ``OUTPUT_DIR/report.json`` (the
checkpoint's folder by default) holds ``eval.ap`` / ``eval.ap50`` at
``--val-size``, ``eval.sizes`` (the 12 COCO numbers per size) and the images
that could not be read (left out of the evaluation, listed under ``broken``).
Works under ``torchrun`` (the images are split over the processes).
"""

from __future__ import annotations

import argparse
from typing import Any

from peg_core.engine import add_eval_args, evaluate_checkpoint, new_parser

from .options import add_val_args
from .task import DetectTask

__all__ = ["build_eval_parser", "main", "parse_eval_args"]


def build_eval_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_detr eval", __doc__)
    add_eval_args(p)
    add_val_args(p, required=False)
    return p


def parse_eval_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_eval_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m peg_detr eval ...``; returns the report (also in OUTPUT_DIR/report.json)."""
    return evaluate_checkpoint(DetectTask(), parse_eval_args(argv))
