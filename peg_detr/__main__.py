"""Command line: ``python -m peg_detr {train,eval,predict,make-data} ...``.

* ``train``: see ``python -m peg_detr train --help`` (works under ``torchrun``).
* ``eval``: ``train`` with ``--eval-only`` (give ``--resume CKPT``; ``--eval-sizes`` for a size table).
* ``predict``: draw detections on image files (``peg_detr.predict``).
* ``make-data OUT``: write the synthetic shapes set in COCO layout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

COMMANDS = ("train", "eval", "predict", "make-data")


def make_data(argv: list[str]) -> Path:
    from .data import SyntheticSpec, make_synthetic_coco

    p = argparse.ArgumentParser(
        prog="python -m peg_detr make-data", description="synthetic COCO-format shapes"
    )
    p.add_argument("out", type=Path)
    p.add_argument("--train", type=int, default=512, help="number of training images")
    p.add_argument("--val", type=int, default=128, help="number of validation images")
    p.add_argument("--size", type=int, default=160, help="image side in pixels")
    p.add_argument("--num-classes", type=int, default=3, help="shape classes (1..4)")
    p.add_argument("--min-objects", type=int, default=1)
    p.add_argument("--max-objects", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    spec = SyntheticSpec(a.size, a.num_classes, a.min_objects, a.max_objects)
    out = make_synthetic_coco(a.out, a.train, a.val, seed=a.seed, spec=spec)
    print(f"wrote {a.train} train + {a.val} val images to {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "make-data":
        make_data(rest)
        return 0
    if cmd == "predict":
        from .predict import main as predict_main

        predict_main(rest)
        return 0
    from .train import main as train_main

    try:
        train_main(rest + (["--eval-only"] if cmd == "eval" else []))
    except FloatingPointError:
        return 1  # the message (and the kept checkpoint) was printed by train
    return 0


if __name__ == "__main__":
    sys.exit(main())
