"""One training epoch and one COCO evaluation pass for DETR (single process or DDP)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from peg_core.utils import MetricLogger, autocast_context, check_finite, progress, reduce_mean

from .evaluation import CocoEvaluator
from .structures import ImageBatch

__all__ = ["evaluate", "train_one_epoch", "weighted_loss"]


def _to_float(x: Any) -> Any:
    """Cast floating tensors in nested outputs to float32 (matching and losses run in full precision)."""
    if isinstance(x, Tensor):
        return x.float() if x.is_floating_point() else x
    if isinstance(x, dict):
        return {k: _to_float(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_to_float(v) for v in x)
    return x


def _targets_to(targets: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    return [{k: v.to(device) if isinstance(v, Tensor) else v for k, v in t.items()} for t in targets]


def weighted_loss(loss_dict: Mapping[str, Tensor], weight_dict: Mapping[str, float]) -> Tensor:
    """DETR's total loss: sum of the losses that have a weight in ``weight_dict``."""
    terms = [loss_dict[k] * weight_dict[k] for k in loss_dict if k in weight_dict]
    if not terms:
        raise KeyError(f"no loss in {sorted(loss_dict)} has a weight in {sorted(weight_dict)}")
    return torch.stack(terms).sum()


def train_one_epoch(
    model: nn.Module,
    criterion: nn.Module,
    loader: Iterable[tuple[ImageBatch, list[dict[str, Any]]]],
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    epoch: int,
    *,
    clip_max_norm: float = 0.1,
    amp: str = "none",
    scaler: torch.amp.GradScaler | None = None,
    logger: MetricLogger | None = None,
    global_step: int = 0,
    log_every: int = 10,
    show_progress: bool = True,
) -> dict[str, float]:
    """Train for one pass over ``loader``; return the epoch means of the (rank-averaged) losses.

    Raises ``FloatingPointError`` (via ``peg_core.utils.check_finite``) as soon
    as the total loss is NaN/inf on any rank; the caller has not yet
    overwritten the last checkpoint at that point.
    """
    model.train()
    criterion.train()
    sums: dict[str, float] = {}
    steps = 0
    bar = progress(loader, enable=show_progress, desc=f"epoch {epoch}", leave=False)
    for samples, targets in bar:
        samples = samples.to(device)
        targets = _targets_to(targets, device)
        with autocast_context(device, amp):
            outputs = model(samples)
        loss_dict = criterion(_to_float(outputs), targets)
        loss = weighted_loss(loss_dict, criterion.weight_dict)
        # The check uses the mean over ranks so every rank stops at the same step (no hang in DDP).
        check_finite(reduce_mean(loss.detach()), global_step + steps, where="DETR loss")

        optimizer.zero_grad(set_to_none=True)
        if scaler is not None and scaler.is_enabled():
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            if clip_max_norm > 0:
                nn.utils.clip_grad_norm_(model.parameters(), clip_max_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if clip_max_norm > 0:
                nn.utils.clip_grad_norm_(model.parameters(), clip_max_norm)
            optimizer.step()

        # One collective for all logged values: the rank means of each weighted loss term and the total.
        keys = [k for k in loss_dict if k in criterion.weight_dict]
        means = reduce_mean(torch.stack([loss_dict[k].detach() for k in keys] + [loss.detach()])).tolist()
        logged = dict(zip([*keys, "loss"], means))
        for k, v in logged.items():
            sums[k] = sums.get(k, 0.0) + v
        steps += 1
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{logged['loss']:.3f}")
        if logger is not None and (global_step + steps) % log_every == 0:
            logger.log(
                global_step + steps, "train_step", loss=logged["loss"], lr=optimizer.param_groups[0]["lr"]
            )
    if steps == 0:
        raise RuntimeError("the training loader yielded no batch (data set smaller than one batch?)")
    return {k: v / steps for k, v in sums.items()} | {"steps": steps}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    postprocessor: nn.Module,
    loader: Iterable[tuple[ImageBatch, list[dict[str, Any]]]],
    coco_gt: Any,
    device: torch.device,
    *,
    amp: str = "none",
    show_progress: bool = True,
    verbose: bool = True,
) -> dict[str, float]:
    """COCO bbox numbers (:data:`~peg_detr.evaluation.STAT_NAMES`) of ``model`` on ``loader``.

    Boxes are rescaled to each image's ``orig_size`` so the numbers do not
    depend on the evaluation resolution's coordinate frame.
    """
    model.eval()
    evaluator = CocoEvaluator(coco_gt)
    for samples, targets in progress(loader, enable=show_progress, desc="eval", leave=False):
        samples = samples.to(device)
        with autocast_context(device, amp):
            outputs = model(samples)
        sizes = torch.stack([t["orig_size"] for t in targets]).to(device)
        results = postprocessor(_to_float(outputs), sizes)
        evaluator.update({int(t["image_id"]): r for t, r in zip(targets, results)})
    return evaluator.summarize(verbose=verbose)
