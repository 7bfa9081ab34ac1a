"""The detector's own command-line flags (data, model, schedule), shared by ``train`` and ``eval``.

The common run flags (``--output-dir --resume --epochs --batch-size --lr
--workers --amp --device --seed`` ...) come from :mod:`peg_core.engine`.
Values are checked by argparse types, so a bad one is a one-line usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from peg_core.engine import (
    grid_arg,
    int_list,
    nonnegative_float,
    positive_int,
    positive_int_list,
    unit_fraction,
)

from .evaluation import BACKENDS
from .models import BACKBONES, DECODER_KEY_POS, POS_ENCODINGS

__all__ = [
    "add_model_args",
    "add_train_data_args",
    "add_val_args",
    "min_max",
    "model_kwargs_from_args",
    "sizes_or_off",
]

# argparse dests forwarded to peg_detr.build_detr as keywords when set (None: the builder's default).
_MODEL_OPTIONS = (
    "backbone_weights", "hidden_dim", "nheads", "enc_layers", "dec_layers", "dim_feedforward", "dropout",
    "peg_at", "decoder_key_pos", "learned_grid",
)  # fmt: skip


def sizes_or_off(text: str) -> list[int]:
    """``argparse`` type: ``"400,500,600"`` -> ``[400, 500, 600]``; ``""`` / ``off`` -> ``[]`` (disabled)."""
    if str(text).strip().lower() in ("", "off", "none"):
        return []
    return positive_int_list(text)


def min_max(text: str) -> list[int]:
    """``argparse`` type: ``"384,600"`` -> ``[384, 600]`` (two positive integers, min <= max)."""
    values = positive_int_list(text)
    if len(values) != 2 or values[0] > values[1]:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX with MIN <= MAX, e.g. 384,600; got {text!r}")
    return values


def add_val_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    """Where the validation split is and the sizes it is evaluated at (``train`` and ``eval``)."""
    g = p.add_argument_group("data")
    g.add_argument(
        "--coco-path",
        type=Path,
        required=required,
        help="folder with train2017/, val2017/, annotations/" + ("" if required else " (default: the run's)"),
    )
    g.add_argument("--val-json", help="validation json (default annotations/instances_val2017.json)")
    g.add_argument("--val-size", type=positive_int, help="short side at evaluation (headline numbers)")
    g.add_argument(
        "--eval-sizes",
        type=positive_int_list,
        help="comma-separated short sides to evaluate at, e.g. 512,800,1024 (default: --val-size)",
    )
    g.add_argument(
        "--coco-eval-backend",
        choices=BACKENDS,
        default=BACKENDS[0],
        help="COCO evaluation code: faster (faster-coco-eval, default) or pycocotools (reference); same numbers",
    )


def add_train_data_args(p: argparse.ArgumentParser) -> None:
    """The training split, its augmentation and the batch over all processes."""
    g = p.add_argument_group("training data")
    g.add_argument("--train-json", help="training json (default annotations/instances_train2017.json)")
    g.add_argument("--num-classes", type=positive_int, help="classifier size; default: max category id + 1")
    g.add_argument("--train-scales", type=positive_int_list, help="short sides of the multi-scale resize")
    g.add_argument("--max-size", type=positive_int, help="long-side cap of the training resize")
    g.add_argument(
        "--crop-resize", type=sizes_or_off, help="sizes before the random crop; '' or off disables it"
    )
    g.add_argument("--crop-size", type=min_max, help="MIN,MAX side of the random crop")
    g.add_argument(
        "--total-batch-size",
        type=positive_int,
        help="images per step over all processes, split over them (--batch-size, per process, wins)",
    )
    t = p.add_argument_group("schedule")
    t.add_argument("--lr-backbone", type=nonnegative_float, help="learning rate of the backbone")
    t.add_argument("--weight-decay", type=nonnegative_float, help="AdamW weight decay")
    t.add_argument("--lr-drop", type=positive_int, help="the lr is divided by 10 every this many epochs")


def add_model_args(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    m.add_argument("--backbone", choices=BACKBONES, help="CNN backbone (tiny: for CPU demos and tests)")
    m.add_argument(
        "--backbone-weights", type=Path, help="local ImageNet weights for the ResNet (nothing is downloaded)"
    )
    m.add_argument("--dilation", action="store_true", help="DC5: dilate the last ResNet stage")
    m.add_argument("--pos-enc", choices=POS_ENCODINGS, help="encoder position encoding")
    m.add_argument(
        "--peg-at", type=int_list, help="comma-separated encoder layers followed by a PEG (default: 0)"
    )
    m.add_argument("--decoder-key-pos", choices=DECODER_KEY_POS, help="cross-attention key positions")
    m.add_argument(
        "--learned-grid",
        type=grid_arg,
        help="HxW feature grid the learned table is built for (default: that of an 800x1333 image)",
    )
    m.add_argument("--hidden-dim", type=positive_int)
    m.add_argument("--nheads", type=positive_int)
    m.add_argument("--enc-layers", type=positive_int)
    m.add_argument("--dec-layers", type=positive_int)
    m.add_argument("--dim-feedforward", type=positive_int)
    m.add_argument("--dropout", type=unit_fraction)
    m.add_argument("--num-queries", type=positive_int)
    m.add_argument("--no-aux-loss", dest="aux_loss", action="store_false")
    m.add_argument(
        "--pretrained",
        type=Path,
        help="official DETR checkpoint (.pth) or Hugging Face DETR folder / weights file to start from",
    )


#: defaults of the detector flags (DETR's recipe); --config recipes and explicit flags override them
DEFAULTS: dict[str, Any] = {
    "epochs": 300, "lr": 1e-4, "lr_backbone": 1e-5, "weight_decay": 1e-4, "lr_drop": 200, "clip_max_norm": 0.1,
    "total_batch_size": 2, "train_scales": "480,512,544,576,608,640,672,704,736,768,800", "max_size": 1333,
    "crop_resize": "400,500,600", "crop_size": "384,600", "val_size": 800, "backbone": "resnet50",
    "pos_enc": "peg", "num_queries": 100,
}  # fmt: skip


def model_kwargs_from_args(args: argparse.Namespace, num_classes: int) -> dict[str, Any]:
    """Keyword arguments of :func:`peg_detr.build_detr` from parsed flags (unset options: the builder's default)."""
    kw: dict[str, Any] = {
        "backbone": args.backbone,
        "pos_enc": args.pos_enc,
        "num_classes": num_classes,
        "num_queries": args.num_queries,
        "dilation": args.dilation,
        "aux_loss": args.aux_loss,
    }
    for name in _MODEL_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            kw[name] = str(value) if isinstance(value, Path) else value
    return kw
