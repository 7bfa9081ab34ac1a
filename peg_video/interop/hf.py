"""Hugging Face video encoders (VideoMAE, TimeSformer, V-JEPA 2) as peg_video's :class:`VideoTransformer`.

A local folder written by ``save_pretrained`` (``config.json`` + ``model.safetensors`` or a
``pytorch_model.bin``, read with ``weights_only=True``) becomes a video transformer with the
same outputs at the native clip shape::

    model, report = peg_video.from_hf("videomae-small-finetuned-kinetics")  # its own table
    model, report = peg_video.from_hf(folder, "peg3d", num_classes=10)     # table -> zero PEG3d

Public API:

* :func:`from_hf` ``(folder, pos_enc=None, *, num_classes=None, **options) -> (model, LoadReport)``;
* :func:`hf_model_config` ``(folder, pos_enc=None, *, num_classes=None, **options) -> dict``: the
  JSON-safe :func:`peg_video.build_video_model` keywords of that model (what a checkpoint stores);
* :func:`hf_build_config` / :func:`load_hf_model`: the same two steps for a folder already read
  (``config.json`` read once for both);
* :func:`read_hf_video_config` ``(folder) -> dict``: the folder's sizes, clip shape, normalisation
  and labels in peg_video's terms;
* :func:`export_hf` ``(model, out_dir, classes=None, *, short_side=None, mean=None, std=None) -> Path``:
  a VideoMAE-layout folder (``config.json`` + ``model.safetensors`` + the processors
  :func:`videomae_processor_configs` gives, which ``pipeline("video-classification")`` reads) for a
  model with VideoMAE's table (a training checkpoint is read by the application,
  :func:`peg_video.model.load_model`, then exported);
* :data:`HF_MODEL_TYPES`: the ``config.json`` ``model_type`` values it reads.

How each model maps (transformers 5.x key layouts; peg_video takes clips ``(B, 3, T, H, W)``,
transformers ``(B, T, 3, H, W)``):

* VideoMAE: tubelet Conv3d; the fixed 1-D sinusoid over the flattened ``T'*H'*W'`` token index
  (not in the state dict) is ``pos_enc="sinusoid-1d"``, rebuilt by the model and resized with
  :func:`peg_core.resize.resize_pos_embed_3d` at another clip shape; ``q_bias`` / ``v_bias``
  with no key bias is ``qkv_bias="qv"``; ``use_mean_pooling`` is mean pooling + ``fc_norm``
  (otherwise the final norm and the first token, as transformers does).  The pre-training
  decoder (``encoder_to_decoder``, ``decoder.*``, ``mask_token``) is left out and reported.
* TimeSformer: the per-frame Conv2d is a ``(1, p, p)`` tubelet; the class token, the spatial
  table ``(1, 1 + N, D)`` and the time table ``(1, T, D)`` are ``pos_enc="learned"`` (the class
  token's code is folded into the class token); divided attention with the extra
  ``temporal_dense`` projection (``temporal_fc=True``); class-token head.
* V-JEPA 2: tubelet Conv3d, 3-D rotary attention (``pos_enc="rope-3d"``,
  ``rope_layout="vjepa2"``) with positions from the input's grid; the predictor is left out and
  reported.  ``VJEPA2ForVideoClassification``'s attentive pooler is ``global_pool="attentive"``
  (:class:`peg_video.models.pool.AttentivePool`: ``pooler.query_tokens`` -> ``pool.query``,
  ``pooler.self_attention_layers.i`` -> ``pool.blocks.i`` with ``q/k/v_proj`` fused into
  ``attn.qkv``, ``pooler.cross_attention_layer`` -> ``pool.cross`` with ``k/v_proj`` fused into
  ``kv``; ``pool_depth`` = ``num_pooler_layers``) and its ``classifier`` is ``head``; the
  pooler has no position-sized part, so it is kept by every ``pos_enc``.

Off the native clip shape (another clip length or crop; ``pos_enc=None``):

* VideoMAE: transformers raises (its patch embedding checks the crop, and its fixed table only
  adds to the native token count).  peg_video reads the table as its ``(T', H', W')`` grid and
  resizes it with :func:`peg_core.resize.resize_pos_embed_3d`, mode ``"trilinear"``
  (``align_corners=False``, float32; ``pos_interpolation="nearest"`` / ``"area"`` choose another
  mode): the output is transformers' model run with that resized table in place of its own.
* TimeSformer: transformers 5.x resizes both tables by nearest neighbour (the spatial one as a
  square grid, the time one along ``T``); :func:`from_hf` sets ``pos_interpolation="nearest"``
  and ``pos_temporal_interpolation="nearest"`` to do the same (``pos_interpolation="bicubic"`` /
  ``pos_temporal_interpolation="linear"`` in ``options`` resize smoothly instead).  With joint
  attention the outputs are then transformers' at every shape.  transformers' divided
  attention splits the tokens into frames by the config's ``num_frames`` / ``image_size``, so
  off that shape it groups the wrong tokens (more frames) or raises (another crop); peg_video
  splits by the input's grid, and equals transformers configured for that clip shape with the
  nearest-resized tables.
* V-JEPA 2: peg_video takes the rotary ids from the input's grid.  transformers numbers the
  tokens with the config's ``crop_size // patch_size`` grid, so another clip length is right
  but another crop silently gets wrong height / width ids; peg_video's output at a crop equals
  transformers' model configured with that ``crop_size`` (same weights).  The attentive pooler
  is not sized by the clip.

``pos_enc``: ``None`` keeps the model's own encoding; ``"peg3d"`` / ``"peg3d-factorized"`` (or
another registered conditional encoding) drop the table (or the rotary encoding) and add a
zero-initialised PEG3d, so before fine-tuning the model equals the original with its table
zeroed; ``"peg3d+rope-3d"`` (V-JEPA 2) keeps the rotary encoding and adds the zero PEG3d;
``"none"`` drops the encoding.  Another table has no weights in the folder and is refused.

Errors: a missing folder or ``config.json``, an unsupported ``model_type`` / option, or weights
that do not match the config are :class:`peg_core.interop.io.WeightsError` (``what`` + ``where``,
one line on the command line).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from peg_core.interop.hf_folder import (
    ConfigFields,
    read_hf_config,
    read_hf_weights,
    read_json_object,
    write_hf_folder,
)
from peg_core.interop.io import LoadReport, WeightsError
from peg_core.interop.resolve import resolve_weights
from peg_core.registry import parse_pos_enc

from ..models.registry import build_video_model
from ..models.vit import VIDEO_ENCODINGS, VideoTransformer, tubelet_misfits

__all__ = [
    "HF_MODEL_TYPES",
    "export_hf",
    "from_hf",
    "hf_build_config",
    "hf_model_config",
    "load_hf_model",
    "read_hf_video_config",
    "videomae_processor_configs",
]

#: ``config.json`` model types :func:`from_hf` reads
HF_MODEL_TYPES = ("videomae", "timesformer", "vjepa2")

PathLike = str | os.PathLike

#: preprocessor files that may hold the normalisation a checkpoint expects, tried in order
PREPROCESSOR_FILES = ("video_preprocessor_config.json", "preprocessor_config.json")


def _mean_std(folder: Path) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """``image_mean`` / ``image_std`` of the folder's (video) preprocessor config, or ``(None, None)``.

    Each is a number (every channel, as transformers reads it) or 3 numbers; ``image_std`` must be
    positive (it divides).  Anything else is a :class:`WeightsError` naming the file and the field.
    """
    for name in PREPROCESSOR_FILES:
        if (folder / name).is_file():
            pre = ConfigFields(read_json_object(folder / name, name), folder / name)
            mean, std = pre.per_channel("image_mean"), pre.per_channel("image_std", above=0.0)
            if mean is not None and std is not None:
                return mean, std
    return None, None


def _sizes(f: ConfigFields, model_type: str) -> dict[str, Any]:
    """The transformer's sizes and clip shape from a ``config.json`` of ``model_type``, every field checked."""
    dim = f.integer("hidden_size", 768)
    heads = f.integer("num_attention_heads", 12, max=dim)
    if dim % heads:
        f.fail("num_attention_heads", f"a divisor of hidden_size {dim}")
    if f.integer("num_channels", 3) != 3:
        f.fail("num_channels", "3 (peg_video reads RGB clips)")
    if model_type == "vjepa2":
        size_key, frames_key = "crop_size", "frames_per_clip"
        image = f.pair(size_key, 256)
        frames, tub = f.integer(frames_key, 64), f.integer("tubelet_size", 2)
        mlp_ratio = f.number("mlp_ratio", 4.0, above=0.0, max=64.0)
        if dim * mlp_ratio != round(dim * mlp_ratio):
            f.fail("mlp_ratio", f"a ratio that gives a whole number of channels with hidden_size {dim}")
    else:
        size_key, frames_key = "image_size", "num_frames"
        image = f.pair(size_key, 224)
        frames = f.integer(frames_key, 16 if model_type == "videomae" else 8)
        tub = f.integer("tubelet_size", 2) if model_type == "videomae" else 1
        mlp_ratio = f.integer("intermediate_size", 4 * dim) / dim
    patch = f.pair("patch_size", 16, max=min(image))
    for axis, _, _ in tubelet_misfits((frames, *image), (tub, *patch)):  # the first axis that does not split
        if axis == "T":
            f.fail(frames_key, f"a multiple of tubelet_size {tub}")
        f.fail(size_key, f"a multiple of patch_size {list(patch)}")
    eps_default = 1e-12 if model_type == "videomae" else 1e-6
    return {
        "embed_dim": dim,
        "depth": f.integer("num_hidden_layers", 12),
        "num_heads": heads,
        "mlp_ratio": mlp_ratio,
        "norm_eps": f.number("layer_norm_eps", eps_default, above=0.0, below=1.0),
        "num_frames": frames,
        "image_size": image,
        "tubelet": (tub, *patch),
        "hidden_act": f.text("hidden_act", "gelu"),
    }


def read_hf_video_config(folder: PathLike) -> dict[str, Any]:
    """The folder's model in peg_video's terms (``config.json``, plus the preprocessor config if any).

    Returns a dict with ``model_type``, ``architecture`` (the ``architectures[0]`` class name or
    ``None``), ``classifier`` (bool), ``embed_dim``, ``depth``, ``num_heads``, ``mlp_ratio``,
    ``norm_eps``, ``num_frames``, ``image_size`` ``(H, W)``, ``tubelet`` ``(t, p, p)``,
    ``pos_enc`` (the model's own position encoding: ``"sinusoid-1d"``, ``"learned"`` or
    ``"rope-3d"``), ``num_classes`` (0 for an encoder), ``id2label`` (``{int: str}``), ``mean`` / ``std``
    (3-tuples from ``preprocessor_config.json`` / ``video_preprocessor_config.json``, else
    ``None``), ``config`` (the raw ``config.json``) and ``config_file`` (its path).

    Raises :class:`WeightsError` for a missing folder or ``config.json``, JSON that does not
    parse, a ``model_type`` outside :data:`HF_MODEL_TYPES`, or a field of the wrong type or range
    (``hidden_size: 0``, ``patch_size: [16]``, ``id2label`` keys that are not labels,
    ``image_std: 0``), naming the file and the field.
    """
    folder = Path(folder)
    cfg = read_hf_config(folder)
    model_type = cfg.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise WeightsError(
            f"model_type {model_type!r} is not a video encoder peg_video reads ({', '.join(HF_MODEL_TYPES)})",
            folder / "config.json",
        )
    f = ConfigFields(cfg, folder / "config.json")
    architectures = cfg.get("architectures") or [None]
    if not isinstance(architectures, list) or not all(isinstance(a, str | None) for a in architectures):
        f.fail("architectures", "a list of class names")
    arch = architectures[0]
    classifier = isinstance(arch, str) and arch.endswith("ForVideoClassification")
    names = f.id2label() if classifier else None
    if classifier and names is None:  # as transformers reads it: num_labels (default 2), named LABEL_i
        names = [f"LABEL_{i}" for i in range(f.integer("num_labels", 2))]
    id2label = dict(enumerate(names or []))
    mean, std = _mean_std(folder)
    info = {
        "model_type": model_type,
        "architecture": arch,
        "classifier": classifier,
        **_sizes(f, model_type),
        "num_classes": len(id2label),
        "id2label": id2label,
        "mean": mean,
        "std": std,
        "config": cfg,
        "config_file": folder / "config.json",
    }
    # the remaining fields (pooling, biases, attention): checked here, before any weights
    info["pos_enc"] = _native(info)["pos_enc"]
    return info


def hf_model_config(
    folder: PathLike, pos_enc: str | None = None, *, num_classes: int | None = None, **options: Any
) -> dict[str, Any]:
    """JSON-safe :func:`peg_video.build_video_model` keywords of the model :func:`from_hf` builds.

    ``num_classes=None`` keeps the folder's classifier size (0, pooled features, for an encoder);
    ``options`` are further :class:`VideoTransformer` keywords (``drop_path_rate``, ``peg_at``,
    ``peg_kernel_size``, ...); ones that would change the mapped architecture are a ``ValueError``.
    """
    return hf_build_config(read_hf_video_config(folder), pos_enc, num_classes=num_classes, **options)


def hf_build_config(
    info: Mapping[str, Any], pos_enc: str | None = None, *, num_classes: int | None = None, **options: Any
) -> dict[str, Any]:
    """:func:`hf_model_config` of a folder already read (:func:`read_hf_video_config`'s ``info``)."""
    return _model_config(info, pos_enc, num_classes, options)


def from_hf(
    folder: PathLike, pos_enc: str | None = None, *, num_classes: int | None = None, **options: Any
) -> tuple[VideoTransformer, LoadReport]:
    """Build the video transformer a Hugging Face folder describes and load its weights.

    Args:
        folder: a ``save_pretrained`` folder of VideoMAE (classifier, ``VideoMAEModel`` or
            ``VideoMAEForPreTraining``), TimeSformer or V-JEPA 2 (``VJEPA2Model``, or the
            classifier ``VJEPA2ForVideoClassification``, attentive pooler included), or a Hugging
            Face hub id (``"MCG-NJU/videomae-base-finetuned-kinetics"``) fetched once into the hub
            cache (:func:`peg_core.interop.resolve_weights`; ``HF_HUB_OFFLINE=1``: the cache only).
        pos_enc: ``None`` (the model's own encoding), ``"peg3d"``, ``"peg3d-factorized"``,
            ``"peg3d+rope-3d"`` (rotary models), ``"none"``, or another conditional encoding of
            the registry (module docstring).
        num_classes: classifier outputs; ``None`` keeps the folder's (0 for an encoder: the
            model returns pooled features).  Another size gets a freshly initialised head.
        options: more :class:`VideoTransformer` keywords (:func:`hf_model_config`).

    Returns:
        ``(model, report)``: the model in eval mode on the CPU, and a
        :class:`~peg_core.interop.io.LoadReport` whose ``copied`` / ``converted`` are the keys
        used, ``skipped`` the source keys left out (decoder, predictor, dropped tables, another
        head) and ``missing`` the model keys added (zero PEG3d, new head); ``args`` is the config.

    Raises:
        WeightsError: missing folder / config / weights file, unsupported model type, or weights
            whose keys or shapes do not match the config (the first offending key named).
    """
    folder = resolve_weights(folder, kind="folder").path  # a hub id: its snapshot (a Path stays a path)
    info = read_hf_video_config(folder)
    return load_hf_model(info, hf_build_config(info, pos_enc, num_classes=num_classes, **options))


def load_hf_model(info: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[VideoTransformer, LoadReport]:
    """:func:`from_hf` of a folder already read: ``info`` (:func:`read_hf_video_config`) and the
    builder keywords ``config`` (:func:`hf_build_config`), so a caller that needs both reads
    ``config.json`` once.  Returns ``(model, report)`` as :func:`from_hf` does."""
    folder = Path(info["config_file"]).parent
    state, where = read_hf_weights(folder)
    _check_against_weights(info, state)  # before the model is built: a width the weights lack builds nothing
    model = build_video_model(**config)
    report = LoadReport(source=str(where), args=info["config"])
    kind = info["model_type"]
    keep_table = any(k.startswith("pos_enc.") for k in model.state_dict())
    _load(model, _MAPPERS[kind](state, report, keep_table), report, where)
    _note_dropped_encoding(report, kind, config["pos_enc"])
    return model.eval(), report


#: the normalisation of runs that record none (peg_video's Kinetics default, ``KINETICS_MEAN`` / ``_STD``)
_DEFAULT_MEAN, _DEFAULT_STD = (0.45, 0.45, 0.45), (0.225, 0.225, 0.225)


def videomae_processor_configs(
    crop: tuple[int, int],
    short_side: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    num_frames: int | None = None,
) -> dict[str, dict[str, Any]]:
    """``{file name: JSON}`` of the processors transformers pairs with VideoMAE, as peg_video evaluates.

    ``preprocessor_config.json`` (``VideoMAEImageProcessor``: what ``AutoImageProcessor`` loads) and
    ``video_preprocessor_config.json`` (``VideoMAEVideoProcessor``: what ``pipeline("video-classification")``
    and ``AutoVideoProcessor`` load): frames resized to ``short_side`` on their short side (the run's
    test scale; default the crop's short side), the centre ``crop`` ``(H, W)`` taken, pixels rescaled
    to [0, 1] and normalised by ``mean`` / ``std`` (the run's; default Kinetics'), as
    :class:`peg_video.predict.Predictor` does with one clip and one crop.  ``num_frames``: what the
    video processor samples when asked to (the pipeline asks for ``config.num_frames``).
    """
    h, w = crop
    common = {
        "do_resize": True,
        "size": {"shortest_edge": int(short_side or min(h, w))},
        "resample": 2,  # bilinear
        "do_center_crop": True,
        "crop_size": {"height": int(h), "width": int(w)},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [float(v) for v in (mean or _DEFAULT_MEAN)],
        "image_std": [float(v) for v in (std or _DEFAULT_STD)],
    }
    video = {"video_processor_type": "VideoMAEVideoProcessor", **common, "do_convert_rgb": True}
    if num_frames:
        video["num_frames"] = int(num_frames)
    return {
        "preprocessor_config.json": {"image_processor_type": "VideoMAEImageProcessor", **common},
        "video_preprocessor_config.json": video,
    }


def export_hf(
    model: VideoTransformer,
    out_dir: PathLike,
    classes: list[str] | None = None,
    *,
    short_side: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Path:
    """Write a VideoMAE-layout folder (``config.json`` + ``model.safetensors``); returns ``out_dir``.

    ``classes`` (one name per output, e.g. a training checkpoint's) become ``id2label``; without
    them the labels are ``LABEL_<i>``.  The model must be what VideoMAE can express: joint
    attention, tubelet Conv3d, ``pos_enc="sinusoid-1d"``, gelu MLP, and mean pooling with
    ``fc_norm`` (eps 1e-5) or the final norm with ``global_pool="first"``.  A full ``qkv`` bias
    is written as ``q_bias`` / ``v_bias``: the key bias adds the same score to every key of a
    query, which the softmax removes, so the outputs do not change.
    ``VideoMAEForVideoClassification.from_pretrained(out_dir)`` then gives the same logits.
    The processors (:func:`videomae_processor_configs`: the model's crop, ``short_side`` the run's
    test scale, ``mean`` / ``std`` its normalisation) make ``pipeline("video-classification", out_dir)``
    feed the model what ``predict`` feeds it; the command line passes the checkpoint's run's.

    Raises ``TypeError`` for another model, ``ValueError`` naming the option VideoMAE cannot express.
    """
    if not isinstance(model, VideoTransformer):
        raise TypeError(f"export_hf writes a VideoTransformer; got {type(model).__name__}")
    _check_exportable(model)
    processors = videomae_processor_configs(tuple(model.img_size), short_side, mean, std, model.num_frames)
    return write_hf_folder(out_dir, _videomae_config(model, classes), _videomae_state(model), processors)


# ------------------------------------------------------------------------------- the model config

#: keywords the mapping sets itself; an ``options`` entry for one would change the architecture
_MAPPED_KEYWORDS = ("name", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "norm_eps", "pos_enc",
                    "rope_layout", "attention", "temporal_fc", "global_pool", "fc_norm_eps", "num_frames",
                    "img_size", "tubelet", "num_classes", "peg_zero_init", "pool_depth", "pool_mlp_ratio")  # fmt: skip
#: how transformers' TimeSformer resizes its tables at another clip shape (nearest, both tables)
_TIMESFORMER_RESIZE = {"pos_interpolation": "nearest", "pos_temporal_interpolation": "nearest"}
#: transformers' LayerNorm default: VideoMAE's ``fc_norm`` does not take the config's eps
_TORCH_LAYERNORM_EPS = 1e-5


def _native(info: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`VideoTransformer` keywords that reproduce the folder's own model."""
    kind = info["model_type"]
    f = ConfigFields(info["config"], info.get("config_file", "config.json"))
    if info["hidden_act"] != "gelu":
        f.fail("hidden_act", '"gelu" (peg_video\'s MLP is gelu)')
    if kind == "videomae":
        pooled = f.flag("use_mean_pooling", True)
        head = (
            {"global_pool": "avg", "fc_norm_eps": _TORCH_LAYERNORM_EPS}
            if pooled
            else {"global_pool": "first"}
        )
        return {"pos_enc": "sinusoid-1d", "qkv_bias": "qv" if f.flag("qv_bias", True) else False, **head}
    if kind == "timesformer":
        attention = f.choice(
            "attention_type", "divided_space_time", ("divided_space_time", "joint_space_time")
        )
        divided = attention == "divided_space_time"
        return {"pos_enc": "learned", "qkv_bias": f.flag("qkv_bias", True), "global_pool": "token",
                "attention": "divided" if divided else "joint", "temporal_fc": divided,
                **_TIMESFORMER_RESIZE}  # fmt: skip
    # a classifier's attentive pooler: its MLPs are 4x wide whatever the encoder's mlp_ratio
    head = {
        "global_pool": "attentive",
        "pool_depth": f.integer("num_pooler_layers", 3, min=0),
        "pool_mlp_ratio": 4.0,
    }
    return {"pos_enc": "rope-3d", "rope_layout": "vjepa2", "qkv_bias": f.flag("qkv_bias", True),
            **(head if info["classifier"] else {"global_pool": "avg"})}  # fmt: skip


def _with_pos_enc(native: dict[str, Any], pos_enc: str | None) -> dict[str, Any]:
    """``native`` with its encoding replaced as ``pos_enc`` asks (module docstring)."""
    if pos_enc is None:
        return native
    spec = parse_pos_enc(pos_enc, VIDEO_ENCODINGS)
    if spec.table is not None:  # the folder has no weights for another table
        raise ValueError(f"pos_enc must be None (the folder's own encoding), a conditional encoding such as "
                         f"'peg3d', its rotary one or 'none'; got the table {pos_enc!r}")  # fmt: skip
    own = parse_pos_enc(native["pos_enc"], VIDEO_ENCODINGS)
    if (
        spec.rotary is not None and spec.rotary is not own.rotary
    ):  # V-JEPA 2's rotary encoding is kept, never added
        raise ValueError(
            f"pos_enc={pos_enc!r} keeps a rotary encoding; this model's is {native['pos_enc']!r}"
        )
    out = {**native, "pos_enc": pos_enc}
    for key in _TIMESFORMER_RESIZE:  # a dropped table has nothing to resize
        out.pop(key, None)
    if spec.rotary is None:
        out.pop("rope_layout", None)
    if spec.conditional is not None:
        out["peg_zero_init"] = True
    return out


def _model_config(
    info: Mapping[str, Any], pos_enc: str | None, num_classes: int | None, options: Mapping[str, Any]
) -> dict[str, Any]:
    clash = sorted(set(options) & set(_MAPPED_KEYWORDS))
    if clash:
        raise ValueError(f"{', '.join(clash)} are set by the Hugging Face config; they cannot be overridden")
    dim, ratio = info["embed_dim"], info["mlp_ratio"]
    if int(dim * ratio) != round(dim * ratio):
        raise WeightsError(
            f"intermediate size {dim * ratio:g} is not a whole number of channels",
            info.get("config_file", "config.json"),
        )
    return {
        "name": "vit_small",  # the registry's ViT; every size below overrides it
        "embed_dim": dim,
        "depth": info["depth"],
        "num_heads": info["num_heads"],
        "mlp_ratio": ratio,
        "norm_eps": info["norm_eps"],
        "num_classes": info["num_classes"] if num_classes is None else int(num_classes),
        "num_frames": info["num_frames"],
        "img_size": list(info["image_size"]),
        "tubelet": list(info["tubelet"]),
        **_with_pos_enc(_native(info), pos_enc),
        **options,
    }


# --------------------------------------------------------------------------------------- weights

#: the tubelet (VideoMAE, V-JEPA 2: Conv3d ``(D, 3, t, p, p)``) or per-frame (TimeSformer: Conv2d
#: ``(D, 3, p, p)``) patch embedding's weight, after the classifier's ``<model_type>.`` prefix
_PATCH_EMBED = {
    "videomae": "embeddings.patch_embeddings.projection.weight",
    "timesformer": "embeddings.patch_embeddings.projection.weight",
    "vjepa2": "encoder.embeddings.patch_embeddings.proj.weight",
}


def _check_against_weights(info: Mapping[str, Any], state: Mapping[str, Tensor]) -> None:
    """The sizes config.json gives against the tensors they describe: a :class:`WeightsError` naming
    config.json, the field and the tensor (width, channels, tubelet, patch, layer count, MLP width)."""
    kind, dim = info["model_type"], info["embed_dim"]
    f = ConfigFields(info["config"], info.get("config_file", "config.json"))

    def key(short: str) -> str:  # a classifier's keys carry the model type's prefix, an encoder's do not
        return f"{kind}.{short}" if f"{kind}.{short}" in state else short

    patch = key(_PATCH_EMBED[kind])
    t, ph, pw = info["tubelet"]
    spatial = 2 if kind == "timesformer" else 3  # the first patch axis: (D, C, [t,] p, p)
    f.against("hidden_size", dim, state, patch, 0)
    f.against("num_channels", 3, state, patch, 1)
    if kind != "timesformer":
        f.against("tubelet_size", t, state, patch, 2)
    f.against("patch_size", ph, state, patch, spatial)
    f.against("patch_size", pw, state, patch, spatial + 1)
    f.count_against("num_hidden_layers", info["depth"], state, rf"(?:{kind}\.)?encoder\.layer\.(\d+)\.")
    if kind != "vjepa2":
        mlp = round(dim * info["mlp_ratio"])
        f.against("intermediate_size", mlp, state, key("encoder.layer.0.intermediate.dense.weight"))


#: a model key's source: (source key, tensor, how it was converted or None when copied as is)
Source = tuple[str, Tensor, str | None]


def _fuse(
    state: dict[str, Tensor], names: tuple[str, ...], fused_name: str, notes: dict[str, str], under: str = ""
) -> dict[str, Tensor]:
    """``<x>.<names[i]>.<weight|bias>`` -> ``<x>.<fused_name>.<weight|bias>`` (rows concatenated in order).

    Only where every one of ``names`` exists and ``<x>`` starts with ``under``; ``notes`` gets,
    for each fused key, how it was made.
    """
    out = dict(state)
    for key in list(state):
        m = re.fullmatch(rf"(.*)\.{names[0]}\.(weight|bias)", key)
        parts = [f"{m[1]}.{n}.{m[2]}" for n in names] if m and m[1].startswith(under) else []
        if parts and all(p in state for p in parts):
            fused = f"{m[1]}.{fused_name}.{m[2]}"
            out[fused] = torch.cat([state[p] for p in parts])
            for p in parts:
                del out[p]
            notes[fused] = f"{m[1]}.{{{','.join(names)}}}.{m[2]} concatenated"
    return out


_LAYER = r"encoder\.layer\.(\d+)\."
#: the transformers ViT layer names VideoMAE and TimeSformer share
_VIT_LAYER = [
    (_LAYER + r"attention\.attention\.qkv\.", r"blocks.\1.attn.qkv."),
    (_LAYER + r"attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    (_LAYER + r"intermediate\.dense\.", r"blocks.\1.mlp.fc1."),
    (_LAYER + r"output\.dense\.", r"blocks.\1.mlp.fc2."),
    (_LAYER + r"layernorm_before\.", r"blocks.\1.norm1."),
    (_LAYER + r"layernorm_after\.", r"blocks.\1.norm2."),
    (r"layernorm\.", "norm."),
    (r"classifier\.", "head."),
]
#: V-JEPA 2's attentive pooler: its self-attention layers and its cross-attention layer
_POOL = r"pooler\.self_attention_layers\.(\d+)\."
_CROSS = r"pooler\.cross_attention_layer\."
#: per model type: (prefix stripped, [(source regex, model key)], [(source regex, why left out)])
_RULES: dict[str, tuple[str, list[tuple[str, str]], list[tuple[str, str]]]] = {
    "videomae": ("videomae.", [
        (r"embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (_LAYER + r"attention\.attention\.(?:query\.bias|q_bias)", r"blocks.\1.attn.qkv.q_bias"),
        (_LAYER + r"attention\.attention\.(?:value\.bias|v_bias)", r"blocks.\1.attn.qkv.v_bias"),
        (r"fc_norm\.", "fc_norm."), *_VIT_LAYER,
    ], [(r"(encoder_to_decoder|decoder|mask_token)\b", "VideoMAE pre-training decoder (not an encoder part)")]),
    "timesformer": ("timesformer.", [
        (_LAYER + r"temporal_attention\.attention\.qkv\.", r"blocks.\1.attn_t.qkv."),
        (_LAYER + r"temporal_attention\.output\.dense\.", r"blocks.\1.attn_t.proj."),
        (_LAYER + r"temporal_dense\.", r"blocks.\1.temporal_fc."),
        (_LAYER + r"temporal_layernorm\.", r"blocks.\1.norm_t."), *_VIT_LAYER,
    ], []),
    "vjepa2": ("vjepa2.", [
        (r"encoder\.embeddings\.patch_embeddings\.proj\.", "patch_embed.proj."),
        (_LAYER + r"attention\.qkv\.", r"blocks.\1.attn.qkv."),
        (_LAYER + r"attention\.proj\.", r"blocks.\1.attn.proj."),
        (_LAYER + r"(norm1|norm2|mlp\.fc1|mlp\.fc2)\.", r"blocks.\1.\2."),
        (r"encoder\.layernorm\.", "norm."),
        (r"pooler\.query_tokens$", "pool.query"),
        (_POOL + r"layer_norm(\d)\.", r"pool.blocks.\1.norm\2."),
        (_POOL + r"self_attn\.qkv\.", r"pool.blocks.\1.attn.qkv."),
        (_POOL + r"self_attn\.out_proj\.", r"pool.blocks.\1.attn.proj."),
        (_POOL + r"mlp\.", r"pool.blocks.\1.mlp."),
        (_CROSS + r"layer_norm(\d)\.", r"pool.cross.norm\1."),
        (_CROSS + r"cross_attn\.q_proj\.", "pool.cross.q."),
        (_CROSS + r"cross_attn\.kv\.", "pool.cross.kv."),
        (_CROSS + r"mlp\.", "pool.cross.mlp."),
        (r"classifier\.", "head."),
    ], [
        (r"predictor\.", "V-JEPA 2 predictor (pre-training only)"),
    ]),
}  # fmt: skip


def _rename(state: Mapping[str, Tensor], kind: str, report: LoadReport, notes: Mapping[str, str] = {}
            ) -> dict[str, Source]:  # fmt: skip
    """Model key -> source by the rules of ``kind``; left-out keys go to ``report.skipped``."""
    prefix, rules, left_out = _RULES[kind]
    out: dict[str, Source] = {}
    for key, value in state.items():
        short = key.removeprefix(prefix)
        why = next((w for pat, w in left_out if re.match(pat, short)), None)
        if why is not None:
            report.skipped[key] = why
            continue
        for pat, repl in rules:
            m = re.match(pat, short)
            if m:
                out[m.expand(repl) + short[m.end() :]] = (key, value, notes.get(key))
                break
        else:
            out[short] = (key, value, None)  # no rule: kept under its own name, which the load refuses
    return out


def _map_joint(kind: str) -> Callable[[dict[str, Tensor], LoadReport, bool], dict[str, Source]]:
    """VideoMAE / V-JEPA 2: separate query / key / value projections fused, everything else renamed."""

    def mapper(state: dict[str, Tensor], report: LoadReport, keep_table: bool) -> dict[str, Source]:
        notes: dict[str, str] = {}
        fused = _fuse(state, ("query", "key", "value"), "qkv", notes)
        # V-JEPA 2's pooler: the cross-attention's key / value first (its query stays alone), then
        # the self-attention layers' query / key / value
        fused = _fuse(fused, ("k_proj", "v_proj"), "kv", notes, under="pooler.cross_attention_layer.")
        fused = _fuse(fused, ("q_proj", "k_proj", "v_proj"), "qkv", notes)
        return _rename(fused, kind, report, notes)

    return mapper


#: the embeddings of a classifier (``timesformer.``) and of a ``TimesformerModel`` (no prefix)
_EMBEDDINGS = ("timesformer.embeddings.", "embeddings.")
_TABLES = ("position_embeddings", "time_embeddings")


def _embedding(key: str) -> str | None:
    """A TimeSformer key below its embeddings (``cls_token``, ...), or None for any other key."""
    return next((key.removeprefix(p) for p in _EMBEDDINGS if key.startswith(p)), None)


def _map_timesformer(state: dict[str, Tensor], report: LoadReport, keep_table: bool) -> dict[str, Source]:
    """TimeSformer: the per-frame Conv2d as a ``(1, p, p)`` tubelet; the tables and the class token."""
    out = _rename({k: v for k, v in state.items() if _embedding(k) is None}, "timesformer", report)
    emb = {short: (k, v) for k, v in state.items() if (short := _embedding(k)) is not None}
    named = {"patch_embeddings.projection.weight": "patch_embed.proj.weight",
             "patch_embeddings.projection.bias": "patch_embed.proj.bias", "cls_token": "cls_token"}  # fmt: skip
    for short, (key, value) in emb.items():
        if short in _TABLES and not keep_table:
            report.skipped[key] = "position table dropped (replaced by the pos_enc asked for)"
        elif short not in named and short not in _TABLES:
            out[key] = (key, value, None)  # unknown: refused by the load
        elif short in named:
            out[named[short]] = (key, value, None)
    key, w, _ = out.get("patch_embed.proj.weight", ("", None, None))
    if w is not None:
        out["patch_embed.proj.weight"] = (
            key,
            w.unsqueeze(2),
            f"{key} (per-frame Conv2d) as a 1-frame tubelet",
        )
    if keep_table and "position_embeddings" in emb:
        key, pos = emb["position_embeddings"]
        out["pos_enc.spatial"] = (key, pos[:, 1:], f"{key} without its class-token row")
        if "cls_token" in emb:  # the class token's code is a constant added to a constant: fold it in
            ckey, cls = emb["cls_token"]
            out["cls_token"] = (ckey, cls + pos[:, :1], f"{ckey} + the class-token row of {key}")
    if keep_table and "time_embeddings" in emb:
        out["pos_enc.temporal"] = (*emb["time_embeddings"], None)
    return out


_MAPPERS = {
    "videomae": _map_joint("videomae"),
    "timesformer": _map_timesformer,
    "vjepa2": _map_joint("vjepa2"),
}

#: model keys a folder need not have: a new PEG3d, a new classifier head, VideoMAE's fc_norm under a new head
_MAY_BE_ADDED = ("pos_blocks.", "head.", "fc_norm.")


def _place(mkey: str, skey: str, value: Tensor, mine: Mapping[str, Tensor], report: LoadReport,
           where: Path) -> bool:  # fmt: skip
    """Whether source ``skey`` fills model key ``mkey``; a head that does not fit is left out, else refused."""
    if mkey.startswith("head.") and (mkey not in mine or mine[mkey].shape != value.shape):
        n = mine["head.weight"].shape[0] if "head.weight" in mine else 0
        report.skipped[skey] = f"the folder's classifier ({value.shape[0]} outputs); the model has {n}"
        return False
    if mkey not in mine:
        raise WeightsError(f"the weights have {skey}, which the model config.json describes has no place for",
                           where)  # fmt: skip
    if value.shape != mine[mkey].shape:
        raise WeightsError(f"{skey} has shape {tuple(value.shape)}; config.json describes "
                           f"{tuple(mine[mkey].shape)} (model key {mkey})", where)  # fmt: skip
    return True


def _load(model: VideoTransformer, mapped: Mapping[str, Source], report: LoadReport, where: Path) -> None:
    """Load ``mapped`` into ``model`` strictly; record every key in ``report``."""
    mine = model.state_dict()
    state = dict(mine)
    filled = set()
    for mkey, (skey, value, how) in mapped.items():
        if not _place(mkey, skey, value, mine, report, where):
            continue
        state[mkey] = value.to(mine[mkey].dtype)
        filled.add(mkey)
        if how is None:
            report.copied.append(mkey)
        else:
            report.converted[mkey] = how
    for key in mine:
        if key in filled:
            continue
        if not key.startswith(_MAY_BE_ADDED):
            raise WeightsError(f"the weights have no tensor for {key}, which the model config.json describes needs",
                               where)  # fmt: skip
        report.missing.append(key)
    model.load_state_dict(state)


def _note_dropped_encoding(report: LoadReport, kind: str, pos_enc: str) -> None:
    """Record an encoding that is no state-dict key (VideoMAE's fixed table, V-JEPA 2's rotary) as left out."""
    spec = parse_pos_enc(pos_enc, VIDEO_ENCODINGS)
    if kind == "videomae" and spec.table is None:
        report.skipped["videomae.embeddings.position_embeddings"] = (
            f"fixed sinusoid table (not in the weights file) dropped for pos_enc={pos_enc!r}"
        )
    if kind == "vjepa2" and spec.rotary is None:
        report.skipped["<3-D rotary encoding>"] = f"dropped for pos_enc={pos_enc!r}"


# ---------------------------------------------------------------------------------------- export


def _check_exportable(model: VideoTransformer) -> None:
    """``ValueError`` naming the first thing of ``model`` that VideoMAE's layout cannot hold."""
    fc_eps = None if model.fc_norm is None else model.fc_norm.eps
    problems = [
        (model.pos_enc_kind != "sinusoid-1d", f"pos_enc={model.pos_enc_kind!r} (VideoMAE has its fixed "
                                              "sinusoid table only, pos_enc='sinusoid-1d')"),
        (model.attention != "joint", f"attention={model.attention!r} (VideoMAE attends jointly)"),
        (model.tubelet[1] != model.tubelet[2], f"tubelet {model.tubelet} (VideoMAE's patches are square)"),
        (model.global_pool == "avg" and fc_eps != _TORCH_LAYERNORM_EPS,
         f"mean pooling without fc_norm_eps={_TORCH_LAYERNORM_EPS:g} (VideoMAE's fc_norm)"),
        (model.global_pool == "token", "global_pool='token' (VideoMAE has no class token)"),
        (model.global_pool == "attentive", "global_pool='attentive' (VideoMAE pools by the mean or the first token)"),
        (model.global_pool == "first" and model.fc_norm is not None, "fc_norm with global_pool='first'"),
    ]  # fmt: skip
    blocks = list(model.blocks)
    if any(not isinstance(b.ls1, torch.nn.Identity) for b in blocks):
        problems.append((True, "layer scale (VideoMAE has none)"))
    if len({b.norm1.eps for b in blocks} | {b.norm2.eps for b in blocks}) > 1:
        problems.append((True, "LayerNorms with different eps (VideoMAE has one layer_norm_eps)"))
    for bad, what in problems:
        if bad:
            raise ValueError(f"export_hf writes VideoMAE's layout, which cannot hold {what}")


def _videomae_config(model: VideoTransformer, classes: list[str] | None) -> dict[str, Any]:
    """``config.json`` of the exported folder (transformers fills the other fields with its defaults)."""
    blk = model.blocks[0]
    n = model.num_classes
    labels = classes if classes and len(classes) == n else [f"LABEL_{i}" for i in range(n)]
    h, w = model.img_size
    return {
        "architectures": ["VideoMAEForVideoClassification" if n else "VideoMAEModel"],
        "model_type": "videomae",
        "hidden_size": model.embed_dim,
        "num_hidden_layers": len(model.blocks),
        "num_attention_heads": blk.attn.num_heads,
        "intermediate_size": blk.mlp.fc1.out_features,
        "hidden_act": "gelu",
        "image_size": h if h == w else [h, w],
        "patch_size": model.tubelet[1],
        "num_channels": model.patch_embed.in_chans,
        "num_frames": model.num_frames,
        "tubelet_size": model.tubelet[0],
        "layer_norm_eps": blk.norm1.eps,
        "qv_bias": blk.attn.qkv.bias is not None or hasattr(blk.attn.qkv, "q_bias"),
        "use_mean_pooling": model.global_pool == "avg",
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
    }


def _videomae_qkv(qkv: torch.nn.Linear, layer: str) -> dict[str, Tensor]:
    """A fused projection as VideoMAE's query / key / value (the key bias, if any, is dropped: see export_hf)."""
    q, k, v = qkv.weight.detach().chunk(3)
    out = {f"{layer}.query.weight": q, f"{layer}.key.weight": k, f"{layer}.value.weight": v}
    if hasattr(qkv, "q_bias"):
        out[f"{layer}.query.bias"], out[f"{layer}.value.bias"] = qkv.q_bias.detach(), qkv.v_bias.detach()
    elif qkv.bias is not None:
        qb, _, vb = qkv.bias.detach().chunk(3)
        out[f"{layer}.query.bias"], out[f"{layer}.value.bias"] = qb, vb
    return out


def _videomae_state(model: VideoTransformer) -> dict[str, Tensor]:
    """The model's weights under VideoMAE's keys (``videomae.`` prefix for a classifier)."""
    pre = "videomae." if model.num_classes else ""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {
        f"{pre}embeddings.patch_embeddings.projection.{p}": sd[f"patch_embed.proj.{p}"]
        for p in ("weight", "bias")
    }
    names = {"attn.proj": "attention.output.dense", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense",
             "norm1": "layernorm_before", "norm2": "layernorm_after"}  # fmt: skip
    for i, blk in enumerate(model.blocks):
        layer = f"{pre}encoder.layer.{i}"
        out.update(_videomae_qkv(blk.attn.qkv, f"{layer}.attention.attention"))
        for mine, theirs in names.items():
            for p in ("weight", "bias"):
                out[f"{layer}.{theirs}.{p}"] = sd[f"blocks.{i}.{mine}.{p}"]
    tail = {"norm": f"{pre}layernorm", **({"fc_norm": "fc_norm", "head": "classifier"} if pre else {})}
    for mine, theirs in tail.items():
        for p in ("weight", "bias"):
            if f"{mine}.{p}" in sd:
                out[f"{theirs}.{p}"] = sd[f"{mine}.{p}"]
    return {k: v.contiguous() for k, v in out.items()}
