"""Broken samples: skipped, counted and listed, never a crash in a DataLoader worker.

A task's dataset raises :class:`BrokenSample` for an item it cannot read (a missing
or truncated image, a non-image file, a malformed annotation, an undecodable video).
:class:`SkipBroken` turns that into a marker; :func:`skipping_collate` drops the
markers from the batch and hands their ``(path, reason)`` to the engine in a
:class:`SampleBatch`.  :class:`BrokenLog` counts them per split, lists them in
``report.json`` and stops the run when more than ``--max-broken`` of a split is
broken, or all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset

from .command import UserError

__all__ = ["BrokenLog", "BrokenSample", "SampleBatch", "SkipBroken", "skipping_collate"]


class BrokenSample(Exception):
    """Raised by a dataset for one item it cannot use; ``path`` names it, ``reason`` says why."""

    def __init__(self, path: Any, reason: str) -> None:
        self.path = str(path)
        self.reason = " ".join(str(reason).split())
        super().__init__(f"{self.path}: {self.reason}")


@dataclass(frozen=True)
class _Broken:
    path: str
    reason: str


@dataclass
class SampleBatch:
    """A collated batch of the usable items (``None`` when none was) and the broken ones met."""

    data: Any
    broken: list[tuple[str, str]] = field(default_factory=list)


class SkipBroken(Dataset):
    """Wrap a map-style dataset: an item that raises :class:`BrokenSample` becomes a marker."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except BrokenSample as e:
            return _Broken(e.path, e.reason)

    def __getattr__(self, name: str) -> Any:  # set_epoch, coco, classes, ... of the wrapped set
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def skipping_collate(collate_fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], SampleBatch]:
    """A collate function that drops broken markers and returns a :class:`SampleBatch`."""
    return _SkippingCollate(collate_fn)


class _SkippingCollate:
    # A class, not a closure: DataLoader workers started with "spawn" must pickle it.
    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, items: list[Any]) -> SampleBatch:
        good = [x for x in items if not isinstance(x, _Broken)]
        broken = [(x.path, x.reason) for x in items if isinstance(x, _Broken)]
        return SampleBatch(self.collate_fn(good) if good else None, broken)


class BrokenLog:
    """The broken samples of one split.

    Args:
        split: name used in messages and the report (``train``, ``val``, ``val_800``...).
        total: samples in the split (the fraction's denominator).
        max_fraction: more broken than ``max_fraction * total`` stops the run.
    """

    def __init__(self, split: str, total: int, max_fraction: float = 0.01) -> None:
        self.split = split
        self.total = int(total)
        self.max_fraction = float(max_fraction)
        self.items: dict[str, str] = {}

    def add(self, entries: Iterable[tuple[str, str]]) -> None:
        for path, reason in entries:
            self.items.setdefault(str(path), str(reason))

    def merge(self, parts: Sequence[dict[str, str]]) -> None:
        """Add the entries gathered from every rank."""
        for part in parts:
            self.add(part.items())

    @property
    def count(self) -> int:
        return len(self.items)

    def check(self, nothing_read: bool = False) -> None:
        """Raise :class:`UserError` when too much (or all) of the split is broken."""
        if self.count == 0 and not nothing_read:
            return
        first = next(iter(sorted(self.items.items())), None)
        example = f"; first: {first[0]}: {first[1]}" if first else ""
        if nothing_read or (self.total and self.count >= self.total):
            raise UserError(
                f"nothing could be read in split {self.split!r} ({self.count} of {self.total} samples broken{example})"
            )
        if self.count > self.max_fraction * self.total:
            raise UserError(
                f"too many broken samples in split {self.split!r}: {self.count} of {self.total} "
                f"(more than --max-broken {self.max_fraction:.1%}){example}"
            )

    def report(self) -> dict[str, Any]:
        """``{"count", "total", "samples": [{"path", "reason"}, ...]}`` for ``report.json``."""
        return {
            "count": self.count,
            "total": self.total,
            "samples": [{"path": p, "reason": r} for p, r in sorted(self.items.items())],
        }
