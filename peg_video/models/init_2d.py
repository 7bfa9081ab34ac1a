"""Start a video transformer from a 2D image checkpoint (peg_core's CPVT or a timm DeiT state dict).

Key by key (both layouts share timm's names)::

    patch_embed.proj (C, 3, p, p)  -> inflated over the tubelet's t frames (C, 3, t, p, p)
    cls_token (+ pos_embed[:, 0])  -> cls_token (the class token's fixed code folded in)
    pos_embed grid part            -> pos_enc.spatial, resized to the clip's grid (learned only);
                                      pos_enc.temporal set to zero
    pos_blocks.<i> (PEG2d)         -> pos_blocks.<i> (PEG3d, see :func:`peg_video.inflate_peg2d`)
    blocks.<i>.*, norm.*           -> copied; a divided block's temporal branch gets the spatial
                                      norm/qkv and a zero output projection
    head.*                         -> copied when num_classes agree, dropped otherwise

With ``inflation="mean"`` and the zero temporal parts, the video model sees a
clip of identical frames as the image model sees one frame.

Given a file, a missing, garbage or foreign (not a ViT) checkpoint is a one-line
:class:`Init2dError` naming it; the file is read with ``weights_only=True``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from peg_core import PEG2d, resize_pos_embed
from peg_core.engine import UserError, read_state_file

from ..peg3d import PEG3d, inflate_peg2d
from .pos_embed import LearnedPositionEncoding3d
from .vit import DividedBlock, VideoTransformer

__all__ = ["Init2dError", "LoadReport", "inflate_patch_embed", "load_2d_checkpoint"]

SOURCES = ("cpvt", "deit")
INFLATIONS = ("mean", "central")


class Init2dError(UserError, ValueError):
    """A 2D checkpoint that does not fit: ``what`` says which key and shapes, ``where`` names the file."""


@dataclass
class LoadReport:
    """What :func:`load_2d_checkpoint` did, key by key.

    Attributes:
        copied: model keys copied unchanged.
        converted: model key -> how it was made (inflated, resized, folded, derived).
        skipped: source key -> why it was not used.
        missing: model keys left at their initial values.
    """

    copied: list[str] = field(default_factory=list)
    converted: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"2D init: {len(self.copied)} copied, {len(self.converted)} converted, "
            f"{len(self.skipped)} source keys skipped, {len(self.missing)} model keys left at init"
        ]
        lines += [f"  converted {k}: {v}" for k, v in self.converted.items()]
        lines += [f"  skipped {k}: {v}" for k, v in self.skipped.items()]
        lines += [f"  missing {k}" for k in self.missing]
        return "\n".join(lines)


def inflate_patch_embed(weight: Tensor, frames: int, inflation: str = "mean") -> Tensor:
    """2D patch kernel ``(C, in, p, p)`` -> tubelet kernel ``(C, in, t, p, p)``.

    ``"mean"``: the kernel repeated over the ``t`` frames and divided by ``t``
    (a static clip embeds exactly as its frame); ``"central"``: the kernel in
    frame ``t // 2`` and zeros elsewhere (I3D's alternative).
    """
    if inflation not in INFLATIONS:
        raise ValueError(f"inflation must be one of {INFLATIONS}; got {inflation!r}")
    if inflation == "mean":
        return weight.unsqueeze(2).repeat(1, 1, frames, 1, 1) / frames
    out = weight.new_zeros(*weight.shape[:2], frames, *weight.shape[2:])
    out[:, :, frames // 2] = weight
    return out


def _unwrap(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Accept ``{"model": sd}`` / ``{"state_dict": sd}`` checkpoints and DDP's ``module.`` prefix
    (entries that are not tensors are dropped)."""
    for key in ("model", "state_dict"):
        if key in state_dict and isinstance(state_dict[key], Mapping):
            state_dict = state_dict[key]
    return {
        (k[len("module.") :] if k.startswith("module.") else k): v
        for k, v in state_dict.items()
        if isinstance(k, str) and isinstance(v, Tensor)
    }


def _peg2d_from(sd: dict[str, Tensor], prefix: str, num_prefix_tokens: int) -> PEG2d:
    """Rebuild the PEG2d stored under ``prefix`` (``proj.weight`` ``(C, 1, k, k)``, or separable)."""
    weight = sd[prefix + "proj.weight"]
    separable = prefix + "proj_w.weight" in sd
    dim, k = weight.shape[0], max(weight.shape[-2:])
    peg = PEG2d(dim, k, num_prefix_tokens, separable=separable, bias=prefix + "proj.bias" in sd)
    peg = peg.to(weight.dtype)  # keep the checkpoint's precision through the inflation
    peg.load_state_dict({k_[len(prefix) :]: v for k_, v in sd.items() if k_.startswith(prefix)})
    return peg


@torch.no_grad()
def load_2d_checkpoint(
    model: VideoTransformer,
    state_dict: Mapping[str, Tensor] | str | os.PathLike,
    source: str = "cpvt",
    inflation: str = "mean",
    source_grid: tuple[int, int] | None = None,
) -> LoadReport:
    """Initialise ``model`` from a 2D image checkpoint; returns a :class:`LoadReport`.

    Args:
        model: a :class:`~peg_video.models.vit.VideoTransformer` whose width,
            patch size and heads match the checkpoint's.
        state_dict: a file to read, or ``peg_core.models.CPVT`` weights (``source="cpvt"``; PEGs in
            ``pos_blocks.<i>``, a learned table in ``pos_enc.pos_embed``) or a
            timm DeiT state dict (``source="deit"``; ``pos_embed``, optional
            ``dist_token``/``head_dist``).  ``{"model": ...}`` wrappers and a
            ``module.`` prefix are accepted.
        inflation: patch-embedding inflation, ``"mean"`` or ``"central"``.
        source_grid: ``(H, W)`` patch grid of the 2D position table; needed only
            when it is not square (a square one is inferred from its length).

    Raises:
        ValueError: unknown source or inflation, or a model that is not a VideoTransformer.
        Init2dError: (a ``UserError`` and a ``ValueError``) an unreadable file, a state dict
            without a ViT layout, or a tensor whose shape does not fit (the message names
            key and shapes, and the file).
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}; got {source!r}")
    if not isinstance(model, VideoTransformer):
        raise ValueError(f"load_2d_checkpoint needs a VideoTransformer; got {type(model).__name__}")
    where = None
    if isinstance(state_dict, str | os.PathLike):
        where = Path(state_dict)
        state_dict = read_state_file(where, what="2D checkpoint")
    if not isinstance(state_dict, Mapping):
        raise Init2dError(f"2D checkpoint holds a {type(state_dict).__name__}, not a state dict", where)
    sd = _unwrap(state_dict)
    for key in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight"):
        if key not in sd:
            raise Init2dError(
                f"the {source} state dict has no {key!r}: not a DeiT-layout ViT checkpoint", where
            )
    target = model.state_dict()
    report = LoadReport()
    new: dict[str, Tensor] = {}
    used: set[str] = set()

    def put(key: str, value: Tensor, src: str, how: str | None = None) -> None:
        if target[key].shape != value.shape:
            shape = tuple(sd[src].shape) if src in sd else tuple(value.shape)
            made = f" (as {tuple(value.shape)} after {how})" if how else ""
            raise Init2dError(
                f"{src} {shape}{made} does not fit the model's {key} {tuple(target[key].shape)}", where
            )
        new[key] = value.to(target[key].dtype)
        used.add(src)
        if how is None:
            report.copied.append(key)
        else:
            report.converted[key] = how

    # Tubelet embedding.
    w2 = sd["patch_embed.proj.weight"]
    t = model.tubelet[0]
    if w2.dim() != 4 or tuple(w2.shape[-2:]) != model.tubelet[1:]:
        raise Init2dError(
            f"patch_embed.proj.weight {tuple(w2.shape)} is not a 2D kernel of the tubelet's "
            f"spatial size {model.tubelet[1:]}",
            where,
        )
    how = f"{inflation} inflation over {t} frames"
    put("patch_embed.proj.weight", inflate_patch_embed(w2, t, inflation), "patch_embed.proj.weight", how)
    if "patch_embed.proj.bias" in sd:
        put("patch_embed.proj.bias", sd["patch_embed.proj.bias"], "patch_embed.proj.bias")

    # Position table: DeiT keeps it at the top level, CPVT in its pos_enc module.
    pos_key = "pos_embed" if source == "deit" else "pos_enc.pos_embed"
    pos = sd.get(pos_key)
    src_prefix = int("cls_token" in sd) + int("dist_token" in sd)
    if pos is not None and pos.shape[1] == src_prefix:  # nothing but prefix entries: not a grid table
        src_prefix = 0

    # Class token, with its fixed position code folded in (the video model gives prefix tokens none).
    if model.cls_token is not None and "cls_token" in sd:
        cls = sd["cls_token"]
        how = None
        if pos is not None and src_prefix:
            cls, how = cls + pos[:, :1], f"cls_token + {pos_key}[:, 0]"
        put("cls_token", cls, "cls_token", how)
    elif "cls_token" in sd:
        report.skipped["cls_token"] = "the model pools by average and has no class token"

    if pos is not None:
        if isinstance(model.pos_enc, LearnedPositionEncoding3d):
            grid = model.pos_enc.grid_size
            try:
                spatial = resize_pos_embed(
                    pos, grid[1:], source_grid, num_prefix_tokens=src_prefix, mode=model.pos_enc.interpolation
                )[:, src_prefix:]
            except ValueError as e:  # a table that is not a (1, P + H*W, C) grid of the given shape
                raise Init2dError(f"{pos_key} {tuple(pos.shape)}: {e}", where) from None
            put("pos_enc.spatial", spatial, pos_key, f"{pos_key} grid part resized to {grid[1:]}")
            new["pos_enc.temporal"] = torch.zeros_like(target["pos_enc.temporal"])
            report.converted["pos_enc.temporal"] = "zeros (the 2D model has no time)"
        else:
            report.skipped[pos_key] = (
                f"the model's position encoding is {model.pos_enc_kind!r}, not 'learned'"
            )

    # PEGs: inflate each PEG2d at block i into the model's PEG3d at block i.
    for key in model.pos_blocks:
        prefix = f"pos_blocks.{key}."
        if prefix + "proj.weight" not in sd:
            continue
        peg3d: PEG3d = model.pos_blocks[key]
        try:
            peg2d = _peg2d_from(sd, prefix, peg3d.num_prefix_tokens)
        except RuntimeError as e:  # load_state_dict: tensors that do not make a PEG2d
            raise Init2dError(f"{prefix}*: not a PEG2d ({str(e).splitlines()[0]})", where) from None
        if (peg2d.dim, peg2d.kernel_size, peg2d.kernel_size) != (peg3d.dim, *peg3d.kernel_size[1:]):
            raise Init2dError(
                f"{prefix}proj.weight: a {peg2d.kernel_size}x{peg2d.kernel_size} PEG2d of dim {peg2d.dim} "
                f"does not inflate into the model's PEG3d {peg3d.kernel_size} of dim {peg3d.dim}",
                where,
            )
        inflated = inflate_peg2d(peg2d, peg3d.kernel_size[0], peg3d.factorized, peg3d.num_prefix_tokens)
        for name, value in inflated.state_dict().items():
            put(prefix + name, value, prefix + "proj.weight", f"inflated from the PEG2d {prefix[:-1]}")
        used.update(k for k in sd if k.startswith(prefix))

    # Transformer blocks, final norm, head: same names.
    for key, value in sd.items():
        if key.startswith(("blocks.", "norm.")) and key in target:
            put(key, value, key)
    for i, blk in enumerate(model.blocks):
        if isinstance(blk, DividedBlock):
            for dst, src in (("norm_t", "norm1"), ("attn_t.qkv", "attn.qkv")):
                for leaf in ("weight", "bias"):
                    src_key, dst_key = f"blocks.{i}.{src}.{leaf}", f"blocks.{i}.{dst}.{leaf}"
                    if src_key in sd and dst_key in target:
                        put(dst_key, sd[src_key], src_key, f"from {src_key} (temporal branch)")
            for leaf in ("weight", "bias"):
                key = f"blocks.{i}.attn_t.proj.{leaf}"
                new[key] = torch.zeros_like(target[key])
                report.converted[key] = "zeros (temporal branch starts switched off)"
    for leaf in ("weight", "bias"):
        key = f"head.{leaf}"
        if key in sd:
            if key in target and target[key].shape == sd[key].shape:
                put(key, sd[key], key)
            else:
                shape = tuple(target[key].shape) if key in target else "no head"
                report.skipped[key] = f"{tuple(sd[key].shape)} vs the model's {shape}: head dropped"

    for key in sd:
        if key not in used and key not in report.skipped:
            report.skipped[key] = "no counterpart in the video model"
    report.missing = [k for k in target if k not in new]
    model.load_state_dict(new, strict=False)
    return report
