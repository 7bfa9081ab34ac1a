"""The optimiser pieces every task shares: AdamW parameter groups and the warm-up + cosine schedule.

Weight decay is not applied to 1-d parameters (norms, biases) and to the names a model lists in
``no_weight_decay()`` (class tokens, learned position tables, rotary frequencies), the convention of
DeiT, CPVT and timm.  A task with a second learning rate (DETR's backbone) passes ``lr_by_prefix``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

__all__ = ["no_weight_decay_names", "param_groups", "warmup_cosine"]


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """``model.no_weight_decay()`` (timm's convention) or the empty set; DDP wrappers are looked through."""
    model = getattr(model, "module", model)
    return set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()


def param_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    decay_1d: bool = False,
    lr_by_prefix: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """AdamW groups of the trainable parameters of ``model``.

    Args:
        weight_decay: decay of the decayed parameters.
        decay_1d: also decay 1-d parameters (norms, biases), as DETR does; ``no_weight_decay()``
            names (learned rotary frequencies) stay undecayed either way.
        lr_by_prefix: ``{"backbone.": 1e-5}``: parameters whose name starts with a prefix get that
            ``lr`` in groups of their own (named by the prefix); the others keep the optimiser's lr.

    Returns:
        Groups in a fixed order (main decayed, main not decayed, then per prefix), empty ones
        dropped; each has ``name``, ``params`` and ``weight_decay`` (and ``lr`` for a prefix).
        The order is part of the checkpoint format: a resumed optimiser state matches it.
    """
    model = getattr(model, "module", model)
    exempt = no_weight_decay_names(model)
    prefixes = dict(lr_by_prefix or {})
    buckets: dict[tuple[str, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        prefix = next((q for q in prefixes if name.startswith(q)), "")
        decayed = name not in exempt and (decay_1d or p.ndim > 1)
        buckets.setdefault((prefix, decayed), []).append(p)
    groups = []
    for prefix in ("", *prefixes):
        for decayed in (True, False):
            params = buckets.get((prefix, decayed))
            if not params:
                continue
            group: dict[str, Any] = {
                "name": (prefix.rstrip(".") or "main") + ("" if decayed else "_no_decay"),
                "params": params,
                "weight_decay": weight_decay if decayed else 0.0,
            }
            if prefix:
                group["lr"] = prefixes[prefix]
            groups.append(group)
    return groups


def _warmup_cosine_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps``, then cosine to ``min_ratio`` × lr at ``total_steps``.

    Stepped once per optimiser step.  A ``LambdaLR`` over the closed form rather than
    ``SequentialLR(LinearLR, CosineAnnealingLR)``: the closed form is exact at any step, so a
    resumed run (``last_epoch`` restored from the checkpoint) continues on the same curve, and
    ``SequentialLR`` warns and jumps at its milestone when stepped per iteration.  Each group's
    own lr (DETR's backbone, a position-lr scale) is multiplied by the same factor.
    """
    fn = partial(_warmup_cosine_factor, warmup=max(0, int(warmup_steps)), total=int(total_steps),
                 min_ratio=float(min_ratio))  # fmt: skip
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
