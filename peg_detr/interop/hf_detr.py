"""Hugging Face DETR folders: the key mapping to the official DETR layout, the config, and the way back.

A Hugging Face ``DetrForObjectDetection`` (timm ResNet backbone, e.g.
``facebook/detr-resnet-50``) holds the same tensors as an official DETR
checkpoint under other names, with each attention's input projection split in
three:

==============================================  =============================================
Hugging Face                                    official DETR / ``peg_detr``
==============================================  =============================================
``model.backbone.conv_encoder.model.X``         ``backbone.0.body.X`` (timm and torchvision
(files; ``model.backbone.model.X`` in memory)   ResNets share ``conv1``, ``layer1.0.bn2``,
                                                ``downsample.0/1`` ...; frozen-BN buffers)
``model.input_projection``                      ``input_proj``
``model.query_position_embeddings``             ``query_embed``
``...self_attn.{q,k,v}_proj``                   ``...self_attn.in_proj_{weight,bias}`` (q;k;v)
``...out_proj`` (in memory: ``o_proj``)          ``...out_proj``
``model.decoder.layers.i.encoder_attn``         ``transformer.decoder.layers.i.multihead_attn``
``fc1`` / ``fc2`` (in memory: ``mlp.fc1/fc2``)  ``linear1`` / ``linear2``
encoder ``self_attn_layer_norm/final_layer_norm``  ``norm1`` / ``norm2``
decoder ``self_attn_layer_norm/encoder_attn_layer_norm/final_layer_norm``  ``norm1/2/3``
``model.decoder.layernorm``                     ``transformer.decoder.norm``
``class_labels_classifier`` / ``bbox_predictor``  ``class_embed`` / ``bbox_embed``
==============================================  =============================================

A folder with transformers' own ResNet (``backbone_config.model_type: "resnet"``, written by
``DetrConfig(use_timm_backbone=False)``) holds the same torchvision-layout ResNet under
transformers' names, mapped by :func:`hf_resnet_to_official` (a ResNet-18 / 50 / 101 config:
``embedding_size`` 64, ReLU, the stride in the 3x3 convolution; its last stage is the one DETR reads):

==============================================================  ========================================
``...embedder.embedder.{convolution,normalization}``            ``conv1`` / ``bn1``
``...encoder.stages.{s}.layers.{i}.layer.{j}.convolution``      ``layer{s+1}.{i}.conv{j+1}``
``...encoder.stages.{s}.layers.{i}.layer.{j}.normalization``    ``layer{s+1}.{i}.bn{j+1}``
``...encoder.stages.{s}.layers.{i}.shortcut.{convolution,normalization}``  ``layer{s+1}.{i}.downsample.{0,1}``
==============================================================  ========================================

The names are one table of :mod:`peg_core.interop.keymap` rows, :data:`DETR_KEYS` (the layers' rows
generated from each part's attention and layer-norm names; transformers' ResNet: :data:`HF_RESNET_KEYS`),
read both ways by :func:`hf_to_official` / :func:`official_to_hf`.

transformers' own ResNet has no dilated variant (``dilation`` applies to timm backbones only, and
transformers ignores it here too), so such a folder builds an undilated backbone whatever it says.

One difference is in the computation, not the names: with ``auxiliary_loss=True``
transformers' decoder passes each layer the layer-normed output of the previous
one (and norms the last output twice), while DETR norms copies for the auxiliary
heads only.  With ``auxiliary_loss=False`` (``facebook/detr-resnet-50``'s
setting) the two agree, so :func:`export_hf_detr` always writes ``False`` and
loading a folder whose config says ``True`` prints a note.

Otherwise the computations match: Hugging Face's ``sine`` position embedding
(``normalize=True``, scale 2π, eps 1e-6 after the cumulative sum, temperature
10000, ``(y, x)`` order) is DETR's, which is ``peg_detr``'s ``sine``; both add
positions to queries and keys only, post-norm layers, a final decoder norm.

Library code: :func:`export_hf_detr` takes a model; ``python -m peg_detr export-hf``
(:mod:`peg_detr.export`) reads the checkpoint and passes its model.  Errors are
:class:`~peg_core.interop.WeightsError` (files) and ``ValueError`` (a model Hugging Face
DETR cannot hold), never the command line's ``UserError``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from peg_core.interop.hf_folder import ConfigFields, read_hf_config, read_hf_weights, write_hf_folder
from peg_core.interop.io import WeightsError, read_state_file
from peg_core.interop.keymap import Functions, KeyMap, Nest, Rename, Rule, Stack, block_rows

from ..models.detr.config import DETRConfig
from .hf_processor import PREPROCESSOR_CONFIG, detr_processor_config

__all__ = [
    "DETR_KEYS",
    "HF_DETR_BACKBONES",
    "HF_RESNETS",
    "HF_RESNET_KEYS",
    "check_detr_config",
    "detr_build_options",
    "detr_hf_config",
    "export_hf_detr",
    "hf_label_names",
    "hf_num_labels",
    "hf_resnet_to_official",
    "hf_to_official",
    "is_hf_source",
    "looks_like_hf",
    "official_to_hf",
    "read_hf_state",
]

# Backbone prefixes: what save_pretrained writes (and the hub files hold), and transformers 5's in-memory name.
_HF_BACKBONE = ("model.backbone.conv_encoder.model.", "model.backbone.model.")
_OFFICIAL_BACKBONE = "backbone.0.body."
#: (Hugging Face, official) prefixes outside the layers
_TOP_RENAMES = (
    ("model.input_projection.", "input_proj."), ("model.query_position_embeddings.", "query_embed."),
    ("model.decoder.layernorm.", "transformer.decoder.norm."), ("class_labels_classifier.", "class_embed."),
    ("bbox_predictor.", "bbox_embed."),
)  # fmt: skip
#: each part's attentions and layer norms: (Hugging Face, official) names inside a layer
_LAYERS = {
    "encoder": (
        (("self_attn", "self_attn"),), (("self_attn_layer_norm", "norm1"), ("final_layer_norm", "norm2"))
    ),
    "decoder": (
        (("self_attn", "self_attn"), ("encoder_attn", "multihead_attn")),
        (("self_attn_layer_norm", "norm1"), ("encoder_attn_layer_norm", "norm2"), ("final_layer_norm", "norm3")),
    ),
}  # fmt: skip
#: (file name, transformers 5's in-memory name, official) of a layer's MLP
_MLP = (("fc1.", "mlp.fc1.", "linear1."), ("fc2.", "mlp.fc2.", "linear2."))
#: a block of transformers' own ResNet -> torchvision's (conv ``j`` is ``conv{j+1}``; the shortcut ``downsample``)
_RESNET_BLOCK = (
    *((f"layer.{j}.{theirs}.", f"{ours}{j + 1}.") for j in range(3)
      for theirs, ours in (("convolution", "conv"), ("normalization", "bn"))),
    ("shortcut.convolution.", "downsample.0."), ("shortcut.normalization.", "downsample.1."),
)  # fmt: skip
#: transformers' own ResNet (``AutoBackbone`` "resnet") -> torchvision's names, below the backbone prefix
#: (stage ``s`` is torchvision's ``layer{s+1}``); read only: a DETR folder is written with timm's, ours
HF_RESNET_KEYS = KeyMap(
    [
        Rename("embedder.embedder.convolution.", "conv1."),
        Rename("embedder.embedder.normalization.", "bn1."),
        *(Rename(f"encoder.stages.{s}.layers.{{i}}.{theirs}", f"layer{s + 1}.{{i}}.{ours}")
          for s in range(4) for theirs, ours in _RESNET_BLOCK),
    ]
)  # fmt: skip


def hf_resnet_to_official(key: str) -> str:
    """A key of transformers' own ResNet (below the backbone prefix) -> torchvision's name; others unchanged.

    ``embedder.embedder.convolution.weight`` -> ``conv1.weight``,
    ``encoder.stages.0.layers.1.layer.2.normalization.bias`` -> ``layer1.1.bn3.bias``,
    ``encoder.stages.1.layers.0.shortcut.convolution.weight`` -> ``layer2.0.downsample.0.weight``
    (:data:`HF_RESNET_KEYS`).
    """
    return HF_RESNET_KEYS.to_ours(key) or key


def _layer_rows(
    part: str, attentions: tuple[tuple[str, str], ...], norms: tuple[tuple[str, str], ...]
) -> tuple[Rule, ...]:
    """The rows of one part's layers: each attention's q / k / v stacked into ``in_proj_*``, then the renames.

    transformers names the output projection ``out_proj`` in files and ``o_proj`` in memory; a layer's
    key no name covers keeps its name below the layer's prefix.
    """
    hf, ours = f"model.{part}.layers.{{n}}.", f"transformer.{part}.layers.{{n}}."
    stacks = tuple(
        Stack(tuple(f"{hf}{a}.{x}_proj." for x in "qkv"), (f"{ours}{o}.in_proj_",)) for a, o in attentions
    )
    names = (
        *((f"{a}.out_proj.", f"{a}.o_proj.", f"{o}.out_proj.") for a, o in attentions),
        *((f"{a}.", f"{a}.", f"{o}.") for a, o in (*attentions, *norms)),
        *_MLP,
        ("", "", ""),
    )
    return stacks + block_rows((hf, hf), ours, names)


def _same(key: str) -> str:
    """The key itself: the backbone's timm / torchvision names are the same on both sides."""
    return key


#: Hugging Face DETR (files and transformers 5's modules) <-> official DETR / ours; written: the file names
DETR_KEYS = KeyMap(
    [
        *(Nest(hf, _OFFICIAL_BACKBONE, Functions(hf_resnet_to_official, _same)) for hf in _HF_BACKBONE),
        *(Rename(hf, official) for hf, official in _TOP_RENAMES),
        *(row for part, (attn, norms) in _LAYERS.items() for row in _layer_rows(part, attn, norms)),
    ]
)
#: the same rows without the q / k / v stacks: where an incomplete set's parts go (named as their layer's)
_UNSTACKED = KeyMap(row for row in DETR_KEYS.rows if not isinstance(row, Stack))
_QKV = re.compile(r"^(.+)\.([qkv])_proj\.(weight|bias)$")


def is_hf_source(path: str | os.PathLike) -> bool:
    """True for a folder with ``config.json`` or a ``.safetensors`` / ``pytorch_model.bin`` file."""
    p = Path(path)
    if p.is_dir():
        return True  # a folder can only be a Hugging Face one here; read_hf_state says what is missing
    return p.suffix == ".safetensors" or p.name == "pytorch_model.bin"


def looks_like_hf(state: dict[str, Tensor]) -> bool:
    """True when ``state`` has Hugging Face DETR key names (e.g. ``class_labels_classifier.weight``)."""
    return any(k.startswith(("class_labels_classifier.", "bbox_predictor.", "model.")) for k in state)


def read_hf_state(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, Any] | None]:
    """``(state dict in Hugging Face names, config.json as a dict or None)`` of a folder or weights file.

    The weights are read by :func:`peg_core.interop.read_state_file` (safetensors first: it
    needs no unpickling); every problem is a :class:`~peg_core.interop.WeightsError` naming the file.
    """
    p = Path(path)
    config = None
    if p.is_dir():
        config = read_hf_config(p)
        # the fields first: a bad one is named before any tensor is read
        detr_build_options(config, p / "config.json")
        state, weights = read_hf_weights(p)
        _check_shapes(state, weights)
        check_detr_config(config, state, p / "config.json")
        return state, config
    state = read_state_file(p, what="Hugging Face weights")
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise WeightsError("Hugging Face weights file is not a state dict of tensors", p)
    _check_shapes(state, p)
    return state, config


#: the timm ResNets of a Hugging Face DETR that peg_detr builds (``backbone`` of config.json)
HF_DETR_BACKBONES = ("resnet18", "resnet50", "resnet101")
#: transformers' own ResNet configs peg_detr builds: name -> (layer_type, depths, hidden_sizes)
HF_RESNETS = {
    "resnet18": ("basic", [2, 2, 2, 2], [64, 128, 256, 512]),
    "resnet50": ("bottleneck", [3, 4, 6, 3], [256, 512, 1024, 2048]),
    "resnet101": ("bottleneck", [3, 4, 23, 3], [256, 512, 1024, 2048]),
}


def _hf_resnet_name(bb: ConfigFields) -> str:
    """The torchvision ResNet a ``ResNetConfig`` ``backbone_config`` describes (transformers' defaults:
    ResNet-50), every field that shapes the computation checked; a :class:`WeightsError` names the first
    one peg_detr's backbones cannot compute."""
    layer_type = bb.choice("layer_type", "bottleneck", ("basic", "bottleneck"))
    depths = bb.integers("depths", [3, 4, 6, 3], length=4)
    widths = bb.integers("hidden_sizes", [256, 512, 1024, 2048], length=4)
    name = next((n for n, spec in HF_RESNETS.items() if spec == (layer_type, depths, widths)), None)
    if name is None:
        shapes = "; ".join(f"{n}: {t} {d} {w}" for n, (t, d, w) in HF_RESNETS.items())
        bb.fail("depths", f"a ResNet peg_detr builds (layer_type, depths, hidden_sizes: {shapes}); "
                f"this one is {layer_type} {depths} {widths}")  # fmt: skip
    if bb.integer("embedding_size", 64) != 64:
        bb.fail("embedding_size", "64 (torchvision's ResNet stem)")
    if bb.integer("num_channels", 3) != 3:
        bb.fail("num_channels", "3")
    bb.choice("hidden_act", "relu", ("relu",))
    for flag in ("downsample_in_first_stage", "downsample_in_bottleneck"):
        if bb.flag(flag, False):
            bb.fail(flag, "false (torchvision's ResNet strides in the 3x3 convolution of stages 2-4)")
    # DETR reads the backbone's last map: it must be stage 4's
    names = bb.data.get("out_features")
    indices = bb.data.get("out_indices")
    last = names[-1] if isinstance(names, list) and names else None
    if last is None and isinstance(indices, list) and indices:
        last = f"stage{indices[-1]}" if isinstance(indices[-1], int) else indices[-1]
    if last not in (None, "stage4"):
        bb.fail("out_features", "a list ending with 'stage4' (DETR reads the last stage's map)")
    return name


def hf_num_labels(config: Mapping[str, Any], where: str | os.PathLike = "config.json") -> int:
    """The class count of a config.json as transformers reads it (``PretrainedConfig.num_labels``).

    ``len(id2label)`` when the file has one (it wins over a ``num_labels`` key); otherwise
    ``num_labels``; otherwise 2, transformers' default, which ``save_pretrained`` does not write:
    the folder of a default ``RTDetrConfig()`` has neither key and 2-class heads.  A malformed
    ``id2label`` (not an object, keys that are not the labels ``0 .. n-1``, names that are not
    strings) or ``num_labels`` is a :class:`WeightsError` naming ``where`` and the field.
    """
    fields = ConfigFields(config, where)
    names = fields.id2label()
    return len(names) if names is not None else fields.integer("num_labels", 2)


def hf_label_names(config: Mapping[str, Any], where: str | os.PathLike = "config.json") -> list[str] | None:
    """``names[label]`` of a config.json's ``id2label`` (keys ``"0"`` .. ``"n-1"``); ``None`` without one.

    A :class:`WeightsError` naming ``where`` and the field when ``id2label`` is malformed.
    """
    return ConfigFields(config, where).id2label()


def detr_build_options(config: Mapping[str, Any], where: str | os.PathLike = "config.json") -> dict[str, Any]:
    """The :func:`peg_detr.models.build_detr` keywords of a ``DetrConfig`` (config.json as a dict).

    Every field used is checked for its type and range (and the two attention / MLP sizes, which
    peg_detr's DETR has once, for being equal); a :class:`WeightsError` names ``where`` and the field.
    The backbone is ``backbone`` (transformers 4, :func:`export_hf_detr`) or ``backbone_config.backbone``
    (transformers 5), one of :data:`HF_DETR_BACKBONES`; or transformers' own ResNet
    (``backbone_config.model_type: "resnet"``, or ``use_timm_backbone: false``), one of :data:`HF_RESNETS`.
    """
    f = ConfigFields(config, where)
    f.choice("model_type", "detr", ("detr",))
    bb = f.section("backbone_config")
    kind = bb.choice("model_type", None, ("timm_backbone", "resnet"))
    if kind == "resnet" or (kind is None and f.flag("use_timm_backbone", True) is False):
        backbone, dilation = _hf_resnet_name(bb), False  # transformers' ResNet: no dilated form
    else:
        own = f.choice("backbone", None, HF_DETR_BACKBONES)
        backbone = own or bb.choice("backbone", "resnet50", HF_DETR_BACKBONES)
        dilation = f.flag("dilation", False)
    f.choice("position_embedding_type", "sine", ("sine",))  # the learned table's keys have no place
    f.choice("activation_function", "relu", ("relu",))
    hidden = f.integer("d_model", 256)
    heads = f.integer("encoder_attention_heads", 8, max=hidden)
    if hidden % heads:
        f.fail("encoder_attention_heads", f"a divisor of d_model {hidden}")
    if f.integer("decoder_attention_heads", heads) != heads:
        f.fail(
            "decoder_attention_heads", f"encoder_attention_heads {heads} (peg_detr's DETR has one head count)"
        )
    ffn = f.integer("encoder_ffn_dim", 2048)
    if f.integer("decoder_ffn_dim", ffn) != ffn:
        f.fail("decoder_ffn_dim", f"encoder_ffn_dim {ffn} (peg_detr's DETR has one MLP width)")
    f.flag("auxiliary_loss", False)
    return {
        "backbone": backbone,
        "num_classes": hf_num_labels(config, where),
        "num_queries": f.integer("num_queries", 100),
        "dilation": dilation,
        "hidden_dim": hidden,
        "num_heads": heads,
        "enc_layers": f.integer("encoder_layers", 6),
        "dec_layers": f.integer("decoder_layers", 6),
        "dim_feedforward": ffn,
        "dropout": f.number("dropout", 0.1, min=0.0, below=1.0),
    }


def check_detr_config(config: Any, state: Mapping[str, Tensor], path: str | os.PathLike) -> dict[str, Any]:
    """:func:`detr_build_options` of ``config`` (the file ``path``), and its sizes against the weights.

    ``state`` is in Hugging Face names.  ``d_model``, ``num_queries``, the layer counts, the MLP
    width and the class count (``id2label`` / ``num_labels``, plus no-object) must be the sizes of
    the tensors they describe; a :class:`WeightsError` names the file, the field and the tensor.
    Checked before any model is built, so a width the weights do not have allocates nothing.
    """
    if not isinstance(config, dict):
        raise WeightsError(f"config.json is not a JSON object (got {type(config).__name__})", path)
    options = detr_build_options(config, path)
    f = ConfigFields(config, path)
    f.against("d_model", options["hidden_dim"], state, "model.input_projection.weight")
    f.against("num_queries", options["num_queries"], state, "model.query_position_embeddings.weight")
    for part in ("encoder", "decoder"):
        layers = options["enc_layers" if part == "encoder" else "dec_layers"]
        f.count_against(f"{part}_layers", layers, state, rf"model\.{part}\.layers\.(\d+)\.")
        for fc1 in ("fc1", "mlp.fc1"):  # files; transformers 5 in memory
            f.against(
                f"{part}_ffn_dim", options["dim_feedforward"], state, f"model.{part}.layers.0.{fc1}.weight"
            )
    head = state.get("class_labels_classifier.weight")
    classes = options["num_classes"]
    if isinstance(head, Tensor) and head.dim() == 2 and head.shape[0] != classes + 1:
        source = next((f"key {k!r} gives" for k in ("id2label", "num_labels") if config.get(k) is not None),
                      "has neither id2label nor num_labels: transformers' default,")  # fmt: skip
        raise WeightsError(
            f"config.json {source} {classes} classes, but the weights' class_labels_classifier.weight "
            f"has shape {tuple(head.shape)} ({head.shape[0] - 1} classes + no-object)",
            Path(path),
        )
    return options


def _check_shapes(state: dict[str, Tensor], path: Path) -> None:
    """The tensors that are measured or combined before the shape comparison: the classifier and q / k / v.

    ``class_labels_classifier.weight`` gives the class count (its rows); each attention's ``q_proj`` /
    ``k_proj`` / ``v_proj`` are concatenated.  A weight must be 2-D ``(out, in)``, its bias 1-D
    ``(out,)``, and k / v shaped like q; a :class:`WeightsError` names the file and key otherwise.
    """
    used = {k: t for k, t in state.items() if k.startswith("class_labels_classifier.") or _QKV.match(k)}
    for key, t in used.items():
        ndim = 2 if key.endswith(".weight") else 1
        if t.dim() != ndim:
            layout = "(out, in)" if ndim == 2 else "(out,)"
            raise WeightsError(f"key {key} has shape {tuple(t.shape)}: expected {layout}", path)
    for key, t in used.items():
        head = key.rpartition(".")[0]
        weight = used.get(f"{head}.weight")
        if key.endswith(".bias") and weight is not None and t.shape[0] != weight.shape[0]:
            raise WeightsError(
                f"key {key} has shape {tuple(t.shape)}: expected ({weight.shape[0]},) like {head}.weight",
                path,
            )
        m = _QKV.match(key)
        q = used.get(f"{m.group(1)}.q_proj.{m.group(3)}") if m else None
        if q is not None and t.shape != q.shape:
            raise WeightsError(
                f"key {key} has shape {tuple(t.shape)}: expected {tuple(q.shape)} like {m.group(1)}.q_proj",
                path,
            )


def hf_to_official(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face ``DetrForObjectDetection`` state dict -> official DETR key names (:data:`DETR_KEYS`).

    ``q_proj``/``k_proj``/``v_proj`` are concatenated (in that order) into
    ``in_proj_weight`` ``(3C, C)`` / ``in_proj_bias`` ``(3C,)``.  Keys that match no rule (and the
    parts of an incomplete q / k / v) are kept, so the loader reports them as unexpected.
    """
    out, _, skipped = DETR_KEYS.convert(state, to_hf=False)
    for key in skipped:
        out[_UNSTACKED.to_ours(key) or key] = state[key]
    return out


def official_to_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Official DETR key names -> the names ``save_pretrained`` writes (inverse of :func:`hf_to_official`).

    ``in_proj_weight`` ``(3C, C)`` is split into ``q_proj``/``k_proj``/``v_proj`` ``(C, C)``; BN
    bookkeeping (``num_batches_tracked``) has no place there.  A key without a name is a ``ValueError``.
    """
    kept = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    out, _, skipped = DETR_KEYS.convert(kept, to_hf=True)
    if skipped:
        raise ValueError(f"no Hugging Face name for {next(iter(skipped))!r}")
    return out


def detr_hf_config(model: nn.Module, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The ``config.json`` of a ``DetrForObjectDetection`` with the shapes of ``model`` (a ``sine`` DETR).

    ``model``: a :class:`~peg_detr.models.DETR` built by :func:`~peg_detr.models.build_detr` (its
    ``build_config`` gives the sizes).  ``names[label]``: the category name of each label (``""`` or
    missing: written ``LABEL_i``).  Other encodings, pre-norm layers, non-ResNet backbones or other
    decoder key positions have no Hugging Face DETR equivalent: a ``ValueError`` names every one.
    """
    stored = getattr(getattr(model, "module", model), "build_config", None)  # a DDP wrapper: its model's
    if not isinstance(stored, dict) or "num_classes" not in stored:
        raise ValueError("the model has no build_config (not built by build_detr)")
    cfg = DETRConfig.from_dict(stored)  # older names (nheads) read too
    refusals = [
        (cfg.pos_enc != "sine", f"pos_enc {cfg.pos_enc!r} (only 'sine' exists in Hugging Face DETR)"),
        (not cfg.backbone.startswith("resnet"), f"backbone {cfg.backbone!r} (ResNets only)"),
        (cfg.pre_norm, "pre_norm=True (Hugging Face DETR is post-norm)"),
        (cfg.decoder_key_pos != "sine", f"decoder_key_pos {cfg.decoder_key_pos!r} (only 'sine')"),
    ]  # fmt: skip
    bad = [why for refused, why in refusals if refused]
    if bad:
        raise ValueError("; ".join(bad))
    num_classes = cfg.num_classes
    names = list(names or [])
    id2label = {str(i): (names[i] if i < len(names) else "") or f"LABEL_{i}" for i in range(num_classes)}
    # the sizes, under the Hugging Face names declared on DETRConfig's fields
    sizes = {hf: getattr(cfg, name) for name, hf_names in DETRConfig.hf_fields().items() for hf in hf_names}
    return {
        "architectures": ["DetrForObjectDetection"],
        "model_type": "detr",
        "use_timm_backbone": True,
        "use_pretrained_backbone": False,
        "num_channels": 3,
        **sizes,
        "activation_function": "relu",
        "position_embedding_type": "sine",
        # False whatever the training used: with auxiliary_loss=True transformers feeds each decoder layer
        # the *normalised* output of the previous one (and normalises the last twice); DETR does not.
        "auxiliary_loss": False,
        "id2label": id2label,
        "label2id": {v: int(k) for k, v in id2label.items()},
    }


def export_hf_detr(
    model: nn.Module,
    out_dir: str | os.PathLike,
    names: Sequence[str] | None = None,
    *,
    size: int | None = None,
) -> Path:
    """Write a ``sine`` DETR as a Hugging Face folder; returns ``out_dir``.

    ``out_dir/config.json`` (:func:`detr_hf_config`) + ``out_dir/model.safetensors`` load with
    ``transformers.DetrForObjectDetection.from_pretrained(out_dir)``; ``preprocessor_config.json``
    (:func:`~peg_detr.interop.hf_processor.detr_processor_config`: the short side ``size``, the run's
    ``--val-size``, default 800; ImageNet mean / std) lets ``pipeline("object-detection", out_dir)``
    feed it what ``predict`` does.  A model Hugging Face DETR cannot hold is a ``ValueError`` raised
    before anything is written; an unwritable folder an ``OSError``.
    """
    model = getattr(model, "module", model)
    config = detr_hf_config(model, names)  # refusals first: nothing is written for them
    processor = {PREPROCESSOR_CONFIG: detr_processor_config(size)}
    return write_hf_folder(out_dir, config, official_to_hf(model.state_dict()), processor)
