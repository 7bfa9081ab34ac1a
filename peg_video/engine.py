"""One training epoch and one multi-view evaluation pass, shared by ``train`` and ``eval``.

Batches are dicts (see :func:`peg_video.data.collate_clips`): ``video`` (training
``(B, C, T, H, W)``; testing ``(B, V, C, T, H, W)`` views), ``label``, ``index`` (video index),
optional ``view_offset`` (first view index of the batch's views, default 0) and ``skipped``
(broken videos met while loading).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from peg_core.utils import check_finite, progress, reduce_mean
from peg_core.utils.amp import autocast_context

from .evaluation import KineticsEvaluator

__all__ = ["evaluate", "train_one_epoch"]


def train_one_epoch(
    model: nn.Module,
    loader: Iterable[dict[str, Any]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    criterion: nn.Module,
    device: torch.device,
    step: int,
    amp: str = "none",
    scaler: torch.amp.GradScaler | None = None,
    clip_grad: float = 0.0,
    logger=None,
    log_every: int = 10,
    show_progress: bool = True,
    desc: str = "train",
) -> tuple[dict[str, Any], int]:
    """Train over ``loader`` once.  Returns ``(stats, step)``; ``stats`` holds the mean loss,
    accuracy and the broken videos met (``skipped``: list of ``(path, reason)``).

    Raises ``FloatingPointError`` (via ``check_finite``) on a NaN/inf loss on any rank.
    """
    model.train()
    total_loss, total_correct, total_seen = 0.0, 0, 0
    skipped: list[tuple[str, str]] = []
    bar = progress(loader, enable=show_progress, desc=desc, leave=False)
    for batch in bar:
        skipped.extend(batch["skipped"])
        if batch["video"] is None:
            continue
        video = batch["video"].to(device, non_blocking=True)
        labels = batch["label"].to(device, non_blocking=True)
        with autocast_context(device, amp):
            logits = model(video)
            loss = criterion(logits.float(), labels)
        check_finite(reduce_mean(loss.detach()), step)  # every rank stops together
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        if clip_grad > 0:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        step += 1
        n = labels.shape[0]
        total_loss += loss.item() * n
        total_correct += int((logits.argmax(1) == labels).sum())
        total_seen += n
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}")
        if logger is not None and step % log_every == 0:
            logger.log(step, "train_step", loss=loss.item(), lr=optimizer.param_groups[0]["lr"])
    stats = {
        "loss": total_loss / max(total_seen, 1) if total_seen else math.nan,
        "acc": total_correct / max(total_seen, 1),
        "clips": total_seen,
        "skipped": skipped,
    }
    return stats, step


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[dict[str, Any]],
    num_classes: int,
    device: torch.device,
    reduction: str = "mean",
    amp: str = "none",
    view_chunk: int = 16,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Multi-view evaluation; returns :meth:`KineticsEvaluator.summarize` (merged over ranks)."""
    model.eval()
    evaluator = KineticsEvaluator(num_classes, reduction=reduction)
    for batch in progress(loader, enable=show_progress, desc="eval", leave=False):
        evaluator.add_skipped(batch["skipped"])
        if batch["video"] is None:
            continue
        video = batch["video"]  # (B, V, C, T, H, W)
        b, v = video.shape[:2]
        flat = video.flatten(0, 1)
        with autocast_context(device, amp):
            logits = torch.cat([model(chunk.to(device)).float() for chunk in flat.split(view_chunk)])
        offset = batch.get("view_offset", torch.zeros(b, dtype=torch.long))
        view_index = (offset[:, None] + torch.arange(v)[None, :]).flatten()
        evaluator.update(
            logits.cpu(),
            batch["label"].repeat_interleave(v),
            batch["index"].repeat_interleave(v),
            view_index,
        )
    return evaluator.summarize()
