"""Parameters and FLOPs of a model's position encoding, measured on one forward pass.

Counting rule (the same for every encoding, so the columns compare):

* convolutions inside the encoding modules (a PEG's depthwise conv): ``2 ×
  MACs`` = ``2 · output elements · (in_channels / groups) · kernel volume``,
  read from forward hooks; this equals what ``torch.utils.flop_counter``
  counts for the conv (a test checks it), bias excluded;
* one addition per code element each time codes join the tokens: a PEG's
  residual add (grid tokens only: prefix tokens pass through), a table or a
  fixed code added to all tokens once (zeros at a class token included),
  DETR's ``q = k = src + pos`` at every encoder layer (``qk_uses``);
* a rotary encoding: 3 operations per rotated query / key element
  (``x * cos + swap(x) * sin``), i.e. ``6 · B · N · C`` per attention that rotates
  (``rotated``: the attention modules, read from forward pre-hooks), prefix rows included.

Generating fixed codes or rotary tables (sin/cos) and resizing a learned table are not counted
(they depend on the grid only and can be cached per size).

The share of a whole CPVT (:func:`cpvt_encoding_cost`, ``python -m
tools.study_cost``) is measured differently, from the model itself: one
forward under ``torch.utils.flop_counter.FlopCounterMode`` on the meta device
(no arithmetic is done, so CPVT-B at 384 px costs nothing), reading the FLOPs
of the ``pos_blocks.*`` and ``pos_enc`` modules against the model's total, and
parameters counted from the modules.  FlopCounterMode counts matrix products
and convolutions only, so elementwise adds (a table added once, a PEG's
residual) are in neither the encoding's nor the model's figure.
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from peg_core import PositionEncoding
from peg_core import models as cpvt_models

__all__ = [
    "COST_ENCODINGS",
    "COST_MODELS",
    "EncodingCost",
    "cost_table",
    "cpvt_encoding_cost",
    "encoding_cost",
]

#: the CPVT sizes and encodings of the cost table (``peg-dynamic``: ``pos_enc="peg", peg_dynamic=True``)
COST_MODELS = ("cpvt_tiny", "cpvt_small", "cpvt_base")
COST_ENCODINGS = ("peg", "peg-dynamic", "learned", "sincos", "none")
#: what the write-ups say, printed next to the measurement
CLAIMS = (
    'Claim (CPVT write-ups): a PEG adds < 1% parameters ("~960 for DeiT-Tiny") and ~3% FLOPs. '
    "Formula: a 3×3 depthwise conv at width 192 has 3·3·192 = 1,728 weights + 192 biases = 1,920 "
    "parameters, and costs 2·k²·C·H·W = 2·9·192·14·14 = 677,376 FLOPs at 224 px."
)


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


def _rotation_hook(counter: list[int]) -> Callable:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        if bound.arguments.get("rope") is not None:
            counter[0] += 6 * args[0].numel()  # q and k, each (B, N, C): one mul, one fused mul-add

    return hook


def encoding_cost(
    modules: Mapping[str, nn.Module | None],
    run: Callable[[], object],
    qk_uses: int = 1,
    rotated: Sequence[nn.Module] = (),
) -> EncodingCost:
    """Count the encoding's parameters and FLOPs during ``run()`` (one forward of the whole model).

    Args:
        modules: the model's encoding modules by name (PEGs, tables; ``None`` entries are skipped).
        run: calls the model once (batch 1, training size) under ``torch.no_grad``.
        qk_uses: how many times a ``apply_to="qk"`` encoding's codes are added per forward
            (DETR: once per encoder layer).
        rotated: modules whose ``forward(x, ..., rope=...)`` rotates q and k of ``x`` ``(B, N, C)``
            when given a rotary table (:class:`peg_core.models.layers.Attention`, DETR's encoder layers).
    """
    mods = {k: m for k, m in modules.items() if m is not None}
    params = sum(p.numel() for m in mods.values() for p in m.parameters() if p.requires_grad)
    conv = [0]
    adds = [0]
    with ExitStack() as stack:
        for mod in rotated:
            stack.callback(mod.register_forward_pre_hook(_rotation_hook(adds), with_kwargs=True).remove)
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


# ---------------------------------------------------------------------------------- whole-model share


def cpvt_encoding_cost(model: nn.Module, img_size: int | Sequence[int]) -> dict[str, Any]:
    """The position encoding's parameters and FLOPs in a :class:`~peg_core.models.CPVT` and their shares.

    One forward of a ``(1, 3, H, W)`` input (on the model's device; build the
    model under ``torch.device("meta")`` to count without computing) under
    ``FlopCounterMode``.  Prefer meta: with CPU tensors FlopCounterMode does
    not see the fused SDPA kernel, so the model total lacks the attention
    products; on meta SDPA runs as (counted) matmuls.  The encoding is the ``pos_blocks.*`` PEGs (their
    routers included) and the ``pos_enc`` module.

    Returns ``{"params", "model_params", "params_share", "flops", "model_flops",
    "flops_share"}`` (shares as fractions; FLOPs = 2 × multiply-adds of
    matmuls and convolutions).
    """
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    encoding = [m for m in (getattr(model, "pos_enc", None), *getattr(model, "pos_blocks", {}).values()) if m]
    params = sum(p.numel() for m in encoding for p in m.parameters())
    model_params = sum(p.numel() for p in model.parameters())
    device = next(model.parameters()).device
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, h, w, device=device))
    # Module names read "<Root>.pos_blocks.<i>" / "<Root>.pos_enc"; a parent's figure includes its children.
    flops = 0
    for name, ops in counter.get_flop_counts().items():
        parts = name.split(".")
        if (parts[1:2] == ["pos_enc"] and len(parts) == 2) or (
            parts[1:2] == ["pos_blocks"] and len(parts) == 3
        ):
            flops += sum(ops.values())
    model_flops = counter.get_total_flops()
    return {
        "params": params,
        "model_params": model_params,
        "params_share": params / model_params,
        "flops": flops,
        "model_flops": model_flops,
        "flops_share": flops / model_flops if model_flops else 0.0,
    }


def _build(arch: str, encoding: str) -> nn.Module:
    kwargs: dict[str, Any] = (
        {"pos_enc": "peg", "peg_dynamic": True} if encoding == "peg-dynamic" else {"pos_enc": encoding}
    )
    with torch.device("meta"):  # shapes only: nothing is allocated or computed
        return getattr(cpvt_models, arch)(**kwargs).eval()


def cost_table(
    archs: Sequence[str] = COST_MODELS,
    encodings: Sequence[str] = COST_ENCODINGS,
    sizes: Sequence[int] = (224, 384),
) -> tuple[str, dict[tuple[str, str, int], dict[str, Any]]]:
    """Markdown table (one row per model and encoding, a column pair per size) and the raw figures."""
    figures: dict[tuple[str, str, int], dict[str, Any]] = {}
    for arch in archs:
        for enc in encodings:
            model = _build(arch, enc)
            for size in sizes:
                figures[arch, enc, size] = cpvt_encoding_cost(model, size)
    head = "| model | encoding | params | % of model params |" + "".join(
        f" MFLOPs {s} | % of FLOPs {s} |" for s in sizes
    )
    lines = [head, "|---|---|---:|---:|" + "---:|---:|" * len(sizes)]
    for arch in archs:
        for enc in encodings:
            first = figures[arch, enc, sizes[0]]
            row = f"| {arch} | {enc} | {first['params']:,} | {100 * first['params_share']:.3f} |"
            for size in sizes:
                f = figures[arch, enc, size]
                row += f" {f['flops'] / 1e6:.3f} | {100 * f['flops_share']:.3f} |"
            lines.append(row)
    return "\n".join(lines), figures


def verdict(figures: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    """One line comparing the measurement with :data:`CLAIMS` (CPVT-Ti with one PEG, first size)."""
    keys = [k for k in figures if k[0] == "cpvt_tiny" and k[1] == "peg"]
    if not keys:
        return ""
    f = figures[min(keys, key=lambda k: k[2])]
    worst_p = max(v["params_share"] for k, v in figures.items() if k[1] == "peg")
    worst_f = max(v["flops_share"] for k, v in figures.items() if k[1] == "peg")
    size = min(keys, key=lambda k: k[2])[2]
    formula = "holds" if f["params"] == 1920 else "does not hold"
    return (
        f"Measured: CPVT-Ti's PEG has {f['params']:,} parameters ({100 * f['params_share']:.4f}% of "
        f'{f["model_params"]:,}; the 1,920 formula {formula}, "~960" is half of it) and costs '
        f"{f['flops']:,} FLOPs ({100 * f['flops_share']:.4f}% of {f['model_flops'] / 1e9:.2f} GFLOPs) at {size} px. "
        f"Over the models and sizes measured a PEG is at most {100 * worst_p:.3f}% of the parameters "
        f"(< 1%: {'yes' if worst_p < 0.01 else 'no'}) and {100 * worst_f:.3f}% of the FLOPs "
        f"({'about' if 0.015 <= worst_f <= 0.05 else 'not'} the ~3% claimed)."
    )


def main(argv: Sequence[str] | None = None) -> str:
    """``python -m tools.study_cost``: print the encoding-cost table and the claim check; returns the text."""
    parser = argparse.ArgumentParser(description="Parameters and FLOPs of CPVT's position encodings.")
    parser.add_argument("--archs", default=",".join(COST_MODELS), help="comma-separated CPVT sizes")
    parser.add_argument("--encodings", default=",".join(COST_ENCODINGS), help="comma-separated encodings")
    parser.add_argument("--sizes", default="224,384", help="comma-separated input sizes (px)")
    args = parser.parse_args(argv)
    archs, encs = args.archs.split(","), args.encodings.split(",")
    bad = [a for a in archs if a not in COST_MODELS] + [e for e in encs if e not in COST_ENCODINGS]
    if bad:
        parser.error(f"unknown arch/encoding {bad}; choose from {COST_MODELS} and {COST_ENCODINGS}")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be integers; got {args.sizes!r}")
    table, figures = cost_table(archs, encs, sizes)
    text = "\n\n".join(t for t in (table, CLAIMS, verdict(figures)) if t)
    print(text)
    return text


if __name__ == "__main__":
    main()
