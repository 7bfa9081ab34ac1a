"""Top-1 / top-5 accuracy and loss of a classifier on one split, merged over ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from ..engine import RunContext, SkipBroken, skipping_collate
from ..engine.distributed import reduce_sum

__all__ = ["accuracy", "eval_loader"]


def eval_loader(ds: Dataset, ctx: RunContext, batch_size: int, workers: int) -> DataLoader:
    """This rank's share of ``ds`` (every ``world_size``-th item: no padding, so no double counts)."""
    world, rank = ctx.dist.world_size, ctx.dist.rank
    part = Subset(ds, range(rank, len(ds), world)) if world > 1 else ds  # type: ignore[arg-type]
    return DataLoader(
        SkipBroken(part),
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        collate_fn=skipping_collate(torch.utils.data.default_collate),
        pin_memory=ctx.device.type == "cuda",
    )


@torch.no_grad()
def accuracy(
    model: nn.Module, ds: Dataset, ctx: RunContext, split: str, batch_size: int = 128, workers: int = 0
) -> dict[str, Any]:
    """``{"top1", "top5" (more than 5 classes only), "loss", "samples"}`` of ``model`` on ``ds``.

    Items are ``(image (3, H, W), label)``; broken ones are skipped and logged under ``split``.
    """
    was_training = model.training
    model.eval()
    # correct@1, correct@5, summed loss, samples: one all-reduce at the end
    sums = torch.zeros(4, dtype=torch.float64, device=ctx.device)
    num_classes = int(getattr(model, "num_classes", 0))
    try:
        loader = eval_loader(ds, ctx, batch_size, workers)
        for x, y in ctx.batches(loader, split, total=len(ds)):  # type: ignore[arg-type]
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            with ctx.autocast():
                logits = model(x)
            logits = logits.float()
            top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # (B, k)
            hit = top == y[:, None]
            sums += torch.stack([
                hit[:, 0].sum(), hit.any(-1).sum(), F.cross_entropy(logits, y, reduction="sum"),
                torch.tensor(len(y), device=ctx.device),
            ]).double()  # fmt: skip
    finally:
        model.train(was_training)
    correct1, correct5, loss, n = reduce_sum(sums).tolist()
    n = max(n, 1.0)  # a split where nothing was read has already stopped the run (ctx.batches)
    out: dict[str, Any] = {"top1": correct1 / n, "loss": loss / n, "samples": int(n)}
    if num_classes > 5:
        out["top5"] = correct5 / n
    return out
