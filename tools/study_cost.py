"""Parameters and FLOPs of a model's position encoding, measured on one forward pass.

Counting rule (the same for every encoding, so the columns compare):

* convolutions inside the encoding modules (a PEG's depthwise conv): ``2 ×
  MACs`` = ``2 · output elements · (in_channels / groups) · kernel volume``,
  read from forward hooks; this equals what ``torch.utils.flop_counter``
  counts for the conv (a test checks it), bias excluded;
* one addition per code element each time codes join the tokens: a PEG's
  residual add (grid tokens only: prefix tokens pass through), a table or a
  fixed code added to all tokens once (zeros at a class token included),
  DETR's ``q = k = src + pos`` at every encoder layer (``qk_uses``).

Generating fixed codes (sin/cos) and resizing a learned table are not counted
(they depend on the grid only and can be cached per size).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from peg_core import PositionEncoding

__all__ = ["EncodingCost", "encoding_cost"]


@dataclass(frozen=True)
class EncodingCost:
    """``params``: trainable parameters of the encoding; ``flops``: per forward at the measured size."""

    params: int
    flops: int
    conv_flops: int
    add_flops: int


def _conv_hook(counter: list[int]) -> Callable:
    def hook(module: nn.Module, _inputs, output: Tensor) -> None:
        per_output = module.weight[0].numel()  # (in_channels / groups) * kernel volume
        counter[0] += 2 * output.numel() * per_output

    return hook


def encoding_cost(
    modules: Mapping[str, nn.Module | None], run: Callable[[], object], qk_uses: int = 1
) -> EncodingCost:
    """Count the encoding's parameters and FLOPs during ``run()`` (one forward of the whole model).

    Args:
        modules: the model's encoding modules by name (PEGs, tables; ``None`` entries are skipped).
        run: calls the model once (batch 1, training size) under ``torch.no_grad``.
        qk_uses: how many times a ``apply_to="qk"`` encoding's codes are added per forward
            (DETR: once per encoder layer).
    """
    mods = {k: m for k, m in modules.items() if m is not None}
    params = sum(p.numel() for m in mods.values() for p in m.parameters() if p.requires_grad)
    conv = [0]
    adds = [0]
    with ExitStack() as stack:
        for mod in mods.values():
            for sub in mod.modules():
                if isinstance(sub, nn.Conv1d | nn.Conv2d | nn.Conv3d):
                    stack.callback(sub.register_forward_hook(_conv_hook(conv)).remove)
                if isinstance(sub, PositionEncoding):  # also inside a ModuleDict of PEGs
                    stack.enter_context(_count_codes(sub, adds, qk_uses))
        with torch.no_grad():
            run()
    return EncodingCost(params=params, flops=conv[0] + adds[0], conv_flops=conv[0], add_flops=adds[0])


class _count_codes:
    """Temporarily wrap ``enc.position`` (and ``forward``) to add ``codes.numel() × uses`` to ``counter``.

    A module's ``forward`` may compute its codes without calling ``position``
    (PEG2d does, for speed), so both are wrapped and a call to ``forward``
    counts once, as one addition of its output's size.
    """

    def __init__(self, enc: PositionEncoding, counter: list[int], qk_uses: int) -> None:
        self.enc, self.counter = enc, counter
        self.uses = qk_uses if enc.apply_to == "qk" else 1
        self.depth = 0

    def __enter__(self) -> _count_codes:
        enc, orig_position, orig_forward = self.enc, self.enc.position, self.enc.forward

        def position(*args, **kwargs):
            self.depth += 1
            try:
                out = orig_position(*args, **kwargs)
            finally:
                self.depth -= 1
            if out is not None and self.depth == 0:
                self.counter[0] += self.uses * math.prod(out.shape)
            return out

        def forward(*args, **kwargs):
            self.depth += 1  # a forward that calls position() must not count twice
            try:
                out = orig_forward(*args, **kwargs)
            finally:
                self.depth -= 1
            if self.depth == 0 and enc.apply_to != "none":
                numel = math.prod(out.shape)
                if enc.conditional and out.dim() == 3:  # a PEG's prefix tokens pass through: no add
                    numel -= out.shape[0] * enc.num_prefix_tokens * out.shape[2]
                self.counter[0] += numel
            return out

        enc.position, enc.forward = position, forward
        return self

    def __exit__(self, *exc) -> None:
        del self.enc.position, self.enc.forward  # back to the class methods
