"""The command line of ``python -m peg_detr``: every verb's parser and the command functions.

* ``make-data OUT``: the synthetic shapes set in COCO layout, or ``--layout roboflow|yolo``
  (:mod:`peg_detr.make_data`).
* ``train``: train on a COCO, Roboflow COCO or YOLO set (:mod:`peg_detr.data.layouts`; works under
  ``torchrun``); returns the run report.
* ``eval --checkpoint CKPT``: COCO box AP of a checkpoint, at one or several ``--eval-sizes``.
* ``predict IMAGE... --checkpoint CKPT``: draw detections on image files (:mod:`peg_detr.predict`).
* ``export`` / ``export-hf``: ONNX graph / Hugging Face folder of a DETR, RT-DETR, D-FINE or DEIMv2
  (:mod:`peg_detr.export`).

The run flags (``--output-dir --resume --epochs --batch-size --lr --init`` ...) and the knob
vocabulary (``--data-root``, ``--arch``, ``--num-heads``, the PEG group) come from
:mod:`peg_core.engine`; the spellings used before it stay as hidden aliases (``--coco-path``,
``--nheads``, ``--train-scales``, ``--pretrained``, ``make-data --train/--val``).  Values are
checked by argparse types, so a bad one is a one-line usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peg_core.engine import (
    RESIZE_MODES,
    Summary,
    add_alias,
    add_arch_arg,
    add_class_map_arg,
    add_data_root_arg,
    add_eval_args,
    add_json_arg,
    add_make_data_counts,
    add_num_heads_arg,
    add_pos_args,
    add_train_args,
    configs_command,
    device_arg,
    done_line,
    ensure_writable,
    evaluate_checkpoint,
    explicit_options,
    fit,
    grid_arg,
    image_side,
    image_side_list,
    new_parser,
    nonnegative_float,
    nonnegative_int,
    output_names,
    parse_with_config,
    positive_float,
    positive_int,
    print_closing,
    refuse_without_effect,
    run_reported,
    unit_fraction,
    unused_pos_flags,
)
from peg_core.engine.flag_checks import typed_options
from peg_core.engine.predict_cli import (
    add_predict_args,
    check_predict_outputs,
    finish_predict,
    predict_device,
)
from peg_core.interop.resolve import format_public_models, resolve_weights_arg
from peg_core.registry import PosEncError, parse_pos_enc

from .archs import ARCHS, arch_of
from .configs import CONFIGS, DEFAULTS, DESCRIPTIONS, PUBLIC_MODELS
from .data import LABEL_MODES, SHAPES
from .data.dense_o2o import dense_o2o_without_effect
from .evaluation import BACKENDS
from .make_data import MAKE_DATA_LAYOUTS, write_shapes
from .models import BACKBONES, DETR_ENCODINGS
from .models.config import Option
from .task import LR_SCHEDULES, DetectTask

__all__ = [
    "build_eval_parser",
    "build_make_data_parser",
    "build_predict_parser",
    "build_train_parser",
    "configs",
    "evaluate",
    "export",
    "export_hf",
    "make_data",
    "min_max",
    "parse_eval_args",
    "parse_train_args",
    "predict",
    "refuse_unused_model_flags",
    "sizes_or_off",
    "train",
]

#: the closing lines' metrics: COCO box AP and AP50 at the headline short side
SUMMARY = Summary(("ap", "ap50"), size_key="size")

_TRAIN_DOC = """Train a detector (DETR, RT-DETR, D-FINE, DEIMv2) on a COCO, Roboflow COCO or YOLO set.

    python -m peg_detr train --data-root /data/coco --config cpvt_peg_50ep --output-dir runs/peg
    torchrun --nproc_per_node 8 -m peg_detr train --data-root /data/coco --config cpvt_peg_50ep --output-dir runs/peg

``--data-root``'s layout is detected (COCO's ``train2017/``, ``val2017/``, ``annotations/``; a Roboflow
export; a YOLO ``data.yaml``); ``--train-ann FILE --train-images DIR`` (and ``--val-ann`` /
``--val-images``) give any other COCO json.  Every epoch writes ``checkpoint.pth`` (``--resume auto``
continues it); ``report.json`` holds the last evaluation.  The recipes: ``python -m peg_detr configs``;
every flag in full: docs/cli.md.
"""

_EVAL_DOC = """Evaluate a detector checkpoint (DETR, RT-DETR, D-FINE, DEIMv2): COCO box AP at one or several sizes.

    python -m peg_detr eval --checkpoint runs/peg/checkpoint.pth --data-root /data/coco --eval-sizes 512,800,1024

The model is rebuilt from the checkpoint; ``--data-root`` (its layout detected again), ``--val-json``,
``--val-ann`` / ``--val-images`` and ``--val-size`` default to the training run's.
``OUTPUT_DIR/report.json`` (``eval/`` beside the checkpoint by default) holds ``eval.ap`` / ``eval.ap50`` at
``--val-size``, ``eval.sizes`` (the 12 COCO numbers per size) and the images
that could not be read (left out of the evaluation, listed under ``broken``).
Works under ``torchrun`` (the images are split over the processes).
"""

_PREDICT_DOC = """Run a trained detector (DETR, RT-DETR, D-FINE, DEIMv2) on image files: annotated images, a JSON.

    python -m peg_detr predict a.jpg b.png --checkpoint runs/detr/checkpoint.pth --threshold 0.7 --output-dir preds

For each input ``NAME.ext`` the output folder gets ``NAME.png`` with the boxes and
``label score`` captions (drawn at least 512 px on the long side; inputs of the same name get
distinct pictures, ``a_x.png`` and ``b_x.png``), and ``detections.json`` maps each input path to
its detections (``label``, ``name``, ``score``, ``box`` as ``[x0, y0, x1, y1]`` pixels).  A missing
or unreadable image is skipped and listed in ``report.json`` (``broken``); exit status 1 when no
image could be read.  A folder holding another command's files (a training run's report.json, an
input image) is refused unless ``--overwrite``.
"""


# ------------------------------------------------------------------------------------ value types


def sizes_or_off(text: str) -> list[int]:
    """``argparse`` type: ``"400,500,600"`` -> ``[400, 500, 600]``; ``""`` / ``off`` -> ``[]`` (disabled)."""
    if str(text).strip().lower() in ("", "off", "none"):
        return []
    return image_side_list(text)


def min_max(text: str) -> list[int]:
    """``argparse`` type: ``"384,600"`` -> ``[384, 600]`` (two positive integers, min <= max)."""
    values = image_side_list(text)
    if len(values) != 2 or values[0] > values[1]:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX with MIN <= MAX, e.g. 384,600; got {text!r}")
    return values


def _int_in(lo: int, hi: int):
    """``argparse`` type: an integer in ``lo..hi``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {text!r}")
        return value

    return parse


# ------------------------------------------------------------------------------------ flag groups


def _add_split_args(g: argparse._ArgumentGroup, split: str, what: str) -> None:
    """``--{split}-json`` (a COCO layout's file), ``--{split}-ann`` and ``--{split}-images`` (any layout).

    The training and validation splits are found the same way; ``what`` names the split in help.
    """
    g.add_argument(
        f"--{split}-json", metavar="FILE",
        help=f"COCO layout: {what} json (default annotations/instances_{split}2017.json)",
    )  # fmt: skip
    g.add_argument(
        f"--{split}-ann", metavar="FILE",
        help=f"{what} split as a COCO json FILE, with --{split}-images (any layout; overrides --data-root's)",
    )  # fmt: skip
    g.add_argument(
        f"--{split}-images",
        metavar="DIR",
        help=f"the folder of --{split}-ann's images (its file_name entries)",
    )


def _add_val_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    """Where the validation split is and the sizes it is evaluated at (``train`` and ``eval``)."""
    g = p.add_argument_group("data")
    # not argparse's required=True, which would refuse the hidden --coco-path: parse_train_args checks
    add_data_root_arg(
        g,
        help="the data set: a COCO layout (train2017/, val2017/, annotations/), a Roboflow COCO export "
        "(train/, valid/) or a YOLO set (data.yaml, or the yaml itself); detected"
        + (" (required unless --train-ann and --val-ann)" if required else " (default: the run's)"),
        aliases=["--coco-path"],
    )
    _add_split_args(g, "val", "validation")
    g.add_argument("--val-size", type=image_side, help="short side at evaluation (headline numbers)")
    g.add_argument(
        "--eval-sizes",
        type=image_side_list,
        help="comma-separated short sides to evaluate at, e.g. 512,800,1024 (default: --val-size)",
    )
    g.add_argument(
        "--coco-eval-backend",
        choices=BACKENDS,
        default=BACKENDS[0],
        help="COCO evaluation code: faster (faster-coco-eval, default) or pycocotools (reference); same numbers",
    )


def _add_train_data_args(p: argparse.ArgumentParser) -> None:
    """The training split, its augmentation and the batch over all processes."""
    g = p.add_argument_group("training data")
    _add_split_args(g, "train", "training")
    g.add_argument(
        "--labels",
        choices=LABEL_MODES,
        help="ids: label = COCO category id (DETR, the default); contiguous: label k = k-th category by id "
        "(RT-DETR's recipes; 80 for COCO); a Hugging Face --init folder whose id2label names match decides",
    )
    add_class_map_arg(g)
    g.add_argument(
        "--num-classes",
        type=positive_int,
        help="classifier size; default: max category id + 1 (--labels ids) or the category count (contiguous)",
    )
    # dest train_scales: the engine reads args.train_sizes as its per-batch resize recipe, which DETR
    # does not use (its transforms draw a short side per image); old checkpoints' args say train_scales
    g.add_argument(
        "--train-sizes",
        dest="train_scales",
        type=image_side_list,
        metavar="SIZES",
        help="short sides of the multi-scale resize",
    )
    add_alias(g, "--train-scales", dest="train_scales", type=image_side_list)
    g.add_argument("--max-size", type=image_side, help="long-side cap of the training resize")
    g.add_argument(
        "--crop-resize",
        type=sizes_or_off,
        metavar="SIZES",
        help="sizes before the random crop; '' or off disables it",
    )
    g.add_argument("--crop-size", type=min_max, metavar="MIN,MAX", help="sides of the random crop")
    g.add_argument(
        "--total-batch-size",
        type=positive_int,
        help="images per optimizer step, split over the processes and --grad-accum-steps (--batch-size, per process, wins)",
    )
    t = p.add_argument_group("schedule")
    t.add_argument("--lr-backbone", type=nonnegative_float, help="learning rate of the backbone")
    t.add_argument(
        "--weight-decay", type=nonnegative_float, help="AdamW weight decay (all parameters, as DETR)"
    )
    t.add_argument("--lr-drop", type=positive_int, help="the lr is divided by 10 every this many epochs")


def _names(names: Sequence[str]) -> str:
    """``hgnetv2_b0, hgnetv2_b1, vit_tiny`` -> ``hgnetv2_{b0,b1}, vit_tiny``: a long list in one help line."""
    families: dict[str, list[str]] = {}
    for name in names:
        head, _, tail = name.rpartition("_") if name.startswith("hgnetv2_") else (name, "", "")
        families.setdefault(head, []).append(tail)
    return ", ".join(
        head if tails == [""] else f"{head}_{{{','.join(tails)}}}" for head, tails in families.items()
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    add_arch_arg(m, tuple(ARCHS), help="detector architecture", default="detr")
    m.add_argument(
        "--backbone",
        choices=list(dict.fromkeys(name for arch in ARCHS.values() for name in arch.backbones)),
        metavar="NAME",
        help="backbone per --arch: "
        + "; ".join(f"{a.name}: {_names(a.backbones)}" for a in ARCHS.values())
        + " (tiny: the CPU demos)",
    )
    m.add_argument(
        "--backbone-weights",
        type=Path,
        help="ImageNet weights for the ResNet: a local file, or torchvision:resnet50.IMAGENET1K_V2 (DETR "
        "ResNets: IMAGENET1K_V2 alone) or a hub id, fetched once into its cache; --arch rtdetr: also an "
        "RT-DETR folder or hub id (PekingU/rtdetr_r50vd), whose ResNet-vd is taken",
    )
    m.add_argument("--dilation", action="store_true", help="DC5: dilate the last ResNet stage (--arch detr)")
    add_pos_args(
        m,
        DETR_ENCODINGS,
        note="--arch rtdetr takes the same but sine, and its sincos is RT-DETR's layout",
        peg_at_help="encoder layers followed by a PEG, e.g. 0 or 0,1; -1: on the encoder input; all: after every layer",
    )
    m.add_argument(
        "--learned-grid",
        type=grid_arg,
        help="HxW feature grid the learned table is built for (default: that of an 800x1333 image)",
    )
    m.add_argument("--hidden-dim", type=positive_int)
    add_num_heads_arg(m, aliases=["--nheads"])
    m.add_argument("--enc-layers", type=positive_int)
    m.add_argument("--dec-layers", type=positive_int)
    m.add_argument("--dim-feedforward", type=positive_int)
    m.add_argument("--dropout", type=unit_fraction)
    m.add_argument("--num-queries", type=positive_int)
    m.add_argument("--no-aux-loss", dest="aux_loss", action="store_false")
    # --init (the run group) takes official DETR .pth files and Hugging Face DETR folders / weights files
    add_alias(m, "--pretrained", dest="init", type=Path)
    _add_rtdetr_args(p)
    _add_config_args(p)
    _add_dense_o2o_args(p)


#: the value kinds a config field's flag names (:attr:`peg_detr.models.config.Option.type`)
_VALUE_TYPES = {
    "int": int, "float": float, "positive_int": positive_int, "nonnegative_int": nonnegative_int,
    "positive_float": positive_float, "nonnegative_float": nonnegative_float, "unit_fraction": unit_fraction,
}  # fmt: skip


def _flag_owners() -> dict[str, tuple[Option, list[str]]]:
    """``dest -> (its Option, the archs whose config has it)`` over the registered archs, in registration order."""
    owners: dict[str, tuple[Option, list[str]]] = {}
    for arch in ARCHS.values():
        for dest, spec in arch.config.flags().items():
            owners.setdefault(dest, (spec, []))[1].append(arch.name)
    return owners


def _add_config_args(p: argparse.ArgumentParser) -> None:
    """The flags the archs' configs declare that the shared groups above do not add, one group per set of archs.

    A family's flag is declared once, on its config's field (:func:`peg_detr.models.config.option`):
    a registered arch (one from outside the package too) gets its flags here, in ``--help`` and docs.
    """
    groups = {g.title: g for g in p._action_groups}
    for dest, (spec, names) in _flag_owners().items():
        if spec.shared or spec.flag in p._option_string_actions:
            continue
        suffix = (
            f"(--arch {', '.join(names)})"  # the group of the archs it serves, the one above if it exists
        )
        title = next((t for t in groups if t and t.endswith(suffix)), None)
        if title is None:
            configs = [ARCHS[n].config for n in names]
            title = f"{' / '.join(c.HELP_TITLE or c.TITLE for c in configs)} {suffix}"
            groups[title] = p.add_argument_group(title)
        kw: dict[str, Any] = {"dest": dest, "help": spec.help}
        if spec.boolean:
            kw.update(action=argparse.BooleanOptionalAction, default=None)
        else:
            kw.update(
                type=_VALUE_TYPES[spec.type] if spec.type else None,
                choices=spec.choices,
                metavar=spec.metavar,
            )
        groups[title].add_argument(
            spec.flag, **{k: v for k, v in kw.items() if v is not None or k == "default"}
        )


def _epoch_window(text: str) -> list[int]:
    """``argparse`` type: ``"4,29"`` -> ``[4, 29]``; ``"29"`` -> ``[0, 29]`` (epochs, START <= END)."""
    try:
        parts = [int(p) for p in str(text).split(",")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = [0, *parts]
    if len(parts) != 2 or min(parts) < 0 or parts[0] > parts[1]:
        raise argparse.ArgumentTypeError(
            f"expected START,END epochs with 0 <= START <= END, e.g. 4,29; got {text!r}"
        )
    return parts


def _add_dense_o2o_args(p: argparse.ArgumentParser) -> None:
    """DEIM's mosaic / mixup (every ``--arch``; the D-FINE / DEIM model flags come from its config)."""
    o = p.add_argument_group("DEIM's dense one-to-one matching: mosaic and mixup (every --arch)")
    o.add_argument("--mosaic-prob", type=unit_fraction, help="chance that a training image is a 2x2 mosaic of "
                   "four (DEIM: 0.5); more targets per image for the one-to-one matching")  # fmt: skip
    o.add_argument("--mosaic-epochs", type=_epoch_window, metavar="START,END",
                   help="epochs [START, END) with mosaics (DEIM: 4,29; one number N: 0,N)")  # fmt: skip
    o.add_argument("--mixup-prob", type=unit_fraction, help="chance that a batch is mixed: each image blended with the previous one, "
                   "the targets of both kept (DEIM: 0.5)")  # fmt: skip
    o.add_argument(
        "--mixup-epochs", type=_epoch_window, metavar="START,END", help="epochs [START, END) with mixup"
    )


def _add_rtdetr_args(p: argparse.ArgumentParser) -> None:
    """The RT-DETR family's run options (``--arch rtdetr / dfine / deimv2``; its model flags come from the configs)."""
    sizes = sorted({name for arch in ARCHS.values() for name in arch.sizes})
    r = p.add_argument_group("RT-DETR, D-FINE and DEIMv2 (--arch rtdetr, dfine, deimv2)")
    r.add_argument("--model-size", choices=sizes, metavar="SIZE", help="a published size's model (D-FINE "
                   "n/s/m/l/x, DEIMv2 atto/femto/pico/n/s/m/l: backbone, widths, depths, points; tiny: the "
                   "CPU demos'); other model flags override it (--arch dfine, deimv2)")  # fmt: skip
    r.add_argument(
        "--ema-decay", type=unit_fraction, help="weight EMA decay, evaluated and checkpointed (0: no EMA)"
    )
    r.add_argument("--ema-warmups", type=positive_int, help="EMA warm-up: decay * (1 - exp(-updates / N))")
    r.add_argument("--warmup-steps", type=nonnegative_int, help="learning-rate warm-up steps (linear; "
                   "flatcosine: quadratic, as DEIM)")  # fmt: skip
    r.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        help="step: /10 every --lr-drop epochs (RT-DETR, D-FINE); flatcosine: flat until --flat-epochs, cosine "
        "down to --lr-gamma x lr at the last --no-aug-epochs, then flat (DEIM)",
    )
    r.add_argument(
        "--flat-epochs", type=nonnegative_int, help="flatcosine: epochs at the full lr (DEIM's flat_epoch)"
    )
    r.add_argument(
        "--lr-gamma", type=unit_fraction, help="flatcosine: the final lr as a fraction of --lr (DEIM: 0.5)"
    )
    r.add_argument(
        "--no-aug-epochs",
        type=nonnegative_int,
        help="last N epochs without photometric / zoom-out / IoU-crop and multi-scale (RT-DETRv2's stop_epoch; 0: off)",
    )


# ---------------------------------------------------------------------------------------- parsers


def build_make_data_parser() -> argparse.ArgumentParser:
    p = new_parser(
        "python -m peg_detr make-data",
        "Write the synthetic shapes set in a COCO, Roboflow COCO or YOLO layout.",
    )
    p.add_argument("out", type=Path)
    p.add_argument(
        "--layout",
        choices=MAKE_DATA_LAYOUTS,
        default="coco",
        help="coco (train2017/, val2017/, annotations/), roboflow (a Roboflow COCO export: train/, valid/) "
        "or yolo (data.yaml, images/, labels/)",
    )
    add_make_data_counts(p, num_train=512, num_val=128, aliases=[("--train", "--val")])
    p.add_argument("--size", type=_int_in(16, 4096), default=160, help="image side in pixels (16..4096)")
    p.add_argument(
        "--num-classes", type=_int_in(1, len(SHAPES)), default=3, help=f"shape classes (1..{len(SHAPES)})"
    )
    p.add_argument("--min-objects", type=nonnegative_int, default=1)
    p.add_argument("--max-objects", type=nonnegative_int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    add_json_arg(p)
    return p


#: what ``train --init`` reads (:func:`~.task.DetectTask.setup_train`)
INIT_HELP = (
    "starting weights: a Hugging Face folder or hub id (DETR, RT-DETR, D-FINE, DEIMv2; e.g. "
    "facebook/detr-resnet-50, PekingU/rtdetr_r50vd), a checkpoint of peg_detr train, or an official DETR "
    ".pth; classes are carried over by name, --class-map for synonyms, the others start fresh"
)


def build_train_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_detr train", _TRAIN_DOC)
    add_train_args(p, output_dir="runs/detr", configs=CONFIGS, init_help=INIT_HELP)
    _add_val_args(p, required=True)
    _add_train_data_args(p)
    _add_model_args(p)
    p.set_defaults(**DEFAULTS)
    return p


def build_eval_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_detr eval", _EVAL_DOC)
    add_eval_args(p)
    _add_val_args(p, required=False)
    p.add_argument(
        "--pos-interpolation",
        choices=RESIZE_MODES,
        help="resize mode of a learned table (default: the checkpoint's)",
    )
    # accepted only as the checkpoint's own: its training fixed what each label means
    p.add_argument(
        "--labels",
        choices=LABEL_MODES,
        help="the checkpoint's --labels (the default; another mode is an error: its labels mean what training made them)",
    )
    return p


def build_predict_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_detr predict", _PREDICT_DOC)
    add_predict_args(p, noun="images")  # IMAGE..., --checkpoint, --output, --overwrite, --json, --debug
    p.add_argument("--threshold", type=unit_fraction, default=0.7, help="keep detections scoring above this")
    p.add_argument("--output-dir", type=Path, default=Path("predictions"),
                   help="the annotated pictures, detections.json and report.json")  # fmt: skip
    add_alias(p, "--out", dest="output_dir", type=Path)
    p.add_argument("--size", type=image_side, help="short side at inference (default: the run's --val-size)")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu | cuda | cuda:N")
    return p


def refuse_unused_model_flags(args: argparse.Namespace, typed: Mapping[str, str] | None = None) -> None:
    """Model flags the chosen configuration ignores: a :class:`UserError` when the command line gives one.

    The PEG group without a PEG in ``--pos-enc`` (DETR and RT-DETR), ``--peg-num-kernels`` without
    ``--peg-dynamic``, ``--pos-interpolation`` / ``--learned-grid`` without a learned table, and
    with ``--arch rtdetr --init FOLDER`` every model flag but ``--pos-enc`` (the folder's model is
    built as its ``config.json`` says, while the run's arguments would record the flag); DEIM's
    mosaic / mixup flags that draw nothing in this run (:func:`~.data.dense_o2o.dense_o2o_without_effect`).
    ``args.cli_flags``: the destinations the command line set (:func:`parse_train_args`); ``typed``:
    the option string each was given as (:func:`~peg_core.engine.flag_checks.typed_options`), so the
    refusal names ``--head-act``, not ``--mlp-activation``.
    """
    pos_enc = str(args.pos_enc)
    reasons: dict[str, str] = {}
    if arch_of(args).from_hf_config is not None and args.init is not None and Path(args.init).is_dir():
        # the folder's config.json is the whole model but --pos-enc (and the loss): a model flag would change nothing
        why = f"the model comes from the Hugging Face folder --init {args.init} (only --pos-enc applies)"
        fixed = [d for d in arch_of(args).options if d not in ("pos_enc", *arch_of(args).loss_options)]
        reasons |= dict.fromkeys([*fixed, "model_size"], why)
    for dest, why in unused_pos_flags(pos_enc, args.peg_dynamic, f"--pos-enc {pos_enc}").items():
        reasons.setdefault(dest, why)
    arch = arch_of(args)
    for dest, (_, names) in _flag_owners().items():  # another family's field: named as typed, with its archs
        if arch.name not in names:
            reasons.setdefault(dest, f"applies to --arch {', '.join(names)} only (not --arch {arch.name})")
    if not arch.sizes:
        reasons.setdefault("model_size", f"--arch {arch.name} has no size presets")
    if arch.family == "detr":  # DETR's StepLR has neither
        reasons |= dict.fromkeys(
            ("lr_schedule", "flat_epochs", "lr_gamma"), "applies to the RT-DETR family only"
        )
    elif getattr(args, "lr_schedule", None) != "flatcosine":
        reasons |= dict.fromkeys(("flat_epochs", "lr_gamma"), "applies to --lr-schedule flatcosine only")
    for dest, why in dense_o2o_without_effect(args).items():
        reasons.setdefault(dest, why)
    refuse_without_effect(args, args.cli_flags, reasons, typed)


def _resolve_weights_args(args: argparse.Namespace) -> None:
    """``--init`` / ``--backbone-weights`` naming remote weights -> the local folder / file (fetched once).

    ``--init org/name``: a Hugging Face DETR / RT-DETR folder (its hub snapshot); ``--backbone-weights``:
    with ``--arch rtdetr`` an RT-DETR folder or hub id (its ResNet-vd is taken), else one file, e.g. ``torchvision:resnet50.IMAGENET1K_V2`` or, for a DETR ResNet, just ``IMAGENET1K_V2``
    (:func:`peg_core.interop.resolve_weights`).  A local path is kept as it is.
    """
    backbone = args.backbone or ("resnet50" if (args.arch or "detr") == "detr" else None)
    # a bare IMAGENET1K_V2 names torchvision's weights of a DETR ResNet; a ResNet-vd has none there
    torchvision_model = backbone if backbone in BACKBONES and backbone != "tiny" else None
    resolve_weights_arg(args, "init", kind="folder")
    # RT-DETR's ResNet-vd from a Hugging Face RT-DETR folder (PekingU/rtdetr_r50vd): its snapshot
    kind = "folder" if arch_of(args).load_backbone is not None else "file"
    resolve_weights_arg(args, "backbone_weights", kind=kind, torchvision_model=torchvision_model)


def parse_train_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``train`` flags; a ``--config`` recipe supplies defaults that explicit flags override.

    ``cli_flags`` lists the destinations the command line itself set; flags that would change
    nothing are refused here (:func:`refuse_unused_model_flags`), before any data is read.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_train_parser()
    pre, _ = parser.parse_known_args(argv)
    try:
        arch = arch_of(pre)
    except ValueError as e:
        parser.error(f"argument --arch: {e}")
    if arch.recipe_defaults and not pre.config:  # e.g. RT-DETR's defaults (R50vd 6x), not DETR's
        parser.set_defaults(**arch.recipe_defaults)
    args = parse_with_config(parser, argv, CONFIGS)
    if args.data_root is None and not (args.train_ann and args.val_ann):
        parser.error("the following arguments are required: --data-root")
    _resolve_weights_args(args)
    if args.pos_enc is not None and arch_of(args).family != "detr":
        try:  # --pos-enc was checked against DETR's encoder; the RT-DETR family has its own rule
            parse_pos_enc(args.pos_enc, arch_of(args).encodings)
        except PosEncError as e:
            parser.error(f"argument --pos-enc: {e}")
    args.cli_flags = sorted(explicit_options(build_train_parser, argv))
    refuse_unused_model_flags(args, typed_options(build_train_parser, argv))
    return args


def parse_eval_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_eval_parser().parse_args(argv)


# --------------------------------------------------------------------------------------- commands


def make_data(argv: list[str] | None = None) -> int:
    """``make-data OUT``: the synthetic shapes set (``peg_detr.data.synthetic``)."""
    p = build_make_data_parser()
    a = p.parse_args(argv)
    if a.min_objects > a.max_objects:
        p.error(f"--min-objects {a.min_objects} is more than --max-objects {a.max_objects}")
    ensure_writable(a.out)
    out = write_shapes(
        a.out, a.num_train, a.num_val, layout=a.layout, size=a.size, num_classes=a.num_classes,
        min_objects=a.min_objects, max_objects=a.max_objects, seed=a.seed,
    )  # fmt: skip
    counts = {
        "command": "make-data",
        "train": a.num_train,
        "val": a.num_val,
        "out": str(out),
        "layout": a.layout,
    }
    layout = {"coco": "COCO layout", "roboflow": "Roboflow COCO export", "yolo": "YOLO set"}[a.layout]
    line = done_line(
        "make-data", f"{a.num_train} train and {a.num_val} val images, {a.size} px, {layout}", out
    )
    print_closing(line, counts, a.json)
    return 0


def train(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m peg_detr train ...``; returns the run's report (also in OUTPUT_DIR/report.json)."""
    args = parse_train_args(argv)
    return run_reported("train", args, lambda: fit(DetectTask(), args), SUMMARY)


def evaluate(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m peg_detr eval ...``; returns the report (also in OUTPUT_DIR/report.json)."""
    args = parse_eval_args(argv)
    return run_reported("eval", args, lambda: evaluate_checkpoint(DetectTask(), args), SUMMARY)


def predict(argv: list[str] | None = None) -> int:
    """``python -m peg_detr predict ...``: annotated images, ``detections.json`` and ``report.json``.

    The flags, outputs and exit status every ``predict`` shares are :mod:`peg_core.engine.predict_cli`'s;
    the pictures' names are distinct for inputs of the same name (:func:`peg_core.engine.output_names`).
    """
    from .predict import predict_images  # torchvision's drawing code only when asked

    args = build_predict_parser().parse_args(argv)
    device = predict_device(args.device, args.threads)
    names = output_names(args.files, ".png")
    # before the model is read: no input, training report or other file is overwritten
    check_predict_outputs(args, args.output_dir, [*names, "detections.json", "report.json"])
    preds = predict_images(
        args.files,
        args.checkpoint,
        args.output_dir,
        args.threshold,
        args.size,
        device,
        names,
        max_memory=args.max_memory,
    )
    pictures = {
        str(path): str(args.output_dir / name)
        for path, name, pred in zip(args.files, names, preds, strict=True)
        if pred.skipped is None
    }
    # detections.json's mapping too (image path -> detections), as the report carried it before
    detections = {p.path: [d.to_json() for d in p.detections] for p in preds if p.skipped is None}
    found = sum(len(d) for d in detections.values())
    finish_predict(
        args, preds, task="detect", noun="images", folder=args.output_dir,
        extra={"pictures": pictures, "detections": detections},
        extra_text=f", {found} detection{'' if found == 1 else 's'}",
    )  # fmt: skip
    return 0


def configs(argv: list[str] | None = None) -> int:
    """``configs [NAME]``: the named recipes of ``train --config`` (:func:`peg_core.engine.configs_command`)."""
    return configs_command(
        argv or [], prog="python -m peg_detr", configs=CONFIGS, train_parser=build_train_parser,
        descriptions=DESCRIPTIONS,
    )  # fmt: skip


def export(argv: list[str] | None = None) -> int:
    """``export CKPT OUT.onnx``: the detector as ONNX with dynamic batch, height and width."""
    from .export import main as export_main  # imports onnx only when asked

    return export_main(argv)


def export_hf(argv: list[str] | None = None) -> Path:
    """``export-hf CKPT DIR``: a checkpoint as a Hugging Face folder (DETR ``sine``; RT-DETR, D-FINE, DEIMv2 ``sincos``)."""
    from .export import main_hf  # imports the export machinery only when asked

    return main_hf(argv)


def models(argv: Sequence[str] | None = None) -> int:
    """``models``: the public weights peg_detr reads by name, their published accuracy and a PEG fine-tuning run."""
    parser = new_parser(
        "python -m peg_detr models", "Public weights by name: ids, published accuracy, a fine-tuning command."
    )
    parser.parse_args(list(argv or []))
    print(format_public_models(PUBLIC_MODELS))
    return 0
