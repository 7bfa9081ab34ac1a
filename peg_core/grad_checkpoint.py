"""Activation checkpointing of transformer blocks (``--grad-checkpointing``), for every family.

:func:`enable_grad_checkpointing` finds the transformer blocks of a model (the members of a
``blocks`` / ``layers`` :class:`~torch.nn.ModuleList` that hold an attention module: CPVT's and the
video ViT's blocks, DEIMv2's DINOv3 blocks, the DETR encoder / decoder layers, RT-DETR's AIFI
layers and the RT-DETR / D-FINE / DEIMv2 decoder layers) and makes each one run its forward through
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` while training with gradients: its
activations are recomputed in the backward instead of kept, and the RNG state is preserved, so
dropout and drop-path draw the same values and the losses are those of the plain model.

The block's class is swapped for a subclass that overrides ``forward`` (state-dict keys, hooks and
``deepcopy`` -- an EMA copy -- are unchanged; the copy checkpoints itself, not the original); in
evaluation or under ``torch.no_grad()`` the forward is the plain one.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["checkpointed_blocks", "enable_grad_checkpointing", "transformer_blocks"]

#: names of the ModuleLists whose members may be transformer blocks
BLOCK_LISTS = ("blocks", "layers")

_SUBCLASSES: dict[type, type] = {}


def _has_attention(module: nn.Module) -> bool:
    return any(
        isinstance(m, nn.MultiheadAttention) or "Attention" in type(m).__name__ or "Attn" in type(m).__name__
        for m in module.modules()
    )


def transformer_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, block)`` of every transformer block of ``model`` with trainable parameters (see the module docstring)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in BLOCK_LISTS:
            for i, block in enumerate(module):
                # a block without trainable parameters (a frozen backbone's, an EMA copy's) keeps nothing to recompute
                if _has_attention(block) and any(p.requires_grad for p in block.parameters()):
                    found.append((f"{name}.{i}", block))
    return found


def _checkpointing_class(cls: type) -> type:
    if getattr(cls, "_grad_checkpointing", False):
        return cls
    if cls not in _SUBCLASSES:

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            import torch
            from torch.utils.checkpoint import checkpoint

            plain = super(sub, self).forward
            if self.training and torch.is_grad_enabled():
                return checkpoint(plain, *args, use_reentrant=False, **kwargs)
            return plain(*args, **kwargs)

        sub = type(
            cls.__name__,
            (cls,),
            {"forward": forward, "_grad_checkpointing": True, "__module__": cls.__module__},
        )
        sub.__qualname__ = cls.__qualname__
        _SUBCLASSES[cls] = sub
    return _SUBCLASSES[cls]


def enable_grad_checkpointing(model: nn.Module) -> list[str]:
    """Checkpoint every transformer block of ``model`` (in place); returns the blocks' names."""
    names = []
    for name, block in transformer_blocks(model):
        block.__class__ = _checkpointing_class(type(block))
        names.append(name)
    return names


def checkpointed_blocks(model: nn.Module) -> list[str]:
    """The names of the blocks of ``model`` that checkpoint their activations."""
    return [n for n, m in model.named_modules() if getattr(type(m), "_grad_checkpointing", False)]
