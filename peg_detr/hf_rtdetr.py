"""Hugging Face detector folders in and out: :func:`from_hf` (DETR and RT-DETR) and :func:`export_hf_rtdetr`.

A folder written by ``save_pretrained`` holds ``config.json`` and ``model.safetensors`` (or
``pytorch_model.bin``).  For ``model_type: "rt_detr"`` (``RTDetrForObjectDetection``) the config
gives every size of peg_detr's :class:`~peg_detr.models.rtdetr.RTDETR` (backbone stages and
widths, encoder and decoder widths, heads, layers, queries), and the keys map by prefix
(:mod:`peg_detr.models.rtdetr.hf_keys`).  RT-DETR's sin-cos table is not a weight, so the same
file loads into any AIFI encoding: ``pos_enc="peg"`` adds a PEG that starts at zero and the model
computes what ``"none"`` computes until it is fine-tuned.  ``model_type: "detr"`` folders go
through :func:`peg_detr.hf.hf_to_official` and :func:`peg_detr.models.build_detr`.

The model's ``build_config`` is json-safe: ``{"hf_config": <config.json>, "pos_enc": ...}``; a
checkpoint rebuilds the architecture with :func:`rtdetr_from_hf_config`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from peg_core.interop.hf_folder import ConfigFields, read_hf_config, read_hf_weights
from peg_core.interop.io import LoadReport, WeightsError, write_state_file

from .hf import detr_build_options, hf_label_names, hf_num_labels, read_hf_state
from .models import build_detr, load_official_checkpoint
from .models.rtdetr.backbone import ResNetVd
from .models.rtdetr.decoder import RTDETRDecoder
from .models.rtdetr.encoder import HybridEncoder
from .models.rtdetr.hf_keys import (
    decoder_key_from_hf,
    decoder_key_to_hf,
    encoder_hf_config,
    encoder_hf_to_ours,
    encoder_ours_to_hf,
)
from .models.rtdetr.model import RTDETR

__all__ = [
    "export_hf_rtdetr",
    "from_hf",
    "hf_label_names",
    "hf_num_labels",
    "rtdetr_build_options",
    "rtdetr_from_hf_config",
    "rtdetr_hf_config",
    "rtdetr_hf_to_ours",
    "rtdetr_ours_to_hf",
]

SUPPORTED_MODEL_TYPES = ("detr", "rt_detr")
# Stride of each ResNet stage (stage1 .. stage4) without downsample_in_first_stage.
_STAGE_STRIDES = (4, 8, 16, 32)


#: the activations peg_detr's RT-DETR layers have (encoder MLP and convolutions, decoder MLP)
_ACTIVATIONS = ("relu", "gelu", "silu")


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
    if f.integers("encoder_in_channels", channels) != channels:
        f.fail("encoder_in_channels", f"the widths {channels} of backbone stages {indices} (hidden_sizes)")
    levels = len(channels)
    hidden = f.integer("encoder_hidden_dim", 256)
    heads = f.integer("encoder_attention_heads", 8, max=hidden)
    if hidden % heads:
        f.fail("encoder_attention_heads", f"a divisor of encoder_hidden_dim {hidden}")
    if pos_enc == "sincos" and hidden % 4:
        f.fail("encoder_hidden_dim", "a multiple of 4 (RT-DETR's sin-cos table)")
    eps = {
        "layer_norm_eps": f.number("layer_norm_eps", 1e-5, above=0.0, below=1.0),
        "batch_norm_eps": f.number("batch_norm_eps", 1e-5, above=0.0, below=1.0),
    }
    dropout = f.number("dropout", 0.0, min=0.0, below=1.0)
    encoder = dict(
        in_channels=channels, hidden_dim=hidden, num_heads=heads, dim_feedforward=f.integer("encoder_ffn_dim", 1024),
        dropout=dropout, act=f.choice("encoder_activation_function", "gelu", _ACTIVATIONS),
        conv_act=f.choice("activation_function", "silu", _ACTIVATIONS),
        expansion=f.number("hidden_expansion", 1.0, above=0.0, max=64.0), num_layers=f.integer("encoder_layers", 1),
        use_encoder_idx=f.integers("encode_proj_layers", [levels - 1], min=0, max=levels - 1),
        temperature=f.number("positional_encoding_temperature", 10000, above=0.0),
        normalize_before=f.flag("normalize_before", False), **eps,
    )  # fmt: skip
    decoder_levels = f.integers("decoder_in_channels", [256, 256, 256])
    if decoder_levels != [hidden] * len(decoder_levels):
        f.fail("decoder_in_channels", f"the encoder's width encoder_hidden_dim {hidden} at every level")
    if f.integer("num_feature_levels", 3) != len(decoder_levels):
        f.fail("num_feature_levels", f"len(decoder_in_channels) {len(decoder_levels)}")
    if not f.flag("with_box_refine", True):
        f.fail("with_box_refine", "true (peg_detr's RT-DETR refines its boxes layer by layer)")
    if not f.flag("use_focal_loss", True):
        f.fail("use_focal_loss", "true (peg_detr's RT-DETR scores classes with sigmoids)")
    d_model = f.integer("d_model", 256)
    decoder_heads = f.integer("decoder_attention_heads", 8, max=d_model)
    if d_model % decoder_heads:
        f.fail("decoder_attention_heads", f"a divisor of d_model {d_model}")
    num_classes = hf_num_labels(config, where)
    num_queries = f.integer("num_queries", 300)
    decoder = dict(
        in_channels=decoder_levels, hidden_dim=d_model, num_classes=num_classes, num_queries=num_queries,
        num_layers=f.integer("decoder_layers", 6), num_heads=decoder_heads,
        dim_feedforward=f.integer("decoder_ffn_dim", 1024), dropout=dropout,
        activation=f.choice("decoder_activation_function", "relu", _ACTIVATIONS),
        num_points=f.integer("decoder_n_points", 4), learn_initial_query=f.flag("learn_initial_query", False), **eps,
    )  # fmt: skip
    model = dict(
        num_classes=num_classes, num_queries=num_queries, num_denoising=f.integer("num_denoising", 100, min=0),
        label_noise_ratio=f.number("label_noise_ratio", 0.5, min=0.0, max=1.0),
        box_noise_scale=f.number("box_noise_scale", 1.0, min=0.0), aux_loss=f.flag("auxiliary_loss", True),
    )  # fmt: skip
    return {"backbone": backbone, "encoder": encoder, "decoder": decoder, "model": model}


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
    backbone = ResNetVd(**options["backbone"])
    encoder = HybridEncoder(pos_enc=pos_enc, **options["encoder"], **encoder_options)
    decoder_kw = dict(options["decoder"])
    decoder = RTDETRDecoder(decoder_kw.pop("in_channels"), decoder_kw.pop("hidden_dim"), decoder_kw.pop("num_classes"),
                            **decoder_kw)  # fmt: skip
    model = RTDETR(backbone, encoder, decoder, **options["model"])
    model.build_config = json.loads(json.dumps({"hf_config": config, "pos_enc": pos_enc, **encoder_options}))
    return model


# AIFI's keys: ``save_pretrained`` writes ``model.encoder.encoder.{i}.layers.{j}.{fc1,fc2,self_attn.out_proj}``,
# transformers 5 (and hf_keys) name them ``model.encoder.aifi.{i}.layers.{j}.{mlp.fc1,mlp.fc2,self_attn.o_proj}``.
def rtdetr_hf_to_ours(key: str) -> str | None:
    """peg_detr's RT-DETR key of a Hugging Face ``RTDetrForObjectDetection`` key (file or in-memory name).

    None when the key has no place in ours.
    """
    return encoder_hf_to_ours(key) or decoder_key_from_hf(key)  # either AIFI layout


def rtdetr_ours_to_hf(key: str) -> str | None:
    """The key ``save_pretrained`` writes for one of ours; None for ours only (PEG, learned table, rotary)."""
    if key.startswith("decoder.") or key.startswith("denoising_class_embed."):
        return decoder_key_to_hf(key)
    return encoder_ours_to_hf(key, layout="file")


def _load_rtdetr(model: RTDETR, state: dict[str, Tensor], path: Path, config: dict[str, Any]) -> LoadReport:
    """Copy every mapped tensor; the model keys HF has no counterpart for must be position modules."""
    own = model.state_dict()
    report = LoadReport(source=str(path), args=config)
    mapped: dict[str, Tensor] = {}
    for key, value in state.items():
        ours = rtdetr_hf_to_ours(key)
        if ours is None or ours not in own:
            # e.g. num_batches_tracked of frozen BNs (FrozenBatchNorm2d has none)
            if not key.endswith("num_batches_tracked"):
                report.skipped[key] = "no place in peg_detr's RT-DETR"
            continue
        if value.shape != own[ours].shape:
            raise WeightsError(
                f"key {key} has shape {tuple(value.shape)}, the model's {ours} {tuple(own[ours].shape)} "
                "(config.json does not describe these weights)",
                path,
            )
        mapped[ours] = value
    absent = sorted(own.keys() - mapped.keys())
    added = [k for k in absent if rtdetr_ours_to_hf(k) is None]  # position modules HF does not have
    missing = [k for k in absent if k not in added and not k.endswith("num_batches_tracked")]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise WeightsError(f"Hugging Face weights lack {len(missing)} model keys: {missing[:5]}{more}", path)
    model.load_state_dict(mapped, strict=False)
    report.copied = sorted(mapped)
    why = f"added: not in Hugging Face RT-DETR ({model.encoder.pos_enc}; a PEG starts at zero)"
    report.converted.update(dict.fromkeys(added, why))
    return report


def from_hf(folder: str | os.PathLike, pos_enc: str | None = None) -> tuple[nn.Module, LoadReport]:
    """Build the detector a Hugging Face folder describes and load its weights: ``(model, report)``.

    Args:
        folder: a ``save_pretrained`` folder: ``config.json`` + ``model.safetensors`` or
            ``pytorch_model.bin`` (read with ``weights_only=True``; nothing is downloaded).
        pos_enc: the encoder's position encoding; default the folder's (RT-DETR ``sincos``, DETR
            ``sine``).  For RT-DETR any AIFI encoding (``peg``: zero-initialised, listed under
            ``report.converted``); for DETR any of :data:`peg_detr.models.POS_ENCODINGS`.

    Returns the model in eval mode and a :class:`~peg_core.interop.LoadReport`: ``copied`` (our keys
    loaded), ``converted`` (our keys added at their initialisation), ``skipped`` (file keys left
    out), ``args`` (config.json).

    Raises:
        WeightsError: no folder, no config.json or weights, unreadable files, tensors that do not
            fit the config (key and shapes named).
        ValueError: a ``model_type`` other than ``detr`` / ``rt_detr``, or settings peg_detr lacks.
    """
    path = Path(folder)
    config = read_hf_config(path)
    kind = config.get("model_type")
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path / 'config.json'}: model_type {kind!r} is not supported (expected 'detr' or 'rt_detr')"
        )
    where = path / "config.json"
    if kind == "detr":
        read_hf_state(path)  # every field, and the sizes against the weights, before the model is built
        model, _, _ = build_detr(pos_enc=pos_enc or "sine", **detr_build_options(config, where))
        report = load_official_checkpoint(model, path)
        return model.eval(), report
    pos_enc = pos_enc or "sincos"
    options = rtdetr_build_options(config, pos_enc, where)  # the fields first: one is named before any tensor
    state, weights = read_hf_weights(path)
    _check_rtdetr_weights(config, options, state, where)
    model = rtdetr_from_hf_config(config, pos_enc, where=where)
    report = _load_rtdetr(model, state, weights, config)
    return model.eval(), report


def rtdetr_hf_config(model: RTDETR, id2label: dict[int, str] | None = None) -> dict[str, Any]:
    """An ``RTDetrConfig`` (as config.json's dict) describing ``model``: the inverse of :func:`rtdetr_from_hf_config`.

    For any RT-DETR with the ``sincos`` encoding, built by ``build_rtdetr`` or from a folder; the
    backbone and encoder fields come from :func:`~peg_detr.models.rtdetr.hf_keys.encoder_hf_config`,
    the decoder's from its ``hparams``.  ``id2label``: class names (default ``LABEL_i``).
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
        auxiliary_loss=model.aux_loss,
        id2label={str(i): (id2label or {}).get(i) or f"LABEL_{i}" for i in range(model.num_classes)},
    )  # fmt: skip
    if dec["dropout"] != config.get("dropout", 0.0) or dec["layer_norm_eps"] != config["layer_norm_eps"]:
        raise ValueError(
            "the encoder and decoder differ in dropout / layer-norm eps; one RTDetrConfig holds one value"
        )
    config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    return config


def export_hf_rtdetr(model_or_checkpoint: RTDETR | str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write an RT-DETR with the ``sincos`` encoding as a Hugging Face folder; returns ``out_dir``.

    ``model_or_checkpoint``: an RT-DETR (from :func:`from_hf`, :func:`rtdetr_from_hf_config` or
    ``build_rtdetr``), or a ``peg_detr train`` checkpoint of one (its EMA weights when it has them,
    as ``eval`` reads it).  Writes ``config.json`` (a folder's own ``hf_config``, else
    :func:`rtdetr_hf_config`) and ``model.safetensors`` in ``save_pretrained``'s key names;
    ``RTDetrForObjectDetection.from_pretrained(out_dir)`` then computes what the model computes.
    Other encodings have no place in transformers' RT-DETR and raise a ValueError before anything
    is written.
    """
    model, source, id2label = _resolve_model(model_or_checkpoint)
    cfg = getattr(model, "build_config", None) or {}
    if model.encoder.pos_enc != "sincos":
        raise ValueError(
            f"{source}: pos_enc {model.encoder.pos_enc!r} cannot be exported; transformers' RT-DETR has only 'sincos'"
        )
    # a model from a folder goes back with that folder's config (and the run's class names, when a
    # checkpoint records them); any other is described from its modules
    if isinstance(cfg.get("hf_config"), dict):
        hf_config = _with_label_names(cfg["hf_config"], id2label, model.num_classes)
    else:
        hf_config = rtdetr_hf_config(model, id2label)
    state = {}
    for key, value in model.state_dict().items():
        hf = rtdetr_ours_to_hf(key)
        if hf is None:
            raise ValueError(f"{source}: key {key} has no Hugging Face name")
        state[hf] = value.detach().cpu().contiguous()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {**hf_config, "anchor_image_size": None, "architectures": ["RTDetrForObjectDetection"]}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_state_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _with_label_names(config: dict[str, Any], names: dict[int, str], num_classes: int) -> dict[str, Any]:
    """``config`` with ``id2label`` / ``label2id`` naming label ``i`` ``names[i]`` (else the config's own name)."""
    if not names:
        return config
    own = config.get("id2label") or {}
    id2label = {str(i): names.get(i) or own.get(str(i)) or f"LABEL_{i}" for i in range(num_classes)}
    return {**config, "id2label": id2label, "label2id": {n: int(i) for i, n in id2label.items()}}


def _resolve_model(model_or_checkpoint: RTDETR | str | os.PathLike) -> tuple[RTDETR, str, dict[int, str]]:
    """``(model, its name in messages, class names by id)``; a checkpoint is read as ``eval`` reads it (EMA weights)."""
    if isinstance(model_or_checkpoint, nn.Module):
        return model_or_checkpoint, "model", {}
    from .model import load_model  # here: peg_detr.model builds RT-DETRs through this module

    loaded = load_model(model_or_checkpoint)
    if not isinstance(loaded.model, RTDETR):
        raise ValueError(
            f"{model_or_checkpoint}: not an RT-DETR checkpoint (arch {loaded.config.get('arch')!r})"
        )
    names = {i: name for i, name in enumerate(loaded.classes) if name}
    return loaded.model, str(model_or_checkpoint), names
