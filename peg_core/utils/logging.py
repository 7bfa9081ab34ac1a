"""Metric logging: JSON lines always, TensorBoard scalars when installed, tqdm bars when installed."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch

__all__ = ["MetricLogger", "check_finite", "progress"]

T = TypeVar("T")


def progress(it: Iterable[T], enable: bool = True, **kwargs: Any) -> Iterable[T]:
    """A tqdm bar over ``it`` when tqdm is installed and ``enable``; else ``it`` itself."""
    if not enable:
        return it
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency of the training packages
        return it
    return tqdm(it, dynamic_ncols=True, **kwargs)


def check_finite(loss: torch.Tensor, step: int, where: str = "loss") -> None:
    """Raise ``FloatingPointError`` when ``loss`` is NaN or inf (one host sync; call once per step)."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(
            f"{where} is {value} at step {step}; training stopped. The last good checkpoint is kept; "
            "lower the learning rate or check the data, then resume."
        )


class MetricLogger:
    """Writes one JSON object per call to ``log.jsonl`` and scalars to TensorBoard.

    Only the main process writes (pass ``enabled=False`` on other ranks).
    """

    def __init__(self, out_dir: str | Path, enabled: bool = True, tensorboard: bool = True) -> None:
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self._tb = None
        self._t0 = time.time()
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "log.jsonl"
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.out_dir / "tb"))
            except ImportError:
                self._tb = None

    def log(self, step: int, tag: str = "train", **metrics: Any) -> None:
        if not self.enabled:
            return
        record = {"tag": tag, "step": step, "time": round(time.time() - self._t0, 3)}
        for k, v in metrics.items():
            if isinstance(v, torch.Tensor):
                v = v.item() if v.numel() == 1 else v.tolist()
            record[k] = v
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if (
                    k not in ("tag", "step", "time")
                    and isinstance(v, int | float)
                    and not isinstance(v, bool)
                ):
                    self._tb.add_scalar(f"{tag}/{k}", v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
