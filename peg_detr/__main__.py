"""Command line: ``python -m peg_detr {make-data,train,eval,predict} ...``.

* ``make-data OUT``: write the synthetic shapes set in COCO layout.
* ``train``: train on a COCO-format set (works under ``torchrun``); see ``train -h``.
* ``eval --checkpoint CKPT``: COCO box AP of a checkpoint, at one or several ``--eval-sizes``.
* ``predict IMAGE... --checkpoint CKPT``: draw detections on image files.
* ``export-hf CKPT DIR``: write a ``sine`` checkpoint as a Hugging Face DETR folder.
* ``export CKPT OUT.onnx``: the detector as an ONNX graph (dynamic batch, height, width).

Exit codes: 0 done, 1 user error (one line ``error: ...``), 2 bad option, 3 NaN/inf loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from peg_core.engine import dispatch, ensure_writable, new_parser, nonnegative_int, positive_int

from . import __version__, evaluate, hf, predict, train
from .data import SHAPES, SyntheticSpec, make_synthetic_coco


def _int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {text!r}")
        return value

    return parse


def make_data(argv: list[str]) -> Path:
    """``make-data OUT``: the synthetic shapes set (``peg_detr.data.synthetic``)."""
    p = new_parser("python -m peg_detr make-data", "synthetic COCO-format shapes")
    p.add_argument("out", type=Path)
    p.add_argument("--train", type=positive_int, default=512, help="number of training images")
    p.add_argument("--val", type=positive_int, default=128, help="number of validation images")
    p.add_argument("--size", type=_int_in(16, 4096), default=160, help="image side in pixels (16..4096)")
    p.add_argument(
        "--num-classes", type=_int_in(1, len(SHAPES)), default=3, help=f"shape classes (1..{len(SHAPES)})"
    )
    p.add_argument("--min-objects", type=nonnegative_int, default=1)
    p.add_argument("--max-objects", type=nonnegative_int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    a = p.parse_args(argv)
    if a.min_objects > a.max_objects:
        p.error(f"--min-objects {a.min_objects} is more than --max-objects {a.max_objects}")
    ensure_writable(a.out)
    spec = SyntheticSpec(a.size, a.num_classes, a.min_objects, a.max_objects)
    out = make_synthetic_coco(a.out, a.train, a.val, seed=a.seed, spec=spec)
    print(f"wrote {a.train} train + {a.val} val images to {out}")
    return out


def _export(argv: list[str]) -> int:
    """``export CKPT OUT.onnx``: the detector as ONNX with dynamic batch, height and width."""
    from .export import main as export_main  # imports onnx only when asked

    return export_main(argv)


COMMANDS = {
    "make-data": make_data,
    "train": train.main,
    "eval": evaluate.main,
    "predict": predict.main,
    "export": _export,
    "export-hf": hf.main,
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m peg_detr", __doc__, COMMANDS, argv, version=__version__)


if __name__ == "__main__":
    sys.exit(main())
