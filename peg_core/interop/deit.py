"""Loading timm / DeiT (and torchvision ViT) weights into :class:`~peg_core.models.CPVT`.

Mapping (timm name -> CPVT name; everything not listed has the same name)::

    patch_embed.proj.*, cls_token, blocks.<i>.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*,
    norm.*, head.*                      -> same names
    pos_embed (1, P + 14*14, C)         -> pos_enc.pos_embed, resized to the model's grid
                                           (pos_enc="learned"); dropped otherwise
    dist_token, head_dist.* (distilled) -> dropped; the dist entry of pos_embed too
    cls_token                           -> dropped when the model has no class token (GAP);
                                           so is pos_embed's class-token entry
    (missing) pos_blocks.<i>.proj.*     -> zeros: the PEGs start as identity
    head.* of another num_classes       -> the model's own initial head is kept

torchvision ``VisionTransformer`` state dicts are renamed first
(:func:`peg_core.interop.torchvision_vit_to_deit`).

Here, not in :mod:`peg_core.models`: the models import nothing of :mod:`peg_core.interop`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..models.cpvt import CPVT
from ..resize import infer_grid, resize_pos_embed
from .io import LoadReport, strip_prefixes, unwrap_state_dict
from .surgery import is_torchvision_vit, torchvision_vit_to_deit

__all__ = ["load_timm_deit"]


@torch.no_grad()
def load_timm_deit(model: CPVT, state_dict: Mapping[str, Any], mode: str = "bicubic") -> LoadReport:
    """Load a timm DeiT / ViT (or torchvision ViT) checkpoint into ``model`` (see the module docstring).

    Args:
        model: the :class:`CPVT` to fill (any ``pos_enc`` and ``global_pool``).
        state_dict: the checkpoint; ``model``/``state_dict`` wrappers and ``module.`` prefixes are fine.
        mode: interpolation for resizing ``pos_embed`` to a learned model's grid.

    Returns:
        the :class:`LoadReport`: ``skipped`` the checkpoint keys with no place (distillation token and
        head, a class token or table the model does not have, a head of another size), ``converted``
        the resized table and the zero-initialised PEGs, ``missing`` a head kept at its
        initialisation, ``copied`` the rest.  Any other mismatch raises (strict load).
    """
    sd = strip_prefixes(unwrap_state_dict(state_dict))
    if is_torchvision_vit(sd):
        sd = torchvision_vit_to_deit(sd)
    report = LoadReport()
    own = model.state_dict()

    n_src_prefix = int("cls_token" in sd) + int("dist_token" in sd)
    for name in [n for n in sd if n == "dist_token" or n.startswith("head_dist.")]:
        del sd[name]
        report.skipped[name] = "distillation: the model has no distillation token"
    if "cls_token" in sd and model.cls_token is None:
        del sd["cls_token"]
        report.skipped["cls_token"] = "the model has no class token"

    if "pos_embed" in sd:
        table = sd.pop("pos_embed")
        if "pos_enc.pos_embed" in own:
            if model.num_prefix_tokens > n_src_prefix:
                raise ValueError(
                    f"the model has a class token but the checkpoint's pos_embed {tuple(table.shape)} has "
                    f"no class-token entry; build the model with global_pool='avg' (no class token)"
                )
            src_grid = infer_grid(table.shape[1] - n_src_prefix)
            # Keep only the class-token row (first) when the model has a class token.
            prefix = table[:, : model.num_prefix_tokens]
            grid = torch.cat([prefix, table[:, n_src_prefix:]], dim=1)
            sd["pos_enc.pos_embed"] = resize_pos_embed(
                grid, model.grid_size, src_grid, num_prefix_tokens=model.num_prefix_tokens, mode=mode
            )
            if tuple(table.shape) != tuple(sd["pos_enc.pos_embed"].shape):  # same grid: a plain copy
                report.converted["pos_enc.pos_embed"] = (
                    f"resized ({mode}) from pos_embed {tuple(table.shape)} to {tuple(sd['pos_enc.pos_embed'].shape)}"
                )
        else:
            report.skipped["pos_embed"] = "the model has no learned table"

    for name, value in own.items():
        if name.startswith("pos_blocks.") and name not in sd:
            sd[name] = torch.zeros_like(value)
            report.converted[name] = "zero-initialised (the checkpoint has no PEG)"
    for name in ("head.weight", "head.bias"):
        if name in sd and name in own and sd[name].shape != own[name].shape:
            report.skipped[name] = f"shape {tuple(sd[name].shape)}, the model's is {tuple(own[name].shape)}"
            report.missing.append(name)
            sd[name] = own[name]
    model.load_state_dict(sd, strict=True)
    report.copied = [k for k in sd if k not in report.converted and k not in report.missing]
    return report
