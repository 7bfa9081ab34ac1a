"""Turn a live timm or torchvision ViT into a CPVT: drop the position table, add PEGs after blocks.

:func:`convert_to_cpvt` edits the model in place (and returns it)::

    image (B, 3, H, W) --pad bottom/right to a multiple of the patch--> patch conv -> (B, C, h, w)
      -> tokens (B, P + h*w, C), no position table added (P: class / register tokens)
      -> blocks.0 -> PEG2d (pos_blocks.0) -> blocks.1 -> ...        (PEGs after the blocks in peg_at)

The PEGs start at zero, so until they train the model computes exactly what the
original computes with its table set to zero, at any input size.  The original
parameter names are kept (the PEGs are extra keys ``pos_blocks.<i>.*``, as in
:class:`peg_core.models.cpvt.CPVT`), so pretrained weights can be loaded before
or after converting.  Each PEG runs as a forward hook of its block; the grid of
the current input is read off the patch convolution's output by another hook.
Both hooks are plain picklable objects owned by the model, so ``copy.deepcopy``
(EMA copies) gives a model whose hooks point at the copy's own PEGs.

Input sizes that are not a multiple of the patch are zero-padded at the bottom
and right (timm's ``dynamic_img_pad``; the same padding
:class:`~peg_core.models.cpvt.CPVT` uses), so an ``H x W`` image gives a
``ceil(H/p) x ceil(W/p)`` grid.

Limits: timm applies ``pos_drop`` only together with a table, so a converted timm
model skips that dropout (0 in timm's configs; eval outputs are unaffected).  The
grid is per model, not per call: one model must not run two inputs concurrently
from different threads.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..peg import PEG2d

__all__ = ["convert_to_cpvt"]


class _GridCell:
    """The ``(h, w)`` patch grid of the input being run; written by a hook on the patch conv."""

    def __init__(self) -> None:
        self.grid: tuple[int, int] | None = None

    def __call__(self, conv: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        # forward hook of the patch conv: output is (B, C, h, w) whatever the token layout after it
        self.grid = (output.shape[-2], output.shape[-1])


class _PEGAfterBlock:
    """Forward hook of a block: ``out (B, P + h*w, C) -> peg(out, grid)``."""

    def __init__(self, peg: PEG2d, cell: _GridCell) -> None:
        self.peg = peg
        self.cell = cell

    def __call__(self, block: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        if self.cell.grid is None:
            raise RuntimeError("PEG ran before the patch embedding: call the whole model, not its blocks")
        return self.peg(output, self.cell.grid)


def _loaded_class(module: str, name: str) -> tuple[type, ...]:
    """``(module.name,)`` if ``module`` is already imported, else ``()``.

    A model of that library cannot exist unless the library was imported, so the optional
    timm / torchvision are never imported here just to be told "no".
    """
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return (cls,) if isinstance(cls, type) else ()


class _Bound:
    """``fn`` bound to ``model``, set as an instance attribute to replace one method of that model only.

    Unlike ``types.MethodType`` it survives ``torch.save(model)`` / pickling, and ``copy.deepcopy``
    binds the copy's ``fn`` to the copied model.
    """

    def __init__(self, fn: Any, model: nn.Module) -> None:
        self.fn = fn
        self.model = model

    def __call__(self, *args: Any) -> Any:
        return self.fn(self.model, *args)


def _torchvision_process_input(self: nn.Module, x: Tensor) -> Tensor:
    """torchvision's ``_process_input`` without its fixed-size assert: ``(B, 3, H, W) -> (B, h*w, C)``."""
    p = self.patch_size
    h, w = x.shape[-2:]
    ph, pw = (-h) % p, (-w) % p
    if ph or pw:  # pad like timm's dynamic_img_pad instead of refusing the size
        x = F.pad(x, (0, pw, 0, ph))
    x = self.conv_proj(x)  # (B, C, h, w)
    return x.flatten(2).transpose(1, 2)


def _timm_distilled_pos_embed(self: nn.Module, x: Tensor) -> Tensor:
    """DeiT-distilled token assembly without the table: ``(B, N, C)`` or ``(B, h, w, C)`` -> ``(B, 2 + h*w, C)``."""
    x = x.flatten(1, 2) if x.dim() == 4 else x  # dynamic_img_size gives NHWC
    b = x.shape[0]
    x = torch.cat((self.cls_token.expand(b, -1, -1), self.dist_token.expand(b, -1, -1), x), dim=1)
    return self.pos_drop(x)


class _TableFreeEncoder(nn.Module):
    """torchvision ``Encoder`` without ``pos_embedding``; same ``dropout``/``layers``/``ln`` names."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.dropout = encoder.dropout
        self.layers = encoder.layers
        self.ln = encoder.ln

    def forward(self, x: Tensor) -> Tensor:
        """Tokens ``(B, 1 + h*w, C)`` -> normed tokens, same shape."""
        if x.dim() != 3:
            raise ValueError(f"expected tokens (B, N, C); got shape {tuple(x.shape)}")
        return self.ln(self.layers(self.dropout(x)))


def _check_peg_at(peg_at: Sequence[int] | int, depth: int) -> tuple[int, ...]:
    if isinstance(peg_at, int):
        peg_at = (peg_at,)
    try:
        idx = tuple(sorted({int(i) for i in peg_at}))
    except (TypeError, ValueError):
        raise ValueError(f"peg_at must be block indices (ints); got {peg_at!r}") from None
    if not idx:
        raise ValueError("peg_at must name at least one block")
    bad = [i for i in idx if not 0 <= i < depth]
    if bad:
        raise ValueError(
            f"peg_at={idx} has indices {bad} outside the model's {depth} blocks (0..{depth - 1})"
        )
    return idx


def _add_pegs(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    patch_conv: nn.Module,
    dim: int,
    num_prefix_tokens: int,
    peg_at: tuple[int, ...],
    kernel_size: int,
) -> None:
    """Create ``model.pos_blocks`` (zero PEGs) and hook them after ``blocks[i]``, ``i`` in ``peg_at``."""
    ref = patch_conv.weight if hasattr(patch_conv, "weight") else next(model.parameters())
    cell = _GridCell()
    pegs = {
        str(i): PEG2d(dim, kernel_size, num_prefix_tokens=num_prefix_tokens, zero_init=True).to(
            device=ref.device, dtype=ref.dtype
        )
        for i in peg_at
    }
    model.pos_blocks = nn.ModuleDict(pegs)
    patch_conv.register_forward_hook(cell)
    for i in peg_at:
        blocks[i].register_forward_hook(_PEGAfterBlock(model.pos_blocks[str(i)], cell))


def _convert_timm(model: nn.Module, peg_at: Sequence[int] | int, kernel_size: int) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    name = type(model).__name__
    distilled = _loaded_class("timm.models.deit", "VisionTransformerDistilled")
    if isinstance(model, distilled):
        # its _pos_embed always adds the table; this one only prepends [cls, dist]
        model._pos_embed = _Bound(_timm_distilled_pos_embed, model)
    elif type(model)._pos_embed is not VisionTransformer._pos_embed:
        raise TypeError(f"convert_to_cpvt: {name} adds its position table its own way; not supported")
    pe = model.patch_embed
    if not isinstance(getattr(pe, "proj", None), nn.Conv2d):
        raise TypeError(
            f"convert_to_cpvt: {name} has no conv patch embedding (patch_embed.proj); not supported"
        )
    idx = _check_peg_at(peg_at, len(model.blocks))
    # No table: timm's _pos_embed then only prepends the class / register tokens.
    model.pos_embed = None
    # Any input size: no fixed-size assert, and sizes that are not a multiple of the patch get padded.
    pe.strict_img_size = False
    pe.dynamic_img_pad = True
    _add_pegs(model, model.blocks, pe.proj, model.embed_dim, model.num_prefix_tokens, idx, kernel_size)
    return model


def _convert_torchvision(model: nn.Module, peg_at: Sequence[int] | int, kernel_size: int) -> nn.Module:
    enc = model.encoder
    idx = _check_peg_at(peg_at, len(enc.layers))
    model.encoder = _TableFreeEncoder(enc)
    # Instance attribute: only this model loses the image_size assert.
    model._process_input = _Bound(_torchvision_process_input, model)
    _add_pegs(model, list(enc.layers), model.conv_proj, model.hidden_dim, 1, idx, kernel_size)
    return model


def convert_to_cpvt(model: nn.Module, peg_at: Sequence[int] | int = (0,), kernel_size: int = 3) -> nn.Module:
    """Replace the learned position table of a ViT by zero-initialised PEGs; in place, returns ``model``.

    Args:
        model: a timm ``VisionTransformer`` (``vit_*``, ``deit_*`` incl. distilled; class token,
            register tokens, ``no_embed_class``, ``dynamic_img_size``, ``global_pool='avg'`` all fine)
            or a torchvision ``VisionTransformer`` (``vit_b_16`` ...).
        peg_at: indices of the blocks after which a PEG runs (CPVT: ``(0,)``).
        kernel_size: odd PEG depthwise conv size (3 in CPVT).

    Returns:
        ``model``, now taking images ``(B, 3, H, W)`` of any size, with new parameters
        ``pos_blocks.<i>.proj.{weight,bias}`` and no ``pos_embed`` / ``encoder.pos_embedding``.

    Raises:
        TypeError: ``model`` is none of the supported classes (the message names its class).
        ValueError: ``peg_at`` empty or outside the blocks; ``model`` already converted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_to_cpvt needs a ViT nn.Module; got {type(model).__name__}")
    if hasattr(model, "pos_blocks") or isinstance(getattr(model, "encoder", None), _TableFreeEncoder):
        raise ValueError(f"convert_to_cpvt: this {type(model).__name__} already has PEGs (pos_blocks)")
    if isinstance(model, _loaded_class("timm.models.vision_transformer", "VisionTransformer")):
        return _convert_timm(model, peg_at, kernel_size)
    if isinstance(model, _loaded_class("torchvision.models.vision_transformer", "VisionTransformer")):
        return _convert_torchvision(model, peg_at, kernel_size)
    raise TypeError(
        f"convert_to_cpvt supports timm and torchvision VisionTransformer models; got {type(model).__module__}."
        f"{type(model).__qualname__}"
    )
