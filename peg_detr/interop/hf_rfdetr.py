"""transformers' ``RfDetrForObjectDetection`` <-> peg_detr's :class:`~peg_detr.models.rfdetr.RFDETR`.

:func:`rfdetr_from_hf_config` builds the model an ``RfDetrConfig`` (or its ``config.json`` dict)
describes; :func:`rfdetr_hf_to_ours` / :func:`rfdetr_ours_to_hf` rename a state dict through the
declarative table below; :func:`rfdetr_from_hf` does both for a ``save_pretrained`` folder.

The project had no key-map mechanism when this was written (nothing like transformers'
``WeightRenaming`` under ``peg_core/interop`` or ``peg_detr/interop``), so the table is this
module's own: :class:`Rename` rows (one key, or every key under a prefix, ``{i}`` standing for a
block / layer / group number) and :class:`Stack` rows (several tensors of one side are one tensor of
the other, concatenated on dim 0: DINOv2's separate query / key / value are CPVT's fused ``qkv``;
the decoder's fused ``in_proj`` is RT-DETR's separate ``q_proj`` / ``k_proj`` / ``v_proj``).  The
same rows read both ways.  A pattern ending in ``.`` or ``_`` is a prefix (the rest of the key is
kept); any other pattern is one whole key.  The first row that matches a key wins.

Two layouts of transformers' keys exist and both are read:

* the **file layout** (:data:`RFDETR_FILE_KEYS`): what ``save_pretrained`` writes and the hub's
  ``Roboflow/rf-detr-*`` folders hold; transformers converts it on load (rf-detr's original names:
  ``backbone.0.encoder.encoder.*``, ``transformer.decoder.layers.{i}.linear1``...);
* the **module layout** (:data:`RFDETR_MODULE_KEYS`): ``RfDetrForObjectDetection().state_dict()``
  (``model.backbone.backbone.*``, ``model.decoder.layers.{i}.mlp.fc1``...).

Keys of transformers with no counterpart here: ``...embeddings.mask_token`` (DINOv2's masked-image
token; detection never reads it) is skipped.  Keys of ours with no counterpart: the PEG
(``backbone.vit.pos_blocks.*``), left at its zero init.  With a ``pos_enc`` without a table
(``none``, ``peg``) the folder's ``position_embeddings`` is skipped and everything else loads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from peg_core.interop.hf_folder import read_hf_config, read_hf_weights
from peg_core.interop.io import LoadReport, WeightsError

from ..models.rfdetr import RFDETR, RFDETRDecoder, ScaleProjector, build_windowed_vit

__all__ = [
    "RFDETR_FILE_KEYS",
    "RFDETR_MODULE_KEYS",
    "Rename",
    "Stack",
    "load_rfdetr_state",
    "rfdetr_build_options",
    "rfdetr_from_hf",
    "rfdetr_from_hf_config",
    "rfdetr_hf_to_ours",
    "rfdetr_ours_to_hf",
]


@dataclass(frozen=True)
class Rename:
    """transformers' key (or prefix) ``hf`` is our ``ours``; ``{i}``-style fields carry numbers across."""

    hf: str
    ours: str


@dataclass(frozen=True)
class Stack:
    """Tensors of one side concatenated on dim 0 are one tensor of the other side (one side has one pattern)."""

    hf: tuple[str, ...]
    ours: tuple[str, ...]


@dataclass(frozen=True)
class Skip:
    """A transformers key (or prefix) that has no counterpart here, with the reason."""

    hf: str
    why: str


Rule = Rename | Stack | Skip


def _compile(pattern: str) -> re.Pattern[str]:
    """``"a.{i}.b."`` -> ``^a\\.(?P<i>\\d+)\\.b\\.(?P<_rest>.+)$`` (prefix) or ``...$`` (whole key)."""
    prefix = pattern.endswith((".", "_"))
    parts = re.split(r"\{(\w+)\}", pattern)
    text = "".join(re.escape(p) if k % 2 == 0 else f"(?P<{p}>\\d+)" for k, p in enumerate(parts))
    return re.compile(f"^{text}(?P<_rest>.+)$" if prefix else f"^{text}$")


def _fill(pattern: str, fields: Mapping[str, str]) -> str:
    return pattern.format(**{k: v for k, v in fields.items() if k != "_rest"}) + fields.get("_rest", "")


_BB = "backbone.0.encoder.encoder."
_LAYER = _BB + "encoder.layer.{i}."
_PROJ = "backbone.0.projector.stages.0."
_DEC = "transformer.decoder.layers.{i}."
_VIT = "backbone.vit."
_BLOCK = _VIT + "blocks.{i}."
_C2F = "projector.c2f."
_OURS_DEC = "decoder.layers.{i}."
_MASK_WHY = "DINOv2's masked-image-modelling token; detection never reads it"

#: rf-detr's / ``save_pretrained``'s key names <-> ours (module docstring)
RFDETR_FILE_KEYS: tuple[Rule, ...] = (
    Skip(_BB + "embeddings.mask_token", _MASK_WHY),
    Rename(_BB + "embeddings.cls_token", _VIT + "cls_token"),
    Rename(_BB + "embeddings.position_embeddings", _VIT + "pos_enc.pos_embed"),
    Rename(_BB + "embeddings.patch_embeddings.projection.", _VIT + "patch_embed.proj."),
    Stack(
        tuple(_LAYER + f"attention.attention.{n}." for n in ("query", "key", "value")),
        (_BLOCK + "attn.qkv.",),
    ),
    Rename(_LAYER + "attention.output.dense.", _BLOCK + "attn.proj."),
    Rename(_LAYER + "layer_scale1.lambda1", _BLOCK + "ls1.gamma"),
    Rename(_LAYER + "layer_scale2.lambda1", _BLOCK + "ls2.gamma"),
    Rename(_LAYER, _BLOCK),  # norm1, norm2, mlp.fc1, mlp.fc2: the same names
    Rename(_BB + "layernorm.", _VIT + "norm."),
    Rename(_PROJ + "0.cv1.conv.", _C2F + "conv1.conv."),
    Rename(_PROJ + "0.cv1.bn.", _C2F + "conv1.norm."),  # a LayerNorm, whatever its name says
    Rename(_PROJ + "0.cv2.conv.", _C2F + "conv2.conv."),
    Rename(_PROJ + "0.cv2.bn.", _C2F + "conv2.norm."),
    Rename(_PROJ + "0.m.{j}.cv1.conv.", _C2F + "bottlenecks.{j}.conv1.conv."),
    Rename(_PROJ + "0.m.{j}.cv1.bn.", _C2F + "bottlenecks.{j}.conv1.norm."),
    Rename(_PROJ + "0.m.{j}.cv2.conv.", _C2F + "bottlenecks.{j}.conv2.conv."),
    Rename(_PROJ + "0.m.{j}.cv2.bn.", _C2F + "bottlenecks.{j}.conv2.norm."),
    Rename(_PROJ + "1.", "projector.norm."),
    Stack((_DEC + "self_attn.in_proj_",), tuple(_OURS_DEC + f"self_attn.{n}_proj." for n in "qkv")),
    Rename(_DEC + "self_attn.out_proj.", _OURS_DEC + "self_attn.out_proj."),
    Rename(_DEC + "norm1.", _OURS_DEC + "self_attn_layer_norm."),
    Rename(_DEC + "cross_attn.", _OURS_DEC + "encoder_attn."),
    Rename(_DEC + "norm2.", _OURS_DEC + "encoder_attn_layer_norm."),
    Rename(_DEC + "linear1.", _OURS_DEC + "fc1."),
    Rename(_DEC + "linear2.", _OURS_DEC + "fc2."),
    Rename(_DEC + "norm3.", _OURS_DEC + "final_layer_norm."),
    Rename("transformer.decoder.norm.", "decoder.norm."),
    Rename("transformer.decoder.ref_point_head.", "decoder.ref_point_head."),
    Rename("transformer.enc_output.", "decoder.enc_output."),
    Rename("transformer.enc_output_norm.", "decoder.enc_output_norm."),
    Rename("transformer.enc_out_class_embed.", "decoder.enc_out_class_embed."),
    Rename("transformer.enc_out_bbox_embed.", "decoder.enc_out_bbox_embed."),
    Rename("refpoint_embed.", "decoder.refpoint_embed."),
    Rename("query_feat.", "decoder.query_feat."),
    Rename("class_embed.", "decoder.class_embed."),
    Rename("bbox_embed.", "decoder.bbox_embed."),
)

_MB = "model.backbone.backbone."
_MLAYER = _MB + "encoder.layer.{i}."
_MPROJ = "model.backbone.projector."
_MDEC = "model.decoder.layers.{i}."

#: ``RfDetrForObjectDetection().state_dict()`` names <-> ours (module docstring)
RFDETR_MODULE_KEYS: tuple[Rule, ...] = (
    Skip(_MB + "embeddings.mask_token", _MASK_WHY),
    Rename(_MB + "embeddings.cls_token", _VIT + "cls_token"),
    Rename(_MB + "embeddings.position_embeddings", _VIT + "pos_enc.pos_embed"),
    Rename(_MB + "embeddings.patch_embeddings.projection.", _VIT + "patch_embed.proj."),
    Stack(tuple(_MLAYER + f"attention.{n}_proj." for n in "qkv"), (_BLOCK + "attn.qkv.",)),
    Rename(_MLAYER + "attention.o_proj.", _BLOCK + "attn.proj."),
    Rename(_MLAYER + "layer_scale1.lambda1", _BLOCK + "ls1.gamma"),
    Rename(_MLAYER + "layer_scale2.lambda1", _BLOCK + "ls2.gamma"),
    Rename(_MLAYER, _BLOCK),
    Rename(_MB + "layernorm.", _VIT + "norm."),
    Rename(_MPROJ + "projector_layer.", _C2F),  # conv1, conv2, bottlenecks.{j}.conv{1,2}: the same names
    Rename(_MPROJ + "layer_norm.", "projector.norm."),
    Rename(_MDEC + "self_attn.o_proj.", _OURS_DEC + "self_attn.out_proj."),
    Rename(_MDEC + "cross_attn_layer_norm.", _OURS_DEC + "encoder_attn_layer_norm."),
    Rename(_MDEC + "cross_attn.", _OURS_DEC + "encoder_attn."),
    Rename(_MDEC + "mlp.fc1.", _OURS_DEC + "fc1."),
    Rename(_MDEC + "mlp.fc2.", _OURS_DEC + "fc2."),
    Rename(_MDEC + "layer_norm.", _OURS_DEC + "final_layer_norm."),
    Rename(_MDEC, _OURS_DEC),  # self_attn.{q,k,v}_proj, self_attn_layer_norm: the same names
    Rename("model.decoder.layernorm.", "decoder.norm."),
    Rename("model.decoder.ref_point_head.", "decoder.ref_point_head."),
    Rename("model.reference_point_embed.", "decoder.refpoint_embed."),
    Rename("model.query_feat.", "decoder.query_feat."),
    Rename("model.enc_output.", "decoder.enc_output."),
    Rename("model.enc_output_norm.", "decoder.enc_output_norm."),
    Rename("model.enc_out_class_embed.", "decoder.enc_out_class_embed."),
    Rename("model.enc_out_bbox_embed.", "decoder.enc_out_bbox_embed."),
    Rename("class_embed.", "decoder.class_embed."),
    Rename("bbox_embed.", "decoder.bbox_embed."),
)


def _layout(keys: Sequence[str]) -> tuple[Rule, ...]:
    """The table of a transformers state dict: the module layout when its keys start with ``model.``."""
    return RFDETR_MODULE_KEYS if any(k.startswith("model.") for k in keys) else RFDETR_FILE_KEYS


def _convert(
    state: Mapping[str, Tensor], rules: Sequence[Rule], to_hf: bool
) -> tuple[dict[str, Tensor], dict[str, str], dict[str, str]]:
    """``(renamed state, made: new key -> how, skipped: source key -> why)`` in one direction."""
    compiled = []
    for rule in rules:
        if isinstance(rule, Skip):
            src: tuple[str, ...] = () if to_hf else (rule.hf,)
            dst: tuple[str, ...] = ()
        elif isinstance(rule, Rename):
            src, dst = ((rule.ours,), (rule.hf,)) if to_hf else ((rule.hf,), (rule.ours,))
        else:
            src, dst = (rule.ours, rule.hf) if to_hf else (rule.hf, rule.ours)
        compiled.append((rule, src, [_compile(p) for p in src], dst))
    out: dict[str, Tensor] = {}
    made: dict[str, str] = {}
    skipped: dict[str, str] = {}
    pending: dict[tuple[int, tuple[tuple[str, str], ...]], dict[int, Tensor]] = {}
    for key, value in state.items():
        for r, (rule, _, patterns, dst) in enumerate(compiled):
            hit = next(
                ((p, m) for p, m in ((p, pat.match(key)) for p, pat in enumerate(patterns)) if m), None
            )
            if hit is None:
                continue
            part, match = hit
            fields = match.groupdict()
            if isinstance(rule, Skip):
                skipped[key] = rule.why
            elif len(dst) == 1 and len(patterns) == 1:
                out[_fill(dst[0], fields)] = value
            elif len(patterns) == 1:  # one tensor -> len(dst) equal chunks
                for name, chunk in zip(dst, value.chunk(len(dst), dim=0)):
                    new = _fill(name, fields)
                    out[new] = chunk.clone()
                    made[new] = f"chunk of {key}"
            else:  # one of several parts; stacked once all are there
                pending.setdefault((r, tuple(sorted(fields.items()))), {})[part] = value
            break
        else:
            skipped[key] = "no key of the other side (not in the key map)"
    for (r, fields_items), parts in pending.items():
        _, names, patterns, dst = compiled[r]
        fields = dict(fields_items)
        if len(parts) != len(patterns):
            for part in parts:
                skipped[_fill(names[part], fields)] = "its other stacked parts are missing"
            continue
        new = _fill(dst[0], fields)
        out[new] = torch.cat([parts[p] for p in range(len(patterns))], dim=0)
        made[new] = f"{len(patterns)} tensors stacked on dim 0"
    return out, made, skipped


def rfdetr_hf_to_ours(
    state: Mapping[str, Tensor],
) -> tuple[dict[str, Tensor], dict[str, str], dict[str, str]]:
    """transformers' state dict (file or module layout) -> ``(ours, made, skipped)``."""
    return _convert(state, _layout(list(state)), to_hf=False)


def rfdetr_ours_to_hf(
    state: Mapping[str, Tensor], *, layout: str = "file"
) -> tuple[dict[str, Tensor], dict[str, str], dict[str, str]]:
    """Our state dict -> ``(transformers' in the file (``save_pretrained``) or module layout, made, skipped)``.

    Our keys without a transformers counterpart (a PEG) are in ``skipped``; the caller decides
    whether that is an error (an export of a PEG model is).
    """
    if layout not in ("file", "module"):
        raise ValueError(f"layout must be 'file' or 'module'; got {layout!r}")
    return _convert(state, RFDETR_FILE_KEYS if layout == "file" else RFDETR_MODULE_KEYS, to_hf=True)


# --- config --------------------------------------------------------------------------------------


def _as_dict(config: Any) -> dict[str, Any]:
    """An ``RfDetrConfig`` (anything with ``to_dict``) or a ``config.json`` mapping -> a plain dict."""
    if hasattr(config, "to_dict"):
        return config.to_dict()
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"expected an RfDetrConfig or its config.json dict; got {type(config).__name__}")


def _num_labels(cfg: Mapping[str, Any]) -> int:
    id2label = cfg.get("id2label")
    if isinstance(id2label, Mapping) and id2label:
        return len(id2label)
    return int(cfg.get("num_labels") or 2)


def _out_indices(bb: Mapping[str, Any]) -> list[int]:
    """transformers' stage numbers of the feature maps (``out_indices``, else from ``out_features``)."""
    if bb.get("out_indices"):
        return [int(i) for i in bb["out_indices"]]
    features = bb.get("out_features")
    if features:
        return [int(str(name).removeprefix("stage")) if name != "stem" else 0 for name in features]
    return [int(bb.get("num_hidden_layers", 12))]  # transformers' default: the last stage


def rfdetr_build_options(config: Any) -> dict[str, Any]:
    """The keywords of :func:`build_rfdetr` for an ``RfDetrConfig`` / ``config.json``; ``ValueError``
    naming any field this model cannot take (SwiGLU MLPs, several feature levels, no attention bias...)."""
    cfg = _as_dict(config)
    bb = cfg.get("backbone_config") or {}
    bb = _as_dict(bb)
    if bb.get("model_type", "rf_detr_dinov2") != "rf_detr_dinov2":
        raise ValueError(f"backbone_config.model_type must be 'rf_detr_dinov2'; got {bb.get('model_type')!r}")
    refuse = {
        "backbone_config.use_swiglu_ffn": (bb.get("use_swiglu_ffn", False), False),
        "backbone_config.hidden_act": (bb.get("hidden_act", "gelu"), "gelu"),
        "backbone_config.reshape_hidden_states": (bb.get("reshape_hidden_states", True), True),
        "backbone_config.num_channels": (bb.get("num_channels", 3), 3),
        "num_feature_levels": (cfg.get("num_feature_levels", 1), 1),
        "attention_bias": (cfg.get("attention_bias", True), True),
    }
    for name, (value, want) in refuse.items():
        if value != want:
            raise ValueError(f"RF-DETR here supports {name}={want!r} only; the config has {value!r}")
    stages = _out_indices(bb)
    if 0 in stages:
        raise ValueError("backbone_config.out_indices may not name stage 0 (the embeddings)")
    depth = int(bb.get("num_hidden_layers", 12))
    windowed = bb.get("window_block_indexes")
    if windowed is None:  # transformers' rule (RfDetrDinov2Config.__post_init__)
        windowed = [i for i in range(max(stages) + 1) if i not in stages]
    patch = int(bb.get("patch_size", 14))
    image_size = bb.get("image_size", 224)
    image_size = int(image_size if isinstance(image_size, int) else image_size[0])
    return {
        "backbone": {
            "embed_dim": int(bb.get("hidden_size", 768)),
            "depth": depth,
            "num_heads": int(bb.get("num_attention_heads", 12)),
            "mlp_ratio": float(bb.get("mlp_ratio", 4)),
            "patch_size": patch,
            # transformers' table has (image_size // patch)^2 cells
            "image_size": image_size // patch * patch,
            "out_blocks": [s - 1 for s in stages],
            "global_blocks": [i for i in range(depth) if i not in set(windowed)],
            "num_windows": int(bb.get("num_windows", 4)),
            "layer_scale": float(bb.get("layerscale_value", 1.0)),
            "qkv_bias": bool(bb.get("qkv_bias", True)),
            "norm_eps": float(bb.get("layer_norm_eps", 1e-6)),
            "drop_path_rate": float(bb.get("drop_path_rate", 0.0)),
            "apply_layernorm": bool(bb.get("apply_layernorm", True)),
        },
        "projector": {
            "d_model": int(cfg.get("d_model", 256)),
            "num_blocks": int(cfg.get("c2f_num_blocks", 3)),
            "expansion": float(cfg.get("hidden_expansion", 0.5)),
            "act": str(cfg.get("activation_function", "silu")),
            "eps": float(cfg.get("layer_norm_eps", 1e-5)),
        },
        "decoder": {
            "d_model": int(cfg.get("d_model", 256)),
            "num_classes": _num_labels(cfg),
            "num_queries": int(cfg.get("num_queries", 300)),
            "group_detr": int(cfg.get("group_detr", 13)),
            "num_layers": int(cfg.get("decoder_layers", 3)),
            "self_heads": int(cfg.get("decoder_self_attention_heads", 8)),
            "cross_heads": int(cfg.get("decoder_cross_attention_heads", 16)),
            "dim_feedforward": int(cfg.get("decoder_ffn_dim", 2048)),
            "dropout": float(cfg.get("dropout", 0.1)),
            "attention_dropout": float(cfg.get("attention_dropout", 0.0)),
            "activation": str(cfg.get("decoder_activation_function", "relu")),
            "num_points": int(cfg.get("decoder_n_points", 4)),
        },
    }


def build_rfdetr(
    backbone: Mapping[str, Any],
    projector: Mapping[str, Any],
    decoder: Mapping[str, Any],
    *,
    pos_enc: str = "learned",
    peg_at: Sequence[int] = (0,),
    normalize_input: bool = True,
    aux_loss: bool = True,
) -> RFDETR:
    """An :class:`RFDETR` from the three parts' keywords (:func:`rfdetr_build_options`' shape)."""
    vit = build_windowed_vit(**backbone, pos_enc=pos_enc, peg_at=peg_at, normalize_input=normalize_input)
    proj_opts = dict(projector)
    d_model = proj_opts.pop("d_model")
    proj = ScaleProjector(vit.out_channels, d_model, **proj_opts)
    return RFDETR(vit, proj, RFDETRDecoder(**decoder), aux_loss=aux_loss)


def rfdetr_from_hf_config(
    config: Any, *, pos_enc: str = "learned", peg_at: Sequence[int] = (0,), normalize_input: bool = True
) -> RFDETR:
    """The (randomly initialised) :class:`RFDETR` an ``RfDetrConfig`` describes, with the backbone's
    position encoding ``pos_enc`` (``learned`` / ``table``: transformers'; ``none``; ``peg``: a zero
    PEG after the blocks ``peg_at``; ``learned+peg``)."""
    return build_rfdetr(**rfdetr_build_options(config), pos_enc=pos_enc, peg_at=peg_at,
                        normalize_input=normalize_input)  # fmt: skip


def load_rfdetr_state(model: RFDETR, state: Mapping[str, Tensor], source: str = "") -> LoadReport:
    """Copy a transformers state dict (either layout) into ``model``; a :class:`LoadReport` of what happened.

    Shapes must agree (a :class:`WeightsError` naming the key otherwise).  The table is skipped
    when ``model`` has none (``pos_enc`` ``none`` / ``peg``); our keys the folder lacks (a PEG)
    stay as they are and are listed as missing.
    """
    ours, made, skipped = rfdetr_hf_to_ours(state)
    target = model.state_dict()
    report = LoadReport(source=source, skipped=dict(skipped))
    loadable: dict[str, Tensor] = {}
    for key, value in ours.items():
        if key not in target:
            why = (
                "the model has no position table (pos_enc without one)"
                if key.endswith("pos_enc.pos_embed")
                else ("the model has no such parameter")
            )
            report.skipped[key] = why
            continue
        if tuple(target[key].shape) != tuple(value.shape):
            raise WeightsError(
                f"{key}: the folder's tensor is {tuple(value.shape)}, the model's {tuple(target[key].shape)}",
                source or "state dict",
            )
        loadable[key] = value
        if key in made:
            report.converted[key] = made[key]
        else:
            report.copied.append(key)
    report.missing = sorted(set(target) - set(loadable))
    model.load_state_dict(loadable, strict=False)
    return report


def rfdetr_from_hf(
    folder: str | os.PathLike, *, pos_enc: str = "learned", peg_at: Sequence[int] = (0,)
) -> tuple[RFDETR, LoadReport]:
    """A ``save_pretrained`` / hub folder of ``RfDetrForObjectDetection`` -> ``(model in eval, report)``.

    ``pos_enc="peg"`` keeps everything of the folder but its table and adds a zero PEG after
    block 0 (the same outputs as ``none`` until fine-tuned).
    """
    config = read_hf_config(folder)
    if config.get("model_type") != "rf_detr":
        raise WeightsError(
            f"config.json model_type is {config.get('model_type')!r}, not 'rf_detr'", Path(folder)
        )
    model = rfdetr_from_hf_config(config, pos_enc=pos_enc, peg_at=peg_at)
    state, path = read_hf_weights(folder)
    report = load_rfdetr_state(model, state, str(path))
    report.args = config
    return model.eval(), report
