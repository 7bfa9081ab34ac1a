"""Hugging Face DETR weights: key mapping to the official DETR layout, and ``python -m peg_detr export-hf``.

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

One difference is in the computation, not the names: with ``auxiliary_loss=True``
transformers' decoder passes each layer the layer-normed output of the previous
one (and norms the last output twice), while DETR norms copies for the auxiliary
heads only.  With ``auxiliary_loss=False`` (``facebook/detr-resnet-50``'s
setting) the two agree, so :func:`export_hf` always writes ``False`` and
loading a folder whose config says ``True`` prints a note.

Otherwise the computations match: Hugging Face's ``sine`` position embedding
(``normalize=True``, scale 2π, eps 1e-6 after the cumulative sum, temperature
10000, ``(y, x)`` order) is DETR's, which is ``peg_detr``'s ``sine``; both add
positions to queries and keys only, post-norm layers, a final decoder norm.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from peg_core.engine import UserError, ensure_writable, new_parser, read_checkpoint
from peg_core.errors import require
from peg_core.interop.hf_folder import read_hf_config, read_hf_weights
from peg_core.interop.io import WeightsError, read_state_file, strip_prefixes, write_state_file

from .labels import LabelMap

__all__ = [
    "export_hf",
    "hf_to_official",
    "is_hf_source",
    "looks_like_hf",
    "main",
    "official_to_hf",
    "read_hf_state",
]

# Backbone prefixes: what save_pretrained writes (and the hub files hold), and transformers 5's in-memory name.
_HF_BACKBONE = ("model.backbone.conv_encoder.model.", "model.backbone.model.")
_OFFICIAL_BACKBONE = "backbone.0.body."
# (Hugging Face, official) names inside a layer, after its prefix.
_ENCODER_RENAMES = (("self_attn_layer_norm", "norm1"), ("final_layer_norm", "norm2"))
_DECODER_RENAMES = (
    ("self_attn_layer_norm", "norm1"),
    ("encoder_attn_layer_norm", "norm2"),
    ("final_layer_norm", "norm3"),
    ("encoder_attn", "multihead_attn"),
)
_COMMON_RENAMES = (("fc1", "linear1"), ("fc2", "linear2"))
_TOP_RENAMES = (
    ("model.input_projection.", "input_proj."),
    ("model.query_position_embeddings.", "query_embed."),
    ("model.decoder.layernorm.", "transformer.decoder.norm."),
    ("class_labels_classifier.", "class_embed."),
    ("bbox_predictor.", "bbox_embed."),
)
_LAYER = re.compile(r"^model\.(encoder|decoder)\.layers\.(\d+)\.(.+)$")
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
        _check_config(config, p / "config.json")
        state, p = read_hf_weights(p)
    else:
        state = read_state_file(p, what="Hugging Face weights")
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise WeightsError("Hugging Face weights file is not a state dict of tensors", p)
    _check_shapes(state, p)
    return state, config


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


#: ``config.json`` fields read here or describing the tensors: (what they must be, check)
CONFIG_FIELDS: dict[str, tuple[str, Any]] = {
    "auxiliary_loss": ("true or false", lambda v: isinstance(v, bool)),
    "d_model": ("a positive int", _positive_int),
    "encoder_layers": ("a positive int", _positive_int),
    "decoder_layers": ("a positive int", _positive_int),
    "num_queries": ("a positive int", _positive_int),
    "id2label": ("an object", lambda v: isinstance(v, dict)),
}


def _check_config(config: Any, path: Path) -> None:
    """``config.json`` must be a JSON object whose known fields have their types; a one-line error otherwise."""
    if not isinstance(config, dict):
        raise WeightsError(f"config.json is not a JSON object (got {type(config).__name__})", path)
    for key, (want, ok) in CONFIG_FIELDS.items():
        if key in config and not ok(config[key]):
            raise WeightsError(f"config.json key {key!r} must be {want}; got {str(config[key])[:60]}", path)


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
    """Hugging Face ``DetrForObjectDetection`` state dict -> official DETR key names.

    ``q_proj``/``k_proj``/``v_proj`` are concatenated (in that order) into
    ``in_proj_weight`` ``(3C, C)`` / ``in_proj_bias`` ``(3C,)``.  Keys that match no rule are
    kept under their own name, so the loader reports them as unexpected.
    """
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}  # (official prefix, weight|bias) -> {q, k, v}
    for key, value in state.items():
        new = _rename(key)
        m = _QKV.match(new)
        if m and m.group(1).startswith("transformer."):
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = value
        else:
            out[new] = value
    for (prefix, kind), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:  # incomplete: leave them for the mismatch report
            out.update({f"{prefix}.{n}_proj.{kind}": t for n, t in parts.items()})
            continue
        out[f"{prefix}.in_proj_{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


def _rename(key: str) -> str:
    for hf in _HF_BACKBONE:
        if key.startswith(hf):
            return _OFFICIAL_BACKBONE + key.removeprefix(hf)
    for hf, official in _TOP_RENAMES:
        if key.startswith(hf):
            return official + key.removeprefix(hf)
    m = _LAYER.match(key)
    if not m:
        return key
    part, index, rest = m.groups()
    # transformers 5 in memory: layers.i.mlp.fc1 and *_attn.o_proj (files: layers.i.fc1, out_proj)
    rest = rest.removeprefix("mlp.").replace(".o_proj.", ".out_proj.")
    renames = (_ENCODER_RENAMES if part == "encoder" else _DECODER_RENAMES) + _COMMON_RENAMES
    head, _, tail = rest.partition(".")
    for hf, official in renames:
        if head == hf:
            head = official
            break
    return f"transformer.{part}.layers.{index}.{head}.{tail}"


def official_to_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Official DETR key names -> the names ``save_pretrained`` writes (inverse of :func:`hf_to_official`).

    ``in_proj_weight`` ``(3C, C)`` is split into ``q_proj``/``k_proj``/``v_proj`` ``(C, C)``.
    """
    inverse_top = [(official, hf) for hf, official in _TOP_RENAMES]
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        if key.startswith(_OFFICIAL_BACKBONE):
            out[_HF_BACKBONE[0] + key.removeprefix(_OFFICIAL_BACKBONE)] = value
            continue
        top = next((hf + key.removeprefix(o) for o, hf in inverse_top if key.startswith(o)), None)
        if top is not None:
            out[top] = value
            continue
        m = re.match(r"^transformer\.(encoder|decoder)\.layers\.(\d+)\.([^.]+)\.(.+)$", key)
        if not m:
            raise ValueError(f"no Hugging Face name for {key!r}")
        part, index, head, tail = m.groups()
        renames = (_ENCODER_RENAMES if part == "encoder" else _DECODER_RENAMES) + _COMMON_RENAMES
        head = next((hf for hf, official in renames if official == head), head)
        prefix = f"model.{part}.layers.{index}.{head}"
        if tail in ("in_proj_weight", "in_proj_bias"):
            for name, chunk in zip("qkv", value.chunk(3, dim=0)):
                out[f"{prefix}.{name}_proj.{tail.removeprefix('in_proj_')}"] = chunk.contiguous()
        else:
            out[f"{prefix}.{tail}"] = value
    return out


def _hf_config(cfg: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``config.json`` of a ``DetrForObjectDetection`` with the shapes of a ``peg_detr`` ``sine`` model.

    ``names[label]``: the category name of each of the ``num_classes`` labels (``""``: none, written
    ``LABEL_i``).
    """
    id2label = {str(i): names[i] or f"LABEL_{i}" for i in range(int(cfg["num_classes"]))}
    return {
        "architectures": ["DetrForObjectDetection"],
        "model_type": "detr",
        "use_timm_backbone": True,
        "backbone": cfg.get("backbone", "resnet50"),
        "use_pretrained_backbone": False,
        "num_channels": 3,
        "dilation": bool(cfg.get("dilation", False)),
        "d_model": int(cfg.get("hidden_dim", 256)),
        "encoder_layers": int(cfg.get("enc_layers", 6)),
        "decoder_layers": int(cfg.get("dec_layers", 6)),
        "encoder_attention_heads": int(cfg.get("num_heads", cfg.get("nheads", 8))),
        "decoder_attention_heads": int(cfg.get("num_heads", cfg.get("nheads", 8))),
        "encoder_ffn_dim": int(cfg.get("dim_feedforward", 2048)),
        "decoder_ffn_dim": int(cfg.get("dim_feedforward", 2048)),
        "num_queries": int(cfg.get("num_queries", 100)),
        "dropout": float(cfg.get("dropout", 0.1)),
        "activation_function": "relu",
        "position_embedding_type": "sine",
        # False whatever the training used: with auxiliary_loss=True transformers feeds each decoder layer
        # the *normalised* output of the previous one (and normalises the last twice); DETR does not.
        "auxiliary_loss": False,
        "id2label": id2label,
        "label2id": {v: int(k) for k, v in id2label.items()},
    }


def export_hf(checkpoint: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a ``sine`` ``peg_detr`` training checkpoint as a Hugging Face folder; returns ``out_dir``.

    ``out_dir/config.json`` + ``out_dir/model.safetensors`` load with
    ``transformers.DetrForObjectDetection.from_pretrained(out_dir)``.  Other encodings, pre-norm
    layers, non-ResNet backbones or other decoder key positions have no Hugging Face DETR
    equivalent and are refused with a :class:`UserError` before anything is written.
    """
    require("safetensors.torch", "hf", "peg-detr", what="export-hf")  # said first; nothing written
    ckpt = read_checkpoint(checkpoint, "detect")
    cfg = ckpt.get("model_config")
    if isinstance(cfg, dict) and cfg.get("arch") == "rtdetr":
        return _export_rtdetr(checkpoint, out_dir)
    if not isinstance(cfg, dict) or "num_classes" not in cfg:
        raise UserError(
            "checkpoint has no detector model_config (not written by `python -m peg_detr train`?)", checkpoint
        )
    refusals = [
        (cfg.get("pos_enc", "peg") != "sine", f"pos_enc {cfg.get('pos_enc')!r} (only 'sine' exists in Hugging Face DETR)"),
        (not str(cfg.get("backbone", "resnet50")).startswith("resnet"), f"backbone {cfg.get('backbone')!r} (ResNets only)"),
        (bool(cfg.get("pre_norm", False)), "pre_norm=True (Hugging Face DETR is post-norm)"),
        (cfg.get("decoder_key_pos", "sine") != "sine", f"decoder_key_pos {cfg.get('decoder_key_pos')!r} (only 'sine')"),
    ]  # fmt: skip
    bad = [why for refused, why in refusals if refused]
    if bad:
        raise UserError(f"cannot export to Hugging Face DETR: {'; '.join(bad)}", checkpoint)
    state = strip_prefixes(ckpt["model"])
    hf_state = {k: v.detach().cpu().contiguous() for k, v in official_to_hf(state).items()}
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    out = Path(out_dir)
    ensure_writable(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        names = LabelMap.from_meta(meta).names(int(cfg["num_classes"]))  # the run's --labels
    except ValueError as e:
        raise UserError(f"checkpoint's label map is malformed ({e})", checkpoint) from None
    (out / "config.json").write_text(json.dumps(_hf_config(cfg, names), indent=2) + "\n")
    write_state_file(hf_state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _export_rtdetr(checkpoint: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """An RT-DETR checkpoint (its EMA weights, as ``eval`` reads them) as an ``RTDetrForObjectDetection`` folder."""
    from .hf_rtdetr import export_hf_rtdetr  # the RT-DETR side imports this module

    try:
        return export_hf_rtdetr(checkpoint, out_dir)
    except ValueError as e:  # another encoding than sincos: refused before anything is written
        why = " ".join(str(e).split()).removeprefix(f"{checkpoint}: ")
        raise UserError(f"cannot export to Hugging Face RT-DETR: {why}", checkpoint) from None
    except OSError as e:
        raise UserError(f"output folder is not writable ({e.strerror or e})", out_dir) from None


def main(argv: list[str] | None = None) -> Path:
    """``python -m peg_detr export-hf CKPT DIR``."""
    p = new_parser(
        "python -m peg_detr export-hf",
        "write a peg_detr checkpoint as a Hugging Face folder (config.json + model.safetensors): DETR with "
        "--pos-enc sine, or RT-DETR with --pos-enc sincos",
    )
    p.add_argument(
        "checkpoint",
        type=Path,
        help="training checkpoint of `python -m peg_detr train` (DETR: sine; RT-DETR: sincos)",
    )
    p.add_argument("out", type=Path, help="output folder (loads with DetrForObjectDetection / "
                   "RTDetrForObjectDetection.from_pretrained)")  # fmt: skip
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    a = p.parse_args(argv)
    out = export_hf(a.checkpoint, a.out)
    print(f"wrote {out / 'config.json'} and {out / 'model.safetensors'}")
    return out
