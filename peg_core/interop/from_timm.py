"""Today's ViT backbones from timm as this project's :class:`~peg_core.models.CPVT`, weights copied.

:func:`from_timm` reads a live timm model and returns a new CPVT that computes the same
outputs, at the native size and at any other (timm needs ``dynamic_img_size=True`` for that)::

    timm VisionTransformer (deit_*, vit_*)   learned table  -> CPVT(pos_enc="learned")
    timm Eva, rope ViTs (vit_*_rope_224)      axial RoPE     -> CPVT(pos_enc="rope-axial")
              (vit_*_rope_mixed{,_ape}_224)   mixed RoPE     -> CPVT(pos_enc="[learned+]rope-mixed")
    timm Eva, DINOv3 (vit_*_patch16_dinov3)   DINOv3 RoPE    -> CPVT(pos_enc="rope-dinov3"),
                                              4 registers, layer scale, no qkv bias, half-layout pairs

Names (timm -> CPVT; all others are the same)::

    pos_embed                         -> pos_enc.pos_embed   (no_embed_class: no prefix entries)
    rope.freqs (mixed)                -> rope.freqs          (same (2, depth, heads, head_dim/2) layout)
    blocks.i.gamma_1 / gamma_2 (Eva)  -> blocks.i.ls1.gamma / ls2.gamma   (timm ViT: ls1.gamma already)
    blocks.i.attn.q_bias, v_bias (Eva) -> blocks.i.attn.qkv.bias = [q_bias, 0, v_bias]

A learned table is resized as timm resizes it (``resample_abs_pos_embed``: bicubic, antialias).
``peg_at`` adds PEGs after those blocks with zero weights, so the converted model computes
the same as timm's until the PEGs train.  Unsupported layouts (SwiGLU / GLU MLPs, qk-norm,
attention pooling, post-norm blocks, distillation tokens, patch dropout, EVA's ``ref_feat_shape``
rescale) raise ``TypeError`` naming the part.  timm is imported only by :func:`from_timm_file`,
which builds the timm model a weights file belongs to (``train --init FILE --init-timm NAME``; the file
may be named remotely, ``timm:NAME`` or a hub id, :mod:`.resolve`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import require
from ..models.cpvt import CPVT
from ..peg import fold_peg_keys
from .convert import _loaded_class
from .io import WeightsError, read_state_file, strip_prefixes, unwrap_state_dict
from .resolve import resolve_weights

__all__ = ["from_timm", "from_timm_file"]


def _json_safe(value: Any) -> Any:
    """Tuples as lists, recursively: a ``model_config`` survives json and ``weights_only`` loading."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_json_safe(v) for v in value]
    return value


def _unsupported(model: nn.Module, what: str) -> TypeError:
    return TypeError(f"from_timm: {type(model).__name__} {what}; not supported")


def _check_block(model: nn.Module, i: int, blk: nn.Module) -> None:
    attn = blk.attn
    for name in ("q_norm", "k_norm", "norm"):
        if not isinstance(getattr(attn, name, nn.Identity()), nn.Identity):
            raise _unsupported(model, f"blocks.{i}.attn.{name} (qk / scale norm)")
    if getattr(attn, "gate", None) is not None or getattr(attn, "qkv", None) is None:
        raise _unsupported(model, f"blocks.{i}.attn (gated or unfused q/k/v projections)")
    mlp = blk.mlp
    if type(mlp).__name__ != "Mlp" or not isinstance(getattr(mlp, "act", None), nn.GELU):
        raise _unsupported(model, f"blocks.{i}.mlp is {type(mlp).__name__} (only the GELU Mlp)")
    if mlp.act.approximate != "none" or not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
        raise _unsupported(model, f"blocks.{i}.mlp (tanh GELU or MLP norm)")
    if not isinstance(getattr(blk, "attn", None), nn.Module) or type(blk).__name__ not in (
        "Block",
        "EvaBlock",
    ):
        raise _unsupported(model, f"blocks.{i} is {type(blk).__name__}")


def _common_config(model: nn.Module, num_heads: int) -> dict:
    pe = model.patch_embed
    if not isinstance(getattr(pe, "proj", None), nn.Conv2d) or pe.proj.bias is None:
        raise _unsupported(model, "has no biased conv patch embedding (patch_embed.proj)")
    ph, pw = pe.patch_size
    if ph != pw:
        raise _unsupported(model, f"has non-square patches {pe.patch_size}")
    for name in ("norm_pre", "attn_pool", "patch_drop"):
        part = getattr(model, name, None)
        if part is not None and not isinstance(part, nn.Identity):
            raise _unsupported(model, f"has {name}")
    if model.global_pool not in ("token", "avg"):
        raise _unsupported(model, f"pools with {model.global_pool!r} (only 'token' and 'avg')")
    blocks = list(model.blocks)
    for i, blk in enumerate(blocks):
        _check_block(model, i, blk)
    blk = blocks[0]
    dim = model.embed_dim
    fc_norm = not isinstance(model.fc_norm, nn.Identity)
    norm = model.fc_norm if fc_norm else model.norm
    if not isinstance(norm, nn.LayerNorm) or (fc_norm and not isinstance(model.norm, nn.Identity)):
        raise _unsupported(model, "norm / fc_norm layout (one LayerNorm, before or after pooling)")
    reg = getattr(model, "reg_token", None)
    head = model.head
    return {
        "embed_dim": dim,
        "depth": len(blocks),
        "num_heads": num_heads,
        "num_classes": head.out_features if isinstance(head, nn.Linear) else 0,
        "img_size": tuple(pe.img_size),
        "patch_size": ph,
        "in_chans": pe.proj.in_channels,
        "mlp_ratio": blk.mlp.fc1.out_features / dim,
        "global_pool": model.global_pool,
        "class_token": model.cls_token is not None,
        "num_reg_tokens": 0 if reg is None else reg.shape[1],
        "norm_eps": blk.norm1.eps,
        "fc_norm": fc_norm,
        "no_embed_class": bool(getattr(model, "no_embed_class", False)),
    }


def _rope_config(model: nn.Module) -> tuple[str, dict]:
    rope = model.rope
    kind = type(rope).__name__
    if kind == "RotaryEmbeddingCat":
        if rope.grid_type != "index" or rope.ref_feat_shape is not None or rope.rotate_half:
            raise _unsupported(model, "uses pixel / rescaled / half-layout axial RoPE (only integer indices)")
        aug = {k: getattr(rope, k) for k in ("shift_coords", "jitter_coords", "rescale_coords")}
        opts = {"offset": float(rope.grid_offset), **{k: v for k, v in aug.items() if v is not None}}
        return "rope-axial", {"rope_temperature": float(rope.temperature), "rope_indexing": rope.grid_indexing,
                              "rope_options": opts}  # fmt: skip
    if kind == "RotaryEmbeddingMixed":
        aug = {k: getattr(rope, k) for k in ("shift_coords", "jitter_coords", "rescale_coords")}
        return "rope-mixed", {"rope_temperature": float(rope.temperature), "rope_indexing": rope.grid_indexing,
                              "rope_options": {k: v for k, v in aug.items() if v is not None}}  # fmt: skip
    if kind == "RotaryEmbeddingDinoV3":
        opts = {
            "min_period": rope.min_period,
            "max_period": rope.max_period,
            "normalize": rope.normalize_coords,
            "offset": float(rope.grid_offset),
            "half": bool(rope.rotate_half),
            **{k: getattr(rope, k) for k in ("shift_coords", "jitter_coords", "rescale_coords")},
        }
        return "rope-dinov3", {"rope_temperature": rope.temperature, "rope_indexing": rope.grid_indexing,
                               "rope_options": opts}  # fmt: skip
    raise _unsupported(model, f"has a {kind} rotary encoding")


def _eva_state(model: nn.Module) -> dict[str, torch.Tensor]:
    sd = {}
    for k, v in model.state_dict().items():
        if ".gamma_1" in k or ".gamma_2" in k:
            k = k.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma")
        elif k.endswith(".attn.q_bias") or k.endswith(".attn.v_bias"):
            continue
        sd[k] = v
    for i, blk in enumerate(model.blocks):
        q_bias = getattr(blk.attn, "q_bias", None)
        if q_bias is not None:
            sd[f"blocks.{i}.attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), blk.attn.v_bias])
    return sd


def _qkv_bias(blk: nn.Module) -> bool:
    return blk.attn.qkv.bias is not None or getattr(blk.attn, "q_bias", None) is not None


@torch.no_grad()
def from_timm(model: nn.Module, peg_at: Sequence[int] | int | None = None, peg_kernel_size: int = 3) -> CPVT:
    """A :class:`~peg_core.models.CPVT` with ``model``'s weights computing ``model``'s outputs (see module doc).

    Args:
        model: a live timm ``VisionTransformer`` (``deit_*``, ``vit_*``; learned table, class /
            register tokens, layer scale, token or average pooling) or ``Eva`` (the rope ViTs
            ``vit_*_patch16_rope{,_mixed}{,_ape}_224`` and the DINOv3 ViTs ``vit_*_patch16_dinov3``).
        peg_at: block indices after which zero-initialised PEGs are added (``None``: none).
        peg_kernel_size: their depthwise kernel size.

    Returns:
        a new CPVT on the device and in the dtype of ``model``, in ``model``'s train / eval mode;
        its ``build_config`` holds the keywords that rebuild it (``{"arch": "cpvt", ...}``).

    Raises:
        TypeError: not a supported timm class or layout (the message names the part).
        ValueError: ``peg_at`` outside the blocks.
    """
    vit = _loaded_class("timm.models.vision_transformer", "VisionTransformer")
    eva = _loaded_class("timm.models.eva", "Eva")
    distilled = _loaded_class("timm.models.deit", "VisionTransformerDistilled")
    if not isinstance(model, nn.Module):
        raise TypeError(f"from_timm needs a timm nn.Module; got {type(model).__name__}")
    if isinstance(model, distilled):
        raise _unsupported(model, "has a distillation token")
    if isinstance(model, vit):
        blk = model.blocks[0]
        cfg = _common_config(model, blk.attn.num_heads)
        for i, b in enumerate(model.blocks):
            if not isinstance(b.ls1, type(blk.ls1)):
                raise _unsupported(model, f"blocks.{i} differs in layer scale from blocks.0")
        parts, extra = (["learned"] if model.pos_embed is not None else []), {}
        state = dict(model.state_dict())
        layer_scale = not isinstance(blk.ls1, nn.Identity)
    elif isinstance(model, eva):
        blk = model.blocks[0]
        cfg = _common_config(model, blk.attn.num_heads)
        parts = ["learned"] if model.pos_embed is not None else []
        extra = {}
        if model.rope is not None:
            kind, extra = _rope_config(model)
            parts.append(kind)
            if bool(getattr(blk.attn, "rotate_half", False)) != extra["rope_options"].get("half", False):
                raise _unsupported(model, "rotates pairs in another layout than its RoPE table")
        state = _eva_state(model)
        layer_scale = blk.gamma_1 is not None
        if layer_scale and blk.gamma_2 is None:
            raise _unsupported(model, "has layer scale on the attention branch only")
    else:
        raise TypeError(
            f"from_timm supports timm VisionTransformer and Eva models; got {type(model).__module__}."
            f"{type(model).__qualname__}"
        )
    if peg_at is not None:
        parts.insert(0, "peg")
    ref = model.patch_embed.proj.weight
    kwargs = {
        **cfg,
        **extra,
        "pos_enc": "+".join(parts) or "none",
        "peg_at": () if peg_at is None else ([peg_at] if isinstance(peg_at, int) else list(peg_at)),
        "peg_kernel_size": peg_kernel_size,
        "init_values": 1.0 if layer_scale else None,
        "qkv_bias": _qkv_bias(blk),
        "pos_antialias": "learned" in parts,  # timm's resample_abs_pos_embed default
    }
    out = CPVT(**fold_peg_keys(kwargs))
    # The keywords that rebuild this network (a checkpoint's ``model_config``; ``arch="cpvt"`` is the
    # plain class): ``train --init`` of a converted file builds exactly this model from them.
    out.build_config = {"arch": "cpvt", **_json_safe(kwargs)}
    state = {("pos_enc.pos_embed" if k == "pos_embed" else k): v for k, v in state.items()}
    own = out.state_dict()
    for k, v in own.items():
        if k.startswith("pos_blocks."):
            state[k] = torch.zeros_like(v)  # zero PEGs: the identity until they train
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise _unsupported(
            model, f"maps to CPVT keys with missing {missing[:6]} and unexpected {unexpected[:6]}"
        )
    out.load_state_dict(state, strict=True)
    return out.to(device=ref.device, dtype=ref.dtype).train(model.training)


def _head_classes(state: dict[str, torch.Tensor]) -> int:
    """Rows of the file's classifier (``head.weight``); 0 for a headless backbone (DINOv3 releases)."""
    head = state.get("head.weight")
    return int(head.shape[0]) if isinstance(head, torch.Tensor) and head.dim() == 2 else 0


def from_timm_file(
    name: str,
    path: str | os.PathLike | None = None,
    peg_at: Sequence[int] | int | None = None,
    peg_kernel_size: int = 3,
) -> CPVT:
    """:func:`from_timm` of the timm model ``name`` holding the weights of a local file.

    Args:
        name: the timm architecture the file belongs to, e.g. ``"vit_small_patch16_rope_mixed_224"``
            (built with ``pretrained=False``: nothing is downloaded).
        path: its weights in timm's own layout (``.safetensors`` or a torch file, read with
            ``weights_only=True``; wrappers such as ``state_dict`` and a ``module.`` prefix are looked
            through), e.g. ``model.safetensors`` of a hub snapshot.  A string may also name remote
            weights (:func:`~peg_core.interop.resolve.resolve_weights`: a hub id ``timm/NAME.TAG``,
            ``timm:NAME``), fetched once into their cache; ``None``: timm's pretrained weights of
            ``name`` (``timm:NAME``).
        peg_at, peg_kernel_size: as :func:`from_timm`.

    Raises:
        MissingDependency: timm is not installed.
        WeightsError: unreadable file, unknown timm name, or weights that do not fit ``name`` (the
            message names the file and the first keys).
        TypeError: a timm layout :func:`from_timm` does not convert.
    """
    timm = require("timm", "timm", what="--init-timm")
    path = resolve_weights(f"timm:{name}" if path is None else path, kind="file").path
    state = strip_prefixes(unwrap_state_dict(read_state_file(path, what="timm weights"), where=path))
    try:
        model = timm.create_model(
            name, pretrained=False, num_classes=_head_classes(state), dynamic_img_size=True
        )
    except RuntimeError as e:  # timm: "Unknown model (...)"
        raise WeightsError(f"timm has no model {name!r} ({e})", path) from None
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of another shape: the first line names the key and shapes
        lines = [line.strip() for line in str(e).splitlines() if "size mismatch" in line]
        raise WeightsError(f"weights do not fit timm {name} ({(lines or [str(e)])[0]})", path) from None
    if result.missing_keys or result.unexpected_keys:
        raise WeightsError(
            f"weights do not fit timm {name}: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}",
            path,
        )
    return from_timm(model.eval(), peg_at=peg_at, peg_kernel_size=peg_kernel_size)
