"""Checkpoint surgery: resize the position table of a ViT checkpoint, or turn it into a CPVT one.

Knows three layouts, also inside a ``{"model": ...}`` / ``{"state_dict": ...}``
wrapper and with DataParallel's ``module.`` prefix:

* timm / DeiT: ``pos_embed`` ``(1, P + H*W, C)`` with ``cls_token`` (and, for
  distilled DeiT, ``dist_token``, so ``P = 2``);
* torchvision ViT: ``encoder.pos_embedding`` ``(1, 1 + H*W, C)`` with ``class_token``;
* this project's classifier (:class:`peg_core.models.CPVT` with
  ``pos_enc="learned"``): ``pos_enc.pos_embed`` ``(1, P + H*W, C)``.

Files are read and written by :mod:`peg_core.interop.io`.  Every problem with the
checkpoint (no table, several tables, a key that is not there, a table that cannot be
resized, a bad argument) is a :class:`~peg_core.interop.io.WeightsError` (a ``ValueError``)
whose message names the key and shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..resize import infer_grid, resize_pos_embed
from .io import WeightsError, locate_state_dict, strip_prefixes, unwrap_state_dict

__all__ = [
    "ConversionReport",
    "TableChange",
    "find_pos_embed_key",
    "is_torchvision_vit",
    "learned_to_cpvt",
    "resize_checkpoint",
    "torchvision_vit_to_deit",
]

#: last key component of a position table
TABLE_NAMES = ("pos_embed", "pos_embedding")
#: tokens in front of the grid, and how many table rows each takes
PREFIX_TOKEN_NAMES = ("cls_token", "class_token", "dist_token", "reg_token")
StateDict = dict[str, Any]


def find_pos_embed_key(
    sd: Mapping[str, Any],
    key: str | None = None,
    old_size: int | Sequence[int] | None = None,
    num_prefix_tokens: int | None = None,
) -> str:
    """The key of the (single) position table in ``sd``; a :class:`WeightsError` naming candidates otherwise.

    A ``key`` given by the caller must hold a position table (see :func:`_check_given_table`);
    ``old_size`` / ``num_prefix_tokens`` are the caller's grid and prefix-token count, if any.
    """
    if key is not None:
        if key not in sd:
            near = [k for k in sd if k.endswith(key) or key.endswith(k)]
            hint = f"; did you mean {near}?" if near else f"; tables found: {_candidates(sd)}"
            raise WeightsError(f"key {key!r} is not in the checkpoint{hint}")
        _check_given_table(sd, key, old_size, num_prefix_tokens)
        return key
    found = _candidates(sd)
    if not found:
        raise WeightsError(
            f"no position table found (looked for keys ending in {TABLE_NAMES}, 2D or 3D tensors) among "
            f"{len(sd)} keys, e.g. {list(sd)[:8]}; pass key=... (--key) to name it"
        )
    if len(found) > 1:
        shapes = {k: tuple(sd[k].shape) for k in found}
        raise WeightsError(f"several position tables found: {shapes}; pass key=... (--key) to choose one")
    return found[0]


def _check_given_table(
    sd: Mapping[str, Any], key: str, old_size: int | Sequence[int] | None, num_prefix_tokens: int | None
) -> None:
    """Refuse a ``--key`` that is not a position table, so no classifier or projection is "resized" or dropped.

    A table is ``(1, N, C)`` (``(N, C)`` only under a table's name: ``pos_embed``, ``pos_embedding``).
    Under a table's name that is enough (the grid is checked, with its hints, when it is resized);
    under any other name the tensor must also look like one: ``C`` the width of the tokens next to it
    (``cls_token`` ..., ``patch_embed.proj``) and ``N`` minus the prefix tokens a grid, square unless
    ``old_size`` is given.
    """
    value = sd[key]
    if not isinstance(value, Tensor):
        raise WeightsError(f"{key} is a {type(value).__name__}: not a position table (1, N, C)")
    shape = tuple(value.shape)
    named = key.rsplit(".", 1)[-1] in TABLE_NAMES
    if not ((value.dim() == 3 and shape[0] == 1) or (value.dim() == 2 and named)):
        raise WeightsError(f"{key} has shape {shape}: not a position table (1, N, C)")
    if named:
        return
    width = _token_width(sd, key)
    if width is not None and shape[-1] != width:
        raise WeightsError(
            f"{key} has shape {shape}: not a position table (1, N, C) of the {width}-wide tokens"
        )
    n = shape[-2]
    p = num_prefix_tokens if num_prefix_tokens is not None else _prefix_tokens_near(sd, key)[0]
    if old_size is not None:
        h, w = (old_size, old_size) if isinstance(old_size, int) else tuple(old_size)
        fits, grid = n - p == h * w, f"{h}x{w}"
    else:
        fits, grid = n - p > 0 and round((n - p) ** 0.5) ** 2 == n - p, "square"
    if not fits:
        raise WeightsError(
            f"{key} has shape {shape}: not a position table (1, N, C) ({n - p} rows after {p} prefix "
            f"token(s) are not a {grid} grid)"
        )


def _token_width(sd: Mapping[str, Any], key: str) -> int | None:
    """The width ``C`` of the model's tokens: its class / distillation tokens', else its patch embedding's."""
    _, names = _prefix_tokens_near(sd, key)
    if names:
        return int(sd[names[0]].shape[-1])
    for name in ("patch_embed.proj.weight", "conv_proj.weight"):
        if isinstance(sd.get(name), Tensor) and sd[name].dim() == 4:
            return int(sd[name].shape[0])
    return None


def _candidates(sd: Mapping[str, Any]) -> list[str]:
    return [
        k
        for k, v in sd.items()
        if k.rsplit(".", 1)[-1] in TABLE_NAMES and isinstance(v, Tensor) and v.dim() in (2, 3)
    ]


def _prefix_tokens_near(sd: Mapping[str, Any], key: str) -> tuple[int, list[str]]:
    """Count the prefix tokens stored next to ``key`` (closest ancestor module that holds any)."""
    parts = key.split(".")[:-1]
    for depth in range(len(parts), -1, -1):
        root = "".join(p + "." for p in parts[:depth])
        names = [root + n for n in PREFIX_TOKEN_NAMES if isinstance(sd.get(root + n), Tensor)]
        if names:
            # cls/dist tokens are (1, 1, C); register tokens (1, R, C).
            count = sum(sd[n].shape[-2] if sd[n].dim() >= 2 else 1 for n in names)
            return count, names
    return 0, []


@dataclass
class TableChange:
    """What :func:`resize_checkpoint` did to one table."""

    key: str
    old_shape: tuple[int, ...]
    new_shape: tuple[int, ...]
    old_grid: tuple[int, int]
    new_grid: tuple[int, int]
    num_prefix_tokens: int
    prefix_source: str
    mode: str

    @property
    def changed(self) -> bool:
        return self.old_grid != self.new_grid

    def __str__(self) -> str:
        og, ng = "x".join(map(str, self.old_grid)), "x".join(map(str, self.new_grid))
        if not self.changed:
            return f"{self.key}: grid already {og}, shape {self.old_shape}; unchanged"
        return (
            f"{self.key}: {self.old_shape} -> {self.new_shape}, grid {og} -> {ng} ({self.mode}), "
            f"{self.num_prefix_tokens} prefix token(s) kept ({self.prefix_source})"
        )


def resize_checkpoint(
    state_dict: Mapping[str, Any],
    new_size: int | Sequence[int],
    key: str | None = None,
    mode: str = "bicubic",
    num_prefix_tokens: int | None = None,
    old_size: int | Sequence[int] | None = None,
    antialias: bool = False,
) -> tuple[Any, TableChange]:
    """Resize the position table of a checkpoint to grid ``new_size``.

    Args:
        state_dict: a state dict, or a checkpoint wrapping one under
            ``model``/``state_dict`` (the wrapper and all other entries are kept).
        new_size: new grid ``(H, W)`` in patches (an int means square), e.g. 24 for 384 px / patch 16.
        key: the table's key; found by name (``pos_embed``, ``encoder.pos_embedding``,
            ``pos_enc.pos_embed``, with any ``module.`` prefix) when ``None``.
        mode: ``nearest`` / ``bilinear`` / ``bicubic`` / ``area``.
        num_prefix_tokens: table rows before the grid; counted from the
            ``cls_token``/``class_token``/``dist_token``/``reg_token`` entries next
            to the table when ``None``, else taken from the row count.
        old_size: the table's grid; ``None`` means square.
        antialias: anti-aliased down-sizing (bilinear/bicubic).

    Returns:
        ``(new_checkpoint, change)``: the same structure with the table replaced
        (the input is not modified), and a :class:`TableChange`.
    """
    sd, rewrap = locate_state_dict(state_dict)
    k = find_pos_embed_key(sd, key, old_size, num_prefix_tokens)
    table = sd[k]
    n = table.shape[-2]
    if num_prefix_tokens is not None:
        p, source = int(num_prefix_tokens), "given"
    else:
        p, names = _prefix_tokens_near(sd, k)
        source = "from " + ", ".join(names) if names else "no class token in the checkpoint"
        if not names and old_size is None:
            p, source = _prefix_from_count(n, k)
    if not 0 <= p < n:
        # Checked here, before infer_grid(n - p) sees a count <= 0.
        raise WeightsError(
            f"cannot resize {k!r} of shape {tuple(table.shape)}: num_prefix_tokens={p} exceeds the {n} "
            f"tokens of the table"
            if p >= n
            else f"num_prefix_tokens must be >= 0; got {p}"
        )
    if old_size is None:
        try:
            old = infer_grid(n - p)
        except ValueError:
            raise WeightsError(
                f"{k!r} of shape {tuple(table.shape)} has {n - p} grid rows after {p} prefix token(s) "
                f"({source}), which is not a square grid; pass old_size (--old-grid HxW) or "
                f"num_prefix_tokens (--prefix-tokens N)"
            ) from None
    else:
        old = (old_size, old_size) if isinstance(old_size, int) else tuple(int(s) for s in old_size)
    new = (new_size, new_size) if isinstance(new_size, int) else tuple(int(s) for s in new_size)
    if len(new) != 2:
        raise WeightsError(f"new_size must be a 2D grid (H, W); got {new}")
    try:
        resized = resize_pos_embed(table, new, old, num_prefix_tokens=p, mode=mode, antialias=antialias)
    except ValueError as e:
        raise WeightsError(f"cannot resize {k!r} of shape {tuple(table.shape)}: {e}") from None
    change = TableChange(k, tuple(table.shape), tuple(resized.shape), old, new, p, source, mode)
    return rewrap({**sd, k: resized}), change


def _prefix_from_count(n: int, key: str) -> tuple[int, str]:
    for p in (0, 1, 2):
        try:
            infer_grid(n - p)
        except ValueError:
            continue
        return p, f"inferred from the {n} rows ({n - p} is a square)"
    raise WeightsError(
        f"{key!r} has {n} rows and no class token next to it; neither {n}, {n - 1} nor {n - 2} is a "
        f"square grid; pass num_prefix_tokens (--prefix-tokens) and old_size (--old-grid)"
    )


# torchvision VisionTransformer -> timm/DeiT names (regex on the key, replacement).
_TV_RULES = [
    (r"^conv_proj\.", "patch_embed.proj."),
    (r"^class_token$", "cls_token"),
    (r"^encoder\.pos_embedding$", "pos_embed"),
    (r"^encoder\.ln\.", "norm."),
    (r"^heads\.head\.", "head."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_1\.", r"blocks.\1.norm1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_2\.", r"blocks.\1.norm2."),
    (
        r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_(weight|bias)$",
        r"blocks.\1.attn.qkv.\2",
    ),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(0|linear_1)\.", r"blocks.\1.mlp.fc1."),
    (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(3|linear_2)\.", r"blocks.\1.mlp.fc2."),
]


def torchvision_vit_to_deit(sd: Mapping[str, Tensor]) -> StateDict:
    """Rename a torchvision ``VisionTransformer`` state dict to the timm/DeiT layout.

    ``in_proj_weight`` is already ``[q; k; v]`` stacked like timm's ``qkv``, so
    only names change.  A ``heads.pre_logits`` layer has no DeiT counterpart and
    is refused.
    """
    out: StateDict = {}
    for k, v in sd.items():
        for pat, rep in _TV_RULES:
            new, hits = re.subn(pat, rep, k)
            if hits:
                out[new] = v
                break
        else:
            raise WeightsError(f"torchvision ViT key {k!r} has no timm/DeiT counterpart")
    return out


def is_torchvision_vit(sd: Mapping[str, Any]) -> bool:
    """True for a torchvision ``VisionTransformer`` state dict (``conv_proj``, ``encoder.pos_embedding``)."""
    return "conv_proj.weight" in sd and "encoder.pos_embedding" in sd


@dataclass
class ConversionReport:
    """What :func:`learned_to_cpvt` changed."""

    source_layout: str
    dropped: dict[str, tuple[int, ...]] = field(default_factory=dict)
    added: dict[str, tuple[int, ...]] = field(default_factory=dict)
    renamed: int = 0

    def __str__(self) -> str:
        lines = [
            f"source layout: {self.source_layout}"
            + (f" ({self.renamed} keys renamed)" if self.renamed else "")
        ]
        lines += [f"dropped {k} {s}" for k, s in self.dropped.items()]
        lines += [f"added   {k} {s} (zeros)" for k, s in self.added.items()]
        return "\n".join(lines)


def learned_to_cpvt(
    state_dict: Mapping[str, Any],
    peg_at: Sequence[int] = (0,),
    kernel_size: int = 3,
    key: str | None = None,
) -> tuple[StateDict, ConversionReport]:
    """Turn a learned-table ViT checkpoint into one for :class:`peg_core.models.CPVT` (``pos_enc="peg"``).

    The position table is dropped and zero-initialised PEG weights are added
    at ``pos_blocks.<i>.proj.weight`` ``(C, 1, k, k)`` and ``.proj.bias`` ``(C,)``
    for each ``i`` in ``peg_at``, so the converted model starts as the original
    one without its table; the PEGs then learn position from fine-tuning.  The
    distillation token and head of a distilled DeiT (``dist_token``,
    ``head_dist.*``) are dropped too.  torchvision ViT checkpoints are renamed to
    the DeiT layout first.  The class token is kept: load the result into a
    ``global_pool="token"`` model, or use :func:`peg_core.interop.load_timm_deit`
    for a GAP one.

    Returns:
        ``(state_dict, report)``: a flat state dict in CPVT names (no wrapper,
        no ``module.`` prefix) and a :class:`ConversionReport`.
    """
    sd = strip_prefixes(unwrap_state_dict(state_dict))
    report = ConversionReport("timm/DeiT")
    if is_torchvision_vit(sd):
        sd = torchvision_vit_to_deit(sd)
        report.source_layout, report.renamed = "torchvision ViT", len(sd)
    k = find_pos_embed_key(sd, key)
    table = sd.pop(k)
    report.dropped[k] = tuple(table.shape)
    for name in [n for n in sd if n == "dist_token" or n.startswith("head_dist.")]:
        report.dropped[name] = tuple(sd.pop(name).shape)

    blocks = {int(m.group(1)) for n in sd if (m := re.match(r"blocks\.(\d+)\.", n))}
    if not blocks:
        raise WeightsError(f"no transformer blocks (blocks.<i>.*) found; keys start {list(sd)[:8]}")
    bad = sorted(i for i in peg_at if i not in blocks)
    if bad:
        raise WeightsError(
            f"peg_at={tuple(peg_at)}: blocks {bad} do not exist (checkpoint has blocks {min(blocks)}..{max(blocks)})"
        )
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise WeightsError(f"kernel_size must be odd; got {kernel_size}")
    dim = table.shape[-1]
    for i in sorted(set(peg_at)):
        for name, shape in ((f"pos_blocks.{i}.proj.weight", (dim, 1, kernel_size, kernel_size)),
                            (f"pos_blocks.{i}.proj.bias", (dim,))):  # fmt: skip
            sd[name] = torch.zeros(shape, dtype=table.dtype)
            report.added[name] = shape
    return sd, report
