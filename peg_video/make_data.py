"""``python -m peg_video make-data OUT``: the synthetic moving-shapes videos in a data set's layout.

The writer itself is :mod:`peg_video.data.synthetic`; this is the verb's work: check the output
folder, turn the parsed flags into a :class:`~peg_video.data.synthetic.SyntheticSpec`, write.
"""

from __future__ import annotations

import argparse
from typing import Any

from peg_core.engine import ensure_writable

from .data.synthetic import SyntheticSpec, make_synthetic_dataset

__all__ = ["make_data"]


def make_data(args: argparse.Namespace) -> dict[str, Any]:
    """Write the set that ``args`` (:func:`peg_video.cli.build_make_data_parser`) describe; returns its counts."""
    ensure_writable(args.out)
    spec = SyntheticSpec(
        num_train=args.num_train,
        num_val=args.num_val,
        width=args.width,
        height=args.height,
        frames=args.frames,
        fps=args.fps,
        seed=args.seed,
        codec=args.codec,
    )
    return make_synthetic_dataset(args.out, args.dataset, spec)
