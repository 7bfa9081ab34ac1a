"""``python -m peg_video train|eval``: the command lines; ``peg_core.engine`` runs them.

``train`` fits the video model on Kinetics-format annotations (one process, or many under
``torchrun``): AdamW with linear warm-up and per-step cosine decay, label smoothing,
multi-view evaluation every ``--eval-every`` epochs.  ``OUTPUT_DIR`` gets ``checkpoint.pth``
(every epoch; ``checkpoint_prev.pth`` before it), ``classes.json``, ``args.json``,
``log.jsonl`` + ``tb/`` and ``report.json`` (metrics, broken videos with reasons).
``--resume auto`` continues exactly where a run stopped.  ``--dataset ssv2|ucf101|hmdb51|folder``
with ``--data-root DIR`` reads those data sets' official files instead of ``--train-ann`` /
``--val-ann`` (see ``docs/data.md``), with their protocol defaults (SSv2: segment sampling, no flip).

``eval`` evaluates a checkpoint with the multi-view protocol; data and view options default
to the training run's, and ``--num-frames`` / ``--crop`` may differ from training.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path
from typing import Any

from peg_core.engine import (
    add_eval_args,
    add_train_args,
    evaluate_checkpoint,
    fit,
    new_parser,
    nonnegative_float,
    parse_with_config,
    positive_int,
    positive_int_list,
    unit_fraction,
)
from peg_core.engine.recipes import add_recipe_args

from .configs import CONFIGS
from .data.datasets import DATASETS, SPLIT_DATASETS
from .evaluation import REDUCTIONS
from .models import VIT_CONFIGS, list_video_models
from .models.vit import POS_ENCODINGS
from .task import VideoTask

__all__ = [
    "build_eval_parser",
    "build_parser",
    "evaluate",
    "main_eval",
    "main_train",
    "parse_args",
    "parse_eval_args",
    "train",
]

#: defaults without ``--config``: the synthetic recipe's data and schedule, a full-size vit_tiny
DEFAULTS: dict[str, Any] = {**CONFIGS["synthetic_tiny"], "model_opts": {}}
BACKENDS = ("peg", "pytorchvideo")
SAMPLINGS = ("stride", "segment")


def _sized_list(count: int, what: str):
    def parse(text: str) -> list[int]:
        values = positive_int_list(text)
        if len(values) != count:
            raise argparse.ArgumentTypeError(f"expected {count} comma-separated {what}, got {text!r}")
        return values

    return parse


scale_range = _sized_list(2, "sizes MIN,MAX")
tubelet_size = _sized_list(3, "sizes T,H,W")


class _ModelOpt(argparse.Action):
    """``--model-opt KEY=VALUE``: adds one keyword to ``model_opts`` (the recipe's and earlier ones)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        key, sep, text = str(values).partition("=")
        if not sep or not key.isidentifier():
            parser.error(f"argument --model-opt: expected KEY=VALUE, got {values!r}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text  # a bare word: a string option such as attention=divided
        namespace.model_opts = {**(namespace.model_opts or {}), key: value}
        namespace.explicit_model_opts = {**getattr(namespace, "explicit_model_opts", {}), key: value}


def split_arg(text: str) -> int | str:
    """``argparse`` type of ``eval --split``: 1, 2, 3 or ``all``."""
    if text.strip().lower() == "all":
        return "all"
    if text.strip() in ("1", "2", "3"):
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 1, 2, 3 or all, got {text!r}")


def _add_view_args(g: argparse._ArgumentGroup) -> None:
    """Data / view flags that ``train`` and ``eval`` share (``eval`` defaults them to the run's)."""
    g.add_argument(
        "--dataset",
        choices=DATASETS,
        help="kinetics: --train-ann/--val-ann files; others: the official files under --data-root "
        "(see docs/data.md)",
    )
    g.add_argument("--data-root", type=Path, help="folder of an ssv2 / ucf101 / hmdb51 / folder data set")
    g.add_argument(
        "--sampling",
        choices=SAMPLINGS,
        help="stride: --num-frames frames --stride apart; segment: one frame per 1/num-frames of the "
        "video (default: segment for ssv2, else stride)",
    )
    g.add_argument("--val-ann", type=Path, help="validation annotations: Kinetics CSV or 'path label' list")
    g.add_argument("--val-root", type=Path, help="folder of the validation videos (default: beside the file)")
    g.add_argument(
        "--data-backend",
        choices=BACKENDS,
        help="peg: this project's decord dataset; pytorchvideo: its labeled_video_dataset (decord)",
    )
    g.add_argument("--num-frames", type=positive_int, help="frames per clip")
    g.add_argument("--stride", type=positive_int, help="step between the frames of a clip")
    g.add_argument("--crop", type=positive_int, help="crop side in pixels")
    g.add_argument("--test-scale", type=positive_int, help="short side before the test crops")
    g.add_argument("--num-clips", type=positive_int, help="test clips per video")
    g.add_argument("--num-crops", type=int, choices=(1, 3), help="test crops per clip")
    g.add_argument("--reduction", choices=REDUCTIONS, help="fusion of a video's views")


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``train``; ``--config NAME`` supplies defaults that flags override."""
    p = new_parser("python -m peg_video train", __doc__)
    add_train_args(p, output_dir="runs/video", configs=CONFIGS)
    g = p.add_argument_group("data")
    g.add_argument(
        "--train-ann",
        type=Path,
        help="training annotations of --dataset kinetics: Kinetics CSV or 'path label' list",
    )
    g.add_argument(
        "--split", type=int, choices=(1, 2, 3), help="official split of ucf101 / hmdb51 (default 1)"
    )
    g.add_argument("--train-root", type=Path, help="folder of the training videos (default: beside the file)")
    g.add_argument(
        "--classes",
        type=Path,
        help="JSON class list; default: classes.json beside --train-ann "
        "for integer-labelled lists, else the sorted label names",
    )
    _add_view_args(g)
    g.add_argument("--train-scale", type=scale_range, metavar="MIN,MAX", help="random short side in training")
    g.add_argument(
        "--hflip",
        action=argparse.BooleanOptionalAction,
        help="random horizontal flips (refused for ssv2, whose labels say left / right)",
    )
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=list_video_models())
    m.add_argument("--pos-enc", choices=POS_ENCODINGS)
    m.add_argument("--tubelet", type=tubelet_size, metavar="T,H,W", help="tubelet of the ViT, e.g. 2,16,16")
    m.add_argument(
        "--model-opt",
        dest="model_opts",
        action=_ModelOpt,
        metavar="KEY=VALUE",
        help="extra build_video_model keyword (repeatable), e.g. depth=4",
    )
    m.add_argument(
        "--init-2d", type=Path, metavar="PATH", help="start from a 2D image checkpoint (a new run)"
    )
    m.add_argument("--init-2d-source", choices=("cpvt", "deit"), default="cpvt", help="layout of --init-2d")
    o = p.add_argument_group("optimisation")
    o.add_argument("--min-lr", type=nonnegative_float, help="learning rate at the end of the cosine")
    o.add_argument("--weight-decay", type=nonnegative_float)
    o.add_argument("--warmup-epochs", type=nonnegative_float, help="linear warm-up (fractions allowed)")
    o.add_argument("--label-smoothing", type=unit_fraction)
    add_recipe_args(p)
    p.set_defaults(**DEFAULTS, data_backend="peg", reduction="mean", dataset="kinetics")
    return p


def _check_dataset(p: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> None:
    """``--dataset`` against the data flags; fills the data set's protocol defaults (sampling, flip, split)."""
    if args.dataset == "kinetics":
        if args.train_ann is None:
            p.error("the following arguments are required with --dataset kinetics: --train-ann")
        if args.data_root is not None:
            p.error("argument --data-root: not used by --dataset kinetics (give --train-ann / --val-ann)")
    else:
        if args.data_root is None:
            p.error(f"the following arguments are required with --dataset {args.dataset}: --data-root")
        for flag in ("train_ann", "val_ann", "train_root", "val_root"):
            if getattr(args, flag) is not None:
                p.error(f"argument --{flag.replace('_', '-')}: not used by --dataset {args.dataset} "
                        "(it reads its official files under --data-root)")  # fmt: skip
    if args.split is not None and args.dataset not in SPLIT_DATASETS:
        p.error(f"argument --split: {args.dataset} has no official splits (only {', '.join(SPLIT_DATASETS)})")
    args.split = (args.split or 1) if args.dataset in SPLIT_DATASETS else None
    if args.dataset == "ssv2":
        if any(a == "--hflip" for a in argv):
            p.error(
                'argument --hflip: refused for ssv2: its labels name directions ("from left to right"), '
                "so a flipped clip contradicts its label"
            )
        args.hflip = False  # whatever a recipe made for another data set says
    if args.sampling is None:
        args.sampling = "segment" if args.dataset == "ssv2" else "stride"
    if args.sampling == "segment" and args.data_backend == "pytorchvideo":
        p.error("argument --sampling: segment sampling needs --data-backend peg")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``train`` arguments (recipe defaults, then flags) and check the options against each other."""
    p = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_with_config(p, argv, CONFIGS)
    _check_dataset(p, args, argv)
    explicit = vars(args).pop("explicit_model_opts", {})
    recipe = CONFIGS[args.config] if args.config else DEFAULTS
    if args.model != recipe["model"]:
        args.model_opts = explicit  # the recipe's model options belong to its own model
    if args.train_scale[0] > args.train_scale[1]:
        p.error(f"argument --train-scale: MIN must not exceed MAX, got {_csv(args.train_scale)}")
    if args.train_scale[0] < args.crop:
        p.error(f"argument --train-scale: {_csv(args.train_scale)} must be >= --crop {args.crop}")
    if args.test_scale < args.crop:
        p.error(f"argument --test-scale: {args.test_scale} must be >= --crop {args.crop}")
    if args.model in VIT_CONFIGS:
        t, h, w = args.tubelet
        if args.num_frames % t or args.crop % h or args.crop % w:
            p.error(
                f"--num-frames {args.num_frames} and --crop {args.crop} must be multiples of "
                f"--tubelet {_csv(args.tubelet)}"
            )
    if args.min_lr > args.lr:
        p.error(f"argument --min-lr: {args.min_lr} must not exceed --lr {args.lr}")
    return args


def _csv(values: list[int]) -> str:
    return ",".join(map(str, values))


def build_eval_parser() -> argparse.ArgumentParser:
    """Arguments of ``eval``; unset data and view options come from the checkpoint's run."""
    p = new_parser(
        "python -m peg_video eval",
        "Multi-view evaluation of a checkpoint; data and view options default to the ones it was trained with.",
    )
    add_eval_args(p)
    g = p.add_argument_group("data and views (default: the training run's)")
    _add_view_args(g)
    g.add_argument(
        "--split",
        type=split_arg,
        help="ucf101 / hmdb51 test list 1, 2, 3, or all: each of the three and their mean (one checkpoint "
        "on all three lists; the published protocol trains one model per split)",
    )
    g.add_argument(
        "--pos-interpolation",
        choices=("nearest", "bilinear", "bicubic"),
        help="resize mode of a learned table's spatial part at another crop (default: the trained one)",
    )
    return p


def parse_eval_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_eval_parser().parse_args(argv)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train as ``args`` say (see :func:`parse_args`); returns the report (also in ``report.json``)."""
    return fit(VideoTask(), args)


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate ``args.checkpoint`` (see :func:`parse_eval_args`); returns the report."""
    return evaluate_checkpoint(VideoTask(), args)


def _print_result(report: dict[str, Any]) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        broken = {split: log["count"] for split, log in report["broken"].items()}
        print(json.dumps({**report["eval"], "broken": broken, "status": report["status"]}), flush=True)


def main_train(argv: list[str]) -> int:
    """``python -m peg_video train ...``; prints the final metrics as one JSON line."""
    _print_result(train(parse_args(argv)))
    return 0


def main_eval(argv: list[str]) -> int:
    """``python -m peg_video eval ...``; prints the metrics as one JSON line."""
    _print_result(evaluate(parse_eval_args(argv)))
    return 0
