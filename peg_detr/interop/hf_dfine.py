"""Hugging Face D-FINE folders in and out: ``config.json`` <-> peg_detr's :class:`~peg_detr.models.dfine.DFINE`, and the key map.

A ``save_pretrained`` folder of ``DFineForObjectDetection`` (``model_type: "d_fine"``) holds
``config.json`` and ``model.safetensors``.  :func:`dfine_build_options` reads every field the model
needs (each checked, a :class:`WeightsError` naming it), :func:`dfine_from_hf_config` builds the
model, :func:`dfine_from_hf` also loads the weights, :func:`export_hf_dfine` writes a folder back.

The key map is one table of :mod:`peg_core.interop.keymap` rows, :data:`DFINE_KEYS`
(:func:`dfine_rows`: HGNetV2's own map nested under its prefix, RT-DETR's encoder and decoder rows
with D-FINE's names, the tied heads).  Keys map by prefix (our modules keep transformers' names below them):

=========================================  ==================================  ===============================
Hugging Face                               ours                                what
=========================================  ==================================  ===============================
``model.backbone.model.*``                 ``backbone.*``                      HGNetV2 (:mod:`.hf_hgnetv2`)
``model.encoder_input_proj.*``             ``encoder.input_proj.*``            1×1 conv + BN per level
``model.encoder.*``                        ``encoder.*``                       AIFI (:mod:`.hf_rtdetr`'s two
                                                                               layouts), FPN / PAN
``model.denoising_class_embed``,           ``denoising_class_embed``,          the decoder side
``model.enc_*``, ``model.decoder_input_    ``decoder.*``                       (:data:`DFINE_DECODER_PREFIXES`)
proj``, ``model.decoder.*``
``class_embed.*``, ``bbox_embed.*``        ``decoder.{class,bbox}_embed.*``    transformers' tied copies of
                                                                               ``model.decoder.*`` (:data:`TIED_HEADS`):
                                                                               read once, never written
=========================================  ==================================  ===============================

Inside a decoder layer transformers writes ``fc1`` / ``fc2`` / ``self_attn.out_proj`` (its files) and
holds ``mlp.layers.{0,1}`` / ``self_attn.o_proj`` (in memory); both are read, ours are the file names
(:data:`DFINE_DECODER_NAMES`; AIFI's: :data:`DFINE_AIFI_NAMES`).

What differs from transformers on purpose: the AIFI table is computed for the actual size in
training and eval (transformers drops it in eval when ``eval_size`` is set), and the anchors are
built for every call (``anchor_image_size`` is not used), so the model runs at any size.  The same
weights load into any AIFI encoding: ``pos_enc="peg"`` adds a zero-initialised PEG (listed in
``report.converted``): the model computes what ``"none"`` computes until fine-tuned.

For the RT-DETR successors that share this layout (DEIMv2), the pieces are separate:
:func:`dfine_rows` gives D-FINE's rows in either layout (a successor puts its own rows first);
:func:`dfine_encoder_options` / :func:`dfine_decoder_options` read the shared fields, so another
reader adds only its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from peg_core.interop.hf_folder import ConfigFields, read_hf_config, read_hf_weights
from peg_core.interop.io import LoadReport, WeightsError
from peg_core.interop.keymap import KeyMap, Nest, Rename, Rule

from ..models.dfine.backbone import build_hgnetv2
from ..models.dfine.config import DFineConfig
from ..models.dfine.decoder import DFineDecoder
from ..models.dfine.encoder import DFineHybridEncoder
from ..models.dfine.model import DFINE
from .hf_detr import hf_num_labels
from .hf_export import HFExport, label_fields
from .hf_hgnetv2 import (
    HF_BACKBONE_PREFIX,
    HGNETV2_KEYS,
    check_hidden_sizes,
    hgnetv2_hf_config,
    hgnetv2_options_from_hf,
)
from .hf_processor import rtdetr_processor_config
from .hf_rtdetr import (
    DECODER_PREFIXES,
    FamilyParts,
    assemble_from_options,
    check_one_value,
    decoder_rows,
    deformable_decoder_options,
    denoising_options,
    encoder_rows,
    hybrid_encoder_options,
    int_if_whole,
    load_mapped_state,
    record_folder_config,
)

__all__ = [
    "DFINE_AIFI_NAMES",
    "DFINE_DECODER_NAMES",
    "DFINE_DECODER_PREFIXES",
    "DFINE_KEYS",
    "TIED_HEADS",
    "dfine_build_options",
    "dfine_decoder_options",
    "dfine_encoder_options",
    "dfine_from_hf",
    "dfine_from_hf_config",
    "dfine_hf_config",
    "dfine_hf_to_ours",
    "dfine_key_from_hf",
    "dfine_key_to_hf",
    "dfine_ours_to_hf",
    "dfine_rows",
    "export_hf_dfine",
    "load_dfine_state",
]

# ---------------------------------------------------------------- keys
#: (Hugging Face prefix, ours) of the decoder side: RT-DETR's rows and D-FINE's own heads and constants
DFINE_DECODER_PREFIXES: tuple[tuple[str, str], ...] = (
    *DECODER_PREFIXES,
    ("model.decoder.pre_bbox_head.", "decoder.pre_bbox_head."),
    ("model.decoder.lqe_layers.", "decoder.lqe_layers."),
    ("model.decoder.up", "decoder.up"),
    ("model.decoder.reg_scale", "decoder.reg_scale"),
)
#: ``(file, memory, ours)`` inside an AIFI layer: the files have RT-DETR's names, the modules ``mlp.layers.{0,1}``
DFINE_AIFI_NAMES = (("fc1.", "mlp.layers.0.", "mlp.fc1."), ("fc2.", "mlp.layers.1.", "mlp.fc2."),
                    ("self_attn.out_proj.", "self_attn.o_proj.", "self_attn.o_proj."))  # fmt: skip
#: ``(file, memory, ours)`` inside a decoder layer; ours are the file names
DFINE_DECODER_NAMES = tuple((f, m, f) for f, m, _ in DFINE_AIFI_NAMES)
#: transformers' top-level heads are tied copies of ``model.decoder``'s: either is read, the decoder's written
TIED_HEADS = tuple(
    Rename((f"model.decoder.{n}.", f"{n}."), f"decoder.{n}.") for n in ("class_embed", "bbox_embed")
)
#: HGNetV2's own map (:mod:`.hf_hgnetv2`) for the keys below ``model.backbone.model.``
HGNETV2_ROW = Nest(HF_BACKBONE_PREFIX, "backbone.", HGNETV2_KEYS)


def dfine_rows(*, write: str = "file") -> tuple[Rule, ...]:
    """D-FINE's rows (HGNetV2, the encoder, the tied heads, the decoder side); ``write``: the names
    written, ``file`` (``save_pretrained``'s: RT-DETR's) or ``memory`` (transformers' modules; DEIMv2's
    files).  Either is read.  A successor puts its own rows first."""
    return (
        HGNETV2_ROW,
        *encoder_rows(DFINE_AIFI_NAMES, write=write),
        *TIED_HEADS,
        *decoder_rows(DFINE_DECODER_NAMES, DFINE_DECODER_PREFIXES, write=write),
    )


#: D-FINE's whole map: file or module names read, the file names written
DFINE_KEYS = KeyMap(dfine_rows())


def dfine_key_from_hf(key: str) -> str | None:
    """Our key of a Hugging Face D-FINE key (file or in-memory names); None when it has no place."""
    return DFINE_KEYS.to_ours(key)


def dfine_key_to_hf(key: str) -> str | None:
    """The key ``save_pretrained`` writes for one of ours; None for ours only (PEG, learned table, rotary)."""
    return DFINE_KEYS.to_hf(key)


#: the same functions under the names of the other readers' (``rtdetr_hf_to_ours`` ...)
dfine_hf_to_ours, dfine_ours_to_hf = dfine_key_from_hf, dfine_key_to_hf


# ---------------------------------------------------------------- config.json -> keywords
def _backbone_options(config: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """``build_hgnetv2`` keywords of ``backbone_config`` (+ the detector's frozen-norm flag), checked."""
    f = ConfigFields(config, where)
    bb = f.section("backbone_config")
    bb.choice("model_type", "hgnet_v2", ("hgnet_v2",))
    try:
        name, options = hgnetv2_options_from_hf(bb.data)
    except ValueError as err:
        raise WeightsError(f"{where.name} backbone_config: {err}", where) from err
    # transformers sizes the input projections by ``hidden_sizes`` at the output stages, the stages by
    # ``stage_out_channels``: the two must agree where both are read
    check_hidden_sizes(bb, [stage[2] for stage in options["stages"]], options["return_idx"])
    # transformers freezes the norms only (its backbone trains otherwise)
    return {
        "name": name,
        **options,
        "freeze_bn": f.flag("freeze_backbone_batch_norms", True),
        "freeze_at": -1,
    }


def dfine_encoder_options(f: ConfigFields, channels: Sequence[int], pos_enc: str) -> dict[str, Any]:
    """:class:`DFineHybridEncoder` keywords (without the encoding) of a D-FINE-layout config, checked.

    ``channels``: the backbone maps' widths, which ``encoder_in_channels`` must give.
    """
    options = hybrid_encoder_options(f, channels, pos_enc, f"the backbone's output widths {list(channels)}")
    return {**options, "depth_mult": f.number("depth_mult", 1.0, above=0.0, max=64.0)}


def dfine_decoder_options(
    f: ConfigFields, encoder_hidden: int, levels: int, num_classes: int
) -> dict[str, Any]:
    """:class:`DFineDecoder` keywords of a D-FINE-layout config, checked (settings peg_detr lacks refused)."""
    in_channels = f.integers("decoder_in_channels", [256] * levels)
    if in_channels != [encoder_hidden] * levels:
        f.fail("decoder_in_channels", f"the encoder's width {encoder_hidden} at each of its {levels} levels")
    if f.integer("num_feature_levels", 3) != levels:
        f.fail("num_feature_levels", f"the number of encoder levels {levels} (no extra stride-2 levels)")
    common = deformable_decoder_options(f, in_channels, num_classes, "D-FINE")
    points = f.data.get("decoder_n_points", 4)
    points = (
        [f.integer("decoder_n_points", 4)] * levels
        if not isinstance(points, list)
        else f.integers("decoder_n_points", length=levels)
    )
    layers = common["num_layers"]
    eval_idx = f.integer("eval_idx", -1, min=-layers, max=layers - 1)
    if eval_idx % layers != layers - 1:
        # transformers builds extra layers for an earlier eval_idx that its heads do not cover
        f.fail("eval_idx", f"-1 or {layers - 1} (the last decoder layer)")
    if f.number("layer_scale", 1.0, above=0.0) != 1.0:
        f.fail("layer_scale", "1 (wider layers after eval_idx are not supported)")
    f.choice("decoder_method", "default", ("default",))
    bins = f.integer("max_num_bins", 32, min=4)
    if bins % 2:
        f.fail("max_num_bins", "an even number >= 4")
    return dict(
        common, num_points=points, offset_scale=f.number("decoder_offset_scale", 0.5), eval_idx=eval_idx,
        max_num_bins=bins, reg_scale=f.number("reg_scale", 4.0), up=f.number("up", 0.5),
        lqe_k=f.integer("top_prob_values", 4), lqe_hidden_dim=f.integer("lqe_hidden_dim", 64),
        lqe_layers=f.integer("lqe_layers", 2),
    )  # fmt: skip


def dfine_build_options(
    config: Mapping[str, Any], pos_enc: str = "sincos", where: str | os.PathLike = "config.json"
) -> dict[str, dict[str, Any]]:
    """The checked keywords of a ``DFineConfig``'s parts: ``{"backbone", "encoder", "decoder", "model"}``.

    ``backbone``: :func:`~peg_detr.models.dfine.backbone.build_hgnetv2` keywords (``name`` first);
    ``encoder`` / ``decoder``: :class:`DFineHybridEncoder` (without ``pos_enc``) / :class:`DFineDecoder`;
    ``model``: :class:`DFINE`.  A field of the wrong type or range, or a setting peg_detr's D-FINE
    lacks, is a :class:`WeightsError` naming ``where`` and the field.
    """
    where = Path(where)
    f = ConfigFields(config, where)
    backbone = _backbone_options(config, where)
    stages, returned = backbone["stages"], backbone["return_idx"]
    channels = [stages[i][2] for i in returned]
    stride, all_strides = 4, []
    for spec in stages:  # the stem is stride 4; a downsampling stage halves
        stride *= 2 if spec[4] else 1
        all_strides.append(stride)
    strides = [all_strides[i] for i in returned]
    if f.integers("feat_strides", strides) != list(strides):
        f.fail("feat_strides", f"the backbone's output strides {list(strides)}")
    encoder = dfine_encoder_options(f, channels, pos_enc)
    num_classes = hf_num_labels(config, where)
    decoder = dfine_decoder_options(f, encoder["hidden_dim"], len(channels), num_classes)
    model = dict(num_classes=num_classes, num_queries=decoder["num_queries"], **denoising_options(f))
    return {"backbone": backbone, "encoder": encoder, "decoder": decoder, "model": model}


def dfine_from_hf_config(
    config: dict[str, Any],
    pos_enc: str = "sincos",
    *,
    where: str | os.PathLike = "config.json",
    **encoder_options: Any,
) -> DFINE:
    """peg_detr's D-FINE with the sizes of a ``DFineConfig`` (config.json as a dict); random weights.

    ``encoder_options`` go to :class:`DFineHybridEncoder` (PEG options).  ``model.build_config`` is
    ``{"hf_config": config, "pos_enc": pos_enc, **encoder_options}`` (a checkpoint rebuilds from it).
    """
    options = dfine_build_options(config, pos_enc, where)
    parts = FamilyParts(build_hgnetv2, DFineHybridEncoder, DFineDecoder, DFINE)
    return record_folder_config(
        assemble_from_options(parts, options, pos_enc, encoder_options), config, pos_enc, encoder_options
    )


# ---------------------------------------------------------------- weights
_CLASS_KEY = "model.enc_score_head.weight"


def load_dfine_state(
    model: DFINE,
    state: Mapping[str, Tensor],
    path: str | os.PathLike,
    config: dict[str, Any] | None = None,
    *,
    keys: KeyMap = DFINE_KEYS,
    title: str = "D-FINE",
) -> LoadReport:
    """Copy every mapped tensor into ``model`` (:func:`~.hf_rtdetr.load_mapped_state` with ``keys``).

    A tensor of another shape, or a model key the file lacks, is a :class:`WeightsError` naming
    ``path``; nothing is loaded then.  ``report.converted`` lists the position modules added at
    their initialisation (a PEG at zero).
    """
    return load_mapped_state(model, state, path, config, keys, title)


def dfine_from_hf(folder: str | os.PathLike, pos_enc: str = "sincos") -> tuple[DFINE, LoadReport]:
    """The D-FINE a Hugging Face ``d_fine`` folder describes, with its weights: ``(model in eval mode, report)``.

    ``pos_enc``: AIFI's encoding (``sincos`` is transformers'; ``peg`` adds a zero-initialised PEG,
    listed under ``report.converted``; ``none`` drops the table).  config.json's fields are checked
    before any tensor is read; the class count against the classifier before the model is built.
    :func:`peg_detr.interop.from_hf` dispatches here on ``model_type``.
    """
    path = Path(folder)
    config = read_hf_config(path)
    where = path / "config.json"
    options = dfine_build_options(config, pos_enc, where)
    state, weights = read_hf_weights(path)
    weight = state.get(_CLASS_KEY)
    num_classes = options["model"]["num_classes"]
    if isinstance(weight, Tensor) and weight.dim() == 2 and weight.shape[0] != num_classes:
        raise WeightsError(
            f"config.json gives {num_classes} classes, but the weights' {_CLASS_KEY} has shape "
            f"{tuple(weight.shape)} (expected {(num_classes, *weight.shape[1:])})",
            where,
        )
    model = dfine_from_hf_config(config, pos_enc, where=where)
    report = load_dfine_state(model, state, weights, config)
    return model.eval(), report


# ---------------------------------------------------------------- the way back: model -> folder
#: encoder / decoder ``hparams`` key -> DFineConfig field: the config's fields declare theirs
#: (:meth:`~peg_detr.models.config.DetectorConfig.hf_names`); these the builder fixes
_ENCODER_FIELDS = {
    **DFineConfig.hf_names("encoder"),
    "in_channels": "encoder_in_channels", "act": "encoder_activation_function", "conv_act": "activation_function",
    "use_encoder_idx": "encode_proj_layers", "temperature": "positional_encoding_temperature",
    "normalize_before": "normalize_before", "layer_norm_eps": "layer_norm_eps", "batch_norm_eps": "batch_norm_eps",
}  # fmt: skip
_DECODER_FIELDS = {
    **DFineConfig.hf_names("decoder"),
    "in_channels": "decoder_in_channels", "offset_scale": "decoder_offset_scale", "lqe_k": "top_prob_values",
    "lqe_layers": "lqe_layers", "learn_initial_query": "learn_initial_query",
}  # fmt: skip


def _require_sincos(model: DFINE) -> None:
    """A ``ValueError`` unless AIFI's encoding is ``sincos``, the only one transformers' D-FINE has."""
    if model.encoder.pos_enc != "sincos":
        raise ValueError(
            f"pos_enc {model.encoder.pos_enc!r} cannot be exported; transformers' D-FINE has only 'sincos'"
        )


def dfine_hf_config(model: DFINE, id2label: Mapping[int, str] | None = None) -> dict[str, Any]:
    """A ``DFineConfig`` (config.json's dict) describing ``model``: the inverse of :func:`dfine_build_options`.

    For a D-FINE with an HGNetv2 backbone and the ``sincos`` encoding; a ``ValueError`` otherwise.
    """
    _require_sincos(model)
    options = getattr(model.backbone, "build_options", None)
    if options is None:
        raise ValueError(
            f"a {type(model.backbone).__name__} backbone has no transformers D-FINE counterpart (HGNetv2 only)"
        )
    if options.get("freeze_at", -1) not in (-1, 0):
        raise ValueError("transformers' D-FINE freezes no backbone stages; freeze_at must be -1 or 0")
    enc, dec = model.encoder.hparams, model.decoder.hparams
    if enc.get("elan_act", "silu") != "silu":
        raise ValueError("transformers' D-FINE fixes the RepNCSPELAN4 activation to silu")
    if dec.get("mlp_activation", "relu") != "relu":  # DEIM's --head-act silu
        raise ValueError(f"transformers' D-FINE fixes its box / position heads to relu (this model: "
                         f"{dec['mlp_activation']})")  # fmt: skip
    config: dict[str, Any] = {
        "model_type": "d_fine", "architectures": ["DFineForObjectDetection"],
        "backbone_config": hgnetv2_hf_config(options), "freeze_backbone_batch_norms": bool(options["freeze_bn"]),
        "feat_strides": list(model.feature_strides), "num_feature_levels": len(dec["in_channels"]),
        "anchor_image_size": None, "eval_size": None, "num_queries": model.num_queries,
        "num_denoising": model.num_denoising, "label_noise_ratio": model.label_noise_ratio,
        "box_noise_scale": model.box_noise_scale, "auxiliary_loss": model.aux_loss, "layer_scale": 1.0,
        "decoder_method": "default",
    }  # fmt: skip
    config.update({hf: enc[ours] for ours, hf in _ENCODER_FIELDS.items()})
    config.update({hf: dec[ours] for ours, hf in _DECODER_FIELDS.items()})
    int_if_whole(config, "positional_encoding_temperature")
    check_one_value(enc, dec, "DFineConfig")
    config.update(label_fields(id2label, model.num_classes))
    return config


#: Write a D-FINE with the ``sincos`` encoding and an HGNetv2 backbone as a Hugging Face folder;
#: returns ``out_dir`` (:class:`~peg_detr.interop.hf_export.HFExport`:
#: ``(model, out_dir, id2label=None, *, size=None)``).  ``config.json`` is the folder's own
#: ``hf_config`` for a model read from one (class names updated from ``id2label``), else
#: :func:`dfine_hf_config`; ``model.safetensors`` holds the weights in ``save_pretrained``'s names,
#: ``anchor_image_size`` / ``eval_size`` unset (anchors and the AIFI table follow each input, as
#: here), and ``preprocessor_config.json`` is
#: :func:`~peg_detr.interop.hf_processor.rtdetr_processor_config` at ``size`` (the run's
#: ``--val-size``; default 640).  Other encodings raise a ``ValueError`` before anything is written.
export_hf_dfine = HFExport(
    name="export_hf_dfine", takes="a D-FINE", model_cls=DFINE, architecture="DFineForObjectDetection",
    describe=dfine_hf_config, keys=DFINE_KEYS, processor=lambda _, size: rtdetr_processor_config(size),
    refuse=_require_sincos,
)  # fmt: skip
