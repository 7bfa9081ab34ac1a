"""Train DETR (PEG / sine / learned / none) on a COCO-format data set.

Single process::

    python -m peg_detr train --coco-path /data/coco --config cpvt_peg_50ep --output-dir runs/peg

Several GPUs / nodes (the recipe's ``--total-batch-size`` is split over the processes)::

    torchrun --nproc_per_node 8 -m peg_detr train --coco-path /data/coco --config cpvt_peg_50ep --output-dir runs/peg

Every epoch writes ``checkpoint.pth`` atomically (``--save-every N`` also keeps
``checkpointNNNN.pth``); ``--resume auto`` continues from the output folder's
checkpoint exactly.  ``report.json`` holds the last evaluation (``eval.ap``,
``eval.ap50`` at ``--val-size``, ``eval.sizes`` per ``--eval-sizes``) and the
broken images that were skipped.  Evaluate a checkpoint with ``python -m peg_detr eval``.
"""

from __future__ import annotations

import argparse
from typing import Any

from peg_core.engine import add_train_args, fit, new_parser, parse_with_config

from .configs import CONFIGS
from .options import DEFAULTS, add_model_args, add_train_data_args, add_val_args
from .task import DetectTask

__all__ = ["build_parser", "main", "parse_train_args"]


def build_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_detr train", __doc__)
    add_train_args(p, output_dir="runs/detr", configs=CONFIGS)
    add_val_args(p, required=True)
    add_train_data_args(p)
    add_model_args(p)
    p.set_defaults(**DEFAULTS)
    return p


def parse_train_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``train`` flags; a ``--config`` recipe supplies defaults that explicit flags override."""
    return parse_with_config(build_parser(), argv, CONFIGS)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m peg_detr train ...``; returns the run's report (also in OUTPUT_DIR/report.json)."""
    return fit(DetectTask(), parse_train_args(argv))
