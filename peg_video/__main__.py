"""``python -m peg_video make-data|train|eval|predict ...``

    python -m peg_video make-data data/synthetic_kinetics --num-train 120 --num-val 60
    python -m peg_video train --train-ann data/synthetic_kinetics/train.csv \\
        --val-ann data/synthetic_kinetics/val.csv --config synthetic_tiny --output-dir runs/video
    torchrun --nproc_per_node 8 -m peg_video train --config k400_vit_s_16x4_peg3d \\
        --train-ann k400/train.csv --val-ann k400/val.csv --output-dir runs/k400_peg3d --resume auto
    python -m peg_video eval --checkpoint runs/video/checkpoint.pth --num-frames 16
    python -m peg_video predict --checkpoint runs/video/checkpoint.pth clip1.mp4 clip2.mp4
    python -m peg_video export runs/video/checkpoint.pth video.onnx --check
    python -m peg_video prepare k400 k400_320 --short-side 320 --workers 16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from peg_core.engine import dispatch, ensure_writable, new_parser, positive_int

from . import __version__


def even_size(text: str) -> int:
    """``argparse`` type: a frame side for yuv420p video, an even number of pixels >= 16."""
    value = positive_int(text)
    if value % 2 or value < 16:
        raise argparse.ArgumentTypeError(f"expected an even number of pixels >= 16 (yuv420p), got {text!r}")
    return value


def make_data(argv: list[str]) -> int:
    """Write the synthetic moving-shapes set in the Kinetics layouts (or another data set's, ``--dataset``)."""
    from .data.datasets import DATASETS
    from .data.synthetic import SyntheticSpec, make_synthetic_dataset

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
    p.add_argument("--num-train", type=positive_int, default=d.num_train, help="training videos")
    p.add_argument("--num-val", type=positive_int, default=d.num_val, help="validation videos")
    p.add_argument("--width", type=even_size, default=d.width, help="frame width (even)")
    p.add_argument("--height", type=even_size, default=d.height, help="frame height (even)")
    p.add_argument("--frames", type=positive_int, default=d.frames, help="frames per video")
    p.add_argument("--fps", type=positive_int, default=d.fps)
    p.add_argument(
        "--codec", default=d.codec, choices=("libx264", "mpeg4"), help="mp4 codec (kinetics, folder)"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args(argv)
    ensure_writable(a.out)
    spec = SyntheticSpec(a.num_train, a.num_val, a.width, a.height, a.frames, a.fps, a.seed, a.codec)
    print(json.dumps(make_synthetic_dataset(a.out, a.dataset, spec)))
    return 0


def _train(argv: list[str]) -> int:
    from .train import main_train

    return main_train(argv)


def _eval(argv: list[str]) -> int:
    from .train import main_eval

    return main_eval(argv)


def _predict(argv: list[str]) -> int:
    from .predict import main

    return main(argv)


def _prepare(argv: list[str]) -> int:
    from .prepare import main

    return main(argv)


def _export(argv: list[str]) -> int:
    from .export import main

    return main(argv)


COMMANDS = {
    "make-data": make_data,
    "train": _train,
    "eval": _eval,
    "predict": _predict,
    "prepare": _prepare,
    "export": _export,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command under the failure policy; returns the exit code."""
    return dispatch("python -m peg_video", __doc__, COMMANDS, argv, version=__version__)


if __name__ == "__main__":
    sys.exit(main())
