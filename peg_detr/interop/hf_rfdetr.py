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

from peg_core.interop.hf_folder import read_hf_config, read_hf_weights, write_hf_folder
from peg_core.interop.io import LoadReport, WeightsError

from ..models.config import json_safe
from ..models.rfdetr import RFDETR, RFDETRConfig, build_rfdetr
from .hf_processor import PREPROCESSOR_CONFIG, rfdetr_processor_config
from .hf_rtdetr import with_label_names

__all__ = [
    "RFDETR_FILE_KEYS",
    "RFDETR_MODULE_KEYS",
    "Rename",
    "Stack",
    "export_hf_rfdetr",
    "load_rfdetr_state",
    "rfdetr_config_from_hf",
    "rfdetr_from_hf",
    "rfdetr_from_hf_config",
    "rfdetr_hf_config",
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

#: transformers' settings this model has no other value for: ``name -> (the only value, its default)``
_FIXED_BACKBONE = {"use_swiglu_ffn": False, "hidden_act": "gelu", "reshape_hidden_states": True,
                   "num_channels": 3, "qkv_bias": True, "apply_layernorm": True, "num_register_tokens": 0}  # fmt: skip
_FIXED = {"num_feature_levels": 1, "attention_bias": True}


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


def _section(cfg: Mapping[str, Any], name: str) -> tuple[Mapping[str, Any], str]:
    """A declared Hugging Face name -> (the dict holding it, its key): ``backbone_config.x`` is the backbone's."""
    section, _, key = name.rpartition(".")
    return (cfg.get(section) or {}) if section else cfg, key


def rfdetr_config_from_hf(config: Any) -> dict[str, Any]:
    """The :class:`~peg_detr.models.rfdetr.RFDETRConfig` fields of an ``RfDetrConfig`` / ``config.json``.

    Every field with a declared Hugging Face name (:meth:`RFDETRConfig.hf_fields`, ``backbone_config.*``
    for the ViT's) is read under it (absent: the field's default); ``image_size``, ``out_blocks`` and
    ``global_blocks`` are converted (the config module's docstring).  A ``ValueError`` names any field
    this model cannot take (SwiGLU MLPs, registers, several feature levels, no attention bias...).
    """
    cfg = _as_dict(config)
    bb = _as_dict(cfg.get("backbone_config") or {})
    cfg = {**cfg, "backbone_config": bb}
    if bb.get("model_type", "rf_detr_dinov2") != "rf_detr_dinov2":
        raise ValueError(f"backbone_config.model_type must be 'rf_detr_dinov2'; got {bb.get('model_type')!r}")
    for where, fixed in (("backbone_config.", _FIXED_BACKBONE), ("", _FIXED)):
        holder = bb if where else cfg
        for name, want in fixed.items():
            if holder.get(name, want) != want:
                raise ValueError(
                    f"RF-DETR here supports {where}{name}={want!r} only; the config has {holder[name]!r}"
                )
    fields: dict[str, Any] = {}
    for field, names in RFDETRConfig.hf_fields().items():
        holder, key = _section(cfg, names[0])
        if key in holder:
            fields[field] = holder[key]
    stages = _out_indices(bb)
    if 0 in stages:
        raise ValueError("backbone_config.out_indices may not name stage 0 (the embeddings)")
    depth = int(fields.get("vit_depth", RFDETRConfig.default("vit_depth")))
    windowed = bb.get("window_block_indexes")
    if windowed is None:  # transformers' rule (RfDetrDinov2Config.__post_init__)
        windowed = [i for i in range(max(stages) + 1) if i not in stages]
    patch = int(fields.get("patch_size", RFDETRConfig.default("patch_size")))
    image_size = bb.get("image_size", RFDETRConfig.default("image_size"))
    image_size = int(image_size if isinstance(image_size, int) else image_size[0])
    fields.update(
        image_size=image_size // patch * patch,  # transformers' table has (image_size // patch)^2 cells
        out_blocks=[s - 1 for s in stages],
        global_blocks=[i for i in range(depth) if i not in set(windowed)],
        num_classes=_num_labels(cfg),
    )
    return fields


def rfdetr_hf_config(model: RFDETR, id2label: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``model`` (built from an :class:`RFDETRConfig`): the declared names, the
    converted fields, transformers' fixed settings; label names from ``id2label`` (``LABEL_i`` otherwise)."""
    cfg = RFDETRConfig.from_dict(model.build_config)
    top: dict[str, Any] = {"model_type": "rf_detr", **_FIXED}
    bb: dict[str, Any] = {"model_type": "rf_detr_dinov2", **_FIXED_BACKBONE, "use_mask_token": True}
    for field, names in RFDETRConfig.hf_fields().items():
        for name in names:
            section, _, key = name.rpartition(".")
            (bb if section else top)[key] = json_safe(getattr(cfg, field))
    depth, glob = cfg.vit_depth, set(model.backbone.global_blocks)
    bb.update(
        image_size=cfg.image_size,
        stage_names=["stem", *(f"stage{i}" for i in range(1, depth + 1))],
        out_indices=[b + 1 for b in model.backbone.out_blocks],
        out_features=[f"stage{b + 1}" for b in model.backbone.out_blocks],
        window_block_indexes=[i for i in range(depth) if i not in glob],
    )
    names = dict(id2label or {})
    top["id2label"] = {str(i): names.get(i) or f"LABEL_{i}" for i in range(model.num_classes)}
    top["label2id"] = {name: int(i) for i, name in top["id2label"].items()}
    return {**top, "backbone_config": bb}


def rfdetr_from_hf_config(
    config: Any, pos_enc: str = "learned", *, peg_at: Sequence[int] | int = (0,)
) -> RFDETR:
    """The (randomly initialised) :class:`RFDETR` an ``RfDetrConfig`` describes, with the backbone's
    position encoding ``pos_enc`` (``learned`` / ``table``: transformers'; ``none``; ``peg``: a zero
    PEG after the blocks ``peg_at``; ``learned+peg``).  ``model.build_config`` keeps the folder's
    config (``hf_config``): a checkpoint of it is rebuilt from that, and ``export-hf`` writes it back."""
    cfg = _as_dict(config)
    model, _, _ = build_rfdetr(RFDETRConfig(**rfdetr_config_from_hf(cfg), pos_enc=pos_enc, peg_at=peg_at))
    model.build_config = {
        "hf_config": cfg,
        "pos_enc": pos_enc,
        "peg_at": json_safe(model.build_config["peg_at"]),
    }
    return model


def load_rfdetr_state(model: RFDETR, state: Mapping[str, Tensor], source: str = "") -> LoadReport:
    """Copy a transformers state dict (either layout) into ``model``; a :class:`LoadReport` of what happened.

    Shapes must agree (a :class:`WeightsError` naming the key otherwise).  The table is skipped
    when ``model`` has none (``pos_enc`` ``none`` / ``peg``); a PEG (not in the folder) stays at its
    zero initialisation and is listed under ``converted``; any other key of ours the folder lacks
    is ``missing``.
    """
    ours, _, skipped = rfdetr_hf_to_ours(state)
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
        report.copied.append(key)  # renamed, or stacked / split (``made``): the folder's values either way
    absent = sorted(set(target) - set(loadable))
    report.converted.update({k: _PEG_WHY for k in absent if k.startswith(_PEG_KEYS)})
    report.missing = [k for k in absent if not k.startswith(_PEG_KEYS)]
    model.load_state_dict(loadable, strict=False)
    return report


#: our keys no transformers folder has: the backbone's PEGs, added at zero
_PEG_KEYS = _VIT + "pos_blocks."
_PEG_WHY = "added: not in transformers' RF-DETR (a PEG starts at zero)"


def rfdetr_from_hf(
    folder: str | os.PathLike, pos_enc: str = "learned", *, peg_at: Sequence[int] | int = (0,)
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
    model = rfdetr_from_hf_config(config, pos_enc, peg_at=peg_at)
    state, path = read_hf_weights(folder)
    report = load_rfdetr_state(model, state, str(path))
    report.args = config
    return model.eval(), report


def export_hf_rfdetr(
    model: RFDETR,
    out_dir: str | os.PathLike,
    id2label: Mapping[int, str] | None = None,
    *,
    size: int | None = None,
) -> Path:
    """Write an RF-DETR with a table (``learned``) or no position encoding as a Hugging Face folder; returns ``out_dir``.

    ``config.json`` is the folder's own ``hf_config`` for a model read from one (class names updated
    from ``id2label``), else :func:`rfdetr_hf_config`; ``model.safetensors`` holds the weights in
    ``save_pretrained``'s names (and a zero ``mask_token``, which detection never reads); and
    ``preprocessor_config.json`` is :func:`~peg_detr.interop.hf_processor.rfdetr_processor_config` at
    ``size`` (the run's ``--val-size``), rounded up to a multiple of ``patch_size * num_windows``.
    A PEG, rotary or bias encoding (transformers' RF-DETR has only its table) raises a ``ValueError``
    before anything is written; ``none`` is written with a zero table, which computes the same.
    """
    model = getattr(model, "module", model)
    if not isinstance(model, RFDETR):
        raise TypeError(f"export_hf_rfdetr takes an RF-DETR, not a {type(model).__name__}")
    cfg = dict(getattr(model, "build_config", None) or {})
    pos_enc = cfg.get("pos_enc", "learned")
    if pos_enc not in ("learned", "table", "none"):
        raise ValueError(
            f"pos_enc {pos_enc!r} cannot be exported; transformers' RF-DETR has only its table "
            "('learned'; 'none' is written as a zero table)"
        )
    if isinstance(cfg.get("hf_config"), dict):
        config = with_label_names(dict(cfg["hf_config"]), dict(id2label or {}), model.num_classes)
    else:
        config = rfdetr_hf_config(model, id2label)
    state, _, skipped = rfdetr_ours_to_hf(model.state_dict())
    if skipped:
        raise ValueError(f"keys without a Hugging Face name: {sorted(skipped)}")
    vit = model.backbone.vit
    dim = vit.embed_dim
    table = _BB + "embeddings.position_embeddings"
    if table not in state:  # pos_enc "none": a zero table adds nothing
        grid = config["backbone_config"]["image_size"] // vit.patch_size
        state[table] = torch.zeros(1, 1 + grid * grid, dim)
    state[_BB + "embeddings.mask_token"] = torch.zeros(1, dim)
    config = {**config, "architectures": ["RfDetrForObjectDetection"]}
    processor = rfdetr_processor_config(size, model.backbone.size_multiple)
    return write_hf_folder(out_dir, config, state, {PREPROCESSOR_CONFIG: processor})
