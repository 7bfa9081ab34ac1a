"""transformers' HGNetV2 (the backbone of ``DFineForObjectDetection`` / ``Deimv2ForObjectDetection``) <-> ours.

Ours is :class:`peg_detr.models.dfine.backbone.HGNetv2Backbone`, built from timm's modules, so its
keys are timm's.  transformers' ``HGNetV2Backbone`` has the same tree under other names; the map,
:data:`HGNETV2_KEYS`, is :mod:`peg_core.interop.keymap` rows generated from the modules that hold a
convolution and the tensors each holds (``conv1`` / ``conv2`` of a light layer are left alone):

=====================================  ============================  ==========================
Hugging Face                           ours                          what
=====================================  ============================  ==========================
``embedder.``                          ``stem.``                     the stem (``stem1`` .. ``stem4``)
``encoder.stages.{s}.``                ``stages.{s}.``               ``downsample``, ``blocks.{b}``
``*.convolution.*``                    ``*.conv.*``                  every convolution
``*.normalization.*``                  ``*.bn.*``                    every batch norm
``*.lab.{scale,bias}``                 the same                      learnable affine blocks
=====================================  ============================  ==========================

Inside a detector the backbone's keys carry ``model.backbone.model.`` (D-FINE and DEIMv2);
:func:`hgnetv2_hf_to_ours` accepts them with that prefix or bare (a standalone
``HGNetV2Backbone``), and returns ours relative to the backbone module (the detector adds its own
``backbone.``).  :func:`hgnetv2_options_from_hf` reads a ``backbone_config`` (``HGNetV2Config``) into
:func:`~peg_detr.models.dfine.backbone.build_hgnetv2` keywords; :func:`hgnetv2_hf_config` writes
one back.  :func:`check_hidden_sizes` checks ``hidden_sizes`` where transformers reads it: the
widths of the stages the detector takes (the input projections are sized by them), never a stage
it leaves out (the default ``HGNetV2Config`` says 256 for stage 1, whose output is 128 wide and unused).

What timm's modules cannot express, refused with a ``ValueError`` by
:func:`hgnetv2_options_from_hf`: ``hidden_act`` other than ReLU (transformers applies it to the
stem alone and keeps ReLU in the stages; ours, like DEIMv2's ``act``, changes every layer), stem
strides other
than ``(2, 1, 1, 2, 1)`` (timm's stem fixes them), a downsampling stride other than 2 (timm's
depthwise conv pads ``(stride - 1 + 2) // 2``, HF pads 1: the same only for strides 1 and 2; 2 is
what every published config uses), and the stem output as a returned feature (``out_indices``
holding 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peg_core.interop.hf_folder import ConfigFields
from peg_core.interop.keymap import KeyMap, Rename

from ..models.dfine.backbone import HGNETV2_BACKBONES

__all__ = [
    "HF_BACKBONE_PREFIX",
    "HGNETV2_KEYS",
    "hgnetv2_hf_config",
    "hgnetv2_hf_to_ours",
    "hgnetv2_options_from_hf",
    "hgnetv2_ours_to_hf",
]

#: Where a detector (``DFineForObjectDetection``, ``Deimv2ForObjectDetection``) keeps its HGNetV2.
HF_BACKBONE_PREFIX = "model.backbone.model."

#: the modules holding a convolution (+ norm, + learnable affine block): (Hugging Face, ours) below the
#: backbone; the stem's by name, a stage's by its place (a light layer's ``conv1`` / ``conv2`` keep theirs)
_MODULES = (
    *((f"embedder.{stem}.", f"stem.{stem}.") for stem in ("stem1", "stem2a", "stem2b", "stem3", "stem4")),
    *((f"encoder.stages.{{s}}.{m}", f"stages.{{s}}.{m}")
      for m in ("downsample.", "blocks.{b}.aggregation.{a}.", "blocks.{b}.layers.{l}.conv{c}.", "blocks.{b}.layers.{l}.")),
)  # fmt: skip
#: each module's tensors: (Hugging Face, ours); whole keys, so a key with another leaf is none of the backbone's
_LEAVES = (
    ("convolution.weight", "conv.weight"),
    *((f"normalization.{leaf}", f"bn.{leaf}")
      for leaf in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")),
    ("lab.scale", "lab.scale"), ("lab.bias", "lab.bias"),
)  # fmt: skip
#: transformers' ``HGNetV2Backbone`` <-> ours (timm's names), both relative to the backbone module
HGNETV2_KEYS = KeyMap(
    Rename(hf + leaf, ours + our_leaf) for hf, ours in _MODULES for leaf, our_leaf in _LEAVES
)


def hgnetv2_hf_to_ours(key: str) -> str | None:
    """A transformers HGNetV2 key -> ours (relative to the backbone module), or None if it is not one.

    ``"model.backbone.model.encoder.stages.2.blocks.0.layers.1.conv1.convolution.weight"`` and
    the bare ``"encoder.stages.2..."`` both give ``"stages.2.blocks.0.layers.1.conv1.conv.weight"``;
    ``"model.backbone.model.embedder.stem1.normalization.running_mean"`` gives
    ``"stem.stem1.bn.running_mean"``.  Keys of the rest of a detector (``model.encoder.*``,
    ``model.decoder.*``, ...) give None (:data:`HGNETV2_KEYS`).
    """
    return HGNETV2_KEYS.to_ours(key.removeprefix(HF_BACKBONE_PREFIX))


def hgnetv2_ours_to_hf(key: str, prefix: str = HF_BACKBONE_PREFIX) -> str | None:
    """Our backbone key -> transformers', under ``prefix`` (``""`` for a bare ``HGNetV2Backbone``).

    The inverse of :func:`hgnetv2_hf_to_ours`; None for a key that is not one of the backbone's.
    """
    hf = HGNETV2_KEYS.to_hf(key)
    return None if hf is None else prefix + hf


def _field(config: Mapping[str, Any], name: str, default: Any) -> Any:
    value = config.get(name, default)
    return default if value is None else value


# HGNetV2Config's defaults, for a config.json that leaves a field out.
_HF_DEFAULTS: dict[str, Any] = {
    "num_channels": 3,
    "hidden_act": "relu",
    "stem_channels": [3, 32, 48],
    "stem_strides": [2, 1, 1, 2, 1],
    "stage_in_channels": [48, 128, 512, 1024],
    "stage_mid_channels": [48, 96, 192, 384],
    "stage_out_channels": [128, 512, 1024, 2048],
    "stage_num_blocks": [1, 1, 3, 1],
    "stage_downsample": [False, True, True, True],
    "stage_downsample_strides": [2, 2, 2, 2],
    "stage_light_block": [False, False, True, True],
    "stage_kernel_size": [3, 3, 5, 5],
    "stage_numb_of_layers": [6, 6, 6, 6],
    "use_learnable_affine_block": False,
}
_STAGE_FIELDS = (
    "stage_in_channels",
    "stage_mid_channels",
    "stage_out_channels",
    "stage_num_blocks",
    "stage_downsample",
    "stage_light_block",
    "stage_kernel_size",
    "stage_numb_of_layers",
)


def _hf_return_idx(config: Mapping[str, Any], num_stages: int) -> list[int]:
    """HF ``out_indices`` (0 = stem, ``s + 1`` = stage ``s``; or ``out_features`` names) -> our ``return_idx``."""
    names = ["stem"] + [f"stage{i}" for i in range(1, num_stages + 1)]
    out_indices = config.get("out_indices") or config.get("_out_indices")
    if not out_indices:
        features = config.get("out_features") or config.get("_out_features")
        if features:
            unknown = [f for f in features if f not in names]
            if unknown:
                raise ValueError(f"HGNetV2 config: unknown out_features {unknown}; stages are {names}")
            out_indices = [names.index(f) for f in features]
        else:
            out_indices = [2, 3, 4]  # D-FINE's / DEIMv2's default for their backbone_config
    out_indices = [int(i) % len(names) for i in out_indices]  # HF allows negative indices
    if 0 in out_indices:
        raise ValueError("HGNetV2 config: the stem output as a feature map (out_indices 0) is not supported")
    return [i - 1 for i in out_indices]


def check_hidden_sizes(bb: ConfigFields, widths: list[int], return_idx: list[int]) -> None:
    """``backbone_config.hidden_sizes`` against the stage widths ``widths`` (``stage_out_channels``),
    at the stages the detector takes (0-based ``return_idx``) only.

    transformers' ``HGNetV2Backbone.channels`` (what sizes the encoder's input projections) are
    ``hidden_sizes`` at the output stages; a stage that is no output never reads its entry.  A
    :class:`~peg_core.interop.WeightsError` names the entry that differs and the width it must be.
    """
    sizes = bb.integers("hidden_sizes", widths, length=len(widths))
    for i in return_idx:
        if sizes[i] != widths[i]:
            outputs = {f"stage{j + 1}": widths[j] for j in return_idx}
            bb.fail("hidden_sizes", f"the widths of the output stages {outputs} (stage_out_channels) at "
                    f"index {i}, where it has {sizes[i]}")  # fmt: skip


def hgnetv2_options_from_hf(backbone_config: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """An ``HGNetV2Config`` (dict, as in a detector's ``config.json``) -> ``(name, build_hgnetv2 options)``.

    ``name`` is the preset (``"hgnetv2_b4"``, ...) whose layout and ``use_lab`` equal the config's,
    or None for any other layout (a small test config, DEIMv2's Atto / Femto / Pico).  The options
    are ``stem_channels``, ``stages``, ``use_lab``, ``return_idx`` and ``in_channels``; the caller
    adds ``freeze_bn`` (the detector's ``freeze_backbone_batch_norms``) and ``freeze_at``.  So
    ``build_hgnetv2(name, **options, freeze_bn=...)`` builds the backbone.

    Raises ``ValueError`` for what timm's modules cannot express (see the module docstring) or
    for inconsistent stage lists.
    """
    cfg = {k: _field(backbone_config, k, v) for k, v in _HF_DEFAULTS.items()}
    if str(cfg["hidden_act"]).lower() != "relu":
        raise ValueError(
            f"HGNetV2 config: hidden_act {cfg['hidden_act']!r} is not supported: transformers applies it "
            "to the stem only (its stage layers keep ReLU), a mix no HGNetv2 release uses; ours takes ReLU, "
            "or one activation everywhere (DEIMv2's act)"
        )
    if [int(s) for s in cfg["stem_strides"]] != [2, 1, 1, 2, 1]:
        raise ValueError(
            f"HGNetV2 config: stem_strides {list(cfg['stem_strides'])} are not supported "
            "(timm's HGNetv2 stem strides (2, 1, 1, 2, 1))"
        )
    stem = [int(c) for c in cfg["stem_channels"]]
    if len(stem) != 3:
        raise ValueError(f"HGNetV2 config: stem_channels must be [in, mid, out]; got {stem}")
    if stem[0] != int(cfg["num_channels"]):
        raise ValueError(f"HGNetV2 config: stem_channels[0]={stem[0]} but num_channels={cfg['num_channels']}")
    lists = [list(cfg[f]) for f in _STAGE_FIELDS]
    if len({len(v) for v in lists}) != 1:
        raise ValueError(
            "HGNetV2 config: the stage_* lists differ in length: "
            + ", ".join(f"{f}={len(v)}" for f, v in zip(_STAGE_FIELDS, lists))
        )
    num_stages = len(lists[0])
    strides = list(cfg["stage_downsample_strides"])
    if len(strides) < num_stages:
        raise ValueError(f"HGNetV2 config: {len(strides)} stage_downsample_strides for {num_stages} stages")
    stages = []
    for s, (cin, mid, cout, blocks, down, light, k, layers) in enumerate(zip(*lists)):
        if down and int(strides[s]) != 2:
            raise ValueError(
                f"HGNetV2 config: stage {s} downsamples with stride {strides[s]}; only 2 is supported "
                "(timm's depthwise conv pads differently from transformers' for strides above 2)"
            )
        stages.append(
            [int(cin), int(mid), int(cout), int(blocks), bool(down), bool(light), int(k), int(layers)]
        )
    use_lab = bool(cfg["use_learnable_affine_block"])
    options = {
        "stem_channels": stem[1:],
        "stages": stages,
        "use_lab": use_lab,
        "return_idx": _hf_return_idx(backbone_config, num_stages),
        "in_channels": stem[0],
    }
    name = None
    for preset, spec in HGNETV2_BACKBONES.items():
        if (
            list(spec["stem_channels"]) == options["stem_channels"]
            and [list(x) for x in spec["stages"]] == stages
            and spec["use_lab"] == use_lab
        ):
            name = preset
            break
    return name, options


def hgnetv2_hf_config(build_options: Mapping[str, Any]) -> dict[str, Any]:
    """Our backbone's ``build_options`` -> the ``backbone_config`` dict of an HF detector (``model_type: hgnet_v2``).

    The inverse of :func:`hgnetv2_options_from_hf` on the layout; the freezing options are the
    detector config's (``freeze_backbone_batch_norms``), not the backbone config's.  A backbone
    with another activation than ReLU has no transformers config (``ValueError``).
    """
    if build_options.get("act", "relu") != "relu":
        raise ValueError(
            f"an HGNetv2 with act={build_options['act']!r} has no transformers config (its hidden_act "
            "changes the stem only)"
        )
    stages = [list(s) for s in build_options["stages"]]
    cols = list(zip(*stages))
    in_channels = int(build_options.get("in_channels", 3))
    n = len(stages)
    return {
        "model_type": "hgnet_v2",
        "num_channels": in_channels,
        "hidden_act": "relu",
        "stem_channels": [in_channels, *(int(c) for c in build_options["stem_channels"])],
        "stem_strides": [2, 1, 1, 2, 1],
        "stage_in_channels": list(cols[0]),
        "stage_mid_channels": list(cols[1]),
        "stage_out_channels": list(cols[2]),
        "stage_num_blocks": list(cols[3]),
        "stage_downsample": [bool(v) for v in cols[4]],
        "stage_downsample_strides": [2] * n,
        "stage_light_block": [bool(v) for v in cols[5]],
        "stage_kernel_size": list(cols[6]),
        "stage_numb_of_layers": list(cols[7]),
        "use_learnable_affine_block": bool(build_options["use_lab"]),
        # HF's bookkeeping fields (stage_names, channels of BackboneMixin) follow from these.
        "depths": list(cols[3]),
        "hidden_sizes": list(cols[2]),
        "embedding_size": int(build_options["stem_channels"][1]),
        "out_features": [f"stage{i + 1}" for i in build_options["return_idx"]],
        "out_indices": [i + 1 for i in build_options["return_idx"]],
    }
