"""transformers' ``RTDetrForObjectDetection`` state-dict keys <-> peg_detr's RT-DETR keys.

Our modules keep HF's names below three prefixes, so the mapping is a prefix map
(:data:`ENCODER_HF_PREFIXES`), the same in both directions.  Our keys are those of the detector
``RTDETR`` with its ``backbone`` (:class:`~peg_detr.models.rtdetr.backbone.ResNetVd`) and
``encoder`` (:class:`~peg_detr.models.rtdetr.encoder.HybridEncoder`) attributes:

=====================================  ===========================  =====================================
HF key prefix                          ours                         what
=====================================  ===========================  =====================================
``model.backbone.model.``              ``backbone.``                ResNet-vd: ``embedder.embedder.{0,1,2}``
                                                                    (the D stem), ``encoder.stages.{s}``
                                                                    ``.layers.{b}.{layer,shortcut}``
``model.encoder_input_proj.``          ``encoder.input_proj.``      per level ``{l}.0`` 1×1 conv, ``{l}.1`` BN
``model.encoder.``                     ``encoder.``                 ``aifi.{i}.layers.{j}.*``,
                                                                    ``lateral_convs``, ``fpn_blocks``,
                                                                    ``downsample_convs``, ``pan_blocks``
=====================================  ===========================  =====================================

HF has two names for AIFI's weights: the module names above (transformers 5, in memory) and the
names its files use (transformers 4, which 5's ``save_pretrained`` still writes and
``from_pretrained`` converts): ``model.encoder.encoder.{i}.layers.{j}.`` instead of
``model.encoder.aifi.{i}.layers.{j}.``, with ``fc1`` / ``fc2`` / ``self_attn.out_proj`` for
``mlp.fc1`` / ``mlp.fc2`` / ``self_attn.o_proj``.  HF -> ours accepts both; ours -> HF writes
``layout="memory"`` (default) or ``layout="file"``.

Keys of ours with no HF counterpart (the map returns None for them): the position modules of
the non-``sincos`` encoders, ``encoder.aifi.{i}.pegs.*`` (``peg``), ``encoder.aifi.{i}.pos.pos_embed``
(``learned``), ``encoder.aifi.{i}.rope.freqs`` (``rope-mixed``).  HF's ``sincos`` table is not in
its state dict either, so an HF checkpoint loads into any of our encodings; the extra modules
keep their initialisation (the PEG: zero, so ``peg`` then computes what ``none`` computes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backbone import ResNetVd
    from .encoder import HybridEncoder

__all__ = [
    "DECODER_PREFIXES",
    "ENCODER_HF_PREFIXES",
    "backbone_kwargs_from_hf",
    "decoder_hf_keys",
    "decoder_key_from_hf",
    "decoder_key_to_hf",
    "encoder_hf_config",
    "encoder_hf_keys",
    "encoder_hf_to_ours",
    "encoder_kwargs_from_hf",
    "encoder_ours_to_hf",
]

#: ``(HF prefix, our prefix)`` pairs for the backbone, the encoder input projections and the encoder.
ENCODER_HF_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.backbone.model.", "backbone."),
    ("model.encoder_input_proj.", "encoder.input_proj."),
    ("model.encoder.", "encoder."),
)

# Our keys of position modules that HF does not have (the map leaves them out).
_OURS_ONLY = (".pegs.", ".pos.", ".rope.")
# AIFI in HF files vs in memory: the prefix, then the renamed modules inside a layer.
_AIFI_FILE, _AIFI_MEMORY = "model.encoder.encoder.", "model.encoder.aifi."
_AIFI_RENAMES = (
    (".fc1.", ".mlp.fc1."),
    (".fc2.", ".mlp.fc2."),
    (".self_attn.out_proj.", ".self_attn.o_proj."),
)
LAYOUTS = ("memory", "file")


def _aifi_layout(key: str, to_file: bool) -> str:
    """An HF AIFI key in the file (``to_file``) or the memory layout; other keys unchanged."""
    src, dst = (_AIFI_MEMORY, _AIFI_FILE) if to_file else (_AIFI_FILE, _AIFI_MEMORY)
    if not key.startswith(src):
        return key
    key = dst + key[len(src) :]
    for file, memory in _AIFI_RENAMES:
        key = key.replace(memory, file) if to_file else key.replace(file, memory)
    return key


def encoder_hf_to_ours(key: str) -> str | None:
    """Our key for an HF backbone / input-projection / encoder key (either layout); None for other keys."""
    key = _aifi_layout(key, to_file=False)
    for hf, ours in ENCODER_HF_PREFIXES:
        if key.startswith(hf):
            return ours + key[len(hf) :]
    return None


def encoder_ours_to_hf(key: str, *, layout: str = "memory") -> str | None:
    """The HF key (``layout`` ``memory`` / ``file``) for one of our backbone / encoder keys.

    None for other keys and for our position modules.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    if key.startswith("encoder.aifi.") and any(part in key for part in _OURS_ONLY):
        return None
    # The longer of our prefixes first: "encoder.input_proj." also starts with "encoder.".
    for hf, ours in sorted(ENCODER_HF_PREFIXES, key=lambda p: -len(p[1])):
        if key.startswith(ours):
            return _aifi_layout(hf + key[len(ours) :], to_file=layout == "file")
    return None


def encoder_hf_keys(keys: Iterable[str], *, to_hf: bool = False, layout: str = "memory") -> dict[str, str]:
    """``{source key: target key}`` for the backbone + encoder keys among ``keys`` (others left out).

    ``to_hf=False`` maps HF keys (either layout) to ours, ``to_hf=True`` ours to HF ``layout``.
    """
    out = {}
    for key in keys:
        target = encoder_ours_to_hf(key, layout=layout) if to_hf else encoder_hf_to_ours(key)
        if target is not None:
            out[key] = target
    return out


# ---------------------------------------------------------------- decoder side (rtdetr-decoder)
# Denoising embedding, query selection, decoder layers and heads.  Renamed by prefix; inside a
# layer the names are transformers' file names (transformers 5 keeps ``mlp.fc1`` /
# ``self_attn.o_proj`` in memory and writes ``fc1`` / ``self_attn.out_proj``; both are read).

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
# transformers 5's in-memory names inside a decoder layer -> the names of its files (and ours)
_IN_MEMORY = ((".mlp.fc1.", ".fc1."), (".mlp.fc2.", ".fc2."), (".self_attn.o_proj.", ".self_attn.out_proj."))


def decoder_hf_keys() -> tuple[tuple[str, str], ...]:
    """The ``(Hugging Face prefix, peg_detr prefix)`` pairs of the decoder side."""
    return DECODER_PREFIXES


def decoder_key_from_hf(key: str) -> str | None:
    """A Hugging Face key of the decoder side in ``peg_detr`` names; None for other keys."""
    for hf, ours in DECODER_PREFIXES:
        if key.startswith(hf):
            new = ours + key.removeprefix(hf)
            for memory, file in _IN_MEMORY:
                new = new.replace(memory, file)
            return new
    return None


def decoder_key_to_hf(key: str) -> str | None:
    """A ``peg_detr`` key of the decoder side in the names ``save_pretrained`` writes; None for other keys."""
    for hf, ours in DECODER_PREFIXES:
        if key.startswith(ours):
            return hf + key.removeprefix(ours)
    return None


# HF stage names -> the stage's output stride (doubled by downsample_in_first_stage).
_STAGE_STRIDES = {"stage1": 4, "stage2": 8, "stage3": 16, "stage4": 32}


def _get(config: Mapping[str, Any], key: str, default: Any, where: str) -> Any:
    value = config.get(key, default)
    if value is None and default is not None:
        raise ValueError(f"{where}: {key!r} is null; expected a value like {default!r}")
    return value


def backbone_kwargs_from_hf(config: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`~peg_detr.models.rtdetr.backbone.ResNetVd` keywords for an HF RT-DETR ``config.json`` dict.

    Reads ``backbone_config`` (``layer_type``, ``depths``, ``hidden_sizes``, ``embedding_size``,
    ``out_features``, ``downsample_in_first_stage``, ``downsample_in_bottleneck``) and
    ``freeze_backbone_batch_norms``.  ValueError for what ResNetVd cannot be (another backbone
    type, a non-ReLU activation, other than 3 input channels).
    """
    bb = config.get("backbone_config") or {}
    where = "config.json backbone_config"
    if bb.get("model_type", "rt_detr_resnet") != "rt_detr_resnet" or config.get("use_timm_backbone"):
        raise ValueError(
            f"{where}: model_type {bb.get('model_type')!r}; only 'rt_detr_resnet' (ResNet-vd) is supported"
        )
    if _get(bb, "hidden_act", "relu", where) != "relu" or _get(bb, "num_channels", 3, where) != 3:
        raise ValueError(f"{where}: hidden_act={bb.get('hidden_act')!r}, num_channels={bb.get('num_channels')!r}; "
                         "ResNet-vd is ReLU on 3-channel images")  # fmt: skip
    layer_type = _get(bb, "layer_type", "bottleneck", where)
    first = bool(_get(bb, "downsample_in_first_stage", False, where))
    features = _get(bb, "out_features", ["stage2", "stage3", "stage4"], where)
    unknown = [f for f in features if f not in _STAGE_STRIDES]
    if unknown:
        raise ValueError(
            f"{where}: out_features {unknown} are not stages of ResNet-vd ({sorted(_STAGE_STRIDES)})"
        )
    return {
        "depth": 18 if layer_type == "basic" else 50,  # only the defaults; everything is given below
        "layer_type": layer_type,
        "depths": [int(d) for d in _get(bb, "depths", [3, 4, 6, 3], where)],
        "widths": [int(w) for w in _get(bb, "hidden_sizes", [256, 512, 1024, 2048], where)],
        "stem_width": int(_get(bb, "embedding_size", 64, where)),
        "out_strides": [_STAGE_STRIDES[f] * (2 if first else 1) for f in features],
        "freeze_bn": bool(config.get("freeze_backbone_batch_norms", True)),
        "downsample_in_first_stage": first,
        "downsample_in_bottleneck": bool(_get(bb, "downsample_in_bottleneck", False, where)),
    }


#: HybridEncoder keyword <- HF RTDetrConfig field (and its HF default).
_ENCODER_FIELDS: dict[str, tuple[str, Any]] = {
    "in_channels": ("encoder_in_channels", [512, 1024, 2048]),
    "hidden_dim": ("encoder_hidden_dim", 256),
    "num_heads": ("encoder_attention_heads", 8),
    "dim_feedforward": ("encoder_ffn_dim", 1024),
    "dropout": ("dropout", 0.0),
    "act": ("encoder_activation_function", "gelu"),
    "conv_act": ("activation_function", "silu"),
    "expansion": ("hidden_expansion", 1.0),
    "num_layers": ("encoder_layers", 1),
    "use_encoder_idx": ("encode_proj_layers", [2]),
    "temperature": ("positional_encoding_temperature", 10000),
    "normalize_before": ("normalize_before", False),
    "layer_norm_eps": ("layer_norm_eps", 1e-5),
    "batch_norm_eps": ("batch_norm_eps", 1e-5),
}


def encoder_kwargs_from_hf(config: Mapping[str, Any], pos_enc: str = "sincos") -> dict[str, Any]:
    """:class:`~peg_detr.models.rtdetr.encoder.HybridEncoder` keywords for an HF RT-DETR ``config.json`` dict.

    ``pos_enc`` is ours to choose (HF's encoder is ``sincos``; ``peg`` adds a zero PEG).  HF's
    ``eval_size`` is not carried over: our ``sincos`` table is computed for the actual size in
    training and evaluation alike (HF's AIFI drops the table in eval mode when ``eval_size`` is set).
    """
    kwargs = {
        ours: _get(config, hf, default, "config.json") for ours, (hf, default) in _ENCODER_FIELDS.items()
    }
    kwargs["in_channels"] = [int(c) for c in kwargs["in_channels"]]
    kwargs["use_encoder_idx"] = [int(i) for i in kwargs["use_encoder_idx"]]
    kwargs["pos_enc"] = pos_enc
    return kwargs


def encoder_hf_config(backbone: ResNetVd, encoder: HybridEncoder) -> dict[str, Any]:
    """The HF ``config.json`` fields of a backbone + encoder (for export-hf).

    The inverse of :func:`backbone_kwargs_from_hf` / :func:`encoder_kwargs_from_hf` on the fields
    they read: ``{"backbone_config": {...}, "freeze_backbone_batch_norms": ..., "encoder_*": ...}``.
    ValueError for a non-``sincos`` encoder (HF's has no PEG, learned table or rotary encoding).
    """
    if encoder.pos_enc != "sincos":
        raise ValueError(f"HF's RT-DETR encoder is sincos; this encoder has pos_enc={encoder.pos_enc!r}")
    first = backbone.downsample_in_first_stage
    names = {s * (2 if first else 1): n for n, s in _STAGE_STRIDES.items()}
    backbone_config = {
        "model_type": "rt_detr_resnet",
        "layer_type": backbone.layer_type,
        "depths": list(backbone.depths),
        "hidden_sizes": list(backbone.widths),
        "embedding_size": backbone.stem_width,
        "hidden_act": "relu",
        "num_channels": 3,
        "out_features": [names[s] for s in backbone.out_strides],
        "downsample_in_first_stage": first,
        "downsample_in_bottleneck": backbone.downsample_in_bottleneck,
    }
    out: dict[str, Any] = {
        "backbone_config": backbone_config,
        "freeze_backbone_batch_norms": backbone.freeze_bn,
    }
    for ours, (hf, _) in _ENCODER_FIELDS.items():
        out[hf] = encoder.hparams[ours]
    temperature = out["positional_encoding_temperature"]
    if isinstance(temperature, float) and temperature.is_integer():
        out["positional_encoding_temperature"] = int(temperature)  # RTDetrConfig validates an int
    return out
