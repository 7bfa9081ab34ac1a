"""transformers' ``Deimv2ForObjectDetection`` folders <-> peg_detr's :class:`~peg_detr.models.deimv2.DEIMv2`.

:func:`deimv2_from_hf` reads ``config.json`` (fields checked and named before any tensor is read:
:func:`deimv2_build_options`), builds the model with :func:`~peg_detr.models.deimv2.build_deimv2`
(:func:`deimv2_from_hf_config`) and copies the weights through the key map below
(:func:`load_deimv2_state`); :func:`export_hf_deimv2` writes a model back (``sincos``; the lite
encoder has no encoding) as a folder transformers' ``from_pretrained`` loads without missing or
unexpected keys.  The encoder and decoder keep transformers' module names, so most keys only
lose or change a prefix:

=============================================================  ===========================================
Hugging Face                                                   ours
=============================================================  ===========================================
``model.conv_encoder.backbone.embeddings.cls_token``           ``backbone.vit.cls_token``
``...embeddings.register_tokens`` / ``patch_embeddings.*``     ``backbone.vit.reg_token`` / ``patch_embed.proj.*``
``...model.layer.{i}.attention.{q,k,v}_proj``                  ``backbone.vit.blocks.{i}.attn.qkv`` (stacked;
                                                               a missing key bias is zero)
``...layer.{i}.attention.o_proj`` / ``mlp.up_proj`` / ``mlp.down_proj``  ``attn.proj`` / ``mlp.fc1`` / ``mlp.fc2``
``...layer.{i}.layer_scale{1,2}.lambda1``                      ``blocks.{i}.ls{1,2}.gamma``
``model.conv_encoder.backbone.norm``                           ``backbone.vit.norm``
``model.conv_encoder.{spatial_tuning_adapter,fusion_proj}.*``  ``backbone.{spatial_tuning_adapter,fusion_proj}.*``
``model.conv_encoder.model.*`` (HGNetV2)                       ``backbone.*`` (:mod:`.hf_hgnetv2`)
``model.conv_encoder.encoder_input_proj.{l}.*``                ``encoder.input_proj.{l}.*``
every other key                                                D-FINE's map (:func:`.hf_dfine.dfine_rows`)
``model.decoder.bbox_embed.{j}`` (a shared box head)           every ``decoder.bbox_embed.{i}`` slot
=============================================================  ===========================================

DEIMv2's files have D-FINE's layout except for the ``model.conv_encoder.*`` part (the backbone
and what projects its maps), and keep transformers' module names (D-FINE's files do not), so its key
map (:data:`DEIMV2_KEYS`, :func:`deimv2_rows`) is its own rows for that part (the ViT's q / k / v a
:class:`~peg_core.interop.keymap.Stack` row, a missing key bias zeros) followed by
:func:`~peg_detr.interop.hf_dfine.dfine_rows` with the module names; the config is read the same way:
D-FINE's shared fields by :func:`~peg_detr.interop.hf_dfine.dfine_encoder_options` /
``dfine_decoder_options``, DEIMv2's own fields here, and the weights are loaded by
:func:`~peg_detr.interop.hf_dfine.load_dfine_state` (a shared box head, written once, fills every
layer's slot first).

What differs from transformers on purpose: AIFI's ``sincos`` table is computed for the actual
map size in eval too (transformers' AIFI drops the table in eval when ``eval_size`` is set, and
caches anchors for ``anchor_image_size``: both are ignored here, anchors are built per call);
the DINOv3 rotation is rebuilt per call (as transformers').  With ``pos_enc="peg"`` the same
weights plus a zero PEG: the model computes what ``none`` computes until fine-tuned.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from peg_core.interop.hf_folder import ConfigFields, read_hf_config, read_hf_weights
from peg_core.interop.io import LoadReport, WeightsError
from peg_core.interop.keymap import KeyMap, Nest, Rename, Rule, Skip, Stack, block_rows

from ..models.deimv2 import DEIMv2, DEIMv2Config, build_deimv2
from .hf_detr import hf_num_labels
from .hf_dfine import (
    HGNETV2_ROW,
    dfine_decoder_options,
    dfine_encoder_options,
    dfine_rows,
    load_dfine_state,
)
from .hf_export import HFExport, label_fields
from .hf_hgnetv2 import (
    check_hidden_sizes,
    hgnetv2_hf_config,
    hgnetv2_options_from_hf,
)
from .hf_processor import rtdetr_processor_config
from .hf_rtdetr import check_one_value, denoising_options, int_if_whole, record_folder_config

__all__ = [
    "DEIMV2_KEYS",
    "deimv2_build_options",
    "deimv2_from_hf",
    "deimv2_from_hf_config",
    "deimv2_hf_config",
    "deimv2_hf_to_ours",
    "deimv2_ours_to_hf",
    "deimv2_rows",
    "export_hf_deimv2",
    "load_deimv2_state",
]

_CONV_ENCODER = "model.conv_encoder."
_VIT_HF = _CONV_ENCODER + "backbone."
_OWN = ("spatial_tuning_adapter.", "fusion_proj.")  # below model.conv_encoder. and backbone. alike
_VIT = "backbone.vit."
_BLOCK = _VIT + "blocks.{i}."
#: a ViT layer in ``save_pretrained``'s files and in transformers' modules
_VIT_LAYERS = (_VIT_HF + "layer.{i}.", _VIT_HF + "model.layer.{i}.")
#: DINOv3's names in a layer -> CPVT's in a block (q / k / v: :func:`_qkv_rows`)
_VIT_BLOCK = (
    ("attention.o_proj.", "attn.proj."), ("mlp.up_proj.", "mlp.fc1."), ("mlp.down_proj.", "mlp.fc2."),
    ("layer_scale1.lambda1", "ls1.gamma"), ("layer_scale2.lambda1", "ls2.gamma"), ("norm1.", "norm1."),
    ("norm2.", "norm2."),
)  # fmt: skip
#: DINOv3's names outside the layers -> CPVT's
_VIT_TOP = (("embeddings.cls_token", "cls_token"), ("embeddings.register_tokens", "reg_token"),
            ("embeddings.patch_embeddings.", "patch_embed.proj."), ("norm.", "norm."))  # fmt: skip


def _qkv_rows(layer: str) -> tuple[Stack, ...]:
    """DINOv3's separate q / k / v projections of a layer are CPVT's fused ``qkv`` (a missing key bias: zeros)."""
    return tuple(
        Stack(
            tuple(f"{layer}attention.{p}_proj.{leaf}" for p in "qkv"), (f"{_BLOCK}attn.qkv.{leaf}",), optional
        )
        for leaf, optional in (("weight", ()), ("bias", (1,)))
    )


def deimv2_rows(*, lite: bool = False) -> tuple[Rule, ...]:
    """DEIMv2's rows: its ``model.conv_encoder.*`` part (DINOv3 + STA or HGNetV2, the input projections),
    then D-FINE's rows with the module names (DEIMv2's files keep them).  ``lite``: the lite encoder's
    input projections are ``model.encoder.input_proj`` (written; the hybrid encoder's
    ``model.conv_encoder.encoder_input_proj``: both read)."""
    proj = ("model.encoder.input_proj.",) * lite + (_CONV_ENCODER + "encoder_input_proj.",)
    return (
        Skip(
            _VIT_HF + "embeddings.mask_token",
            "DINOv3's masked-image-modelling token; detection never reads it",
        ),
        *(row for layer in _VIT_LAYERS for row in _qkv_rows(layer)),
        *block_rows(_VIT_LAYERS, _BLOCK, [(hf, hf, ours) for hf, ours in _VIT_BLOCK]),
        *(Rename(_VIT_HF + hf, _VIT + ours) for hf, ours in _VIT_TOP),
        *(Rename(_CONV_ENCODER + name, "backbone." + name) for name in _OWN),
        Rename(proj, "encoder.input_proj."),
        Nest(_CONV_ENCODER + "model.", "backbone.", HGNETV2_ROW.inner),
        *dfine_rows(write="memory"),
    )


#: DEIMv2's maps, by whether the model has the lite encoder: either layout read, the files' names written
DEIMV2_KEYS = {lite: KeyMap(deimv2_rows(lite=lite)) for lite in (False, True)}


def deimv2_hf_to_ours(key: str) -> str | None:
    """Our key of a transformers ``Deimv2ForObjectDetection`` key (file or in-memory names); None when it
    has no place, or is one of the ViT's q / k / v (stacked: :data:`DEIMV2_KEYS` ``convert``)."""
    return DEIMV2_KEYS[False].to_ours(key)


def deimv2_ours_to_hf(key: str, *, lite: bool = False) -> str | None:
    """The ``save_pretrained`` key of one of ours; None: ours only (PEG, ...) or the ViT's fused ``qkv`` (split).

    ``lite``: the model has the lite encoder, whose ``encoder.input_proj`` is transformers'
    ``model.encoder.input_proj`` (the hybrid encoder's is ``model.conv_encoder.encoder_input_proj``).
    """
    return DEIMV2_KEYS[lite].to_hf(key)


_BOX_HEAD = re.compile(r"^(model\.decoder\.)?bbox_embed\.(\d+)\.(.+)$")


def _share_box_head(state: Mapping[str, Tensor], num_layers: int) -> dict[str, Tensor]:
    """A shared box head's one copy in every layer's slot (``model.decoder.bbox_embed.{i}.*``).

    ``save_pretrained`` writes one copy of tied tensors, under one layer index (not always 0); our
    shared head is one module in every slot, so every slot gets the lowest index's copy (the
    decoder's before transformers' top-level one).
    """
    found = sorted(
        (int(m[2]), m[1] is None, m[3], value) for key, value in state.items() if (m := _BOX_HEAD.match(key))
    )
    out = {k: v for k, v in state.items() if not _BOX_HEAD.match(k)}
    for index, _, rest, value in found:
        if index == found[0][0]:
            for i in range(num_layers):
                out.setdefault(f"model.decoder.bbox_embed.{i}.{rest}", value)
    return out


def load_deimv2_state(
    model: DEIMv2, state: Mapping[str, Tensor], path: str | os.PathLike, config: dict[str, Any] | None = None
) -> LoadReport:
    """Copy a transformers DEIMv2 state dict into ``model`` (D-FINE's loader with DEIMv2's key map).

    A tensor of another shape or a model key the file lacks is a :class:`WeightsError` naming
    ``path``; PEG / learned-table / rotary keys are added at their initialisation (``report.converted``).
    """
    if model.decoder.share_bbox_head:
        state = _share_box_head(state, len(model.decoder.layers))
    keys = DEIMV2_KEYS[not hasattr(model.encoder, "aifi")]
    return load_dfine_state(model, state, path, config, keys=keys, title="DEIMv2")


def _dinov3_options(f: ConfigFields) -> dict[str, Any]:
    """:func:`build_deimv2` keywords of a ``DINOv3ViTConfig`` ``backbone_config``, checked."""
    bb = f.section("backbone_config")
    width = bb.integer("hidden_size")
    heads = bb.integer("num_attention_heads", max=width)
    if width % heads or (width // heads) % 4:
        bb.fail(
            "num_attention_heads", f"a divisor of hidden_size {width} leaving a head width divisible by 4"
        )
    depth = bb.integer("num_hidden_layers")
    if bb.flag("use_gated_mlp", False):
        bb.fail("use_gated_mlp", "false (CPVT's blocks have a GELU MLP; DINOv3 ViT-S+/H+ are not supported)")
    bb.choice("hidden_act", "gelu", ("gelu",))
    for field in ("proj_bias", "mlp_bias"):
        if not bb.flag(field, True):
            bb.fail(field, "true (CPVT's projections have biases)")
    if bb.flag("key_bias", False) and not (bb.flag("query_bias", True) and bb.flag("value_bias", True)):
        bb.fail("key_bias", "false, or query and value biases too")
    stages = ["stem"] + [f"stage{i}" for i in range(1, depth + 1)]
    if bb.data.get("out_indices") is not None:
        out = bb.integers("out_indices", min=1, max=depth, length=3)
    else:
        names = bb.data.get("out_features") or []
        if len(names) != 3 or any(n not in stages[1:] for n in names):
            bb.fail("out_features", f"three of {stages[1:]}")
        out = [stages.index(n) for n in names]
    rope = {
        ours: bb.number(hf, above=0.0) for hf, ours in (("pos_embed_shift", "shift_coords"),
        ("pos_embed_jitter", "jitter_coords"), ("pos_embed_rescale", "rescale_coords")) if bb.data.get(hf) is not None
    }  # fmt: skip
    vit = dict(
        embed_dim=width, depth=depth, num_heads=heads, mlp_ratio=bb.integer("intermediate_size") / width,
        num_reg_tokens=bb.integer("num_register_tokens", 0, min=0), patch_size=bb.integer("patch_size", 16),
        norm_eps=bb.number("layer_norm_eps", 1e-5, above=0.0, below=1.0),
        qkv_bias=bb.flag("query_bias", True) or bb.flag("value_bias", True) or bb.flag("key_bias", False),
        rope_temperature=bb.number("rope_theta", 100.0, above=0.0), rope_options=rope,
    )  # fmt: skip
    if bb.integer("patch_size", 16) != 16:
        bb.fail("patch_size", "16 (the STA's maps are strides 8 / 16 / 32)")
    return dict(
        backbone="vit_tiny", vit_options=vit, vit_out_indices=[i - 1 for i in out],
        vit_layer_scale=bb.number("layerscale_value", 1.0), vit_apply_layernorm=bb.flag("apply_layernorm", True),
        vit_final_norm=True,  # transformers' DINOv3ViTBackbone normalises its last stage always
        drop_path_rate=bb.number("drop_path_rate", 0.0, min=0.0, below=1.0),
        sta_inplanes=f.integer("spatial_tuning_adapter_inplanes", 16),
    )  # fmt: skip


def _hgnet_options(f: ConfigFields, where: Path) -> tuple[dict[str, Any], list[int]]:
    """:func:`build_deimv2` keywords of an ``HGNetV2Config`` ``backbone_config`` and its output widths."""
    bb = f.section("backbone_config")
    try:
        name, options = hgnetv2_options_from_hf(bb.data)
    except ValueError as err:
        raise WeightsError(f"{where.name} backbone_config: {err}", where) from err
    widths = [stage[2] for stage in options["stages"]]
    # transformers sizes the input projections by ``hidden_sizes`` at the output stages, the stages by
    # ``stage_out_channels``: the two must agree where both are read
    check_hidden_sizes(bb, widths, options["return_idx"])
    return_idx = options.pop("return_idx")
    opts = dict(
        backbone=name or "hgnetv2_custom", hgnet_options=options, hgnet_return_idx=return_idx,
        freeze_backbone_bn=f.flag("freeze_backbone_batch_norms", True),
    )  # fmt: skip
    return opts, [widths[i] for i in return_idx]


def deimv2_build_options(
    config: Mapping[str, Any], pos_enc: str = "sincos", where: str | os.PathLike = "config.json"
) -> dict[str, Any]:
    """:func:`~peg_detr.models.deimv2.build_deimv2` keywords of a ``Deimv2Config``, checked.

    D-FINE's shared fields are read by :func:`~peg_detr.interop.hf_dfine.dfine_encoder_options` /
    ``dfine_decoder_options``; DEIMv2's own ones (the backbone kind, ``encoder_type``,
    ``encoder_fuse_op``, ``encoder_has_trailing_conv``, ``use_gateway``, ``share_bbox_head``,
    ``spatial_tuning_adapter_inplanes``, the MAL settings) here.  A field of the wrong type or
    range, or a setting peg_detr's DEIMv2 lacks, is a :class:`WeightsError` naming ``where`` and it.
    """
    where = Path(where)
    f = ConfigFields(config, where)
    kind = f.section("backbone_config").choice("model_type", "hgnet_v2", ("dinov3_vit", "hgnet_v2"))
    encoder = f.choice("encoder_type", "hybrid", ("hybrid", "lite"))
    hidden = f.integer("encoder_hidden_dim", 256)
    if kind == "dinov3_vit":
        if encoder != "hybrid":
            f.fail("encoder_type", "'hybrid' with the DINOv3 backbone")
        opts, channels = _dinov3_options(f), [hidden] * 3  # the STA fusion projects to the width
    else:
        opts, channels = _hgnet_options(f, where)
    if f.integer("d_model", 256) != hidden:
        f.fail("d_model", f"encoder_hidden_dim {hidden} (DEIMv2 uses one width)")
    num_classes = hf_num_labels(config, where)
    levels = len(channels) + (1 if encoder == "lite" else 0)
    dec = dfine_decoder_options(f, hidden, levels, num_classes)
    if encoder == "hybrid":
        enc = dfine_encoder_options(f, channels, pos_enc)
        if enc.pop("normalize_before"):
            f.fail("normalize_before", "false")
        opts.update(
            num_heads=enc["num_heads"], enc_dim_feedforward=enc["dim_feedforward"], enc_layers=enc["num_layers"],
            use_encoder_idx=enc["use_encoder_idx"], temperature=enc["temperature"],
        )  # fmt: skip
        act, conv_act = enc["act"], enc["conv_act"]
    else:  # no attention: no position encoding to choose
        if pos_enc not in ("sincos", "none"):
            raise ValueError(
                f"{where}: the lite encoder (encoder_type 'lite') has no attention for pos_enc {pos_enc!r}"
            )
        pos_enc = "none"
        if f.integers("encoder_in_channels", channels) != channels:
            f.fail("encoder_in_channels", f"the backbone's output widths {channels}")
        act, conv_act = "gelu", f.choice("activation_function", "silu", ("silu",))
    if (act, conv_act) != ("gelu", "silu"):
        f.fail("activation_function", "silu, with encoder_activation_function gelu")
    opts.update(
        pos_enc=pos_enc, num_classes=num_classes, encoder=encoder, hidden_dim=hidden,
        encoder_expansion=f.number("hidden_expansion", 1.0, above=0.0, max=64.0),
        depth_mult=f.number("depth_mult", 1.0, above=0.0, max=64.0),
        trailing_conv=f.flag("encoder_has_trailing_conv", True),
        fuse_op=f.choice("encoder_fuse_op", "sum", ("sum", "cat")),
        dec_layers=dec["num_layers"], dec_heads=dec["num_heads"], dim_feedforward=dec["dim_feedforward"],
        dropout=dec["dropout"], num_queries=dec["num_queries"], num_points=dec["num_points"],
        offset_scale=dec["offset_scale"], max_num_bins=dec["max_num_bins"], reg_scale=dec["reg_scale"],
        up=dec["up"], lqe_k=dec["lqe_k"], lqe_hidden_dim=dec["lqe_hidden_dim"], lqe_layers=dec["lqe_layers"],
        learn_initial_query=dec["learn_initial_query"], layer_norm_eps=dec["layer_norm_eps"],
        batch_norm_eps=dec["batch_norm_eps"], query_pos_act=dec["activation"],
        use_gateway=f.flag("use_gateway", True), share_bbox_head=f.flag("share_bbox_head", False),
        **denoising_options(f),
        mal_loss_coef=f.number("weight_loss_mal", 1.0, min=0.0), bbox_loss_coef=f.number("weight_loss_bbox", 5.0, min=0.0),
        giou_loss_coef=f.number("weight_loss_giou", 2.0, min=0.0), fgl_loss_coef=f.number("weight_loss_fgl", 0.15, min=0.0),
        ddf_loss_coef=f.number("weight_loss_ddf", 1.5, min=0.0),
        focal_alpha=f.number("focal_loss_alpha", 0.75, min=0.0, max=1.0),
        focal_gamma=f.number("focal_loss_gamma", 2.0, min=0.0),
        mal_alpha=f.number("mal_alpha", None, min=0.0) if config.get("mal_alpha") is not None else None,
        use_uni_set=f.flag("use_dense_one_to_one", True),
    )  # fmt: skip
    return opts


def deimv2_from_hf_config(
    config: dict[str, Any],
    pos_enc: str = "sincos",
    *,
    where: str | os.PathLike = "config.json",
    **encoder_options: Any,
) -> DEIMv2:
    """peg_detr's DEIMv2 with the sizes of a ``Deimv2Config`` (config.json as a dict); random weights.

    ``encoder_options``: more :func:`~peg_detr.models.deimv2.build_deimv2` keywords (the PEG's
    ``peg_at``, ``peg_kernel_size``).  ``model.build_config`` is ``{"hf_config": config, "pos_enc":
    pos_enc, **encoder_options}`` (a checkpoint rebuilds from it), as D-FINE's reader records it.
    """
    options = deimv2_build_options(config, pos_enc, where)
    model, _, _ = build_deimv2(**{**options, **encoder_options})
    return record_folder_config(model, config, pos_enc, encoder_options)


def deimv2_from_hf(folder: str | os.PathLike, pos_enc: str | None = None) -> tuple[DEIMv2, LoadReport]:
    """The DEIMv2 a Hugging Face ``deimv2`` folder describes, with its weights: ``(model in eval mode, report)``.

    ``pos_enc``: AIFI's encoding (default ``sincos``, transformers'; ``peg``: a zero PEG, listed under
    ``report.converted``, so the model computes what ``none`` computes until fine-tuned).  The
    fields of ``config.json`` are checked before any tensor is read.
    """
    path = Path(folder)
    config = read_hf_config(path)
    model = deimv2_from_hf_config(config, pos_enc or "sincos", where=path / "config.json")
    state, weights = read_hf_weights(path)
    report = load_deimv2_state(model, state, weights, config)
    return model.eval(), report


# ---------------------------------------------------------------- export (a model -> a folder)
#: encoder / decoder ``hparams`` key -> Deimv2Config field: the config's fields declare theirs
#: (:meth:`~peg_detr.models.config.DetectorConfig.hf_names`); these the builder fixes
_ENCODER_FIELDS = {**DEIMv2Config.hf_names("encoder"), "use_encoder_idx": "encode_proj_layers"}
_DECODER_FIELDS = {
    **DEIMv2Config.hf_names("decoder"),
    "in_channels": "decoder_in_channels",
    "eval_idx": "eval_idx",
}


def _identity_block(backbone: Any) -> bool:
    """Whether the folder needs one more ViT block that changes nothing (see :func:`export_hf_deimv2`).

    transformers' ``DINOv3ViTBackbone`` normalises its last stage's output always; DEIMv2's distilled
    ViTs (``vit_tiny`` / ``vit_tinyplus``: the S / M recipes) take their last block's tokens as they
    are.  One more block, every weight and layer scale zero, computes ``x + 0 = x`` exactly; its
    output is the one transformers normalises, and no scale reads it.
    """
    last = len(backbone.vit.blocks) - 1
    return last in backbone.out_indices and not (backbone.apply_layernorm or backbone.final_norm)


def _dinov3_hf_config(backbone: Any) -> dict[str, Any]:
    """The ``DINOv3ViTConfig`` dict of our DINOv3 + STA backbone (``ValueError`` where transformers differs)."""
    vit = backbone.vit
    blk = vit.blocks[0]
    if (
        vit.pos_enc is not None
        or len(vit.pos_blocks)
        or vit.rope is None
        or type(vit.rope).__name__ != "RoPEDinoV3"
    ):
        raise ValueError("only a ViT with the rope-dinov3 encoding alone has a transformers DINOv3 config")
    rope = vit.rope
    if rope.temperature is None or rope.normalize != "separate" or rope.offset:
        raise ValueError(
            "transformers' DINOv3 RoPE is temperature-based with 'separate' normalised coordinates"
        )
    qkv_bias = blk.attn.qkv.bias
    k_bias = qkv_bias is not None and bool(qkv_bias.detach()[vit.embed_dim : 2 * vit.embed_dim].any())
    ls = getattr(blk.ls1, "gamma", None)
    return {
        "model_type": "dinov3_vit", "hidden_size": vit.embed_dim, "num_hidden_layers": len(vit.blocks) + _identity_block(backbone),
        "num_attention_heads": blk.attn.num_heads, "intermediate_size": blk.mlp.fc1.out_features,
        "patch_size": vit.patch_size, "num_register_tokens": 0 if vit.reg_token is None else vit.reg_token.shape[1],
        "layer_norm_eps": vit.norm.eps, "layerscale_value": 1.0 if ls is None else float(ls.detach().flatten()[0]),
        "rope_theta": rope.temperature, "query_bias": qkv_bias is not None, "key_bias": k_bias,
        "value_bias": qkv_bias is not None, "proj_bias": True, "mlp_bias": True, "use_gated_mlp": False,
        "hidden_act": "gelu", "pos_embed_shift": rope.shift_coords, "pos_embed_jitter": rope.jitter_coords,
        "pos_embed_rescale": rope.rescale_coords, "out_indices": [i + 1 for i in backbone.out_indices],
        "apply_layernorm": backbone.apply_layernorm, "reshape_hidden_states": True,
    }  # fmt: skip


def deimv2_hf_config(model: DEIMv2, id2label: Mapping[int, str] | None = None) -> dict[str, Any]:
    """A ``Deimv2Config`` (config.json's dict) describing ``model``: the inverse of :func:`deimv2_build_options`.

    For the ``sincos`` encoding (the lite encoder: none); a ``ValueError`` for what transformers' DEIMv2 lacks.
    """
    lite = not hasattr(model.encoder, "aifi")
    if model.encoder.pos_enc != ("none" if lite else "sincos"):
        raise ValueError(
            f"pos_enc {model.encoder.pos_enc!r} cannot be exported; transformers' DEIMv2 has only 'sincos'"
        )
    dec, enc = model.decoder.hparams, model.encoder.hparams
    config: dict[str, Any] = {
        "model_type": "deimv2", "architectures": ["Deimv2ForObjectDetection"], "encoder_type": "lite" if lite else "hybrid",
        "encoder_hidden_dim": dec["hidden_dim"], "num_feature_levels": len(dec["in_channels"]),
        "feat_strides": list(getattr(model.backbone, "out_strides", None) or model.backbone.strides),
        "anchor_image_size": None, "eval_size": None,
        "num_queries": model.num_queries, "num_denoising": model.num_denoising,
        "label_noise_ratio": model.label_noise_ratio, "box_noise_scale": model.box_noise_scale,
        "auxiliary_loss": model.aux_loss, "layer_scale": 1.0, "decoder_method": "default",
        "activation_function": "silu", "encoder_activation_function": "gelu", "normalize_before": False,
    }  # fmt: skip
    config.update({hf: dec[ours] for ours, hf in _DECODER_FIELDS.items()})
    if lite:
        config.update(hidden_expansion=enc["expansion"], depth_mult=enc["depth_mult"],
                      encoder_has_trailing_conv=enc["trailing_conv"], encoder_in_channels=enc["in_channels"])  # fmt: skip
    else:
        config.update({hf: enc[ours] for ours, hf in _ENCODER_FIELDS.items()})
        config["encode_proj_layers"] = list(model.encoder.use_encoder_idx)  # non-negative
        int_if_whole(config, "positional_encoding_temperature")
        check_one_value(enc, dec, "Deimv2Config")
    if hasattr(model.backbone, "vit"):
        config["backbone_config"] = _dinov3_hf_config(model.backbone)
        config["spatial_tuning_adapter_inplanes"] = (
            model.backbone.spatial_tuning_adapter.conv2.conv.in_channels
        )
        config.setdefault("encoder_in_channels", [dec["hidden_dim"]] * 3)
        config["encoder_in_channels"] = [dec["hidden_dim"]] * 3
    else:
        options = model.backbone.build_options
        bb = hgnetv2_hf_config(options)
        bb.update(out_indices=[i + 1 for i in options["return_idx"]], hidden_sizes=bb["stage_out_channels"])
        config.update(backbone_config=bb, freeze_backbone_batch_norms=bool(options["freeze_bn"]))
        if not lite:
            config["encoder_in_channels"] = list(model.backbone.out_channels)
    config.update(label_fields(id2label, model.num_classes))
    return config


def _dinov3_tensors(model: DEIMv2, config: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with what transformers' DINOv3 backbone has and the key map has no source for.

    The split's key bias dropped where transformers' has none; the unused mask token as zeros; a
    missing layer scale as ones.  A DINOv3 backbone whose last block is taken without a norm
    (DEIMv2-S / M's distilled ViTs) gets one more block that changes nothing, every weight zero:
    transformers' ``DINOv3ViTBackbone`` normalises its last stage, now that extra block, which no
    scale reads, so transformers computes what the model computes.  An HGNetV2 backbone: ``state``.
    """
    bb = config.get("backbone_config") or {}
    if bb.get("model_type") != "dinov3_vit":
        return state
    width = bb["hidden_size"]
    if not bb["key_bias"]:  # the split wrote one; transformers' DINOv3 without a key bias has none
        state = {k: v for k, v in state.items() if not (k.startswith(_VIT_HF) and k.endswith(".k_proj.bias"))}
    state[_VIT_HF + "embeddings.mask_token"] = torch.zeros(1, 1, width)
    depth = len(model.backbone.vit.blocks)
    for i in range(depth):  # no layer scale: transformers' is a scale of ones
        for j in (1, 2):
            state.setdefault(f"{_VIT_HF}layer.{i}.layer_scale{j}.lambda1", torch.ones(width))
    if bb["num_hidden_layers"] > depth:  # the block that changes nothing (_identity_block)
        last = f"{_VIT_HF}layer.{depth - 1}."
        for key in [k for k in state if k.startswith(last)]:
            state[f"{_VIT_HF}layer.{depth}.{key.removeprefix(last)}"] = torch.zeros_like(state[key])
    return state


#: Write a DEIMv2 (``sincos``; the lite encoder: none) as a Hugging Face folder; returns ``out_dir``
#: (:class:`~peg_detr.interop.hf_export.HFExport`: ``(model, out_dir, id2label=None, *, size=None)``).
#: ``config.json`` is :func:`deimv2_hf_config`'s (described from the modules, a folder's own config
#: or not); ``model.safetensors`` holds the weights in ``save_pretrained``'s names (the ViT's q / k / v
#: split again; DINOv3's tensors we lack: :func:`_dinov3_tensors`).  ``preprocessor_config.json``:
#: :func:`~peg_detr.interop.hf_processor.rtdetr_processor_config` at ``size`` (the run's
#: ``--val-size``; default 640), with ImageNet mean / std for the DINOv3 backbones (peg_detr's
#: standardises inside the model, transformers' takes standardised pixels).  Other encodings raise
#: a ``ValueError`` before anything is written.
export_hf_deimv2 = HFExport(
    name="export_hf_deimv2", takes="a DEIMv2", model_cls=DEIMv2, architecture="Deimv2ForObjectDetection",
    describe=deimv2_hf_config, keys=lambda model: DEIMV2_KEYS[not hasattr(model.encoder, "aifi")],
    processor=lambda model, size: rtdetr_processor_config(size, hasattr(model.backbone, "vit")),
    extra=_dinov3_tensors, own_config=False,
)  # fmt: skip
