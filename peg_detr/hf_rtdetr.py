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
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from peg_core.interop.hf_folder import read_hf_config, read_hf_weights
from peg_core.interop.io import LoadReport, WeightsError, write_state_file

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
    "rtdetr_from_hf_config",
    "rtdetr_hf_config",
    "rtdetr_hf_to_ours",
    "rtdetr_ours_to_hf",
]

SUPPORTED_MODEL_TYPES = ("detr", "rt_detr")
# Stride of each ResNet stage (stage1 .. stage4) without downsample_in_first_stage.
_STAGE_STRIDES = (4, 8, 16, 32)


def _field(config: dict[str, Any], key: str, default: Any = None) -> Any:
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"config.json of an rt_detr model has no {key!r}")
    return value


def _backbone_from_hf(config: dict[str, Any], freeze_bn: bool) -> ResNetVd:
    """The ResNet-vd of an ``RTDetrResNetConfig`` (``backbone_config`` of config.json)."""
    bb = config.get("backbone_config") or {}
    if bb.get("model_type", "rt_detr_resnet") != "rt_detr_resnet" or bb.get("hidden_act", "relu") != "relu":
        raise ValueError(
            f"backbone {bb.get('model_type')!r} with {bb.get('hidden_act')!r}: only the ReLU "
            "rt_detr_resnet (ResNet-vd) backbone is supported"
        )
    layer_type = bb.get("layer_type", "bottleneck")
    first = 2 if bb.get("downsample_in_first_stage", False) else 1
    indices = bb.get("out_indices") or [2, 3, 4]
    return ResNetVd(
        18 if layer_type == "basic" else 50,
        depths=bb.get("depths", (3, 4, 6, 3)),
        widths=bb.get("hidden_sizes", (256, 512, 1024, 2048)),
        stem_width=bb.get("embedding_size", 64),
        layer_type=layer_type,
        out_strides=[_STAGE_STRIDES[i - 1] * first for i in indices],
        freeze_bn=freeze_bn,
        in_channels=bb.get("num_channels", 3),
        downsample_in_first_stage=bool(bb.get("downsample_in_first_stage", False)),
        downsample_in_bottleneck=bool(bb.get("downsample_in_bottleneck", False)),
    )


def hf_num_labels(config: dict[str, Any]) -> int:
    """The class count of a config.json as transformers reads it (``PretrainedConfig.num_labels``).

    ``len(id2label)`` when the file has one (it wins over a ``num_labels`` key); otherwise
    ``num_labels``; otherwise 2, transformers' default, which ``save_pretrained`` does not write:
    the folder of a default ``RTDetrConfig()`` has neither key and 2-class heads.
    """
    id2label = config.get("id2label")
    if id2label is not None:
        if not isinstance(id2label, dict) or not id2label:
            raise ValueError(f"config.json's id2label must be a non-empty object; got {id2label!r}")
        return len(id2label)
    num_labels = config.get("num_labels")
    if num_labels is None:
        return 2
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ValueError(f"config.json's num_labels must be a positive integer; got {num_labels!r}")
    return num_labels


def hf_label_names(config: dict[str, Any]) -> list[str] | None:
    """``names[label]`` of a config.json's ``id2label`` (keys ``"0"`` .. ``"n-1"``); None without one.

    A ValueError when the keys are not the labels ``0 .. n-1``.
    """
    id2label = config.get("id2label")
    if id2label is None:
        return None
    hf_num_labels(config)  # a non-empty object
    try:
        by_label = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        raise ValueError(
            f"config.json's id2label keys must be integers; got {sorted(id2label)[:5]}"
        ) from None
    if sorted(by_label) != list(range(len(by_label))):
        raise ValueError(
            f"config.json's id2label keys must be 0..{len(by_label) - 1}; got {sorted(by_label)[:5]}..."
        )
    return [by_label[k] for k in range(len(by_label))]


# The encoder proposals' classifier, ``(num_labels, d_model)``; every decoder layer's has the same width.
_CLASS_KEY = "model.enc_score_head.weight"


def _check_num_labels(config: dict[str, Any], state: dict[str, Tensor], path: Path) -> None:
    """A one-line WeightsError when the config's class count is not the weights' classifier width."""
    weight = state.get(_CLASS_KEY)
    num_classes = hf_num_labels(config)
    if weight is not None and weight.shape[0] != num_classes:
        source = next((k for k in ("id2label", "num_labels") if config.get(k) is not None), "default")
        raise WeightsError(
            f"key {_CLASS_KEY} has shape {tuple(weight.shape)}, config.json's {source} gives {num_classes} "
            f"classes (expected shape {(num_classes, *weight.shape[1:])})",
            path,
        )


def _check_rtdetr_config(config: dict[str, Any], backbone_channels: list[int]) -> None:
    """The config.json settings peg_detr's RT-DETR does not have: a ValueError naming the field."""
    levels = list(_field(config, "decoder_in_channels", (256, 256, 256)))
    problems = [
        (list(config.get("encoder_in_channels", backbone_channels)) != backbone_channels,
         f"encoder_in_channels {config.get('encoder_in_channels')} != the backbone's {backbone_channels}"),
        (config.get("num_feature_levels", 3) != len(levels),
         f"num_feature_levels {config.get('num_feature_levels')} != len(decoder_in_channels) {len(levels)}"),
        (levels != [config.get("encoder_hidden_dim", 256)] * len(levels),
         f"decoder_in_channels {levels} != the encoder's width {config.get('encoder_hidden_dim', 256)}"),
        (not config.get("with_box_refine", True), "with_box_refine=false"),
        (not config.get("use_focal_loss", True), "use_focal_loss=false (softmax classes)"),
    ]  # fmt: skip
    bad = [why for failed, why in problems if failed]
    if bad:
        raise ValueError(f"unsupported rt_detr config.json: {'; '.join(bad)}")


def rtdetr_from_hf_config(config: dict[str, Any], pos_enc: str = "sincos", **encoder_options: Any) -> RTDETR:
    """peg_detr's RT-DETR with the sizes of an ``RTDetrConfig`` (config.json as a dict); random weights.

    ``pos_enc`` is AIFI's encoding (``sincos`` is transformers'); ``encoder_options`` go to
    :class:`HybridEncoder` (PEG options).  The model's ``build_config`` is
    ``{"hf_config": config, "pos_enc": pos_enc, **encoder_options}``.
    """
    backbone = _backbone_from_hf(config, bool(config.get("freeze_backbone_batch_norms", True)))
    _check_rtdetr_config(config, backbone.out_channels)
    eps = {
        "layer_norm_eps": config.get("layer_norm_eps", 1e-5),
        "batch_norm_eps": config.get("batch_norm_eps", 1e-5),
    }
    encoder = HybridEncoder(
        backbone.out_channels, config.get("encoder_hidden_dim", 256), num_heads=config.get("encoder_attention_heads", 8),
        dim_feedforward=config.get("encoder_ffn_dim", 1024), dropout=config.get("dropout", 0.0),
        act=config.get("encoder_activation_function", "gelu"), conv_act=config.get("activation_function", "silu"),
        expansion=config.get("hidden_expansion", 1.0), num_layers=config.get("encoder_layers", 1),
        use_encoder_idx=config.get("encode_proj_layers", (2,)), pos_enc=pos_enc,
        temperature=config.get("positional_encoding_temperature", 10000),
        normalize_before=config.get("normalize_before", False), **eps, **encoder_options,
    )  # fmt: skip
    num_classes = hf_num_labels(config)
    num_queries = config.get("num_queries", 300)
    decoder = RTDETRDecoder(
        config.get("decoder_in_channels", (256, 256, 256)), config.get("d_model", 256), num_classes,
        num_queries=num_queries, num_layers=config.get("decoder_layers", 6),
        num_heads=config.get("decoder_attention_heads", 8), dim_feedforward=config.get("decoder_ffn_dim", 1024),
        dropout=config.get("dropout", 0.0), activation=config.get("decoder_activation_function", "relu"),
        num_points=config.get("decoder_n_points", 4), learn_initial_query=config.get("learn_initial_query", False),
        **eps,
    )  # fmt: skip
    model = RTDETR(
        backbone, encoder, decoder, num_classes=num_classes, num_queries=num_queries,
        num_denoising=config.get("num_denoising", 100), label_noise_ratio=config.get("label_noise_ratio", 0.5),
        box_noise_scale=config.get("box_noise_scale", 1.0), aux_loss=config.get("auxiliary_loss", True),
    )  # fmt: skip
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
    if kind == "detr":
        model = _detr_from_config(config, pos_enc or "sine")
        report = load_official_checkpoint(model, path)
        return model.eval(), report
    state, weights = read_hf_weights(path)
    _check_num_labels(config, state, weights)
    model = rtdetr_from_hf_config(config, pos_enc or "sincos")
    report = _load_rtdetr(model, state, weights, config)
    return model.eval(), report


def _detr_from_config(config: dict[str, Any], pos_enc: str) -> nn.Module:
    """:func:`build_detr` with the sizes of a ``DetrConfig`` (timm ResNet backbones)."""
    heads = config.get("encoder_attention_heads", 8)
    model, _, _ = build_detr(
        config.get("backbone", "resnet50"), pos_enc, num_classes=hf_num_labels(config),
        num_queries=config.get("num_queries", 100), dilation=bool(config.get("dilation", False)),
        hidden_dim=config.get("d_model", 256), num_heads=heads, enc_layers=config.get("encoder_layers", 6),
        dec_layers=config.get("decoder_layers", 6), dim_feedforward=config.get("encoder_ffn_dim", 2048),
        dropout=config.get("dropout", 0.1),
    )  # fmt: skip
    return model


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
