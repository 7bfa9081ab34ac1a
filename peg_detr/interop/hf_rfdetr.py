"""transformers' ``RfDetrForObjectDetection`` <-> peg_detr's :class:`~peg_detr.models.rfdetr.RFDETR`.

:func:`rfdetr_from_hf_config` builds the model an ``RfDetrConfig`` (or its ``config.json`` dict)
describes; :func:`rfdetr_hf_to_ours` / :func:`rfdetr_ours_to_hf` rename a state dict through the
declarative table below; :func:`rfdetr_from_hf` does both for a ``save_pretrained`` folder.

The tables are rows of :mod:`peg_core.interop.keymap` (the project's one key-map mechanism, whose
docstring gives the rules): :class:`Rename` rows (one key, or every key under a prefix, ``{i}``
standing for a block / layer / group number), :class:`Stack` rows (DINOv2's separate query / key /
value are CPVT's fused ``qkv``; the decoder's fused ``in_proj`` is RT-DETR's separate ``q_proj`` /
``k_proj`` / ``v_proj``) and :class:`~peg_core.interop.keymap.Skip` rows.  The same rows read both
ways.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from peg_core.interop.hf_folder import read_hf_config, read_hf_weights
from peg_core.interop.io import LoadReport, WeightsError
from peg_core.interop.keymap import Converted, KeyMap, Rename, Rule, Skip, Stack

from ..models.config import json_safe
from ..models.rfdetr import RFDETR, RFDETRConfig, build_rfdetr
from .hf_export import HFExport
from .hf_processor import rfdetr_processor_config

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


_BB = "backbone.0.encoder.encoder."
_PROJ = "backbone.0.projector.stages.0."
_DEC = "transformer.decoder.layers.{i}."
_VIT = "backbone.vit."
_BLOCK = _VIT + "blocks.{i}."
_C2F = "projector.c2f."
_OURS_DEC = "decoder.layers.{i}."
_MASK_WHY = "DINOv2's masked-image-modelling token; detection never reads it"
#: the ViT's embeddings: transformers' name below ``embeddings.`` -> ours below ``backbone.vit.``
_EMBEDDINGS = (("cls_token", "cls_token"), ("position_embeddings", "pos_enc.pos_embed"),
               ("patch_embeddings.projection.", "patch_embed.proj."))  # fmt: skip
#: the decoder-side modules both layouts keep below ``transformer.`` / ``model.``
_QUERY_SELECTION = ("enc_output", "enc_output_norm", "enc_out_class_embed", "enc_out_bbox_embed")


def _dinov2_rows(top: str, qkv: tuple[str, ...], proj: str) -> tuple[Rule, ...]:
    """The ViT's rows below transformers' prefix ``top``: ``qkv`` are its attention's three names in a
    layer (stacked into CPVT's ``qkv``), ``proj`` its output projection's; the rest keep their names."""
    layer = top + "encoder.layer.{i}."
    return (
        Skip(top + "embeddings.mask_token", _MASK_WHY),
        *(Rename(f"{top}embeddings.{hf}", _VIT + ours) for hf, ours in _EMBEDDINGS),
        Stack(tuple(layer + n for n in qkv), (_BLOCK + "attn.qkv.",)),
        Rename(layer + proj, _BLOCK + "attn.proj."),
        *(Rename(f"{layer}layer_scale{n}.lambda1", f"{_BLOCK}ls{n}.gamma") for n in (1, 2)),
        Rename(layer, _BLOCK),  # norm1, norm2, mlp.fc1, mlp.fc2: the same names
        Rename(top + "layernorm.", _VIT + "norm."),
    )


#: rf-detr's C2f names (``cv1`` / ``cv2``, ``bn`` for what is a LayerNorm) -> ours, in a block and the stage
_C2F_FILE = tuple(
    Rename(f"{_PROJ}0.{where}{cv}.{part}.", f"{_C2F}{ours_where}conv{cv[-1]}.{ours_part}.")
    for where, ours_where in (("", ""), ("m.{j}.", "bottlenecks.{j}."))
    for cv in ("cv1", "cv2")
    for part, ours_part in (("conv", "conv"), ("bn", "norm"))
)

_FILE_QKV = tuple(f"attention.attention.{n}." for n in ("query", "key", "value"))
#: a decoder layer's modules in rf-detr's names / transformers' module names -> ours (RT-DETR's)
_FILE_DECODER_LAYER = (
    ("self_attn.out_proj.", "self_attn.out_proj."), ("norm1.", "self_attn_layer_norm."),
    ("cross_attn.", "encoder_attn."), ("norm2.", "encoder_attn_layer_norm."), ("linear1.", "fc1."),
    ("linear2.", "fc2."), ("norm3.", "final_layer_norm."),
)  # fmt: skip
_MODULE_DECODER_LAYER = (
    ("self_attn.o_proj.", "self_attn.out_proj."), ("cross_attn_layer_norm.", "encoder_attn_layer_norm."),
    ("cross_attn.", "encoder_attn."), ("mlp.fc1.", "fc1."), ("mlp.fc2.", "fc2."), ("layer_norm.", "final_layer_norm."),
)  # fmt: skip

#: rf-detr's / ``save_pretrained``'s key names <-> ours (module docstring)
RFDETR_FILE_KEYS: tuple[Rule, ...] = (
    *_dinov2_rows(_BB, _FILE_QKV, "attention.output.dense."),
    *_C2F_FILE,
    Rename(_PROJ + "1.", "projector.norm."),
    Stack((_DEC + "self_attn.in_proj_",), tuple(_OURS_DEC + f"self_attn.{n}_proj." for n in "qkv")),
    *(Rename(_DEC + hf, _OURS_DEC + ours) for hf, ours in _FILE_DECODER_LAYER),
    Rename("transformer.decoder.norm.", "decoder.norm."),
    Rename("transformer.decoder.ref_point_head.", "decoder.ref_point_head."),
    *(Rename(f"transformer.{n}.", f"decoder.{n}.") for n in _QUERY_SELECTION),
    *(
        Rename(f"{n}.", f"decoder.{n}.")
        for n in ("refpoint_embed", "query_feat", "class_embed", "bbox_embed")
    ),
)

_MB = "model.backbone.backbone."
_MPROJ = "model.backbone.projector."
_MDEC = "model.decoder.layers.{i}."

#: ``RfDetrForObjectDetection().state_dict()`` names <-> ours (module docstring)
RFDETR_MODULE_KEYS: tuple[Rule, ...] = (
    *_dinov2_rows(_MB, tuple(f"attention.{n}_proj." for n in "qkv"), "attention.o_proj."),
    Rename(_MPROJ + "projector_layer.", _C2F),  # conv1, conv2, bottlenecks.{j}.conv{1,2}: the same names
    Rename(_MPROJ + "layer_norm.", "projector.norm."),
    *(Rename(_MDEC + hf, _OURS_DEC + ours) for hf, ours in _MODULE_DECODER_LAYER),
    Rename(_MDEC, _OURS_DEC),  # self_attn.{q,k,v}_proj, self_attn_layer_norm: the same names
    Rename("model.decoder.layernorm.", "decoder.norm."),
    Rename("model.decoder.ref_point_head.", "decoder.ref_point_head."),
    Rename("model.reference_point_embed.", "decoder.refpoint_embed."),
    *(Rename(f"model.{n}.", f"decoder.{n}.") for n in ("query_feat", *_QUERY_SELECTION)),
    *(Rename(f"{n}.", f"decoder.{n}.") for n in ("class_embed", "bbox_embed")),
)


_FILE_MAP, _MODULE_MAP = KeyMap(RFDETR_FILE_KEYS), KeyMap(RFDETR_MODULE_KEYS)


def _layout(keys: Sequence[str]) -> KeyMap:
    """The map of a transformers state dict: the module layout when its keys start with ``model.``."""
    return _MODULE_MAP if any(k.startswith("model.") for k in keys) else _FILE_MAP


def rfdetr_hf_to_ours(state: Mapping[str, Tensor]) -> Converted:
    """transformers' state dict (file or module layout) -> ``(ours, made, skipped)``."""
    return _layout(list(state)).convert(state, to_hf=False)


def rfdetr_ours_to_hf(state: Mapping[str, Tensor], *, layout: str = "file") -> Converted:
    """Our state dict -> ``(transformers' in the file (``save_pretrained``) or module layout, made, skipped)``.

    Our keys without a transformers counterpart (a PEG) are in ``skipped``; the caller decides
    whether that is an error (an export of a PEG model is).
    """
    if layout not in ("file", "module"):
        raise ValueError(f"layout must be 'file' or 'module'; got {layout!r}")
    return (_FILE_MAP if layout == "file" else _MODULE_MAP).convert(state, to_hf=True)


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


def _refuse_encoding(model: RFDETR) -> None:
    """A ``ValueError`` for a position encoding transformers' RF-DETR cannot hold (it has only its table)."""
    pos_enc = (getattr(model, "build_config", None) or {}).get("pos_enc", "learned")
    if pos_enc not in ("learned", "table", "none"):
        raise ValueError(
            f"pos_enc {pos_enc!r} cannot be exported; transformers' RF-DETR has only its table "
            "('learned'; 'none' is written as a zero table)"
        )


def _table_and_mask(model: RFDETR, config: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with DINOv2's tensors we may lack: a zero table (``pos_enc`` none) and the zero ``mask_token``."""
    vit = model.backbone.vit
    table = _BB + "embeddings.position_embeddings"
    if table not in state:  # pos_enc "none": a zero table adds nothing
        grid = config["backbone_config"]["image_size"] // vit.patch_size
        state[table] = torch.zeros(1, 1 + grid * grid, vit.embed_dim)
    state[_BB + "embeddings.mask_token"] = torch.zeros(1, vit.embed_dim)
    return state


#: Write an RF-DETR with a table (``learned``) or no position encoding as a Hugging Face folder;
#: returns ``out_dir`` (:class:`~peg_detr.interop.hf_export.HFExport`:
#: ``(model, out_dir, id2label=None, *, size=None)``).  ``config.json`` is the folder's own
#: ``hf_config`` for a model read from one (class names updated from ``id2label``), else
#: :func:`rfdetr_hf_config`; ``model.safetensors`` holds the weights in ``save_pretrained``'s names
#: (and a zero ``mask_token``, which detection never reads); and ``preprocessor_config.json`` is
#: :func:`~peg_detr.interop.hf_processor.rfdetr_processor_config` at ``size`` (the run's
#: ``--val-size``), rounded up to a multiple of ``patch_size * num_windows``.  A PEG, rotary or bias
#: encoding (transformers' RF-DETR has only its table) raises a ``ValueError`` before anything is
#: written; ``none`` is written with a zero table, which computes the same.
export_hf_rfdetr = HFExport(
    name="export_hf_rfdetr", takes="an RF-DETR", model_cls=RFDETR, architecture="RfDetrForObjectDetection",
    describe=rfdetr_hf_config, keys=_FILE_MAP, refuse=_refuse_encoding, extra=_table_and_mask, unset=(),
    processor=lambda model, size: rfdetr_processor_config(size, model.backbone.size_multiple),
)  # fmt: skip
