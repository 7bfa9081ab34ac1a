"""``python -m peg_video make-data|train|eval ...``

    python -m peg_video make-data data/synthetic_kinetics [--num-train 120 --num-val 60 --seed 0]
    python -m peg_video train --train-ann data/synthetic_kinetics/train.csv \\
        --val-ann data/synthetic_kinetics/val.csv --out runs/video
    torchrun --nproc_per_node 8 -m peg_video train --config k400_vit_s_16x4_peg3d \\
        --train-ann k400/train.csv --val-ann k400/val.csv --out runs/k400_peg3d
    python -m peg_video eval --checkpoint runs/video/checkpoint.pt --num-frames 16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def make_data(argv: list[str]) -> int:
    from .data.synthetic import SyntheticSpec, make_synthetic_kinetics

    d = SyntheticSpec()
    p = argparse.ArgumentParser(
        prog="python -m peg_video make-data",
        description="Generate the synthetic Kinetics-format set (moving shapes).",
    )
    p.add_argument("out", type=Path)
    p.add_argument("--num-train", type=int, default=d.num_train)
    p.add_argument("--num-val", type=int, default=d.num_val)
    p.add_argument("--width", type=int, default=d.width)
    p.add_argument("--height", type=int, default=d.height)
    p.add_argument("--frames", type=int, default=d.frames)
    p.add_argument("--fps", type=int, default=d.fps)
    p.add_argument("--codec", default=d.codec, choices=("libx264", "mpeg4"))
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args(argv)
    spec = SyntheticSpec(a.num_train, a.num_val, a.width, a.height, a.frames, a.fps, a.seed, a.codec)
    print(json.dumps(make_synthetic_kinetics(a.out, spec)))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("make-data", "train", "eval")
    if not argv or argv[0] not in commands:
        print(__doc__)
        print(f"commands: {', '.join(commands)} (add -h for the options of each)")
        return 0 if argv and argv[0] in ("-h", "--help") else 1
    command, rest = argv[0], argv[1:]
    if command == "make-data":
        return make_data(rest)
    from .train import main_eval, main_train

    return main_train(rest) if command == "train" else main_eval(rest)


if __name__ == "__main__":
    sys.exit(main())
