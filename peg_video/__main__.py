"""Video transformers with a space-time PEG or another position encoding, for action recognition.

``python -m peg_video VERB ...``; ``python -m peg_video -h`` lists the verbs (:data:`SUMMARIES`, one
line each), ``VERB -h`` their options, docs/cli.md all of it::

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

#: the top-level -h: one line per verb
SUMMARIES = {
    "make-data": "write the synthetic moving-shapes set (Kinetics, SSv2, UCF101, HMDB51 or folder layout)",
    "train": "train on annotated clips (CSV or the data set's own files; torchrun: several GPUs)",
    "eval": "multi-view top-1 / top-5 of a checkpoint on a validation split",
    "predict": "the top-k classes of video files",
    "configs": "the named recipes of train --config and what they set",
    "models": "the public video models --init takes by id, their published accuracy, a PEG run",
    "prepare": "a copy of a Kinetics tree with videos at a smaller short side",
    "export": "a checkpoint as an ONNX graph (dynamic batch, frames, height, width)",
    "export-hf": "a checkpoint as a Hugging Face folder (VideoMAE)",
}


def main(argv: list[str] | None = None) -> int:
    """Run one command under the failure policy; returns the exit code."""
    return dispatch("python -m peg_video", __doc__, COMMANDS, argv, version=__version__, summaries=SUMMARIES)


if __name__ == "__main__":
    sys.exit(main())
