"""Metric logging: JSON lines always, TensorBoard scalars when installed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["MetricLogger"]


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
