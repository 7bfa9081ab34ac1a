"""The command lines of ``python -m peg_video``: every verb's parser and command function.

One place for a verb's flags: ``build_<verb>_parser()`` builds it, ``<verb>(argv)`` runs it
(``make_data``, ``train`` -> the run report, ``evaluate`` -> the eval report, ``predict``,
``prepare``; ``export`` keeps its parser beside its code in :mod:`peg_video.export`).
``peg_core.engine`` runs ``train`` and ``eval``; :mod:`peg_video.task` holds the task's hooks.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Callable, Sequence
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
    add_layer_decay_arg,
    add_make_data_counts,
    add_num_heads_arg,
    add_overwrite_arg,
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
    nonnegative_int,
    parse_with_config,
    positive_float,
    positive_int,
    positive_int_list,
    print_closing,
    run_reported,
    unit_fraction,
    unused_pos_flags,
)
from peg_core.engine.predict_cli import (
    add_predict_args,
    check_predict_outputs,
    finish_predict,
    predict_device,
)
from peg_core.engine.recipes import add_recipe_args
from peg_core.errors import InputError
from peg_core.interop.resolve import format_public_models, resolve_weights_arg
from peg_core.registry import EncodingSpec, parse_pos_enc

from .configs import (
    CONFIGS,
    DEFAULTS,
    DESCRIPTIONS,
    FINETUNE_CONFIGS,
    MODEL_KEYS,
    PUBLIC_MODELS,
    folder_clip,
    videomae_views,
)
from .data.clip import ClipSpec
from .data.datasets import DATASETS, SPLIT_DATASETS
from .data.transforms import (
    KINETICS_MEAN,
    KINETICS_STD,
    RRC_RATIO,
    RRC_SCALE,
    TRAIN_CROPS,
    check_rrc_range,
    parse_rand_augment,
)
from .evaluation import REDUCTIONS
from .interop.hf import read_hf_video_config
from .models import X3D_CONFIGS, list_video_models
from .models.vit import VIDEO_ENCODINGS

__all__ = [
    "build_eval_parser",
    "build_export_hf_parser",
    "build_make_data_parser",
    "build_predict_parser",
    "build_prepare_parser",
    "build_train_parser",
    "configs",
    "evaluate",
    "export",
    "export_hf",
    "make_data",
    "parse_eval_args",
    "parse_train_args",
    "predict",
    "prepare",
    "train",
]

TRAIN_DOC = """Train a video transformer (or an X3D) on Kinetics-format annotations or an official data set.

    python -m peg_video train --train-ann train.csv --val-ann val.csv --config synthetic_tiny --output-dir runs/video
    torchrun --nproc_per_node 8 -m peg_video train --config k400_vit_s_16x4_peg3d --train-ann ... --val-ann ...

``--dataset ssv2|ucf101|hmdb51|folder --data-root DIR`` reads those data sets' own files instead of
``--train-ann`` / ``--val-ann`` (docs/data.md), with their protocol defaults.  Every epoch writes
``checkpoint.pth`` (``--resume auto`` continues it); ``report.json`` holds the last evaluation.  An
``--init`` folder gives the model and the input defaults (clip length, size, normalisation); flags and
``--config`` win.  The recipes: ``python -m peg_video configs``; every flag in full: docs/cli.md.
"""

#: what ``train --init`` reads (docs/cli.md, "train --init FOLDER")
INIT_HELP = (
    "starting weights: a Hugging Face folder or hub id (VideoMAE, TimeSformer, V-JEPA 2; the folder's "
    "model, --pos-enc peg3d adds a PEG), a checkpoint of peg_video train, or a 2-D image checkpoint "
    "(peg_core's CPVT, timm:NAME or a DeiT file with --init-source deit) inflated to 3-D; classes are "
    "carried over by name, --class-map for synonyms, the others start fresh"
)

BACKENDS = ("peg", "pytorchvideo")
#: what ``export-hf`` writes (and what a Hugging Face folder holds: refused there without --overwrite)
HF_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "preprocessor_config.json",
            "video_preprocessor_config.json")  # fmt: skip
#: the closing lines' metrics: video-level top-1 / top-5 of the multi-view protocol
SUMMARY = Summary(("top1", "top5"), at="{num_frames} frames, {crop} px")
SAMPLINGS = ("stride", "segment")
#: ``--model-opt`` keys that have a flag of their own: they go to that flag's value
_OWN_FLAGS = ("num_heads", "peg_at", "peg_kernel_size", "peg_padding", "peg_dynamic", "peg_num_kernels",
              "pos_interpolation")  # fmt: skip
_PEG_DESTS = ("peg_at", "peg_kernel_size", "peg_separable", "peg_padding", "peg_dynamic", "peg_num_kernels")


# ------------------------------------------------------------------------------------ argparse types


#: the most frames a clip (``--num-frames``) may have: V-JEPA 2 samples 64; a ViT over 256 frames of
#: 224 px already attends over 25k tokens, and a typo such as 100000 would exhaust memory
MAX_CLIP_FRAMES = 256
#: the most frames of a generated video (``make-data --frames``)
MAX_VIDEO_FRAMES = 4096
#: the most test clips per video (``--num-clips``; VideoMAE uses 5, SlowFast 10)
MAX_TEST_CLIPS = 64
#: the most augmented clips per video and visit (``--repeated-aug``; VideoMAE: 2): a step holds
#: K x --batch-size clips, so 100000 would never finish a step
MAX_REPEATED_AUG = 16

clip_frames = int_in(1, MAX_CLIP_FRAMES, "a frame count")
video_frames = int_in(1, MAX_VIDEO_FRAMES, "a frame count")
test_clips = int_in(1, MAX_TEST_CLIPS, "a clip count")
repeats = int_in(1, MAX_REPEATED_AUG, "a repeat count")


def even_size(text: str) -> int:
    """``argparse`` type: a frame side for yuv420p video, an even number of pixels >= 16."""
    value = image_side(text)
    if value % 2 or value < 16:
        raise argparse.ArgumentTypeError(f"expected an even number of pixels >= 16 (yuv420p), got {text!r}")
    return value


def _sized_list(
    count: int, what: str, kind: Callable[[str], list[int]] = positive_int_list
) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        values = kind(text)
        if len(values) != count:
            raise argparse.ArgumentTypeError(f"expected {count} comma-separated {what}, got {text!r}")
        return values

    return parse


scale_range = _sized_list(2, "sizes MIN,MAX", image_side_list)
tubelet_size = _sized_list(3, "sizes T,H,W")


def _floats(kind: Callable[[str], float]) -> Callable[[str], list[float]]:
    return lambda text: [kind(v) for v in text.split(",")]


channel_means = _sized_list(3, "numbers R,G,B", _floats(nonnegative_float))
channel_stds = _sized_list(3, "numbers R,G,B", _floats(positive_float))


def rand_augment_arg(text: str) -> str | None:
    """``argparse`` type of ``--rand-augment``: ``mM-nN`` (e.g. ``m7-n4``), canonical; ``off``: ``None``."""
    if str(text).strip().lower() in ("off", "none"):
        return None
    try:
        num_ops, magnitude = parse_rand_augment(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return f"m{magnitude}-n{num_ops}"


def _rrc_range(what: str) -> Callable[[str], list[float]]:
    """``argparse`` type of ``--rrc-scale`` / ``--rrc-ratio``: ``LO,HI`` (:func:`check_rrc_range`)."""

    def parse(text: str) -> list[float]:
        try:
            lo, hi = (float(v) for v in str(text).split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected two comma-separated numbers LO,HI, got {text!r}"
            ) from None
        try:
            return list(check_rrc_range((lo, hi), what))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


#: flags whose value may start with "-" (argparse would read "-1,2" as an option): joined by "="
_SIGNED_VALUES = ("--rrc-scale", "--rrc-ratio")


def _join_signed_values(argv: Sequence[str]) -> list[str]:
    """``--rrc-ratio -1,2`` -> ``--rrc-ratio=-1,2``, so a negative value is its flag's bad value."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in _SIGNED_VALUES and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def split_arg(text: str) -> int | str:
    """``argparse`` type of ``eval --split``: 1, 2, 3 or ``all``."""
    if text.strip().lower() == "all":
        return "all"
    if text.strip() in ("1", "2", "3"):
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 1, 2, 3 or all, got {text!r}")


class _ModelOpt(argparse.Action):
    """``--model-opt KEY=VALUE``: one more builder keyword in ``model_opts`` (after the recipe's).

    A key with a flag of its own (``num_heads``, ``peg_at``, ...; :data:`_OWN_FLAGS`) sets that
    flag's value instead, so ``--model-opt peg_at=[0]`` (the older spelling) is ``--peg-at 0``.
    """

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        key, sep, text = str(values).partition("=")
        if not sep or not key.isidentifier():
            parser.error(f"argument --model-opt: expected KEY=VALUE, got {values!r}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text  # a bare word: a string option such as attention=divided
        if key in _OWN_FLAGS:
            setattr(namespace, key, value)
        else:
            namespace.model_opts = {**(getattr(namespace, "model_opts", None) or {}), key: value}


# ------------------------------------------------------------------------------------------ parsers


def build_make_data_parser() -> argparse.ArgumentParser:
    """Arguments of ``make-data``: the synthetic moving-shapes set in a data set's layout."""
    from .data.synthetic import SyntheticSpec

    d = SyntheticSpec()
    p = new_parser(
        "python -m peg_video make-data",
        "Generate the synthetic moving-shapes set in the official layout of a data set (default Kinetics).",
    )
    p.add_argument("out", type=Path)
    p.add_argument(
        "--dataset",
        choices=DATASETS,
        default="kinetics",
        help="layout: kinetics (CSV + lists, mp4), ssv2 (JSON, VP9 webm), ucf101 / hmdb51 (three splits, "
        "avi; --num-train + --num-val videos in all), folder (train/val class folders, mp4)",
    )
    add_make_data_counts(p, num_train=d.num_train, num_val=d.num_val)
    p.add_argument("--width", type=even_size, default=d.width, help="frame width (even)")
    p.add_argument("--height", type=even_size, default=d.height, help="frame height (even)")
    p.add_argument(
        "--frames", type=video_frames, default=d.frames, help=f"frames per video (1..{MAX_VIDEO_FRAMES})"
    )
    p.add_argument("--fps", type=positive_int, default=d.fps)
    p.add_argument(
        "--codec", default=d.codec, choices=("libx264", "mpeg4"), help="mp4 codec (kinetics, folder)"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    add_json_arg(p)
    return p


def _add_view_args(g: argparse._ArgumentGroup) -> None:
    """Data / view flags that ``train`` and ``eval`` share (``eval`` defaults them to the run's)."""
    g.add_argument(
        "--dataset",
        choices=DATASETS,
        help="kinetics: --train-ann/--val-ann files; others: the official files under --data-root "
        "(see docs/data.md)",
    )
    add_data_root_arg(g, help="folder of an ssv2 / ucf101 / hmdb51 / folder data set")
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
    g.add_argument("--num-frames", type=clip_frames, help=f"frames per clip (1..{MAX_CLIP_FRAMES})")
    g.add_argument("--stride", type=positive_int, help="step between the frames of a clip")
    g.add_argument("--crop", type=image_side, help="crop side in pixels")
    g.add_argument("--test-scale", type=image_side, help="short side before the test crops")
    g.add_argument("--num-clips", type=test_clips, help=f"test clips per video (1..{MAX_TEST_CLIPS})")
    g.add_argument("--num-crops", type=int, choices=(1, 3), help="test crops per clip")
    g.add_argument("--reduction", choices=REDUCTIONS, help="fusion of a video's views")


def _add_train_data_args(p: argparse.ArgumentParser) -> None:
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
    g.add_argument(
        "--scale-jitter",
        type=scale_range,
        metavar="MIN,MAX",
        help="random short side of the training clips before the crop (augmentation; not --train-sizes)",
    )
    add_alias(g, "--train-scale", dest="scale_jitter", type=scale_range, metavar="MIN,MAX")
    for flag, kind, what in (
        ("--mean", channel_means, "mean"),
        ("--std", channel_stds, "standard deviation"),
    ):
        g.add_argument(flag, type=kind, metavar="R,G,B", help=f"per-channel {what} of the input normalisation "
                       "(default: an --init folder's, else the recipe's; Kinetics 0.45 / 0.225)")  # fmt: skip
    g.add_argument(
        "--hflip",
        action=argparse.BooleanOptionalAction,
        help="random horizontal flips (refused for ssv2, whose labels say left / right)",
    )
    _add_augment_args(g)


def _add_augment_args(g: argparse._ArgumentGroup) -> None:
    """VideoMAE's fine-tuning augmentations of the training clips (all off by default)."""
    g.add_argument("--train-crop", choices=TRAIN_CROPS, default="jitter",
                   help="training crop: jitter (a random short side in --scale-jitter, then a random --crop; "
                   "the default) or rrc (VideoMAE's random-resized crop: a box of --rrc-scale of the frame "
                   "at aspect --rrc-ratio, the same for all frames, resized to --crop)")  # fmt: skip
    g.add_argument("--rrc-scale", type=_rrc_range("scale"), default=list(RRC_SCALE), metavar="LO,HI",
                   help="--train-crop rrc: box area, fraction of the frame (VideoMAE: 0.08,1)")  # fmt: skip
    g.add_argument("--rrc-ratio", type=_rrc_range("ratio"), default=list(RRC_RATIO), metavar="LO,HI",
                   help="--train-crop rrc: width / height of the box (VideoMAE: 0.75,1.3333)")  # fmt: skip
    g.add_argument("--rand-augment", type=rand_augment_arg, metavar="mM-nN",
                   help="RandAugment of each training clip, one draw for all its frames: N ops at magnitude "
                   "M of 10 (timm's scale; VideoMAE: m7-n4); off: none (the default)")  # fmt: skip
    g.add_argument("--random-erasing", type=unit_fraction, default=0.0, metavar="P",
                   help="erase one box of normal noise, the same in every frame, with probability P "
                   "(after normalisation; VideoMAE: 0.25); 0: off")  # fmt: skip
    g.add_argument("--repeated-aug", type=repeats, default=1, metavar="K",
                   help="K augmented clips of each training video per visit (VideoMAE's num_sample): a step "
                   f"holds K x --batch-size clips, an epoch keeps its steps; 1: off (1..{MAX_REPEATED_AUG})")  # fmt: skip


def _add_model_args(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    add_arch_arg(
        m, list_video_models(), help="video model (vit_*: transformers, x3d_*: CNNs)", aliases=["--model"]
    )
    add_num_heads_arg(m)
    add_pos_args(
        m,
        VIDEO_ENCODINGS,
        extra={"table": "keep the --init Hugging Face folder's own encoding"},
        peg_at_help="blocks followed by a PEG3d, e.g. 0 or -1,0; -1: before block 0; all: after every block",
    )
    m.add_argument("--tubelet", type=tubelet_size, metavar="T,H,W", help="tubelet of the ViT, e.g. 2,16,16")
    m.add_argument(
        "--model-opt",
        dest="model_opts",
        action=_ModelOpt,
        metavar="KEY=VALUE",
        help="another build_video_model keyword (repeatable), e.g. depth=4, attention=divided",
    )
    m.add_argument(
        "--init-source", choices=("cpvt", "deit"), help="layout of a 2-D --init file (default cpvt)"
    )
    add_class_map_arg(m)
    add_alias(m, "--init-2d", dest="init", type=Path)
    add_alias(m, "--init-2d-source", dest="init_source", choices=("cpvt", "deit"))


def build_train_parser() -> argparse.ArgumentParser:
    """Arguments of ``train``; ``--config NAME`` supplies defaults that flags override."""
    p = new_parser("python -m peg_video train", TRAIN_DOC)
    add_train_args(p, output_dir="runs/video", configs=CONFIGS, init_help=INIT_HELP)
    _add_train_data_args(p)
    _add_model_args(p)
    o = p.add_argument_group("optimisation")
    o.add_argument("--min-lr", type=nonnegative_float, help="learning rate at the end of the cosine")
    o.add_argument("--weight-decay", type=nonnegative_float)
    o.add_argument("--warmup-epochs", type=nonnegative_float, help="linear warm-up (fractions allowed)")
    o.add_argument("--label-smoothing", type=unit_fraction)
    add_layer_decay_arg(o)
    o.add_argument("--mixup", type=nonnegative_float, default=0.0, metavar="ALPHA",
                   help="Mixup of the training batches, lam ~ Beta(ALPHA, ALPHA); 0: off")  # fmt: skip
    o.add_argument("--cutmix", type=nonnegative_float, default=0.0, metavar="ALPHA",
                   help="CutMix of the training batches, box area ~ Beta(ALPHA, ALPHA); 0: off; with "
                   "--mixup: one of the two per batch")  # fmt: skip
    add_recipe_args(p)
    p.set_defaults(**DEFAULTS, data_backend="peg", reduction="mean", dataset="kinetics")
    return p


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
        choices=RESIZE_MODES,
        help="resize mode of a learned table's spatial part at another crop (default: the trained one)",
    )
    return p


def build_predict_parser() -> argparse.ArgumentParser:
    """Arguments of ``predict``: video files and a checkpoint; views default to the training run's."""
    from . import predict as predict_module

    p = new_parser("python -m peg_video predict", predict_module.__doc__)
    add_predict_args(p, noun="videos")  # VIDEO..., --checkpoint, --output, --overwrite, --json, --debug
    p.add_argument("--top-k", type=positive_int, default=5, help="classes listed per video")
    p.add_argument("--num-frames", type=clip_frames, help="frames per clip (default: the training run's)")
    p.add_argument("--num-clips", type=test_clips, help="clips per video (default: the training run's)")
    p.add_argument("--num-crops", type=int, choices=(1, 3), help="crops per clip (default: the run's)")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu | cuda | cuda:N")
    return p


def build_prepare_parser() -> argparse.ArgumentParser:
    """Arguments of ``prepare``: a Kinetics tree copied with its videos at a short side."""
    p = new_parser(
        "python -m peg_video prepare",
        "A copy of a Kinetics tree with videos at short side 320 (docs/data.md).",
    )
    p.add_argument("src", type=Path, help="Kinetics tree (videos and annotation files)")
    p.add_argument("dst", type=Path, help="where the prepared copy goes (created)")
    p.add_argument(
        "--short-side", type=image_side, default=320, help="short side of the copies (default 320)"
    )
    p.add_argument("--workers", type=positive_int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--crf", type=nonnegative_int, default=20, help="x264 quality (lower: better, larger)")
    p.add_argument(
        "--preset",
        default="veryfast",
        choices=("ultrafast", "superfast", "veryfast", "faster", "fast", "medium"),
    )
    add_overwrite_arg(p, help="when DST was prepared with other settings, prepare every video again (default: "
                      "refuse)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    return p


# -------------------------------------------------------------------------------- train's checks


def _check_dataset(p: argparse.ArgumentParser, args: argparse.Namespace, explicit: dict[str, Any]) -> None:
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
        if explicit.get("hflip"):
            p.error(
                'argument --hflip: refused for ssv2: its labels name directions ("from left to right"), '
                "so a flipped clip contradicts its label"
            )
        args.hflip = False  # whatever a recipe made for another data set says
    if args.sampling is None:
        args.sampling = "segment" if args.dataset == "ssv2" else "stride"
    if args.sampling == "segment" and args.data_backend == "pytorchvideo":
        p.error("argument --sampling: segment sampling needs --data-backend peg")
    if args.data_backend == "pytorchvideo":
        _refuse_peg_only(p, args)


def _refuse_peg_only(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The peg back-end's training augmentations, refused with pytorchvideo's (its own train pipeline)."""
    peg_only = {"--rand-augment": args.rand_augment, "--random-erasing": args.random_erasing,
                "--repeated-aug": args.repeated_aug > 1,
                "--train-crop": args.train_crop == "rrc"}  # fmt: skip
    for flag, on in peg_only.items():
        if on:
            value = " rrc" if flag == "--train-crop" else ""
            p.error(f"argument {flag}:{value} needs --data-backend peg (pytorchvideo has its own pipeline)")


def _check_train_crop(p: argparse.ArgumentParser, args: argparse.Namespace, explicit: dict[str, Any]) -> None:
    """``--rrc-scale`` / ``--rrc-ratio`` shape the random-resized crop: refused, not ignored, without it."""
    if args.train_crop == "rrc":
        return
    for dest in ("rrc_scale", "rrc_ratio"):
        if dest in explicit:
            p.error(f"argument {_flag(dest)}: shapes the random-resized crop, which needs --train-crop rrc "
                    f"(not {args.train_crop})")  # fmt: skip


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _drop_or_refuse(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    explicit: dict[str, Any],
    dests: Sequence[str],
    why: str,
) -> None:
    """Options the model cannot honour: refused when given as flags, a recipe's value is dropped."""
    for dest in dests:
        if getattr(args, dest, None) is None:
            continue
        if dest in explicit:
            p.error(f"argument {_flag(dest)}: {why}")
        setattr(args, dest, None)


def _drop_unused_pos_flags(
    p: argparse.ArgumentParser, args: argparse.Namespace, explicit: dict[str, Any], pos_enc: str, source: str
) -> None:
    """The PEG group and ``--pos-interpolation`` against the encoding ``pos_enc`` (from ``source``).

    :func:`peg_core.engine.unused_pos_flags` says which have no effect and why: given as flags they
    are refused, a recipe's value is dropped.  ``--peg-at`` asking for no PEG at all is no conflict.
    """
    for dest, why in unused_pos_flags(pos_enc, args.peg_dynamic, source).items():
        if dest == "peg_at" and args.peg_at in ([], "none"):
            args.peg_at = None
            continue
        _drop_or_refuse(p, args, explicit, (dest,), why)


def _conditional_name(pos_enc: str) -> str | None:
    """The conditional part of ``pos_enc`` (``"peg3d"`` of ``"peg3d+rope-3d"``), or None."""
    spec: EncodingSpec = parse_pos_enc(pos_enc, VIDEO_ENCODINGS)  # the parser's type checked it
    return None if spec.conditional is None else spec.conditional.name


def _apply_peg_separable(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--peg-separable``: the video PEG3d's separable form is the factorized one (spatial kxk, then temporal k)."""
    conditional = _conditional_name(args.pos_enc)
    if args.peg_separable and conditional == "peg3d":
        args.pos_enc = "+".join(
            "peg3d-factorized" if part == "peg3d" else part for part in args.pos_enc.split("+")
        )
    elif args.peg_separable is False and conditional == "peg3d-factorized":
        p.error(f"argument --no-peg-separable: contradicts --pos-enc {args.pos_enc} (the separable PEG3d)")


def _check_model(p: argparse.ArgumentParser, args: argparse.Namespace, explicit: dict[str, Any]) -> None:
    """Model options against the model: each one given is honoured or refused, never ignored."""
    recipe = CONFIGS[args.config] if args.config else DEFAULTS
    if args.arch != recipe["arch"]:  # the recipe's model options belong to its own model
        for key in MODEL_KEYS:
            setattr(args, key, explicit.get(key, {} if key == "model_opts" else None))
    if args.arch in X3D_CONFIGS:
        _drop_or_refuse(p, args, explicit, ("num_heads",), f"{args.arch} is a CNN without attention heads")
        cnn = f"--arch {args.arch}: a CNN without position encoding"
        _drop_or_refuse(p, args, explicit, _PEG_DESTS, f"has no effect without a PEG ({cnn})")
        _drop_or_refuse(
            p, args, explicit, ("pos_interpolation",), f"has no effect without a learned table ({cnn})"
        )
    else:
        _drop_unused_pos_flags(p, args, explicit, args.pos_enc, f"--pos-enc {args.pos_enc}")
    _apply_peg_separable(p, args)
    if args.peg_dynamic and _conditional_name(args.pos_enc) == "peg3d-factorized":
        p.error("argument --peg-dynamic: not with the factorized (separable) PEG3d")


def _check_sizes(p: argparse.ArgumentParser, args: argparse.Namespace, clip: ClipSpec) -> None:
    lo, hi = args.scale_jitter
    if lo > hi:
        p.error(f"argument --scale-jitter: MIN must not exceed MAX, got {lo},{hi}")
    if lo < args.crop and args.train_crop == "jitter":  # rrc resizes its box to --crop
        p.error(f"argument --scale-jitter: {lo},{hi} must be >= --crop {args.crop}")
    if args.test_scale < args.crop:
        p.error(f"argument --test-scale: {args.test_scale} must be >= --crop {args.crop}")
    if clip.misfits():  # a vit_* or the model of an --init folder (an X3D has no tubelet)
        p.error(
            f"--num-frames {clip.num_frames} and --crop {clip.crop} must be multiples of "
            f"--tubelet {','.join(map(str, clip.tubelet))}"
        )
    if args.min_lr > args.lr:
        p.error(f"argument --min-lr: {args.min_lr} must not exceed --lr {args.lr}")


# ------------------------------------------------------------------ train --init FOLDER (Hugging Face)

#: ``--model-opt`` keys that leave a pre-trained model's shapes alone (the rest would not load)
_FINETUNE_OPTS = ("drop_path_rate", "drop_rate")


def _hf_folder_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """:func:`peg_video.interop.hf.read_hf_video_config` of ``--init`` when it is a folder, else ``None``.

    A folder without a readable ``config.json`` of a supported model type is the reader's
    one-line ``WeightsError``, here, before any data is read; a file (or a path that does not
    exist: "--init checkpoint not found") is read when the model is built.
    """
    if args.init is None or not args.init.is_dir():
        return None
    return read_hf_video_config(args.init)


def _given(args: argparse.Namespace, explicit: dict[str, Any], dest: str) -> bool:
    """Whether ``dest`` was set by a flag or by the ``--config`` recipe (not a parser default)."""
    return dest in explicit or (args.config is not None and dest in CONFIGS[args.config])


def _check_hf_model(p: argparse.ArgumentParser, args: argparse.Namespace, explicit: dict[str, Any],
                    hf: dict[str, Any]) -> None:  # fmt: skip
    """The model options against an ``--init`` folder's model, whose shapes come from the folder."""
    folder = f"the model comes from the Hugging Face folder --init {args.init}"
    if "arch" in explicit:
        p.error(f"argument --arch: {folder}")
    _drop_or_refuse(p, args, explicit, ("num_heads", "tubelet", "pos_interpolation"), folder)
    opts = args.model_opts or {}
    shaped = sorted(set(explicit.get("model_opts") or {}) - set(_FINETUNE_OPTS))
    if shaped:
        p.error(f"argument --model-opt: {', '.join(shaped)} would change the shapes; {folder} "
                f"(only {', '.join(_FINETUNE_OPTS)} apply)")  # fmt: skip
    args.model_opts = {k: v for k, v in opts.items() if k in _FINETUNE_OPTS}
    if not _given(args, explicit, "pos_enc"):
        args.pos_enc = "table"  # the folder's model as it was saved
    if args.pos_enc == "table":  # the folder's own encoding, which has no PEG
        _drop_unused_pos_flags(
            p, args, explicit, hf["pos_enc"], f"--pos-enc table: the folder's {hf['pos_enc']}"
        )
    else:
        _drop_unused_pos_flags(p, args, explicit, args.pos_enc, f"--pos-enc {args.pos_enc}")
        _apply_peg_separable(p, args)
    args.arch = hf["model_type"]


def _clip_spec(args: argparse.Namespace, explicit: dict[str, Any], hf: dict[str, Any] | None) -> ClipSpec:
    """The run's clip, decided once from the flags, the ``--config`` recipe and an ``--init`` folder.

    One precedence rule per field:

    * ``num_frames``, ``stride``, ``crop``: a flag, else the recipe; with an ``--init`` folder and
      neither, the folder's native clip length and crop, else :data:`VIDEOMAE_INPUT`'s (16 frames
      at stride 4, 224 px);
    * ``tubelet``: an ``--init`` folder's (the model is the folder's), else ``--tubelet`` / the
      recipe's; none for an X3D (a CNN);
    * ``mean`` / ``std``: a flag, else the folder's preprocessor config, else the recipe's, else
      ImageNet's (VideoMAE's fine-tuning) with a folder and Kinetics' without.
    """
    native = folder_clip(hf) if hf is not None else {}
    sizes = {
        dest: getattr(args, dest) if hf is None or _given(args, explicit, dest) else native[dest]
        for dest in ("num_frames", "stride", "crop")
    }
    tubelet = native.get("tubelet") or (None if args.arch in X3D_CONFIGS else tuple(args.tubelet))
    norm = {}
    for dest, default in zip(("mean", "std"), (KINETICS_MEAN, KINETICS_STD), strict=True):
        value = getattr(args, dest, None)
        if hf is not None and (value is None or dest not in explicit):
            # the folder's preprocessor config, else the recipe's, else ImageNet's (VideoMAE's)
            value = hf[dest] if hf.get(dest) is not None else value if value is not None else native[dest]
        norm[dest] = tuple(float(v) for v in (value if value is not None else default))
    return ClipSpec(**sizes, tubelet=tubelet, **norm)


def _apply_clip(args: argparse.Namespace, clip: ClipSpec) -> None:
    """Write ``clip`` into the run's arguments (what ``args.json`` and the checkpoint record, and
    :meth:`ClipSpec.of_run` reads back); an X3D keeps its unused ``tubelet`` argument."""
    for dest, value in clip.record().items():
        if value is not None:
            setattr(args, dest, value)


def _apply_hf_views(args: argparse.Namespace, explicit: dict[str, Any]) -> None:
    """The VideoMAE recipe's views for an ``--init`` folder, where neither a flag nor the recipe says.

    The scale jitter is VideoMAE's 256..320 for a 224 crop, scaled with the crop, and the test
    short side is the crop (VideoMAE's ``short_side_size``).
    """
    views = videomae_views(args.crop)
    for dest in ("scale_jitter", "test_scale"):
        if not _given(args, explicit, dest):
            setattr(args, dest, views[dest])


def parse_train_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``train`` arguments (recipe defaults, then flags) and check the options against each other.

    ``--init FOLDER`` (a Hugging Face folder) is read here, so a wrong folder fails before any data.
    """
    p = build_train_parser()
    argv = _join_signed_values(sys.argv[1:] if argv is None else argv)
    args = parse_with_config(p, argv, CONFIGS)
    explicit = explicit_options(build_train_parser, argv)
    _check_dataset(p, args, explicit)
    _check_train_crop(p, args, explicit)
    # a hub id (org/name[@rev]) is its snapshot folder, timm:NAME a 2-D weights file; a path stays
    resolve_weights_arg(args, "init", kind="folder")
    hf = _hf_folder_config(args)
    if hf is None and args.config in FINETUNE_CONFIGS:
        p.error(f"argument --config: {args.config} fine-tunes pre-trained weights; give --init FOLDER "
                "(a Hugging Face VideoMAE folder)")  # fmt: skip
    if hf is None and args.pos_enc == "table":
        p.error("argument --pos-enc: table keeps the position encoding of an --init Hugging Face folder")
    if hf is not None:
        _check_hf_model(p, args, explicit, hf)
    else:
        _check_model(p, args, explicit)
    clip = _clip_spec(args, explicit, hf)
    _apply_clip(args, clip)
    if hf is not None:
        _apply_hf_views(args, explicit)
    _check_sizes(p, args, clip)
    return args


def parse_eval_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``eval`` arguments (unset ones are the checkpoint's run's)."""
    return build_eval_parser().parse_args(argv)


# ------------------------------------------------------------------------------ command functions


def make_data(argv: Sequence[str] | None = None) -> int:
    """``make-data OUT ...``: write the synthetic set; one closing line with its counts (``--json``: as JSON)."""
    from .make_data import make_data as write

    args = build_make_data_parser().parse_args(argv)
    counts = write(args)
    text = ", ".join(f"{v} {k}" for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool))
    line = done_line("make-data", f"{text or 'written'}, {args.dataset} layout", args.out)
    print_closing(line, {"command": "make-data", **counts}, args.json)
    return 0


def train(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``train ...``: fit the model; prints the closing line (``--json``: the report), returns the run report."""
    from .task import VideoTask

    args = parse_train_args(argv)
    return run_reported("train", args, lambda: fit(VideoTask(), args), SUMMARY)


def evaluate(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``eval --checkpoint CKPT ...``: prints the closing line (``--json``: the report), returns the eval report."""
    from .task import VideoTask

    args = parse_eval_args(argv)
    return run_reported("eval", args, lambda: evaluate_checkpoint(VideoTask(), args), SUMMARY)


def predict(argv: Sequence[str] | None = None) -> int:
    """``predict --checkpoint CKPT VIDEO...``: one line per video with its top classes, then a closing line.

    The flags, outputs and exit status every ``predict`` shares are :mod:`peg_core.engine.predict_cli`'s.
    """
    from .predict import predict as run

    args = build_predict_parser().parse_args(argv)
    args.device = predict_device(args.device, args.threads)
    check_predict_outputs(args)  # before the model is read: nothing the user owns is overwritten
    finish_predict(args, run(args), task="video", noun="videos")
    return 0


def configs(argv: Sequence[str] | None = None) -> int:
    """``configs [NAME]``: the named recipes of ``train --config`` (:func:`peg_core.engine.configs_command`)."""
    return configs_command(
        argv or [], prog="python -m peg_video", configs=CONFIGS, train_parser=build_train_parser,
        descriptions=DESCRIPTIONS,
    )  # fmt: skip


def prepare(argv: Sequence[str] | None = None) -> int:
    """``prepare SRC DST ...``: the short-side copy of a Kinetics tree; prints a one-line summary."""
    from .prepare import REPORT_NAME, prepare_tree

    p = build_prepare_parser()
    a = p.parse_args(argv)
    if a.crf > 51:
        p.error(f"argument --crf: expected an integer in [0, 51], got {a.crf}")
    r = prepare_tree(a.src, a.dst, a.short_side, a.workers, a.crf, a.preset, not a.no_progress, a.overwrite)
    print(
        f"prepared {r['videos']} videos in {r['seconds']:.1f}s: {r['encoded']} re-encoded, {r['copied']} copied, "
        f"{r['done']} already done, {r['broken']['count']} broken (listed in {a.dst / REPORT_NAME})"
    )
    return 0


def export(argv: Sequence[str]) -> int:
    """``export CKPT OUT.onnx ...`` (its parser is beside its code, :mod:`peg_video.export`)."""
    from .export import main

    return main(list(argv))


def build_export_hf_parser() -> argparse.ArgumentParser:
    """Arguments of ``export-hf``: a checkpoint with VideoMAE's table and the folder to write."""
    p = new_parser(
        "python -m peg_video export-hf",
        "Write a trained model with VideoMAE's table (e.g. fine-tuned from a VideoMAE folder with "
        "--pos-enc table) as a Hugging Face VideoMAE folder: config.json + model.safetensors, read by "
        "VideoMAEForVideoClassification.from_pretrained.  A PEG3d model has no table to write.",
    )
    p.add_argument("checkpoint", type=Path, help="checkpoint.pth written by train")
    p.add_argument(
        "out_dir", type=Path, help="the folder to write (created; a Hugging Face model there is refused)"
    )
    add_overwrite_arg(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    add_json_arg(p)
    return p


def export_hf(argv: Sequence[str] | None = None) -> int:
    """``export-hf CKPT OUT_DIR``: the checkpoint as a VideoMAE-layout folder (:func:`peg_video.interop.hf.export_hf`)."""
    from peg_core.engine import UserError, check_output_folder, read_checkpoint

    from .interop.hf import export_hf as write
    from .model import checkpoint_run, load_model

    args = build_export_hf_parser().parse_args(argv)
    # an existing Hugging Face folder (its config.json and weights) is the user's: refused, before any work
    check_output_folder(args.out_dir, HF_FILES, command="export-hf", inputs=[args.checkpoint],
                        overwrite=args.overwrite, create=False)  # fmt: skip
    ckpt = read_checkpoint(args.checkpoint, "video")
    config, _, _ = checkpoint_run(ckpt, args.checkpoint)
    pos_enc = str(config.get("pos_enc"))
    spec = parse_pos_enc(pos_enc, VIDEO_ENCODINGS)  # what the checkpoint's model was built with
    if spec.conditional is not None or not spec.parts:
        what = "a PEG3d model" if spec.conditional is not None else "a model without position encoding"
        raise UserError(f"{what} (pos_enc {pos_enc!r}) has no table for the VideoMAE layout (it needs "
                        "VideoMAE's sinusoid table)", args.checkpoint)  # fmt: skip
    loaded = load_model(ckpt, args.checkpoint)
    # the folder's processors feed the model what predict does: the run's test scale and normalisation
    clip = ClipSpec.of_run(loaded.args)
    try:
        out = write(loaded.model, args.out_dir, classes=loaded.classes, short_side=loaded.args.get("test_scale"),
                    mean=clip.mean, std=clip.std)  # fmt: skip
    except InputError:
        raise
    except ValueError as e:  # an option VideoMAE cannot express, named by export_hf
        raise UserError(f"not expressible in the VideoMAE layout ({e})", args.checkpoint) from None
    line = done_line("export-hf", f"VideoMAE folder ({pos_enc} table)", out)
    print_closing(line, {"command": "export-hf", "out_dir": str(out), "pos_enc": pos_enc}, args.json)
    return 0


def models(argv: Sequence[str] | None = None) -> int:
    """``models``: the public weights peg_video reads by name, their published accuracy and a PEG fine-tuning run."""
    parser = new_parser(
        "python -m peg_video models",
        "Public weights by name: ids, published accuracy, a fine-tuning command.",
    )
    parser.parse_args(list(argv or []))
    print(format_public_models(PUBLIC_MODELS))
    return 0
