"""Resolution-change recipes shared by the classifier and the video model.

* ``--train-sizes 32,40,48``: multi-scale training, one input size per batch, drawn from a
  generator seeded by ``(seed, epoch, step)``: the same on every rank and after a resume;
* ``--progressive-sizes 32,40,48 [--progressive-epochs 2,2,2]``: the input size grows by
  stages of epochs (default: the epochs split evenly, the remainder to the last stage);
* ``--freeze-pos`` / ``--pos-lr-scale X``: the position parameters (a learned table, PEG
  weights; sincos has none) are frozen, or trained with ``lr × X`` in their own group.

The sizes act through the task's ``TrainParts.resize_batch(batch, size)`` hook, which the
engine calls before ``step``; the position recipe acts on the task's optimizer
(:func:`apply_position_recipe`, called before the scheduler is built).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..base import PositionEncoding
from .cli import image_side_list, positive_float, positive_int_list
from .command import UserError

__all__ = [
    "add_recipe_args",
    "apply_position_recipe",
    "check_recipe_args",
    "draw_train_size",
    "position_parameter_names",
    "progressive_epochs",
    "size_for_step",
    "stage_of_epoch",
]


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    """The recipe flags of a ``train`` command whose task has a ``resize_batch`` hook."""
    g = p.add_argument_group("resolution-change recipes")
    g.add_argument("--train-sizes", type=image_side_list,
                   help="multi-scale training: one size per batch drawn from this list, e.g. 32,40,48")  # fmt: skip
    g.add_argument("--progressive-sizes", type=image_side_list,
                   help="progressive resolution: one size per stage of epochs, e.g. 32,40,48")  # fmt: skip
    g.add_argument("--progressive-epochs", type=positive_int_list,
                   help="epochs of each progressive stage, summing to --epochs (default: an even split)")  # fmt: skip
    g.add_argument("--freeze-pos", action="store_true",
                   help="freeze the position parameters (learned table, PEG weights)")  # fmt: skip
    g.add_argument("--pos-lr-scale", type=positive_float,
                   help="learning rate of the position parameters = lr x this (their own group)")  # fmt: skip


def progressive_epochs(epochs: int, stages: int, given: Sequence[int] | None = None) -> list[int]:
    """Epochs per stage: ``given`` (checked to sum to ``epochs``) or an even split, remainder last."""
    if given is not None:
        if len(given) != stages:
            raise UserError(f"{len(given)} stages for {stages} sizes", f"--progressive-epochs {_csv(given)}")
        if sum(given) != epochs:
            raise UserError(f"stages sum to {sum(given)}, not --epochs {epochs}",
                            f"--progressive-epochs {_csv(given)}")  # fmt: skip
        return list(given)
    if stages > epochs:
        raise UserError(f"{stages} stages need at least {stages} epochs (--epochs {epochs})",
                        "--progressive-sizes")  # fmt: skip
    base = epochs // stages
    return [base] * (stages - 1) + [epochs - base * (stages - 1)]


def stage_of_epoch(epoch: int, per_stage: Sequence[int]) -> int:
    """Index of the stage that epoch ``epoch`` (0-based) belongs to (the last one past the end)."""
    end = 0
    for i, n in enumerate(per_stage):
        end += n
        if epoch < end:
            return i
    return len(per_stage) - 1


def draw_train_size(sizes: Sequence[int], seed: int, epoch: int, step: int) -> int:
    """The multi-scale size of global step ``step``: a function of ``(seed, epoch, step)`` only.

    A string seed goes through SHA-512 in :class:`random.Random`, so the draw is the same on
    every rank, platform and Python run, and a resumed run draws what the full run drew.
    """
    return random.Random(f"peg-train-size:{seed}:{epoch}:{step}").choice(list(sizes))


def check_recipe_args(args: argparse.Namespace) -> None:
    """Options that only make sense together: a one-line :class:`UserError` before any work."""
    train_sizes = getattr(args, "train_sizes", None)
    prog = getattr(args, "progressive_sizes", None)
    prog_epochs = getattr(args, "progressive_epochs", None)
    if train_sizes and prog:
        raise UserError("choose one of --train-sizes and --progressive-sizes", "--train-sizes")
    if prog_epochs and not prog:
        raise UserError("needs --progressive-sizes", f"--progressive-epochs {_csv(prog_epochs)}")
    if prog:
        progressive_epochs(args.epochs, len(prog), prog_epochs)
    if getattr(args, "freeze_pos", False) and getattr(args, "pos_lr_scale", None) is not None:
        raise UserError("choose one of --freeze-pos and --pos-lr-scale", "--pos-lr-scale")


def uses_sizes(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask for per-batch resizing (multi-scale or progressive)."""
    return bool(getattr(args, "train_sizes", None) or getattr(args, "progressive_sizes", None))


def size_for_step(args: argparse.Namespace, epoch: int, step: int) -> int | None:
    """The input size of global step ``step`` in ``epoch``; ``None`` when no recipe resizes."""
    sizes = getattr(args, "train_sizes", None)
    if sizes:
        return draw_train_size(sizes, args.seed, epoch, step)
    prog = getattr(args, "progressive_sizes", None)
    if prog:
        per_stage = progressive_epochs(args.epochs, len(prog), getattr(args, "progressive_epochs", None))
        return prog[stage_of_epoch(epoch, per_stage)]
    return None


def position_parameter_names(model: nn.Module) -> list[str]:
    """Names of the trainable-or-not parameters that encode position, found by module type.

    Every encoding of the suite (learned tables, PEG 2D/3D, sincos, the video encodings) is a
    :class:`~peg_core.base.PositionEncoding`; the parameters below such a module are position
    parameters (a learned table, PEG kernels and biases), so no name pattern is needed.
    """
    names: list[str] = []
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        if not isinstance(module, PositionEncoding):
            continue
        for name, p in module.named_parameters(prefix=prefix):
            if id(p) not in seen:  # nested encodings (or shared weights) counted once
                seen.add(id(p))
                names.append(name)
    return names


def apply_position_recipe(
    optimizer: torch.optim.Optimizer, model: nn.Module, *, freeze: bool = False, lr_scale: float | None = None
) -> list[str]:
    """Freeze the position parameters or give them ``lr × lr_scale``; returns their names.

    Call it on a fresh optimizer, before its scheduler is built: a frozen parameter gets
    ``requires_grad_(False)`` and leaves the optimizer; a scaled one moves to a copy of its
    group with ``lr`` scaled, so a ``LambdaLR`` (which multiplies each group's own initial
    lr) scales it along.  The group layout is the same on a resume with the same flags.
    """
    names = position_parameter_names(model)
    if not freeze and lr_scale is None:
        return names
    params = dict(model.named_parameters(remove_duplicate=False))
    pos = {id(params[n]) for n in names}
    if freeze:
        for n in names:
            params[n].requires_grad_(False)
    new_groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        moved = [p for p in group["params"] if id(p) in pos]
        group["params"] = [p for p in group["params"] if id(p) not in pos]
        if moved and lr_scale is not None:
            extra = {k: v for k, v in group.items() if k != "params"}
            extra.update(params=moved, lr=group["lr"] * lr_scale, position=True)
            new_groups.append(extra)
    for g in new_groups:
        optimizer.add_param_group(g)
    return names


def _csv(values: Sequence[int]) -> str:
    return ",".join(map(str, values))
