"""Progress display: a tqdm bar on a terminal, a plain line every few seconds elsewhere.

CI logs, ``> log.txt`` and SLURM output files get readable lines such as
``epoch 3/50: 120/512 (23%) 4.1 it/s loss=0.853`` instead of carriage-return bar frames.
After each epoch :func:`epoch_line` says what it did in one line that fits a terminal,
``epoch 3/12: loss 1.234 (vfl 0.410, bbox 0.120, giou 0.330) lr 2.0e-04 38 s``; every logged
term goes to the metrics log (``log.jsonl``, TensorBoard) as before.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TextIO, TypeVar

__all__ = ["Progress", "epoch_line", "format_seconds", "main_terms", "progress"]

T = TypeVar("T")

#: seconds between two plain lines; ``PEG_PROGRESS_INTERVAL`` overrides it
DEFAULT_INTERVAL = 10.0


class Progress(Iterable[T]):
    """Iterate ``it`` and report progress to ``stream``.

    Args:
        it: the iterable (a DataLoader, ...).
        desc: prefix of every report.
        total: number of items (``len(it)`` when it has one).
        enable: ``False`` reports nothing.
        stream: where reports go (default ``sys.stderr``).
        interval: seconds between plain lines (non-terminal streams).
        force_plain: plain lines even on a terminal.
    """

    def __init__(
        self,
        it: Iterable[T],
        desc: str = "",
        total: int | None = None,
        enable: bool = True,
        stream: TextIO | None = None,
        interval: float | None = None,
        force_plain: bool = False,
    ) -> None:
        self.it = it
        self.desc = desc
        self.total = total if total is not None else (len(it) if hasattr(it, "__len__") else None)
        self.enable = enable
        self.stream = stream if stream is not None else sys.stderr
        if interval is None:
            interval = float(os.environ.get("PEG_PROGRESS_INTERVAL", DEFAULT_INTERVAL))
        self.interval = interval
        self.postfix: dict[str, Any] = {}
        self._tqdm = None
        if enable and not force_plain and _isatty(self.stream):
            try:
                from tqdm.auto import tqdm

                self._tqdm = tqdm(
                    total=self.total, desc=desc, dynamic_ncols=True, leave=False, file=self.stream
                )
            except ImportError:  # pragma: no cover - tqdm is a dependency of the task packages
                self._tqdm = None

    def set_postfix(self, **values: Any) -> None:
        """Values shown after the count (e.g. ``loss=0.85``)."""
        self.postfix = values
        if self._tqdm is not None:
            self._tqdm.set_postfix(values, refresh=False)

    def line(self, done: int, elapsed: float) -> str:
        """The plain report after ``done`` items in ``elapsed`` seconds."""
        count = f"{done}/{self.total} ({100 * done / self.total:.0f}%)" if self.total else f"{done}"
        rate = f"{done / elapsed:.2f} it/s" if elapsed > 0 else "- it/s"
        extra = "".join(f" {k}={v}" for k, v in self.postfix.items())
        return f"{self.desc + ': ' if self.desc else ''}{count} {rate}{extra}"

    def __iter__(self) -> Iterator[T]:
        t0 = last = time.monotonic()
        done = 0
        try:
            for item in self.it:
                yield item
                done += 1
                if self._tqdm is not None:
                    self._tqdm.update(1)
                elif self.enable:
                    now = time.monotonic()
                    if now - last >= self.interval:
                        last = now
                        print(self.line(done, now - t0), file=self.stream, flush=True)
        finally:
            if self._tqdm is not None:
                self._tqdm.close()
            elif self.enable and done and time.monotonic() - t0 >= self.interval:
                print(self.line(done, time.monotonic() - t0), file=self.stream, flush=True)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress(
    it: Iterable[T], desc: str = "", total: int | None = None, enable: bool = True, **kw: Any
) -> Progress[T]:
    """Shorthand for :class:`Progress`."""
    return Progress(it, desc=desc, total=total, enable=enable, **kw)


#: the terms of an epoch line after the total loss
EPOCH_TERMS = 4
#: entries of an epoch's statistics that are not loss terms (said otherwise, or not at all)
_NOT_TERMS = ("loss", "steps", "broken", "size")


def main_terms(stats: Mapping[str, Any], most: int = EPOCH_TERMS) -> dict[str, float]:
    """The main loss terms of an epoch's ``stats``, short-named: ``loss_vfl`` -> ``vfl``.

    A main term is a final-layer one: its name without ``loss_`` has no ``_`` left (``loss_giou``,
    ``acc``); the per-layer, auxiliary, encoder and denoising copies (``loss_giou_0``,
    ``loss_vfl_aux_0``, ``loss_bbox_dn_pre``) are not.  At most ``most``, in the order logged.
    """
    terms = {k: v for k, v in stats.items() if k not in _NOT_TERMS and isinstance(v, int | float)}
    main = {k.removeprefix("loss_"): float(v) for k, v in terms.items() if "_" not in k.removeprefix("loss_")}
    return dict(list(main.items())[:most])


def format_seconds(seconds: float) -> str:
    """``38 s``, ``12.5 min``, ``2.1 h``: a duration with its unit."""
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 6000:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def epoch_line(epoch: int, epochs: int, stats: Mapping[str, Any], lr: float | None, seconds: float) -> str:
    """``epoch 3/12: loss 1.234 (vfl 0.410, bbox 0.120, giou 0.330) lr 2.0e-04 38 s``.

    ``epoch`` counts from 1; ``stats`` are the epoch's means (``loss`` and the task's terms) with
    ``steps``, ``broken`` and ``size``; ``seconds`` the epoch's duration.  The total loss, the
    :func:`main_terms`, the learning rate and the time; the input size when the run draws several
    (``at 48 px``) and the broken samples when there were any.  The other terms are in the metrics log.
    """
    text = f"epoch {epoch}/{epochs}:"
    if "loss" in stats:
        text += f" loss {float(stats['loss']):.3f}"
    terms = main_terms(stats)
    losses = [f"{k} {v:.3f}" for k, v in terms.items() if f"loss_{k}" in stats]
    if losses:  # the loss's terms in brackets; other numbers (accuracy) after them
        text += " (" + ", ".join(losses) + ")"
    text += "".join(f" {k} {v:.3f}" for k, v in terms.items() if f"loss_{k}" not in stats)
    if lr is not None:
        text += f" lr {lr:.1e}"
    if stats.get("size"):
        text += f" at {float(stats['size']):.0f} px"
    text += f" {format_seconds(seconds)}"
    if stats.get("broken"):
        text += f", {int(stats['broken'])} broken"
    return text
