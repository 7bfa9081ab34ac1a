"""The classifier's commands: ``python -m peg_core make-data|train|eval|predict``.

    python -m peg_core make-data data/shapes
    python -m peg_core train --config demo --output-dir runs/classify
    python -m peg_core train --config demo --data-root data/shapes --output-dir runs/classify_folder
    python -m peg_core eval --checkpoint runs/classify/checkpoint.pth --eval-sizes 36,48,72,96
    python -m peg_core predict --checkpoint runs/classify/checkpoint.pth data/shapes/val/*/00001.png

Each function takes the command's arguments (without the command name) and raises
:class:`~peg_core.engine.UserError` for a user error; :func:`peg_core.engine.dispatch` runs them
under the one-line failure policy.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..engine import (
    RESIZE_MODES,
    Summary,
    UserError,
    add_alias,
    add_arch_arg,
    add_class_map_arg,
    add_data_root_arg,
    add_eval_args,
    add_json_arg,
    add_layer_decay_arg,
    add_make_data_counts,
    add_num_heads_arg,
    add_pos_args,
    add_train_args,
    configs_command,
    device_arg,
    done_line,
    evaluate_checkpoint,
    explicit_options,
    fit,
    image_side,
    image_side_list,
    int_in,
    new_parser,
    nonnegative_float,
    parse_with_config,
    positive_float,
    positive_int,
    print_closing,
    run_reported,
    unit_fraction,
)
from ..engine.memory import check_memory
from ..engine.predict_cli import (
    add_predict_args,
    check_predict_outputs,
    finish_predict,
    predict_device,
    predict_paths,
)
from ..engine.recipes import add_recipe_args
from ..interop.resolve import format_public_models, resolve_weights_arg
from ..models.cpvt import CPVT_ENCODINGS, GLOBAL_POOLS
from .configs import CONFIGS, DEFAULTS, DESCRIPTIONS, PUBLIC_MODELS
from .data import AUGMENTS, NORMALIZE, check_layout, require_torchvision
from .make_data import FORMATS, write_shapes_folder
from .model import ARCHS, refuse_unused_pos_flags
from .predict import Predictor
from .shapes import CLASS_NAMES
from .task import ClassifyTask

__all__ = [
    "CONFIGS",
    "build_eval_parser",
    "build_make_data_parser",
    "build_predict_parser",
    "build_train_parser",
    "configs",
    "evaluate",
    "make_data",
    "parse_train_args",
    "predict",
    "train",
]

#: the generated shapes' split sizes (make-data's defaults, the demo recipe's)
NUM_TRAIN, NUM_VAL = DEFAULTS["num_train"], DEFAULTS["num_val"]
#: the closing lines' metrics: top-1 / top-5, at the training size
SUMMARY = Summary(("top1", "top5"), size_key="train_size")
#: the largest ``--patch-size``: ViTs use 8 to 32; a patch of 100000 would be a weight no memory holds
MAX_PATCH_SIDE = 256


def crop_ratio(text: str) -> float:
    """``argparse`` type: a fraction in ``(0, 1]`` (``0.875`` or ``87.5%``)."""
    value = unit_fraction(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1]; got {text!r}")
    return value


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (CPVT)")
    add_arch_arg(g, ARCHS, help="demo (small, for the generated shapes), a CPVT size, or cpvt "
                 "(the plain class: sizes from the flags); with --init FILE naming its model: the file's")  # fmt: skip
    g.add_argument("--init-timm", metavar="NAME",
                   help="--init FILE holds the weights of this timm model in timm's layout (e.g. "
                   "vit_small_patch16_rope_mixed_224, vit_small_patch16_dinov3): converted with "
                   "peg_core.from_timm, its architecture kept (needs timm)")  # fmt: skip
    add_class_map_arg(g)
    add_pos_args(g, CPVT_ENCODINGS)  # --pos-enc, the PEG group (peg: CPVT), --pos-interpolation
    add_alias(g, "--mode", dest="pos_interpolation", choices=RESIZE_MODES)
    g.add_argument("--global-pool", choices=GLOBAL_POOLS, help="token (class token) or avg (default: arch's)")
    g.add_argument("--embed-dim", type=positive_int, help="override the arch's width")
    g.add_argument("--depth", type=positive_int, help="override the arch's number of blocks")
    add_num_heads_arg(g)
    g.add_argument("--patch-size", type=int_in(1, MAX_PATCH_SIDE, "a patch side"),
                   help=f"override the arch's patch side (1..{MAX_PATCH_SIDE})")  # fmt: skip
    g.add_argument("--mlp-ratio", type=positive_float, help="override the arch's MLP width ratio")
    g.add_argument("--drop-path-rate", type=unit_fraction, help="stochastic depth (default 0)")


def _data_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    add_data_root_arg(g, aliases=["--data"], help="ImageFolder root: PATH/train/<class>/*.jpg, "
                      "PATH/val/<class>/*.jpg (default: the generated shapes)")  # fmt: skip
    g.add_argument("--img-size", type=image_side, help="training image side")
    # the generated shapes' counts (without --data-root)
    add_make_data_counts(g, num_train=NUM_TRAIN, num_val=NUM_VAL, aliases=[("--n-train", "--n-val")])
    g.add_argument("--augment", choices=AUGMENTS, help="folder training: flip-crop (default) or none")
    g.add_argument("--crop-ratio", type=crop_ratio,
                   help="folder evaluation: resize to size / ratio, centre-crop size (default 0.875)")  # fmt: skip
    g.add_argument("--normalize", choices=sorted(NORMALIZE),
                   help="pixel statistics: imagenet (folder default) or half (2x - 1, generated shapes)")  # fmt: skip


TRAIN_DOC = """Train a CPVT classifier on the generated shapes or an ImageFolder.

    python -m peg_core train --config demo --output-dir runs/classify
    python -m peg_core train --config demo --data-root data/shapes --output-dir runs/classify_folder

A file given to --init that names its model (a checkpoint's model_config, a timm model) gives the
architecture; model flags on the command line replace its entries (--pos-enc peg+rope-mixed adds a
PEG, which starts at zero).  Keys the file lacks keep their fresh initialisation, a learned table of
another grid is resized, a head of another number of classes is left out; any other mismatch is an
error naming the key.  The recipes: python -m peg_core configs; every flag in full: docs/cli.md.
"""

#: what ``train --init`` reads (:func:`~.model.read_init`)
INIT_HELP = (
    "starting weights: a checkpoint of peg_core train, a state dict (.pth, .safetensors) with the CPVT's "
    "keys (a DeiT after to-cpvt), a timm ViT file with --init-timm NAME, or by name: a Hugging Face id "
    "org/name[@rev] or timm:NAME, fetched once (HF_HUB_OFFLINE=1: the cache only)"
)


def build_train_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_core train", TRAIN_DOC)
    add_train_args(p, output_dir="runs/classify", configs=CONFIGS, init_help=INIT_HELP)
    _data_args(p)
    _model_args(p)
    g = p.add_argument_group("optimiser (AdamW, warm-up + cosine per step)")
    g.add_argument(
        "--weight-decay", type=nonnegative_float, help="AdamW weight decay (none on norms, biases, tokens)"
    )
    g.add_argument("--warmup-epochs", type=nonnegative_float, help="linear warm-up length in epochs")
    add_layer_decay_arg(g)
    add_recipe_args(p)
    p.set_defaults(**DEFAULTS)
    return p


def build_eval_parser() -> argparse.ArgumentParser:
    p = new_parser(
        "python -m peg_core eval", "Evaluate a classifier checkpoint at one or several input sizes."
    )
    add_eval_args(p, batch_size=128)
    g = p.add_argument_group("classify")
    add_data_root_arg(
        g, aliases=["--data"], help="ImageFolder root with val/ (default: the checkpoint's data)"
    )
    g.add_argument("--eval-sizes", type=image_side_list,
                   help="input sizes, e.g. 36,48,72,96 (default: 0.75, 1, 1.5, 2 x the training size)")  # fmt: skip
    g.add_argument("--pos-interpolation", choices=RESIZE_MODES,
                   help="resize mode of a learned table (default: the checkpoint's)")  # fmt: skip
    add_alias(g, "--mode", dest="pos_interpolation", choices=RESIZE_MODES)
    g.add_argument(
        "--num-val", type=positive_int, help="generated validation images (default: the training run's)"
    )
    add_alias(g, "--n-val", dest="num_val", type=positive_int)
    return p


def build_predict_parser() -> argparse.ArgumentParser:
    p = new_parser(
        "python -m peg_core predict",
        "Print the top-k classes of image files (the flags every predict shares: docs/cli.md).",
    )
    add_predict_args(p, noun="images")  # IMAGE..., --checkpoint, --output, --overwrite, --json, --debug
    p.add_argument("--top-k", type=positive_int, default=5, help="classes shown per image")
    p.add_argument("--img-size", type=image_side, help="input size (default: the training size)")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--device", type=device_arg, default="auto", help="auto | cpu | cuda | cuda:N")
    return p


def build_make_data_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_core make-data", "Write the generated shapes as an ImageFolder tree.")
    p.add_argument("out", type=Path, help="folder to create (OUT/train/<class>/, OUT/val/<class>/)")
    add_make_data_counts(p, num_train=NUM_TRAIN, num_val=NUM_VAL, aliases=[("--n-train", "--n-val")])
    p.add_argument("--img-size", type=image_side, default=DEFAULTS["img_size"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=sorted(FORMATS), default="png")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    add_json_arg(p)
    return p


# ------------------------------------------------------------------------------------------ commands


def make_data(argv: Sequence[str] | None = None) -> int:
    """Write the generated shapes as an ImageFolder tree (:func:`~.make_data.write_shapes_folder`)."""
    args = build_make_data_parser().parse_args(argv)
    counts = write_shapes_folder(
        args.out, args.num_train, args.num_val, args.img_size, args.seed, args.format
    )
    if not args.json:
        print(f"train on them: python -m peg_core train --config demo --data-root {args.out}")
    line = done_line("make-data", f"{counts['train']} train and {counts['val']} val images, {args.img_size} px, "
                     f"{len(CLASS_NAMES)} classes", args.out)  # fmt: skip
    print_closing(
        line, {"command": "make-data", **counts, "img_size": args.img_size, "out": str(args.out)}, args.json
    )
    return 0


def parse_train_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``train``'s arguments: ``--config NAME`` supplies the recipe's values, explicit flags override them.

    ``cli_flags`` lists the destinations the command line itself set: a ``--init`` file that names
    its model keeps its architecture except for those (:func:`~.model.init_model_config`).
    Position flags the model would ignore (``--peg-kernel-size`` without a PEG, ``--pos-interpolation``
    without a learned table) are a :class:`UserError` (:func:`~.model.refuse_unused_pos_flags`).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_with_config(build_train_parser(), argv, CONFIGS)
    args.cli_flags = sorted(explicit_options(build_train_parser, argv))
    if args.init_timm is not None and args.init is None:
        build_train_parser().error(
            "--init-timm needs --init (a file, timm:NAME or a hub id: the timm weights)"
        )
    if args.init is not None:  # a hub id or timm:NAME -> the local file (fetched once, cached)
        if os.fspath(args.init).startswith("timm:") and args.init_timm is None:
            args.init_timm = os.fspath(args.init)[len("timm:") :]  # timm's weights are in timm's layout
        resolve_weights_arg(args, "init", kind="file")
    if args.init is None:  # with --init FILE the model may be the file's: checked when it is read (task)
        refuse_unused_pos_flags(args, vars(args), f"--pos-enc {args.pos_enc}")
    return args


def train(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train (or resume) a classifier; returns the run report (``report.json``)."""
    args = parse_train_args(argv)
    if args.data_root is not None:
        require_torchvision()
        check_layout(args.data_root)  # before the output folder is made
    if args.init is not None and not args.init.is_file():
        raise UserError("--init weights not found", args.init)  # before the output folder is made
    return run_reported("train", args, lambda: fit(ClassifyTask(), args), SUMMARY)


def evaluate(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Evaluate a checkpoint (or a quantized ``.pt2``) at one or several sizes; returns the eval report."""
    args = build_eval_parser().parse_args(argv)
    if args.checkpoint.suffix == ".pt2":  # int8 models from 'peg_core quantize' run on the CPU
        if args.device.startswith("cuda"):
            raise UserError("quantized models run on the CPU only", f"--device {args.device}")
        args.device = "cpu"
    return run_reported("eval", args, lambda: evaluate_checkpoint(ClassifyTask(), args), SUMMARY)


def predict(argv: Sequence[str] | None = None) -> int:
    """Print (and with ``--output`` write) the top-k classes of image files (:mod:`peg_core.engine.predict_cli`).

    Returns 0 when at least one image was read (unreadable ones are skipped and listed); none
    read is a :class:`UserError` naming the first.
    """
    args = build_predict_parser().parse_args(argv)
    require_torchvision("predict")
    device = predict_device(args.device, args.threads)
    check_predict_outputs(args)  # before the model is read: nothing the user owns is overwritten
    predictor = Predictor.from_checkpoint(
        args.checkpoint, device, top_k=args.top_k, img_size=args.img_size, batch_size=args.batch_size
    )
    if args.img_size is not None:  # a side whose attention bias / table cannot fit: refused before any image
        shape = (args.batch_size, 3, args.img_size, args.img_size)
        check_memory(predictor.model, shape, where=f"--img-size {args.img_size}", args=args, device=device)
    finish_predict(args, predict_paths(predictor, args.files), task="classify", noun="images")
    return 0


def configs(argv: Sequence[str] | None = None) -> int:
    """``configs [NAME]``: the named recipes of ``train --config`` (:func:`peg_core.engine.configs_command`)."""
    return configs_command(
        argv or [], prog="python -m peg_core", configs=CONFIGS, train_parser=build_train_parser,
        descriptions=DESCRIPTIONS,
    )  # fmt: skip


def models(argv: Sequence[str] | None = None) -> int:
    """``models``: the public weights the classifier reads by name, their published accuracy and a PEG fine-tuning run."""
    parser = new_parser(
        "python -m peg_core models", "Public weights by name: ids, published accuracy, a fine-tuning command."
    )
    parser.parse_args(list(argv or []))
    print(format_public_models(PUBLIC_MODELS))
    return 0
