"""The clip of a run: one frozen spec of what the data reads and the model is sized for.

A video run has one clip: ``num_frames`` frames ``stride`` apart, cropped to ``crop`` pixels,
normalised with ``mean`` / ``std``, and (for a transformer) split into ``tubelet`` tubelets.
:class:`ClipSpec` holds them together; it is decided once, when ``train``'s arguments are parsed
(:func:`peg_video.cli.parse_train_args`: flags, the ``--config`` recipe and an ``--init`` folder,
one precedence rule), recorded in the run's arguments, and read back from them
(:meth:`ClipSpec.of_run`) for the data loaders and the model.  Its tubelet check is
:func:`peg_video.models.vit.tubelet_misfits`, the one rule every check of the tubelet uses.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peg_core.errors import InputError

from ..models.vit import tubelet_misfits
from .transforms import KINETICS_MEAN, KINETICS_STD

__all__ = ["ClipSpec", "ClipSpecError"]

#: the command-line flag of each clip axis (a tubelet's ``T`` is the clip length, ``H`` / ``W`` the crop)
FLAGS = {"T": "--num-frames", "H": "--crop", "W": "--crop"}


class ClipSpecError(InputError):
    """A clip that does not split into the model's tubelets: ``what`` says how, ``where`` names the flag."""


@dataclass(frozen=True)
class ClipSpec:
    """One run's clip.

    Attributes:
        num_frames: frames per clip ``T``.
        stride: step between the sampled frames (stride sampling).
        crop: square crop side in pixels (``H = W``).
        tubelet: the transformer's ``(t, p, p)``, or ``None`` for a model without tubelets (X3D).
        mean, std: per-channel input normalisation (RGB).
    """

    num_frames: int
    stride: int
    crop: int
    tubelet: tuple[int, int, int] | None = None
    mean: tuple[float, float, float] = KINETICS_MEAN
    std: tuple[float, float, float] = KINETICS_STD

    @classmethod
    def of_run(
        cls, run: argparse.Namespace | Mapping[str, Any], tubelet: Sequence[int] | None = None
    ) -> ClipSpec:
        """The clip a run's arguments record (parsed ``train`` flags, or a checkpoint's stored ``args``).

        ``tubelet``: the model's, when the caller has it (else the run's ``tubelet``, if any).
        Runs from before ``--mean`` / ``--std`` read Kinetics' normalisation.
        """
        get = run.get if isinstance(run, Mapping) else lambda k, d=None: getattr(run, k, d)
        tub = tubelet if tubelet is not None else get("tubelet")
        return cls(
            num_frames=get("num_frames"),
            stride=get("stride"),
            crop=get("crop"),
            tubelet=None if tub is None else tuple(int(k) for k in tub),
            mean=tuple(float(v) for v in (get("mean") or KINETICS_MEAN)),
            std=tuple(float(v) for v in (get("std") or KINETICS_STD)),
        )

    def misfits(self) -> list[tuple[str, int, int]]:
        """``(axis, size, k)`` for each axis of ``(num_frames, crop, crop)`` the tubelet does not divide."""
        if self.tubelet is None:
            return []
        return tubelet_misfits((self.num_frames, self.crop, self.crop), self.tubelet)

    def check(self) -> None:
        """:class:`ClipSpecError` naming the first flag whose size the tubelet does not divide."""
        for axis, size, _ in self.misfits():
            raise ClipSpecError(
                f"must be a multiple of the model's tubelet {self.tubelet}", f"{FLAGS[axis]} {size}"
            )

    def record(self) -> dict[str, Any]:
        """The run arguments that hold this clip (JSON-safe: lists, not tuples)."""
        return {
            "num_frames": self.num_frames,
            "stride": self.stride,
            "crop": self.crop,
            "tubelet": None if self.tubelet is None else list(self.tubelet),
            "mean": list(self.mean),
            "std": list(self.std),
        }
