"""Progress display: a tqdm bar on a terminal, a plain line every few seconds elsewhere.

CI logs, ``> log.txt`` and SLURM output files get readable lines such as
``epoch 3/50: 120/512 (23%) 4.1 it/s loss=0.853`` instead of carriage-return bar frames.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

__all__ = ["Progress", "progress"]

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
