"""One inference API for the three task packages: ``Predictor.from_checkpoint(path)`` then ``predictor(inputs)``.

    from peg_detr.predict import Predictor          # or peg_core.classify.predict, peg_video.predict
    predictor = Predictor.from_checkpoint("runs/detr/checkpoint.pth", device="cpu")
    for p in predictor.predict_files(["a.jpg", "b.jpg"]):
        print(p.line())

A task's predictor subclasses :class:`FilePredictor`: it says how to read a file
(:meth:`~FilePredictor.read`, raising :class:`~peg_core.engine.broken.BrokenSample` for one that
cannot be used), how to turn a read input into the model's input (:meth:`~FilePredictor.prepare`)
and how to run a batch of them (:meth:`~FilePredictor.run`).  This module does the rest: paths
and in-memory inputs mixed, unreadable files kept as skipped :class:`Prediction` s (never an
exception, never silently dropped), batching, results in input order.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .broken import BrokenSample

__all__ = ["ClassPrediction", "FilePredictor", "Prediction"]


@dataclass
class Prediction(ABC):
    """The result for one input: ``path`` (``None`` for an in-memory input) and ``skipped`` (why not, or None).

    A task's subclass adds its result and :meth:`result_text`.
    """

    path: str | None
    skipped: str | None = None

    @property
    def name(self) -> str:
        return self.path if self.path is not None else "<input>"

    @abstractmethod
    def result_text(self) -> str:
        """The result in words (one line); the subclass's."""

    def line(self) -> str:
        """One console line: ``PATH: <result>`` or ``PATH: skipped (<reason>)``."""
        if self.skipped is not None:
            return f"{self.name}: skipped ({self.skipped})"
        return f"{self.name}: {self.result_text()}"

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict of the prediction (``--json``, ``--output``)."""


@dataclass
class ClassPrediction(Prediction):
    """Classes with probabilities, best first (classify: images; video: clips)."""

    top: list[tuple[str, float]] = field(default_factory=list)

    def result_text(self) -> str:
        return ", ".join(f"{name} {p:.3f}" for name, p in self.top)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "top": [{"class": c, "p": p} for c, p in self.top],
            "skipped": self.skipped,
        }


def _is_single(inputs: Any) -> bool:
    return isinstance(inputs, str | os.PathLike | torch.Tensor) or not isinstance(inputs, Iterable)


class FilePredictor(ABC):
    """Base of the task predictors: ``predictor(inputs) -> list[Prediction]`` in input order.

    ``inputs`` is one input or a sequence of them; a ``str`` / ``os.PathLike`` is a file read by
    :meth:`read`, anything else (a tensor, a PIL image) is taken as already read.  Subclasses set
    :attr:`batch_size` and implement :meth:`read`, :meth:`prepare` and :meth:`run`.
    """

    batch_size: int = 1
    device: torch.device = torch.device("cpu")

    @abstractmethod
    def read(self, path: str) -> Any:
        """The input in ``path``; :class:`BrokenSample` when it cannot be used."""

    def prepare(self, item: Any) -> Any:
        """A read input -> what :meth:`run` batches (default: unchanged)."""
        return item

    @abstractmethod
    def run(self, paths: list[str | None], items: list[Any]) -> list[Prediction]:
        """Predictions for a batch of prepared inputs (``paths[i]`` names ``items[i]``)."""

    @abstractmethod
    def skipped(self, path: str, reason: str) -> Prediction:
        """The prediction of a file that could not be read (the subclass's type, without a result)."""

    @torch.no_grad()
    def __call__(self, inputs: Any) -> list[Prediction]:
        items = [inputs] if _is_single(inputs) else list(inputs)
        out: list[Prediction | None] = [None] * len(items)
        ready: list[tuple[int, str | None, Any]] = []
        for i, item in enumerate(items):
            path = os.fspath(item) if isinstance(item, str | os.PathLike) else None
            try:
                ready.append((i, path, self.prepare(self.read(path) if path is not None else item)))
            except BrokenSample as e:
                out[i] = self.skipped(str(path), e.reason)
        for start in range(0, len(ready), max(1, self.batch_size)):
            chunk = ready[start : start + max(1, self.batch_size)]
            results = self.run([p for _, p, _ in chunk], [x for _, _, x in chunk])
            for (i, _, _), pred in zip(chunk, results, strict=True):
                out[i] = pred
        return [p for p in out if p is not None]

    def predict_files(self, paths: Sequence[str | os.PathLike]) -> list[Prediction]:
        """:meth:`__call__` on files: unreadable ones come back skipped, with the reason."""
        return self([os.fspath(p) for p in paths])
