"""Gradient accumulation (``--grad-accum-steps N``): one optimizer step over N micro-batches.

The task's loader yields the batch of a whole optimizer step (``N x --batch-size`` samples per
process, :func:`step_batch_size`); the engine splits it into N micro-batches
(:func:`split_batch`), runs the task's ``step`` on each and back-propagates each loss scaled by
the micro-batch's share of the step's samples, so the step's gradient is the large batch's
(the loss of each micro-batch is a mean over its samples).  Because the loader yields whole
steps, everything that is drawn per batch is drawn per optimizer step: RT-DETR's multi-scale
side, the engine's ``--train-sizes`` side, the order of the samples; the scheduler, the EMA,
the logs, the NaN policy and the checkpoints count optimizer steps.

A loss that is normalised by something other than the samples (the DETR family's box losses,
normalised by the boxes of the batch over all processes) reads :attr:`Micro.share` and the
step's whole batch (:attr:`Micro.step_batch`) from ``ctx.micro`` and normalises by
``share x`` the step's count, so that ``share x loss`` sums to the large batch's loss.

What stays different from the large batch: batch-dependent layers (BatchNorm's batch
statistics are those of each micro-batch), a loss that is a weighted mean (DETR's
cross-entropy with its no-object weight), D-FINE's union-set box normaliser (a count of the
matches, known after the forward only; scaled by the micro-batch's share of the boxes), and
the random draws inside the model (dropout, drop-path: drawn per micro-batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["Micro", "accum_steps", "batch_length", "split_batch", "step_batch_size"]


@dataclass(frozen=True)
class Micro:
    """The micro-batch being run, as ``ctx.micro`` shows it to the task's ``step`` (None without accumulation).

    Attributes:
        index: 0 .. count - 1.
        count: micro-batches in this optimizer step (N, fewer for a step with fewer samples than N).
        share: this micro-batch's samples / the step's samples on this process; its loss is
            back-propagated times ``share``.
        step_batch: the whole step's batch (as the loader gave it, before the split).
    """

    index: int
    count: int
    share: float
    step_batch: Any


def accum_steps(args: argparse.Namespace | None) -> int:
    """``--grad-accum-steps`` (1 when absent)."""
    return int(getattr(args, "grad_accum_steps", None) or 1)


def step_batch_size(args: argparse.Namespace, batch_size: int | None = None) -> int:
    """The loader's batch per process: ``batch_size`` (default ``--batch-size``) x ``--grad-accum-steps``."""
    return int(batch_size if batch_size is not None else args.batch_size) * accum_steps(args)


def _is_structure(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        or (isinstance(obj, tuple) and hasattr(obj, "_fields"))
        or dataclasses.is_dataclass(obj)
    )


def batch_length(batch: Any) -> int:
    """The number of samples of a collated batch: the first dimension of its first tensor of at least one dimension,
    else the length of its first per-sample list."""
    if isinstance(batch, Tensor):
        if batch.dim() == 0:
            raise ValueError("a 0-dimensional tensor holds no samples")
        return int(batch.shape[0])
    if isinstance(batch, dict):
        items = list(batch.values())
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):
        items = list(batch)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        items = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    elif isinstance(batch, list | tuple):
        # a structure such as (images, labels): its first tensor says; else a list of samples
        if not any(
            (isinstance(x, Tensor) and x.dim() > 0) or _is_structure(x) or isinstance(x, list) for x in batch
        ):
            return len(batch)
        items = list(batch)
    else:
        raise ValueError(f"cannot count the samples of a {type(batch).__name__}")
    for x in items:
        if isinstance(x, Tensor) and x.dim() > 0:
            return int(x.shape[0])
    for x in items:
        try:
            return batch_length(x)
        except ValueError:
            continue
    if isinstance(batch, list | tuple):
        return len(batch)
    raise ValueError("the batch holds no tensor or list of samples")


def _take(obj: Any, n: int, start: int, stop: int) -> Any:
    if isinstance(obj, Tensor):
        return obj[start:stop] if obj.dim() > 0 and obj.shape[0] == n else obj
    if isinstance(obj, dict):
        return {k: _take(v, n, start, stop) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple (peg_detr's ImageBatch)
        return type(obj)(*(_take(v, n, start, stop) for v in obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj,
            **{
                f.name: _take(getattr(obj, f.name), n, start, stop) for f in dataclasses.fields(obj) if f.init
            },
        )
    if isinstance(obj, list | tuple):
        # (images, labels) is a structure; [target dict, ...] or [path, ...] one item per sample
        structure = any(
            (isinstance(x, Tensor) and x.dim() > 0 and x.shape[0] == n)
            or _is_structure(x)
            or isinstance(x, list)
            for x in obj
        )
        if structure and not (len(obj) == n and all(isinstance(x, dict) for x in obj)):
            return type(obj)(_take(x, n, start, stop) for x in obj)
        if len(obj) == n:
            return type(obj)(obj[start:stop])
    return obj


def split_batch(batch: Any, parts: int) -> list[tuple[Any, int]]:
    """``batch`` as ``min(parts, samples)`` micro-batches of near-equal size (``torch.tensor_split``'s
    sizes, in order), each with its number of samples.

    Tensors whose first dimension is the batch's are sliced, per-sample lists (target dicts,
    paths) too; dicts, tuples, NamedTuples and dataclasses are split field by field; anything
    else (a scalar, a shared tensor) is handed to every micro-batch.
    """
    n = batch_length(batch)
    parts = max(1, min(parts, n))
    bounds = [0, *(int(i[-1]) + 1 for i in torch.arange(n).tensor_split(parts))]
    return [(_take(batch, n, a, b), b - a) for a, b in itertools.pairwise(bounds)]
