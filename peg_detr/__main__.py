"""Command line: ``python -m peg_detr {make-data,train,eval,predict,configs,models,export,export-hf} ...``.

* ``make-data OUT``: write the synthetic shapes set in COCO layout.
* ``train``: train on a COCO-format set (works under ``torchrun``); see ``train -h``.
* ``eval --checkpoint CKPT``: COCO box AP of a checkpoint, at one or several ``--eval-sizes``.
* ``predict IMAGE... --checkpoint CKPT``: draw detections on image files.
* ``configs [NAME]``: the named recipes of ``train --config NAME`` and what they set.
* ``models``: the public Hugging Face detectors ``--init`` takes by id, published AP, a PEG run.
* ``export-hf CKPT DIR``: write a ``sine`` checkpoint as a Hugging Face DETR folder.
* ``export CKPT OUT.onnx``: the detector as an ONNX graph (dynamic batch, height, width).

Exit codes: 0 done, 1 user error (one line ``error: ...``), 2 bad option, 3 NaN/inf loss.
The parsers and commands are in :mod:`peg_detr.cli`.
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


def main(argv: list[str] | None = None) -> int:
    return dispatch("python -m peg_detr", __doc__, COMMANDS, argv, version=__version__)


if __name__ == "__main__":
    sys.exit(main())
