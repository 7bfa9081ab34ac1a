"""2-D -> 3-D inflation: a video transformer started from a 2D image checkpoint (peg_core's CPVT or a timm DeiT state dict).

:func:`inflate_peg2d` turns one trained :class:`peg_core.PEG2d` into a :class:`peg_core.PEG3d`
that acts on every frame as the 2D PEG acts on an image; :func:`inflate_patch_embed` does the
same for the patch embedding; :func:`load_2d_checkpoint` fills a whole
:class:`~peg_video.models.vit.VideoTransformer` from a 2D checkpoint.

Key by key (both layouts share timm's names)::

    patch_embed.proj (C, 3, p, p)  -> inflated over the tubelet's t frames (C, 3, t, p, p)
    cls_token (+ pos_embed[:, 0])  -> cls_token (the class token's fixed code folded in)
    pos_embed grid part            -> pos_enc.spatial, resized to the clip's grid (learned only);
                                      pos_enc.temporal set to zero
    pos_blocks.<i> (PEG2d)         -> pos_blocks.<i> (PEG3d, see :func:`inflate_peg2d`)
    blocks.<i>.*, norm.*           -> copied; a divided block's temporal branch gets the spatial
                                      norm/qkv and a zero output projection
    head.*                         -> copied when num_classes agree, dropped otherwise

With ``inflation="mean"`` and the zero temporal parts, the video model sees a
clip of identical frames as the image model sees one frame.

Given a file, it is read by :func:`peg_core.interop.read_state_file` (``weights_only=True``)
and the state dict found by :func:`~peg_core.interop.unwrap_state_dict` /
:func:`~peg_core.interop.strip_prefixes`.  A missing, garbage or foreign (not a ViT)
checkpoint is a :class:`~peg_core.interop.WeightsError` (a ``ValueError``; :class:`Init2dError`
for a checkpoint that does not fit) naming it; the command line prints it as one line.

:func:`load_2d_checkpoint` runs six named steps over one :class:`_Transfer` (which records
every key it fills in the :class:`~peg_core.interop.LoadReport`): read the source, the
tubelet embedding, the class token, the position table, the PEGs, the blocks and the head.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from peg_core import PEG2d, PEG3d, resize_pos_embed
from peg_core.encodings import LearnedPositionEncoding3d
from peg_core.interop.io import LoadReport, WeightsError, read_state_file, strip_prefixes, unwrap_state_dict

from ..models.vit import DividedBlock, VideoTransformer

__all__ = ["Init2dError", "inflate_patch_embed", "inflate_peg2d", "load_2d_checkpoint"]

SOURCES = ("cpvt", "deit")
INFLATIONS = ("mean", "central")
#: keys every DeiT-layout ViT checkpoint has
REQUIRED_KEYS = ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight")


class Init2dError(WeightsError):
    """A 2D checkpoint that does not fit: ``what`` says which key and shapes, ``where`` names the file."""


def _dense_kernel2d(peg: PEG2d) -> Tensor:
    """The single ``(C, 1, k, k)`` kernel a PEG2d applies (the outer product of its two convs if separable).

    A ``k×1`` conv after a ``1×k`` one, both zero-padded and without a bias in
    between, equals one ``k×k`` conv with the outer-product kernel.
    """
    if not peg.separable:
        return peg.proj.weight.detach()
    col = peg.proj.weight.detach()  # (C, 1, k, 1)
    row = peg.proj_w.weight.detach()  # (C, 1, 1, k)
    return col * row


@torch.no_grad()
def inflate_peg2d(
    peg2d: PEG2d, temporal_kernel: int = 3, factorized: bool = False, num_prefix_tokens: int | None = None
) -> PEG3d:
    """Build a :class:`PEG3d` that acts on every frame exactly as ``peg2d`` acts on an image.

    The 2D kernel goes into the centre temporal slice of a ``(kT, k, k)``
    kernel with zeros elsewhere (for ``factorized=True``: the 2D kernel is the
    spatial conv and the temporal conv is a unit impulse), the bias is copied.
    With the zero padding, ``PEG3d(x)[:, :, t] == PEG2d(x[:, :, t])`` for every
    frame ``t`` of any clip; training then learns the temporal taps.

    Args:
        peg2d: a trained 2D PEG (plain or separable).
        temporal_kernel: odd ``kT``.
        factorized: build the factorized PEG3d.
        num_prefix_tokens: defaults to ``peg2d.num_prefix_tokens``.
    """
    k = peg2d.kernel_size
    p = peg2d.num_prefix_tokens if num_prefix_tokens is None else num_prefix_tokens
    bias = peg2d.proj.bias is not None
    peg3d = PEG3d(peg2d.dim, (temporal_kernel, k, k), p, factorized=factorized, bias=bias)
    peg3d = peg3d.to(device=peg2d.proj.weight.device, dtype=peg2d.proj.weight.dtype)
    kernel = _dense_kernel2d(peg2d)  # (C, 1, k, k)
    centre = temporal_kernel // 2
    if factorized:
        peg3d.proj_s.weight.copy_(kernel.unsqueeze(2))
        peg3d.proj.weight.zero_()
        peg3d.proj.weight[:, :, centre] = 1.0
    else:
        peg3d.proj.weight.zero_()
        peg3d.proj.weight[:, :, centre] = kernel
    if bias:
        peg3d.proj.bias.copy_(peg2d.proj.bias)
    return peg3d


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


def _peg2d_from(sd: dict[str, Tensor], prefix: str, num_prefix_tokens: int) -> PEG2d:
    """Rebuild the PEG2d stored under ``prefix`` (``proj.weight`` ``(C, 1, k, k)``, or separable)."""
    weight = sd[prefix + "proj.weight"]
    separable = prefix + "proj_w.weight" in sd
    dim, k = weight.shape[0], max(weight.shape[-2:])
    peg = PEG2d(dim, k, num_prefix_tokens, separable=separable, bias=prefix + "proj.bias" in sd)
    peg = peg.to(weight.dtype)  # keep the checkpoint's precision through the inflation
    peg.load_state_dict({k_[len(prefix) :]: v for k_, v in sd.items() if k_.startswith(prefix)})
    return peg


def _read_source(
    state_dict: Mapping[str, Any] | str | os.PathLike, source: str
) -> tuple[dict[str, Tensor], Path | None]:
    """Step 1: the source's tensors by name (file read, wrapper and ``module.`` prefix removed), and its file.

    Entries that are not tensors are dropped; a state dict without :data:`REQUIRED_KEYS` is an
    :class:`Init2dError` (not a DeiT-layout ViT checkpoint).
    """
    where = None
    if isinstance(state_dict, str | os.PathLike):
        where = Path(state_dict)
        state_dict = read_state_file(where, what="2D checkpoint")
    if not isinstance(state_dict, Mapping):
        raise Init2dError(f"2D checkpoint holds a {type(state_dict).__name__}, not a state dict", where)
    try:
        found = unwrap_state_dict(state_dict, where=where)
    except WeightsError:
        found = {}  # no tensors at all: reported below as a missing ViT key
    sd = strip_prefixes({k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, Tensor)})
    for key in REQUIRED_KEYS:
        if key not in sd:
            raise Init2dError(
                f"the {source} state dict has no {key!r}: not a DeiT-layout ViT checkpoint", where
            )
    return sd, where


@dataclass
class _Transfer:
    """The state of one 2D -> video transfer: source tensors, target shapes, what is filled so far.

    Attributes:
        sd: the source's tensors by name.
        target: the video model's state dict (shapes and dtypes to fill).
        where: the source file, named in errors (``None`` for an in-memory state dict).
        new: model key -> the value it gets.
        used: source keys consumed.
        report: the key-by-key account returned to the caller.
    """

    sd: dict[str, Tensor]
    target: dict[str, Tensor]
    where: Path | None
    new: dict[str, Tensor] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    report: LoadReport = field(default_factory=LoadReport)

    def put(self, key: str, value: Tensor, src: str, how: str | None = None) -> None:
        """Set model ``key`` to ``value`` (made from source ``src``, ``how``: ``None`` means copied unchanged).

        A shape that does not fit the model is an :class:`Init2dError` naming both keys and shapes.
        """
        if self.target[key].shape != value.shape:
            shape = tuple(self.sd[src].shape) if src in self.sd else tuple(value.shape)
            made = f" (as {tuple(value.shape)} after {how})" if how else ""
            raise Init2dError(
                f"{src} {shape}{made} does not fit the model's {key} {tuple(self.target[key].shape)}",
                self.where,
            )
        self.new[key] = value.to(self.target[key].dtype)
        self.used.add(src)
        if how is None:
            self.report.copied.append(key)
        else:
            self.report.converted[key] = how

    def zeros(self, key: str, why: str) -> None:
        """Set model ``key`` to zeros (a part the 2D model has no counterpart for)."""
        self.new[key] = torch.zeros_like(self.target[key])
        self.report.converted[key] = why


def _load_tubelet_embed(tr: _Transfer, model: VideoTransformer, inflation: str) -> None:
    """Step 2: the 2D patch kernel ``(C, 3, p, p)`` inflated over the tubelet's ``t`` frames."""
    w2 = tr.sd["patch_embed.proj.weight"]
    t = model.tubelet[0]
    if w2.dim() != 4 or tuple(w2.shape[-2:]) != model.tubelet[1:]:
        raise Init2dError(
            f"patch_embed.proj.weight {tuple(w2.shape)} is not a 2D kernel of the tubelet's "
            f"spatial size {model.tubelet[1:]}",
            tr.where,
        )
    how = f"{inflation} inflation over {t} frames"
    tr.put("patch_embed.proj.weight", inflate_patch_embed(w2, t, inflation), "patch_embed.proj.weight", how)
    if "patch_embed.proj.bias" in tr.sd:
        tr.put("patch_embed.proj.bias", tr.sd["patch_embed.proj.bias"], "patch_embed.proj.bias")


def _table_prefix(sd: dict[str, Tensor], pos: Tensor | None) -> int:
    """Rows of the 2D table ``(1, P + H*W, C)`` that belong to prefix tokens (class, distillation)."""
    prefix = int("cls_token" in sd) + int("dist_token" in sd)
    if pos is not None and pos.shape[1] == prefix:  # nothing but prefix entries: not a grid table
        return 0
    return prefix


def _load_cls_token(tr: _Transfer, model: VideoTransformer, pos_key: str, src_prefix: int) -> None:
    """Step 3: the class token, with its fixed position code folded in (prefix tokens get no code here)."""
    if "cls_token" not in tr.sd:
        return
    if model.cls_token is None:
        tr.report.skipped["cls_token"] = "the model pools by average and has no class token"
        return
    cls, how = tr.sd["cls_token"], None
    pos = tr.sd.get(pos_key)
    if pos is not None and src_prefix:
        cls, how = cls + pos[:, :1], f"cls_token + {pos_key}[:, 0]"
    tr.put("cls_token", cls, "cls_token", how)


def _load_pos_table(
    tr: _Transfer, model: VideoTransformer, pos_key: str, src_prefix: int, source_grid: tuple[int, int] | None
) -> None:
    """Step 4: the 2D table's grid part ``(1, H*W, C)`` -> ``pos_enc.spatial`` at the clip's grid; temporal zeros.

    Only a ``learned`` video model has a table; for the others the source table is skipped.
    """
    pos = tr.sd.get(pos_key)
    if pos is None:
        return
    if not isinstance(model.pos_enc, LearnedPositionEncoding3d):
        tr.report.skipped[pos_key] = f"the model's position encoding is {model.pos_enc_kind!r}, not 'learned'"
        return
    grid = model.pos_enc.grid_size
    try:
        spatial = resize_pos_embed(
            pos, grid[1:], source_grid, num_prefix_tokens=src_prefix, mode=model.pos_enc.interpolation
        )[:, src_prefix:]
    except ValueError as e:  # a table that is not a (1, P + H*W, C) grid of the given shape
        raise Init2dError(f"{pos_key} {tuple(pos.shape)}: {e}", tr.where) from None
    tr.put("pos_enc.spatial", spatial, pos_key, f"{pos_key} grid part resized to {grid[1:]}")
    tr.zeros("pos_enc.temporal", "zeros (the 2D model has no time)")


def _load_pegs(tr: _Transfer, model: VideoTransformer) -> None:
    """Step 5: each PEG2d at ``pos_blocks.<i>`` inflated into the model's PEG3d at ``pos_blocks.<i>``."""
    for key in model.pos_blocks:
        prefix = f"pos_blocks.{key}."
        if prefix + "proj.weight" not in tr.sd:
            continue
        peg3d = model.pos_blocks[key]
        if not isinstance(
            peg3d, PEG3d
        ):  # another (registered) conditional encoding: no PEG3d to inflate into
            tr.report.skipped[prefix + "proj.weight"] = (
                f"the model's {prefix[:-1]} is a {type(peg3d).__name__}, not a PEG3d"
            )
            continue
        try:
            peg2d = _peg2d_from(tr.sd, prefix, peg3d.num_prefix_tokens)
        except RuntimeError as e:  # load_state_dict: tensors that do not make a PEG2d
            raise Init2dError(f"{prefix}*: not a PEG2d ({str(e).splitlines()[0]})", tr.where) from None
        if (peg2d.dim, peg2d.kernel_size, peg2d.kernel_size) != (peg3d.dim, *peg3d.kernel_size[1:]):
            raise Init2dError(
                f"{prefix}proj.weight: a {peg2d.kernel_size}x{peg2d.kernel_size} PEG2d of dim {peg2d.dim} "
                f"does not inflate into the model's PEG3d {peg3d.kernel_size} of dim {peg3d.dim}",
                tr.where,
            )
        inflated = inflate_peg2d(peg2d, peg3d.kernel_size[0], peg3d.factorized, peg3d.num_prefix_tokens)
        for name, value in inflated.state_dict().items():
            tr.put(prefix + name, value, prefix + "proj.weight", f"inflated from the PEG2d {prefix[:-1]}")
        tr.used.update(k for k in tr.sd if k.startswith(prefix))


def _load_blocks(tr: _Transfer, model: VideoTransformer) -> None:
    """Step 6: blocks and final norm by name; a divided block's temporal branch from its spatial one, switched off."""
    for key, value in tr.sd.items():
        if key.startswith(("blocks.", "norm.")) and key in tr.target:
            tr.put(key, value, key)
    for i, blk in enumerate(model.blocks):
        if not isinstance(blk, DividedBlock):
            continue
        for dst, src in (("norm_t", "norm1"), ("attn_t.qkv", "attn.qkv")):
            for leaf in ("weight", "bias"):
                src_key, dst_key = f"blocks.{i}.{src}.{leaf}", f"blocks.{i}.{dst}.{leaf}"
                if src_key in tr.sd and dst_key in tr.target:
                    tr.put(dst_key, tr.sd[src_key], src_key, f"from {src_key} (temporal branch)")
        for leaf in ("weight", "bias"):
            tr.zeros(f"blocks.{i}.attn_t.proj.{leaf}", "zeros (temporal branch starts switched off)")


def _load_head(tr: _Transfer) -> None:
    """Step 7: the classifier head when the class counts agree; dropped (and reported) otherwise."""
    for leaf in ("weight", "bias"):
        key = f"head.{leaf}"
        if key not in tr.sd:
            continue
        if key in tr.target and tr.target[key].shape == tr.sd[key].shape:
            tr.put(key, tr.sd[key], key)
        else:
            shape = tuple(tr.target[key].shape) if key in tr.target else "no head"
            tr.report.skipped[key] = f"{tuple(tr.sd[key].shape)} vs the model's {shape}: head dropped"


@torch.no_grad()
def load_2d_checkpoint(
    model: VideoTransformer,
    state_dict: Mapping[str, Tensor] | str | os.PathLike,
    source: str = "cpvt",
    inflation: str = "mean",
    source_grid: tuple[int, int] | None = None,
) -> LoadReport:
    """Initialise ``model`` from a 2D image checkpoint; returns a :class:`~peg_core.interop.LoadReport`.

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
        WeightsError: an unreadable file (:class:`Init2dError`, a subclass, for a state dict
            without a ViT layout, or a tensor whose shape does not fit; the message names key
            and shapes, and the file).
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}; got {source!r}")
    if not isinstance(model, VideoTransformer):
        raise ValueError(f"load_2d_checkpoint needs a VideoTransformer; got {type(model).__name__}")
    sd, where = _read_source(state_dict, source)
    tr = _Transfer(
        sd, model.state_dict(), where, report=LoadReport(source="" if where is None else str(where))
    )
    _load_tubelet_embed(tr, model, inflation)
    # DeiT keeps the table at the top level, CPVT in its pos_enc module.
    pos_key = "pos_embed" if source == "deit" else "pos_enc.pos_embed"
    src_prefix = _table_prefix(sd, sd.get(pos_key))
    _load_cls_token(tr, model, pos_key, src_prefix)
    _load_pos_table(tr, model, pos_key, src_prefix, source_grid)
    _load_pegs(tr, model)
    _load_blocks(tr, model)
    _load_head(tr)
    for key in sd:
        if key not in tr.used and key not in tr.report.skipped:
            tr.report.skipped[key] = "no counterpart in the video model"
    tr.report.missing = [k for k in tr.target if k not in tr.new]
    model.load_state_dict(tr.new, strict=False)
    return tr.report
