"""``python -m peg_video make-data|train|eval|predict|configs|models|prepare|export|export-hf ...``

    python -m peg_video make-data data/synthetic_kinetics --num-train 120 --num-val 60
    python -m peg_video train --train-ann data/synthetic_kinetics/train.csv \\
        --val-ann data/synthetic_kinetics/val.csv --config synthetic_tiny --output-dir runs/video
    torchrun --nproc_per_node 8 -m peg_video train --config k400_vit_s_16x4_peg3d \\
        --train-ann k400/train.csv --val-ann k400/val.csv --output-dir runs/k400_peg3d --resume auto
    python -m peg_video eval --checkpoint runs/video/checkpoint.pth --num-frames 16
    python -m peg_video predict --checkpoint runs/video/checkpoint.pth clip1.mp4 clip2.mp4
    python -m peg_video export runs/video/checkpoint.pth video.onnx --check
    python -m peg_video train --init videomae-small-folder --pos-enc peg3d --train-ann ... --val-ann ...
    python -m peg_video export-hf runs/video/checkpoint.pth videomae_folder
    python -m peg_video configs [NAME]
    python -m peg_video models
    python -m peg_video prepare k400 k400_320 --short-side 320 --workers 16
"""

from __future__ import annotations

import sys

from peg_core.engine import dispatch
from peg_core.errors import MissingDependency

from . import __version__

try:
    from . import cli
except MissingDependency as e:  # a required package missing from a broken installation: one line, exit 1
    raise SystemExit(f"error: {e}") from None

COMMANDS = {
    "make-data": cli.make_data,
    "train": cli.train,
    "eval": cli.evaluate,
    "predict": cli.predict,
    "configs": cli.configs,
    "models": cli.models,
    "prepare": cli.prepare,
    "export": cli.export,
    "export-hf": cli.export_hf,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command under the failure policy; returns the exit code."""
    return dispatch("python -m peg_video", __doc__, COMMANDS, argv, version=__version__)


if __name__ == "__main__":
    sys.exit(main())
