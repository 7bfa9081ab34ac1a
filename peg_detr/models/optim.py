"""AdamW parameter groups for DETR: the backbone trains at its own (smaller) learning rate."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["param_groups"]


def param_groups(
    model: nn.Module, lr: float, lr_backbone: float, weight_decay: float
) -> list[dict[str, Any]]:
    """Two groups of trainable parameters: everything but the backbone at ``lr``, ``backbone.*`` at ``lr_backbone``.

    Frozen parameters (stem, ``layer1``, FrozenBatchNorm buffers) are left out;
    an empty group is dropped.  Weight decay applies to all parameters, as in
    DETR.  Accepts a DistributedDataParallel wrapper.
    """
    model = getattr(model, "module", model)
    main, backbone = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (backbone if name.startswith("backbone.") else main).append(p)
    groups = [
        {"params": main, "lr": lr, "weight_decay": weight_decay, "name": "transformer_heads"},
        {"params": backbone, "lr": lr_backbone, "weight_decay": weight_decay, "name": "backbone"},
    ]
    return [g for g in groups if g["params"]]
