"""Hugging Face RT-DETR folders in and out: the one config <-> keyword mapping and the one key map.

A folder written by ``save_pretrained`` holds ``config.json`` and ``model.safetensors`` (or
``pytorch_model.bin``).  For ``model_type: "rt_detr"`` (``RTDetrForObjectDetection``) the config
gives every size of peg_detr's :class:`~peg_detr.models.rtdetr.RTDETR` (backbone stages and
widths, encoder and decoder widths, heads, layers, queries): :func:`rtdetr_build_options` reads it
(each field checked), :func:`rtdetr_hf_config` writes it back.  :func:`rtdetr_from_hf` builds the
model and loads the weights; :func:`export_hf_rtdetr` writes a model as a folder.

The key map is one table of :mod:`peg_core.interop.keymap` rows, :data:`RTDETR_KEYS` (built by
:func:`encoder_rows` + :func:`decoder_rows` from the prefix pairs and the few names that differ);
:func:`rtdetr_hf_to_ours` / :func:`rtdetr_ours_to_hf` and the encoder / decoder functions read it.
Our modules keep transformers' names below these prefixes:

=====================================  ===========================  =====================================
Hugging Face key prefix                ours                         what
=====================================  ===========================  =====================================
``model.backbone.model.``              ``backbone.``                ResNet-vd: ``embedder.embedder.{0,1,2}``
                                                                    (the D stem), ``encoder.stages.{s}``
                                                                    ``.layers.{b}.{layer,shortcut}``
``model.encoder_input_proj.``          ``encoder.input_proj.``      per level ``{l}.0`` 1×1 conv, ``{l}.1`` BN
``model.encoder.``                     ``encoder.``                 ``aifi.{i}.layers.{j}.*``,
                                                                    ``lateral_convs``, ``fpn_blocks``,
                                                                    ``downsample_convs``, ``pan_blocks``
``model.denoising_class_embed.``,      ``denoising_class_embed.``,  the decoder side
``model.enc_*``, ``model.decoder.*``   ``decoder.*``                (:data:`DECODER_PREFIXES`)
=====================================  ===========================  =====================================

transformers has two names for AIFI's weights: the module names above (transformers 5, in
memory) and the names its files use (transformers 4, which 5's ``save_pretrained`` still writes
and ``from_pretrained`` converts): ``model.encoder.encoder.{i}.layers.{j}.`` instead of
``model.encoder.aifi.{i}.layers.{j}.``, with ``fc1`` / ``fc2`` / ``self_attn.out_proj`` for
``mlp.fc1`` / ``mlp.fc2`` / ``self_attn.o_proj`` (:data:`AIFI_NAMES`); inside a decoder layer ours
are the file names (:data:`DECODER_NAMES`).  Hugging Face -> ours accepts both; ours -> Hugging Face
writes ``layout="memory"`` (default) or ``layout="file"`` (:func:`encoder_ours_to_hf`; the whole
detector: the file names, which ``save_pretrained`` writes).

Keys of ours with no Hugging Face counterpart (:data:`AIFI_OURS_ONLY` rows: the map returns None,
a load adds them at their initialisation): the position
modules of the non-``sincos`` encoders, ``encoder.aifi.{i}.pegs.*`` (``peg``),
``encoder.aifi.{i}.pos.pos_embed`` (``learned``), ``encoder.aifi.{i}.rope.freqs`` (``rope-mixed``),
``encoder.aifi.{i}.attn_bias.*`` (``fire``).
RT-DETR's sin-cos table is not a weight, so the same file loads into any AIFI encoding:
``pos_enc="peg"`` adds a PEG that starts at zero and the model computes what ``"none"`` computes
until it is fine-tuned.  ``model_type: "detr"`` folders are :mod:`peg_detr.interop.hf_detr`'s;
:func:`peg_detr.interop.from_hf` takes either.

The model's ``build_config`` is json-safe: ``{"hf_config": <config.json>, "pos_enc": ...}``; a
checkpoint rebuilds the architecture with :func:`rtdetr_from_hf_config`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from torch import Tensor, nn

from peg_core.interop.hf_folder import ConfigFields, read_hf_config, read_hf_weights
from peg_core.interop.io import LoadReport, WeightsError, load_state_strict, read_state_file
from peg_core.interop.keymap import KeyMap, OursOnly, Rename, Rule, block_rows
from peg_core.peg import fold_peg_keys

from ..models.layers import LAYER_ACTIVATIONS
from ..models.rtdetr.backbone import ResNetVd
from ..models.rtdetr.config import NUM_QUERIES, RTDETRConfig
from ..models.rtdetr.decoder import RTDETRDecoder
from ..models.rtdetr.encoder import HybridEncoder
from ..models.rtdetr.model import RTDETR
from .hf_detr import hf_num_labels
from .hf_export import HFExport, label_fields, with_label_names
from .hf_processor import rtdetr_processor_config

M = TypeVar("M", bound=nn.Module)

__all__ = [
    "ACTIVATION_NAMES",
    "AIFI_NAMES",
    "DECODER_NAMES",
    "DECODER_PREFIXES",
    "ENCODER_HF_PREFIXES",
    "RTDETR_KEYS",
    "FamilyParts",
    "assemble_from_options",
    "check_one_value",
    "config_for_classes",
    "decoder_key_from_hf",
    "decoder_key_to_hf",
    "decoder_rows",
    "deformable_decoder_options",
    "denoising_options",
    "encoder_hf_config",
    "encoder_hf_keys",
    "encoder_hf_to_ours",
    "encoder_ours_to_hf",
    "encoder_rows",
    "export_hf_rtdetr",
    "hybrid_encoder_options",
    "int_if_whole",
    "load_mapped_state",
    "load_rtdetr_backbone",
    "record_folder_config",
    "rtdetr_build_options",
    "rtdetr_from_hf",
    "rtdetr_from_hf_config",
    "rtdetr_hf_config",
    "rtdetr_hf_to_ours",
    "rtdetr_ours_to_hf",
]

# Stride of each ResNet stage (stage1 .. stage4) without downsample_in_first_stage.
_STAGE_STRIDES = (4, 8, 16, 32)


# ---------------------------------------------------------------- keys: one table, two layouts
#: ``(HF prefix, our prefix)`` pairs for the backbone, the encoder input projections and the encoder.
ENCODER_HF_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.backbone.model.", "backbone."),
    ("model.encoder_input_proj.", "encoder.input_proj."),
    ("model.encoder.", "encoder."),
)
#: (Hugging Face prefix, peg_detr prefix): denoising embedding, query selection, decoder and heads
DECODER_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.denoising_class_embed.", "denoising_class_embed."),
    ("model.enc_output.", "decoder.enc_output."),
    ("model.enc_score_head.", "decoder.enc_score_head."),
    ("model.enc_bbox_head.", "decoder.enc_bbox_head."),
    ("model.weight_embedding.", "decoder.weight_embedding."),
    ("model.decoder_input_proj.", "decoder.input_proj."),
    ("model.decoder.layers.", "decoder.layers."),
    ("model.decoder.query_pos_head.", "decoder.query_pos_head."),
    ("model.decoder.class_embed.", "decoder.class_embed."),
    ("model.decoder.bbox_embed.", "decoder.bbox_embed."),
)
#: the names a layout writes: transformers' modules (``memory``) or its files (``file``)
LAYOUTS = ("memory", "file")
_WRITE = {"file": 0, "memory": 1}  # the index of a layout in every (file, memory, ...) triple below
#: AIFI's prefixes in transformers' files and modules (the order of every name triple below)
_AIFI = ("model.encoder.encoder.{i}.", "model.encoder.aifi.{i}.")
#: ``(file, memory, ours)`` names inside an AIFI layer that differ; ours are transformers 5's module names
AIFI_NAMES = (("fc1.", "mlp.fc1.", "mlp.fc1."), ("fc2.", "mlp.fc2.", "mlp.fc2."),
              ("self_attn.out_proj.", "self_attn.o_proj.", "self_attn.o_proj."))  # fmt: skip
#: ``(file, memory, ours)`` names inside a decoder layer that differ; ours are the file names
DECODER_NAMES = (("fc1.", "mlp.fc1.", "fc1."), ("fc2.", "mlp.fc2.", "fc2."),
                 ("self_attn.out_proj.", "self_attn.o_proj.", "self_attn.out_proj."))  # fmt: skip
#: our AIFI position modules transformers' weights lack (PEG, learned table, rotary, bias): added at init
AIFI_OURS_ONLY = tuple(
    OursOnly(f"encoder.aifi.{{i}}.{name}.", "a position module transformers' AIFI does not have")
    for name in ("pegs", "pos", "rope", "attn_bias")
)


def encoder_rows(aifi_names: Sequence[tuple[str, str, str]], *, write: str) -> tuple[Rule, ...]:
    """The rows of the backbone, input projections and encoder: our position modules, AIFI's two
    layouts (``aifi_names``: ``(file, memory, ours)`` inside a layer; ``write``: the layout written),
    then :data:`ENCODER_HF_PREFIXES`."""
    w = _WRITE[write]
    layer = tuple(p + "layers.{j}." for p in _AIFI)
    return (
        *AIFI_OURS_ONLY,
        *block_rows(layer, "encoder.aifi.{i}.layers.{j}.", aifi_names, write=w),
        *block_rows(_AIFI, "encoder.aifi.{i}.", [("", "", "")], write=w),
        *(Rename(hf, ours) for hf, ours in ENCODER_HF_PREFIXES),
    )


def decoder_rows(
    layer_names: Sequence[tuple[str, str, str]],
    prefixes: Sequence[tuple[str, str]] = DECODER_PREFIXES,
    *,
    write: str = "file",
) -> tuple[Rule, ...]:
    """The decoder side's rows: ``layer_names`` ``(file, memory, ours)`` inside a layer (``write``:
    the layout written), then the ``(HF, ours)`` prefix rows."""
    layer = ("model.decoder.layers.{i}.",) * 2
    return (
        *block_rows(layer, "decoder.layers.{i}.", layer_names, write=_WRITE[write]),
        *(Rename(hf, ours) for hf, ours in prefixes),
    )


_ENCODER_KEYS = {layout: KeyMap(encoder_rows(AIFI_NAMES, write=layout)) for layout in LAYOUTS}
_DECODER_KEYS = KeyMap(decoder_rows(DECODER_NAMES))
#: RT-DETR's whole map: either layout read, the file layout (``save_pretrained``'s) written
RTDETR_KEYS = _ENCODER_KEYS["file"] + _DECODER_KEYS


def encoder_hf_to_ours(key: str) -> str | None:
    """Our key for an HF backbone / input-projection / encoder key (either layout); None for other keys."""
    return _ENCODER_KEYS["file"].to_ours(key)


def encoder_ours_to_hf(key: str, *, layout: str = "memory") -> str | None:
    """The HF key (``layout`` ``memory`` / ``file``) for one of our backbone / encoder keys.

    None for other keys and for our position modules.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    return _ENCODER_KEYS[layout].to_hf(key)


def encoder_hf_keys(keys: Iterable[str], *, to_hf: bool = False, layout: str = "memory") -> dict[str, str]:
    """``{source key: target key}`` for the backbone + encoder keys among ``keys`` (others left out).

    ``to_hf=False`` maps HF keys (either layout) to ours, ``to_hf=True`` ours to HF ``layout``.
    """
    pairs = ((k, encoder_ours_to_hf(k, layout=layout) if to_hf else encoder_hf_to_ours(k)) for k in keys)
    return {key: target for key, target in pairs if target is not None}


def decoder_key_from_hf(key: str) -> str | None:
    """A Hugging Face key of the decoder side (file or module names) in ``peg_detr`` names; None for other keys."""
    return _DECODER_KEYS.to_ours(key)


def decoder_key_to_hf(key: str) -> str | None:
    """A ``peg_detr`` key of the decoder side in the names ``save_pretrained`` writes; None for other keys."""
    return _DECODER_KEYS.to_hf(key)


# ---------------------------------------------------------------- config.json <-> keywords
#: the activations peg_detr's RT-DETR layers have (encoder MLP and convolutions, decoder MLP)
ACTIVATION_NAMES = tuple(LAYER_ACTIVATIONS)


def _backbone_options(config: Mapping[str, Any], where: str | os.PathLike) -> dict[str, Any]:
    """:class:`ResNetVd` keywords of an ``RTDetrResNetConfig`` (``backbone_config`` of config.json), checked."""
    f = ConfigFields(config, where)
    bb = f.section("backbone_config")
    bb.choice("model_type", "rt_detr_resnet", ("rt_detr_resnet",))  # ResNet-vd only
    bb.choice("hidden_act", "relu", ("relu",))
    layer_type = bb.choice("layer_type", "bottleneck", ("basic", "bottleneck"))
    depths = bb.integers("depths", [3, 4, 6, 3], length=len(_STAGE_STRIDES))
    widths = bb.integers("hidden_sizes", [256, 512, 1024, 2048], length=len(_STAGE_STRIDES))
    stages = len(depths)
    indices = bb.integers("out_indices", [2, 3, 4], max=stages)  # past the last stage: refused here
    if indices != sorted(set(indices)):
        bb.fail("out_indices", f"increasing stage numbers in 1..{stages}")
    first = bb.flag("downsample_in_first_stage", False)
    return {
        "depth": 18 if layer_type == "basic" else 50,  # only the defaults; every size is given below
        "depths": depths,
        "widths": widths,
        "stem_width": bb.integer("embedding_size", 64),
        "layer_type": layer_type,
        "out_strides": [_STAGE_STRIDES[i - 1] * (2 if first else 1) for i in indices],
        "freeze_bn": f.flag("freeze_backbone_batch_norms", True),
        "in_channels": bb.integer("num_channels", 3),
        "downsample_in_first_stage": first,
        "downsample_in_bottleneck": bb.flag("downsample_in_bottleneck", False),
    }


def hybrid_encoder_options(
    f: ConfigFields, channels: Sequence[int], pos_enc: str, channels_are: str
) -> dict[str, Any]:
    """:class:`HybridEncoder` keywords (without the encoding) of an RT-DETR-layout config, checked.

    ``channels``: the backbone maps' widths, which ``encoder_in_channels`` must give (``channels_are``
    says what they are in the error).  D-FINE's and DEIMv2's hybrid encoders read the same fields
    (:func:`~peg_detr.interop.hf_dfine.dfine_encoder_options` adds theirs).
    """
    channels = list(channels)
    if f.integers("encoder_in_channels", channels) != channels:
        f.fail("encoder_in_channels", channels_are)
    levels = len(channels)
    hidden = f.integer("encoder_hidden_dim", 256)
    heads = f.integer("encoder_attention_heads", 8, max=hidden)
    if hidden % heads:
        f.fail("encoder_attention_heads", f"a divisor of encoder_hidden_dim {hidden}")
    if pos_enc == "sincos" and hidden % 4:
        f.fail("encoder_hidden_dim", "a multiple of 4 (AIFI's sin-cos table)")
    return dict(
        in_channels=channels, hidden_dim=hidden, num_heads=heads, dim_feedforward=f.integer("encoder_ffn_dim", 1024),
        dropout=f.number("dropout", 0.0, min=0.0, below=1.0),
        act=f.choice("encoder_activation_function", "gelu", ACTIVATION_NAMES),
        conv_act=f.choice("activation_function", "silu", ACTIVATION_NAMES),
        expansion=f.number("hidden_expansion", 1.0, above=0.0, max=64.0), num_layers=f.integer("encoder_layers", 1),
        use_encoder_idx=f.integers("encode_proj_layers", [levels - 1], min=0, max=levels - 1),
        temperature=f.number("positional_encoding_temperature", 10000, above=0.0),
        normalize_before=f.flag("normalize_before", False),
        layer_norm_eps=f.number("layer_norm_eps", 1e-5, above=0.0, below=1.0),
        batch_norm_eps=f.number("batch_norm_eps", 1e-5, above=0.0, below=1.0),
    )  # fmt: skip


def rtdetr_build_options(
    config: Mapping[str, Any], pos_enc: str = "sincos", where: str | os.PathLike = "config.json"
) -> dict[str, dict[str, Any]]:
    """The checked keywords of the parts of an ``RTDetrConfig`` (config.json as a dict).

    Returns ``{"backbone": ResNetVd kw, "encoder": HybridEncoder kw (without the encoding),
    "decoder": RTDETRDecoder kw, "model": RTDETR kw}``.  Every field used is checked for its type and
    range, and against the others (``out_indices`` within the backbone's stages,
    ``encoder_in_channels`` the backbone's widths, ``encode_proj_layers`` among the levels, heads
    dividing widths, ``decoder_in_channels`` the encoder's width); a :class:`WeightsError` names
    ``where`` and the field.  Settings peg_detr's RT-DETR does not have (``with_box_refine: false``,
    softmax classes) are refused the same way.
    """
    f = ConfigFields(config, where)
    backbone = _backbone_options(config, where)
    bb = f.section("backbone_config")
    indices = bb.integers("out_indices", [2, 3, 4])
    channels = [backbone["widths"][i - 1] for i in indices]  # what the chosen stages put out
    encoder = hybrid_encoder_options(
        f, channels, pos_enc, f"the widths {channels} of backbone stages {indices} (hidden_sizes)"
    )
    hidden = encoder["hidden_dim"]
    decoder_levels = f.integers("decoder_in_channels", [256, 256, 256])
    if decoder_levels != [hidden] * len(decoder_levels):
        f.fail("decoder_in_channels", f"the encoder's width encoder_hidden_dim {hidden} at every level")
    if f.integer("num_feature_levels", 3) != len(decoder_levels):
        f.fail("num_feature_levels", f"len(decoder_in_channels) {len(decoder_levels)}")
    num_classes = hf_num_labels(config, where)
    decoder = deformable_decoder_options(f, decoder_levels, num_classes, "peg_detr's RT-DETR")
    decoder["num_points"] = f.integer("decoder_n_points", 4)  # one count for every level (D-FINE: a list)
    model = dict(num_classes=num_classes, num_queries=decoder["num_queries"], **denoising_options(f))
    return {"backbone": backbone, "encoder": encoder, "decoder": decoder, "model": model}


def deformable_decoder_options(
    f: ConfigFields, in_channels: list[int], num_classes: int, title: str
) -> dict[str, Any]:
    """The decoder keywords every RT-DETR-family config gives alike, checked (the points per level are the family's).

    ``in_channels``: ``decoder_in_channels``, already checked against the encoder; ``title``: the
    family in the refusal of a setting it lacks (``with_box_refine: false``, softmax classes).
    """
    if not f.flag("with_box_refine", True):
        f.fail("with_box_refine", f"true ({title} refines its boxes layer by layer)")
    if not f.flag("use_focal_loss", True):
        f.fail("use_focal_loss", f"true ({title} scores classes with sigmoids)")
    d_model = f.integer("d_model", 256)
    heads = f.integer("decoder_attention_heads", 8, max=d_model)
    if d_model % heads:
        f.fail("decoder_attention_heads", f"a divisor of d_model {d_model}")
    return dict(
        in_channels=in_channels, hidden_dim=d_model, num_classes=num_classes,
        num_queries=f.integer("num_queries", NUM_QUERIES), num_layers=f.integer("decoder_layers", 6), num_heads=heads,
        dim_feedforward=f.integer("decoder_ffn_dim", 1024), dropout=f.number("dropout", 0.0, min=0.0, below=1.0),
        activation=f.choice("decoder_activation_function", "relu", ACTIVATION_NAMES),
        learn_initial_query=f.flag("learn_initial_query", False),
        layer_norm_eps=f.number("layer_norm_eps", 1e-5, above=0.0, below=1.0),
        batch_norm_eps=f.number("batch_norm_eps", 1e-5, above=0.0, below=1.0),
    )  # fmt: skip


def denoising_options(f: ConfigFields) -> dict[str, Any]:
    """The RT-DETR family's training settings of a config, checked: denoising groups and auxiliary losses."""
    return dict(
        num_denoising=f.integer("num_denoising", 100, min=0),
        label_noise_ratio=f.number("label_noise_ratio", 0.5, min=0.0, max=1.0),
        box_noise_scale=f.number("box_noise_scale", 1.0, min=0.0), aux_loss=f.flag("auxiliary_loss", True),
    )  # fmt: skip


def _check_rtdetr_weights(
    config: Mapping[str, Any], options: Mapping[str, dict[str, Any]], state: Mapping[str, Tensor], where: Path
) -> None:
    """The sizes config.json gives against the tensors they describe, before the model is built.

    A WeightsError names config.json, the field and the tensor: a width the weights do not have
    would otherwise build a model of that width first, and a class count that differs from the
    classifier's would load into the wrong heads.
    """
    f, bb = ConfigFields(config, where), ConfigFields(config, where).section("backbone_config")
    backbone, encoder, decoder = options["backbone"], options["encoder"], options["decoder"]
    stage = "model.backbone.model.encoder.stages"
    last = 1 if backbone["layer_type"] == "basic" else 2  # the stage's last convolution gives its width
    bb.against(
        "embedding_size",
        backbone["stem_width"],
        state,
        "model.backbone.model.embedder.embedder.2.convolution.weight",
    )
    for i, (depth, width) in enumerate(zip(backbone["depths"], backbone["widths"], strict=True)):
        bb.count_against(
            f"depths[{i}]", depth, state, rf"model\.backbone\.model\.encoder\.stages\.{i}\.layers\.(\d+)\."
        )
        bb.against(
            f"hidden_sizes[{i}]", width, state, f"{stage}.{i}.layers.0.layer.{last}.convolution.weight"
        )
    for i, c in enumerate(encoder["in_channels"]):
        f.against(
            "encoder_hidden_dim", encoder["hidden_dim"], state, f"model.encoder_input_proj.{i}.0.weight"
        )
        f.against(f"encoder_in_channels[{i}]", c, state, f"model.encoder_input_proj.{i}.0.weight", axis=1)
    for aifi in (
        "model.encoder.encoder.0.layers.0.fc1",
        "model.encoder.aifi.0.layers.0.mlp.fc1",
    ):  # file, memory
        f.against("encoder_ffn_dim", encoder["dim_feedforward"], state, f"{aifi}.weight")
    f.against("d_model", decoder["hidden_dim"], state, "model.enc_output.0.weight")
    f.count_against("decoder_layers", decoder["num_layers"], state, r"model\.decoder\.layers\.(\d+)\.")
    for fc1 in ("fc1", "mlp.fc1"):
        f.against(
            "decoder_ffn_dim", decoder["dim_feedforward"], state, f"model.decoder.layers.0.{fc1}.weight"
        )
    weight = state.get(_CLASS_KEY)
    num_classes = decoder["num_classes"]
    if isinstance(weight, Tensor) and weight.dim() == 2 and weight.shape[0] != num_classes:
        source = next((f"key {k!r} gives" for k in ("id2label", "num_labels") if config.get(k) is not None),
                      "has neither id2label nor num_labels: transformers' default,")  # fmt: skip
        raise WeightsError(
            f"config.json {source} {num_classes} classes, but the weights' {_CLASS_KEY} has shape "
            f"{tuple(weight.shape)} (expected {(num_classes, *weight.shape[1:])})",
            where,
        )


# The encoder proposals' classifier, ``(num_labels, d_model)``; every decoder layer's has the same width.
_CLASS_KEY = "model.enc_score_head.weight"


def rtdetr_from_hf_config(
    config: dict[str, Any],
    pos_enc: str = "sincos",
    *,
    where: str | os.PathLike = "config.json",
    **encoder_options: Any,
) -> RTDETR:
    """peg_detr's RT-DETR with the sizes of an ``RTDetrConfig`` (config.json as a dict); random weights.

    ``pos_enc`` is AIFI's encoding (``sincos`` is transformers'); ``encoder_options`` go to
    :class:`HybridEncoder` (PEG options).  The model's ``build_config`` is
    ``{"hf_config": config, "pos_enc": pos_enc, **encoder_options}``.  A field of the wrong type or
    range is a :class:`WeightsError` naming ``where`` (:func:`rtdetr_build_options`).
    """
    options = rtdetr_build_options(config, pos_enc, where)
    model = assemble_from_options(
        FamilyParts(ResNetVd, HybridEncoder, RTDETRDecoder, RTDETR), options, pos_enc, encoder_options
    )
    return record_folder_config(model, config, pos_enc, encoder_options)


class FamilyParts(NamedTuple):
    """The classes an RT-DETR-family model of a Hugging Face config is assembled from (:func:`assemble_from_options`)."""

    backbone: Callable[..., nn.Module]  # (**options["backbone"]) -> the backbone
    encoder: Callable[..., nn.Module]  # (pos_enc=, **options["encoder"], peg=) -> the hybrid encoder
    decoder: type[RTDETRDecoder]  # (num_classes, its spec_type(**options["decoder"]))
    model: Callable[..., RTDETR]  # (backbone, encoder, decoder, **options["model"])


def assemble_from_options(
    parts: FamilyParts,
    options: Mapping[str, dict[str, Any]],
    pos_enc: str,
    encoder_options: Mapping[str, Any],
) -> RTDETR:
    """The model of a format's checked ``*_build_options`` (random weights), its parts built in order."""
    backbone = parts.backbone(**options["backbone"])
    # a stored config's loose peg_* keywords -> the encoder's one peg value
    encoder = parts.encoder(pos_enc=pos_enc, **options["encoder"], **fold_peg_keys(dict(encoder_options)))
    decoder = dict(options["decoder"])
    num_classes = decoder.pop("num_classes")
    return parts.model(
        backbone, encoder, parts.decoder(num_classes, parts.decoder.spec_type(**decoder)), **options["model"]
    )


def record_folder_config(
    model: M, config: Mapping[str, Any], pos_enc: str, encoder_options: Mapping[str, Any]
) -> M:
    """``model`` with the ``build_config`` of a model built from a folder's config.json (JSON-safe).

    ``{"hf_config": config, "pos_enc": pos_enc, **encoder_options}``: a checkpoint rebuilds the model
    from it (``Arch.from_hf_config``), the same for every format.
    """
    model.build_config = json.loads(json.dumps({"hf_config": config, "pos_enc": pos_enc, **encoder_options}))
    return model


# ---------------------------------------------------------------- keys: the whole detector
def rtdetr_hf_to_ours(key: str) -> str | None:
    """peg_detr's RT-DETR key of a Hugging Face ``RTDetrForObjectDetection`` key (file or in-memory name).

    None when the key has no place in ours.
    """
    return RTDETR_KEYS.to_ours(key)


def rtdetr_ours_to_hf(key: str) -> str | None:
    """The key ``save_pretrained`` writes for one of ours; None for ours only (PEG, learned table, rotary)."""
    return RTDETR_KEYS.to_hf(key)


def load_mapped_state(
    model: nn.Module,
    state: Mapping[str, Tensor],
    path: str | os.PathLike,
    config: dict[str, Any] | None,
    keys: KeyMap,
    title: str,
) -> LoadReport:
    """Copy a Hugging Face state dict into ``model`` through ``keys`` (RT-DETR, D-FINE, DEIMv2).

    Every model key must come from the file unless its row says ours only (a position module:
    added at its initialisation, listed in ``report.converted``).  A tensor of another shape or a
    model key the file lacks is a :class:`WeightsError` naming ``path``; nothing is loaded then.
    File keys with no place in the model are ``report.skipped`` (batch-norm counters, which frozen
    norms lack, silently).
    """
    own = model.state_dict()
    nowhere = f"no place in peg_detr's {title}"
    mapped, made, skipped = keys.convert(state, to_hf=False, unmapped=nowhere)
    for ours in [k for k in mapped if k not in own]:
        skipped[made[ours]] = nowhere
        del mapped[ours]
    for ours, value in mapped.items():
        if value.shape != own[ours].shape:
            raise WeightsError(
                f"key {made[ours]} has shape {tuple(value.shape)}, the model's {ours} {tuple(own[ours].shape)} "
                "(config.json does not describe these weights)",
                path,
            )
    absent = sorted(own.keys() - mapped.keys())
    added = [k for k in absent if keys.ours_only(k)]
    missing = [k for k in absent if k not in added and not k.endswith("num_batches_tracked")]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise WeightsError(f"Hugging Face weights lack {len(missing)} model keys: {missing[:5]}{more}", path)
    model.load_state_dict(mapped, strict=False)
    report = LoadReport(source=str(path), args=config, copied=sorted(mapped))
    report.skipped = {k: why for k, why in skipped.items() if not k.endswith("num_batches_tracked")}
    why = (
        f"added: not in Hugging Face {title} ({model.encoder.pos_enc}; a PEG starts at zero, so the model "
        "computes what pos_enc='none' computes until fine-tuned)"
    )
    report.converted.update(dict.fromkeys(added, why))
    return report


def rtdetr_from_hf(folder: str | os.PathLike, pos_enc: str = "sincos") -> tuple[RTDETR, LoadReport]:
    """The RT-DETR a Hugging Face ``rt_detr`` folder describes, with its weights: ``(model in eval mode, report)``.

    ``pos_enc``: AIFI's encoding (``sincos`` is transformers'; ``peg`` adds a zero-initialised PEG,
    listed under ``report.converted``).  The fields of ``config.json`` are checked first, then their
    sizes against the weights, before the model is built (:class:`WeightsError` naming the field).
    :func:`peg_detr.interop.from_hf` dispatches here on ``model_type``.
    """
    path = Path(folder)
    config = read_hf_config(path)
    where = path / "config.json"
    options = rtdetr_build_options(config, pos_enc, where)  # the fields first: one is named before any tensor
    state, weights = read_hf_weights(path)
    _check_rtdetr_weights(config, options, state, where)
    model = rtdetr_from_hf_config(config, pos_enc, where=where)
    report = load_mapped_state(model, state, weights, config, RTDETR_KEYS, "RT-DETR")
    return model.eval(), report


# ---------------------------------------------------------------- the backbone alone (--backbone-weights)
#: the HF prefix of the ResNet-vd's keys (:data:`ENCODER_HF_PREFIXES`' first row)
_BACKBONE_HF = ENCODER_HF_PREFIXES[0][0]


def _describe(layer_type: str, depths: list[int], widths: list[int], stem: int) -> str:
    """A ResNet-vd's shape in words: ``basic blocks [2, 2, 2, 2], widths [64, ...], stem 64``."""
    return f"{layer_type} blocks {list(depths)}, widths {list(widths)}, stem {stem}"


def load_rtdetr_backbone(net: ResNetVd, source: str | os.PathLike) -> LoadReport:
    """``--arch rtdetr --backbone-weights SOURCE``: fill ``net`` (a :class:`ResNetVd`) and report what was copied.

    ``source`` is one of:

    * a Hugging Face ``rt_detr`` folder (``save_pretrained``'s, or a hub snapshot such as
      ``PekingU/rtdetr_r50vd``'s): its ``config.json``'s ``backbone_config`` must describe ``net``
      (block type, depths, widths, stem; else one :class:`WeightsError` naming both), and the
      ``model.backbone.model.*`` tensors are mapped by :func:`encoder_hf_to_ours`, the detector's
      one key map;
    * a weights file holding such keys (the folder's ``model.safetensors``): mapped the same way;
    * a plain ResNet-vd state dict in our names: loaded strictly, as ``build_rtdetr`` does.

    Every model key must be given with its shape (the batch-norm counters a frozen norm lacks
    excepted: ``net`` keeps its own); a missing key, a key ``net`` lacks or another shape is one
    :class:`WeightsError` naming the file.  Nothing is loaded when a check fails.  The report's
    ``copied`` are ``net``'s keys; the detector's other keys of a folder are left out of it.
    """
    path = Path(source)
    if path.is_dir():
        config = read_hf_config(path)
        where = path / "config.json"
        if config.get("model_type") != "rt_detr":
            raise WeightsError(
                f"model_type {config.get('model_type')!r} is not an RT-DETR folder (rt_detr)", where
            )
        want = _backbone_options(config, where)
        theirs = _describe(want["layer_type"], want["depths"], want["widths"], want["stem_width"])
        ours = _describe(net.layer_type, net.depths, net.widths, net.stem_width)
        if theirs != ours:
            raise WeightsError(f"the folder's backbone has {theirs}; the model's has {ours} (another --backbone)",
                               where)  # fmt: skip
        state, weights = read_hf_weights(path)
    else:
        state, weights = read_state_file(path, what="backbone weights"), path
        if not any(k.startswith(_BACKBONE_HF) for k in state):  # our own names: as build_rtdetr loads them
            return load_state_strict(net, state, path)
    prefix = ENCODER_HF_PREFIXES[0][1]  # "backbone.": the detector's name of the ResNet-vd
    mapped = {}
    for key, value in state.items():
        ours = encoder_hf_to_ours(key) if key.startswith(_BACKBONE_HF) else None
        if ours is not None and not ours.endswith("num_batches_tracked"):
            mapped[ours.removeprefix(prefix)] = value
    own = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    missing = sorted(own.keys() - mapped.keys())
    unexpected = sorted(mapped.keys() - own.keys())
    wrong = sorted(k for k in own.keys() & mapped.keys() if tuple(mapped[k].shape) != tuple(own[k].shape))
    if missing or unexpected or wrong:
        parts = [f"{len(keys)} {name} (e.g. {keys[0]})" for name, keys in
                 (("missing", missing), ("unexpected", unexpected), ("shape mismatch", wrong)) if keys]  # fmt: skip
        raise WeightsError(f"the RT-DETR backbone weights do not fit the model: {', '.join(parts)}", weights)
    net.load_state_dict(mapped, strict=False)
    # the detector's other keys are not listed: hundreds of lines saying "not the backbone"
    return LoadReport(source=str(weights), copied=sorted(mapped))


# ---------------------------------------------------------------- the way back: model -> folder
#: :class:`HybridEncoder` keyword -> the ``RTDetrConfig`` field :func:`rtdetr_build_options` reads it from
#: encoder ``hparams`` key -> RTDetrConfig field: the config's fields declare theirs
#: (:meth:`~peg_detr.models.config.DetectorConfig.hf_names`); these the builder fixes
_ENCODER_FIELDS = {
    **RTDETRConfig.hf_names("encoder"),
    "in_channels": "encoder_in_channels", "act": "encoder_activation_function", "conv_act": "activation_function",
    "use_encoder_idx": "encode_proj_layers", "temperature": "positional_encoding_temperature",
    "normalize_before": "normalize_before", "layer_norm_eps": "layer_norm_eps", "batch_norm_eps": "batch_norm_eps",
}  # fmt: skip


def _require_sincos(encoder: HybridEncoder) -> None:
    """A ``ValueError`` unless AIFI's encoding is ``sincos``, the only one transformers' RT-DETR has."""
    if encoder.pos_enc != "sincos":
        raise ValueError(
            f"pos_enc {encoder.pos_enc!r} cannot be exported; transformers' RT-DETR has only 'sincos'"
        )


def encoder_hf_config(backbone: ResNetVd, encoder: HybridEncoder) -> dict[str, Any]:
    """The ``config.json`` fields of a backbone + encoder: the inverse of :func:`rtdetr_build_options` on them.

    ``{"backbone_config": {...}, "freeze_backbone_batch_norms": ..., "encoder_*": ...}``.  The chosen
    stages are written as ``out_indices`` (what :func:`rtdetr_build_options` reads) and as
    ``out_features`` (their names), as transformers' ``save_pretrained`` writes both.  A
    ``ValueError`` for another encoding than ``sincos`` (transformers' RT-DETR has no PEG, learned
    table or rotary encoding).
    """
    _require_sincos(encoder)
    first = backbone.downsample_in_first_stage
    strides = [s * (2 if first else 1) for s in _STAGE_STRIDES]
    indices = [strides.index(s) + 1 for s in backbone.out_strides]
    config: dict[str, Any] = {
        "backbone_config": {
            "model_type": "rt_detr_resnet",
            "layer_type": backbone.layer_type,
            "depths": list(backbone.depths),
            "hidden_sizes": list(backbone.widths),
            "embedding_size": backbone.stem_width,
            "hidden_act": "relu",
            "num_channels": 3,
            "out_features": [f"stage{i}" for i in indices],
            "out_indices": indices,
            "downsample_in_first_stage": first,
            "downsample_in_bottleneck": backbone.downsample_in_bottleneck,
        },
        "freeze_backbone_batch_norms": backbone.freeze_bn,
    }
    config.update({hf: encoder.hparams[ours] for ours, hf in _ENCODER_FIELDS.items()})
    int_if_whole(config, "positional_encoding_temperature")
    return config


def rtdetr_hf_config(model: RTDETR, id2label: Mapping[int, str] | None = None) -> dict[str, Any]:
    """An ``RTDetrConfig`` (as config.json's dict) describing ``model``: the inverse of :func:`rtdetr_build_options`.

    For any RT-DETR with the ``sincos`` encoding, built by ``build_rtdetr`` or from a folder: the
    backbone's and encoder's fields from :func:`encoder_hf_config`, the decoder's from its ``hparams``.  ``id2label``: class names (default ``LABEL_i``).  A
    ``ValueError`` for another encoding (transformers' RT-DETR has no PEG, learned table or rotary
    encoding) or settings one config cannot hold.
    """
    dec = model.decoder.hparams
    config = encoder_hf_config(model.backbone, model.encoder)  # ValueError unless sincos
    config.update(
        model_type="rt_detr", architectures=["RTDetrForObjectDetection"], anchor_image_size=None,
        d_model=dec["hidden_dim"], decoder_in_channels=dec["in_channels"], num_feature_levels=len(dec["in_channels"]),
        decoder_layers=dec["num_layers"], decoder_attention_heads=dec["num_heads"],
        decoder_ffn_dim=dec["dim_feedforward"], decoder_activation_function=dec["activation"],
        decoder_n_points=dec["num_points"], eval_idx=dec["eval_idx"], learn_initial_query=dec["learn_initial_query"],
        num_queries=model.num_queries, num_denoising=model.num_denoising,
        label_noise_ratio=model.label_noise_ratio, box_noise_scale=model.box_noise_scale,
        auxiliary_loss=model.aux_loss, **label_fields(id2label, model.num_classes),
    )  # fmt: skip
    check_one_value(model.encoder.hparams, dec, "RTDetrConfig")
    return config


#: Write an RT-DETR with the ``sincos`` encoding as a Hugging Face folder; returns ``out_dir``
#: (:class:`~peg_detr.interop.hf_export.HFExport`: ``(model, out_dir, id2label=None, *, size=None)``).
#: ``model``: from :func:`rtdetr_from_hf`, :func:`rtdetr_from_hf_config` or ``build_rtdetr`` (a
#: ``peg_detr train`` checkpoint: ``python -m peg_detr export-hf`` loads its EMA weights, as ``eval``
#: does, and passes the model); D-FINE / DEIMv2 subclass it and have their own exports.  ``id2label``:
#: class names by label (default: a folder's own names, else ``LABEL_i``).  Writes ``config.json`` (a
#: folder's own ``hf_config``, else :func:`rtdetr_hf_config`) and ``model.safetensors`` in
#: ``save_pretrained``'s key names; ``RTDetrForObjectDetection.from_pretrained(out_dir)`` then computes
#: what the model computes (``anchor_image_size`` / ``eval_size`` unset: anchors and the AIFI table
#: follow each input, as here), and ``preprocessor_config.json``
#: (:func:`~peg_detr.interop.hf_processor.rtdetr_processor_config` at ``size``, the run's
#: ``--val-size``; default 640) makes ``pipeline("object-detection", out_dir)`` feed it what
#: ``predict`` does.  Other encodings have no place in transformers' RT-DETR and raise a
#: ``ValueError`` before anything is written.
export_hf_rtdetr = HFExport(
    name="export_hf_rtdetr", takes="an RT-DETR", model_cls=RTDETR, exact=True,
    architecture="RTDetrForObjectDetection", describe=rtdetr_hf_config, keys=RTDETR_KEYS,
    processor=lambda _, size: rtdetr_processor_config(size), refuse=lambda model: _require_sincos(model.encoder),
)  # fmt: skip


def int_if_whole(config: dict[str, Any], key: str) -> None:
    """``config[key]`` as an int when it is a whole float (transformers' configs validate an int there)."""
    value = config[key]
    if isinstance(value, float) and value.is_integer():
        config[key] = int(value)


def check_one_value(encoder: Mapping[str, Any], decoder: Mapping[str, Any], config_name: str) -> None:
    """A ``ValueError`` when the encoder's and decoder's dropout / layer-norm eps differ: one HF config holds one."""
    if decoder["dropout"] != encoder["dropout"] or decoder["layer_norm_eps"] != encoder["layer_norm_eps"]:
        raise ValueError(
            f"the encoder and decoder differ in dropout / layer-norm eps; one {config_name} holds one value"
        )


def config_for_classes(config: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A folder's ``config`` for another label set: ``id2label`` / ``label2id`` of ``names`` alone.

    ``names[i]`` is label ``i``'s (``""``: no category, written ``LABEL_i``); the folder's own names
    do not leak into labels that now mean something else.
    """
    own = {k: v for k, v in config.items() if k not in ("id2label", "label2id", "num_labels")}
    return with_label_names(own, dict(enumerate(names)), len(names))
