"""The classifier: a :class:`~peg_core.models.CPVT` built from a JSON-safe config, and its optimiser.

``model_config`` (stored in every checkpoint) is ``{"arch": ..., **CPVT keywords}``;
:func:`build_model` rebuilds the same network from it for ``eval`` and ``predict``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import models
from ..engine import UserError

__all__ = [
    "ARCHS",
    "DEMO_CONFIG",
    "SCALES",
    "build_checked",
    "build_model",
    "make_optimizer",
    "model_config_from_args",
    "scaled_sizes",
    "warmup_cosine",
]

ARCHS = ("demo", "cpvt_tiny", "cpvt_small", "cpvt_base")
#: small CPVT for the generated set (patch 8 on 48 px images: a 6x6 grid).  The class-token head
#: learns the shape-and-quadrant classes in a few epochs; average pooling stalls at the shape-only
#: plateau (top-1 ~1/4) for many more.  A PEG after every block (CPVT's "0-5" variant, here 0-3).
DEMO_CONFIG: dict[str, Any] = {
    "embed_dim": 64,
    "depth": 4,
    "num_heads": 4,
    "patch_size": 8,
    "mlp_ratio": 2.0,
    "global_pool": "token",
    "peg_at": (0, 1, 2, 3),
}
#: test sizes as multiples of the training size (eval's default)
SCALES = (0.75, 1.0, 1.5, 2.0)
#: argparse destinations that override the arch's shape when given
SHAPE_OPTIONS = ("embed_dim", "depth", "num_heads", "patch_size", "mlp_ratio", "global_pool", "peg_at",
                 "drop_path_rate", "peg_kernel_size", "peg_separable", "peg_padding", "peg_dynamic",
                 "peg_num_kernels")  # fmt: skip


def build_model(config: Mapping[str, Any]) -> models.CPVT:
    """A CPVT from ``{"arch": "demo" | "cpvt_tiny" | "cpvt_small" | "cpvt_base", **CPVT keywords}``.

    ``arch="demo"`` starts from :data:`DEMO_CONFIG`; the keywords override the arch's defaults.
    Raises ``ValueError`` / ``TypeError`` for a config that builds no CPVT.
    """
    cfg = dict(config)
    arch = cfg.pop("arch", "demo")
    if arch == "demo":
        return models.CPVT(**{**DEMO_CONFIG, **cfg})
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}; got {arch!r}")
    return getattr(models, arch)(**cfg)


def model_config_from_args(args: argparse.Namespace, num_classes: int) -> dict[str, Any]:
    """The JSON-safe ``model_config`` of a ``train`` command (only the options the user set)."""
    cfg: dict[str, Any] = {
        "arch": args.arch,
        "pos_enc": args.pos_enc,
        "img_size": args.img_size,
        "num_classes": num_classes,
        "pos_interpolation": args.pos_interpolation,
    }
    for name in SHAPE_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            cfg[name] = list(value) if isinstance(value, tuple | list) else value
    return cfg


def build_checked(config: Mapping[str, Any], where: str) -> models.CPVT:
    """:func:`build_model` with a one-line :class:`UserError` naming ``where`` for a bad config."""
    try:
        return build_model(config)
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build the model ({' '.join(str(e).split())})", where) from None


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; no weight decay on ``model.no_weight_decay()`` names and on 1-D parameters (norms, biases)."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps`` (at least 1), then cosine to 0 at ``total_steps``; stepped per step."""
    warm = max(1, int(warmup_steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total_steps - warm)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def scaled_sizes(train_size: int, scales: Sequence[float] = SCALES) -> list[int]:
    """Test sizes ``round(train_size * s)`` (the model pads sizes that are not multiples of the patch)."""
    return [round(train_size * s) for s in scales]
