"""Detectors with a PEG or another position encoding: DETR, RT-DETR, D-FINE, DEIMv2.

``python -m peg_detr VERB ...``; ``python -m peg_detr -h`` lists the verbs (:data:`SUMMARIES`, one
line each), ``VERB -h`` their options, docs/cli.md all of it.  Exit codes: 0 done, 1 user error
(one line ``error: ...``), 2 bad option, 3 NaN/inf loss.  The parsers and commands are in
:mod:`peg_detr.cli`.
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
    "export": cli.export,
    "export-hf": cli.export_hf,
}

#: the top-level -h: one line per verb
SUMMARIES = {
    "make-data": "write the synthetic shapes set (COCO, Roboflow COCO or YOLO layout)",
    "train": "train on a COCO, Roboflow COCO or YOLO set (torchrun: several GPUs)",
    "eval": "COCO box AP of a checkpoint, at one or several --eval-sizes",
    "predict": "draw a checkpoint's detections on image files",
    "configs": "the named recipes of train --config and what they set",
    "models": "the public detectors --init takes by id, their published AP, a PEG run",
    "export": "a checkpoint as an ONNX graph (dynamic batch, height, width)",
    "export-hf": "a checkpoint as a Hugging Face folder (DETR, RT-DETR, D-FINE, DEIMv2)",
}


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m peg_detr", __doc__, COMMANDS, argv, version=__version__, summaries=SUMMARIES)


if __name__ == "__main__":
    sys.exit(main())
