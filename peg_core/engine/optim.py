"""The optimiser pieces every task shares: AdamW parameter groups and the learning-rate schedules.

Weight decay is not applied to 1-d parameters (norms, biases) and to the names a model lists in
``no_weight_decay()`` (class tokens, learned position tables, rotary frequencies), the convention of
DeiT, CPVT and timm.  A task with a second learning rate (DETR's backbone) passes ``lr_by_prefix``.

Layer-wise learning-rate decay (BEiT, VideoMAE fine-tuning; timm's ``param_groups_layer_decay``):
with ``layer_decay=d`` a model of ``L`` blocks trains its layer ``i`` (0: the embeddings, ``1..L``:
the blocks, ``L + 1``: the final norm and head) at ``lr × d ** (L + 1 - i)``.  The model says which
layer a parameter is in (:class:`LayerDecayModel`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from .command import UserError

__all__ = [
    "LR_SCHEDULES",
    "LayerDecayModel",
    "check_layer_decay",
    "flat_cosine_lr",
    "layer_lr_scale",
    "no_weight_decay_names",
    "param_groups",
    "param_groups_for_run",
    "warmup_cosine",
    "warmup_step_lr",
]


@runtime_checkable
class LayerDecayModel(Protocol):
    """A model that layer-wise lr decay can split: its block count and each parameter's layer id."""

    def num_lr_layers(self) -> int:
        """``L``, the number of blocks: layer ids run from 0 (embeddings) to ``L + 1`` (final norm, head)."""
        ...

    def lr_layer_id(self, name: str) -> int:
        """The layer id in ``0..L + 1`` of the parameter called ``name`` in ``named_parameters()``."""
        ...


def check_layer_decay(layer_decay: float) -> float:
    """``layer_decay`` as a float in ``(0, 1]``, or a ``ValueError`` naming the value."""
    value = float(layer_decay)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"layer_decay must be in (0, 1]; got {layer_decay!r}")
    return value


def layer_lr_scale(layer_id: int, num_layers: int, layer_decay: float) -> float:
    """``layer_decay ** (num_layers + 1 - layer_id)``: 1 for the head, the smallest for the embeddings."""
    return layer_decay ** (num_layers + 1 - layer_id)


def _layer_ids(model: nn.Module) -> tuple[int, dict[str, int]]:
    """``(L, {name: layer id})`` of the trainable parameters of a :class:`LayerDecayModel`."""
    if not isinstance(model, LayerDecayModel):
        raise TypeError(
            f"{type(model).__name__} has no layer ids: it needs num_lr_layers() and lr_layer_id(name) "
            "(peg_core.engine.LayerDecayModel)"
        )
    num_layers = int(model.num_lr_layers())
    ids = {n: int(model.lr_layer_id(n)) for n, p in model.named_parameters() if p.requires_grad}
    bad = {n: i for n, i in ids.items() if not 0 <= i <= num_layers + 1}
    if bad:
        name, i = next(iter(bad.items()))
        raise ValueError(f"{type(model).__name__}.lr_layer_id({name!r}) = {i}, outside 0..{num_layers + 1}")
    return num_layers, ids


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
    layer_decay: float | None = None,
    lr: float | None = None,
) -> list[dict[str, Any]]:
    """AdamW groups of the trainable parameters of ``model``.

    Args:
        weight_decay: decay of the decayed parameters.
        decay_1d: also decay 1-d parameters (norms, biases), as DETR does; ``no_weight_decay()``
            names (learned rotary frequencies) stay undecayed either way.
        lr_by_prefix: ``{"backbone.": 1e-5}``: parameters whose name starts with a prefix get that
            ``lr`` in groups of their own (named by the prefix); the others keep the optimiser's lr.
        layer_decay: layer-wise lr decay in ``(0, 1]`` (``None``: off); ``model`` must be a
            :class:`LayerDecayModel`.  Each layer gets groups of its own with ``lr_scale``
            ``= layer_decay ** (L + 1 - layer id)`` and ``lr = lr × lr_scale`` (a prefix's lr × it).
        lr: the optimiser's base lr; needed with ``layer_decay`` (the groups carry their own lr,
            which a ``LambdaLR`` such as :func:`warmup_cosine` multiplies by its factor).

    Returns:
        Groups in a fixed order (main decayed, main not decayed, then per prefix), empty ones
        dropped; each has ``name``, ``params`` and ``weight_decay`` (and ``lr`` for a prefix).
        With ``layer_decay`` each of those splits by layer, the head's first (``layer_{L+1}``,
        ``layer_{L+1}_no_decay``, ..., ``layer_0_no_decay``), so group 0, whose lr the engine logs,
        runs at the full lr.  The order is part of the checkpoint format: a resumed optimiser
        state matches it.
    """
    model = getattr(model, "module", model)
    exempt = no_weight_decay_names(model)
    prefixes = dict(lr_by_prefix or {})
    num_layers, layer_of = 0, None
    if layer_decay is not None:
        layer_decay = check_layer_decay(layer_decay)
        if lr is None:
            raise ValueError("layer_decay needs the base lr (lr=...) to set each layer's lr")
        num_layers, layer_of = _layer_ids(model)
    buckets: dict[tuple[str, int | None, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        prefix = next((q for q in prefixes if name.startswith(q)), "")
        layer = None if layer_of is None else layer_of[name]
        decayed = name not in exempt and (decay_1d or p.ndim > 1)
        buckets.setdefault((prefix, layer, decayed), []).append(p)
    layers: Sequence[int | None] = (None,) if layer_of is None else range(num_layers + 1, -1, -1)
    groups = []
    for prefix in ("", *prefixes):
        base_lr = prefixes[prefix] if prefix else lr
        for layer in layers:
            scale = None if layer is None else layer_lr_scale(layer, num_layers, layer_decay)
            own_lr = base_lr if prefix or layer is not None else None  # else: the optimiser's lr
            for decayed in (True, False):
                params = buckets.get((prefix, layer, decayed))
                if params:
                    name = _group_name(prefix, layer) + ("" if decayed else "_no_decay")
                    groups.append(_group(name, params, weight_decay if decayed else 0.0, own_lr, scale))
    return groups


def _group(
    name: str, params: list[nn.Parameter], weight_decay: float, lr: float | None, lr_scale: float | None
) -> dict[str, Any]:
    """One optimiser group; ``lr`` (× ``lr_scale`` when given) only when it is not the optimiser's."""
    group: dict[str, Any] = {"name": name, "params": params, "weight_decay": weight_decay}
    if lr_scale is not None:
        group["lr_scale"] = lr_scale
        group["lr"] = lr * lr_scale
    elif lr is not None:
        group["lr"] = lr
    return group


def param_groups_for_run(model: nn.Module, args: argparse.Namespace) -> list[dict[str, Any]]:
    """:func:`param_groups` of a ``train`` command: ``--weight-decay``, ``--lr``, ``--layer-decay``.

    A model that layer decay cannot split is a :class:`UserError` naming the flag.
    """
    decay = getattr(args, "layer_decay", None)
    try:
        return param_groups(model, args.weight_decay, layer_decay=decay, lr=args.lr)
    except (TypeError, ValueError) as e:
        raise UserError(f"cannot apply layer-wise lr decay ({e})", f"--layer-decay {decay}") from None


def _group_name(prefix: str, layer: int | None) -> str:
    """``main``, ``backbone`` (a prefix), ``layer_3``, ``backbone_layer_3`` (layer decay)."""
    if layer is None:
        return prefix.rstrip(".") or "main"
    return f"{prefix.rstrip('.')}_layer_{layer}" if prefix else f"layer_{layer}"


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


def warmup_step_lr(warmup_steps: int, drop_every: int) -> Callable[[int], float]:
    """``LambdaLR`` factor of step ``s``: linear warm-up over ``warmup_steps``, /10 every ``drop_every`` steps."""

    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
        return warm * 0.1 ** (step // max(drop_every, 1))

    return factor


#: ``--lr-schedule`` choices (:func:`warmup_step_lr`, :func:`flat_cosine_lr`)
LR_SCHEDULES = ("step", "flatcosine")


def flat_cosine_lr(
    warmup_steps: int, flat_steps: int, total_steps: int, final_steps: int, gamma: float
) -> Callable[[int], float]:
    """DEIM's ``LambdaLR`` factor of step ``s``: warm-up, flat, cosine decay, flat at the end.

    Quadratic warm-up ``(s / warmup_steps) ** 2`` (DEIM's ``flat_cosine_schedule``), then 1 until
    ``flat_steps``, then a half cosine from 1 down to ``gamma`` reached at ``total_steps -
    final_steps`` (the last, unaugmented epochs), then ``gamma``.  ``flat_steps`` counts from the
    start, as DEIM's ``flat_epoch`` does.
    """
    decay_end = total_steps - final_steps

    def factor(step: int) -> float:
        if warmup_steps and step <= warmup_steps:
            return (step / warmup_steps) ** 2
        if step <= flat_steps:
            return 1.0
        if step >= decay_end:
            return gamma
        progress = (step - flat_steps) / max(decay_end - flat_steps, 1)
        return gamma + (1.0 - gamma) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
