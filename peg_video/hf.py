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
* :func:`read_hf_video_config` ``(folder) -> dict``: the folder's sizes, clip shape, normalisation
  and labels in peg_video's terms;
* :func:`export_hf` ``(model_or_checkpoint, out_dir) -> Path``: a VideoMAE-layout folder
  (``config.json`` + ``model.safetensors``) for a model with VideoMAE's table;
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
  ``rope_layout="vjepa2"``) with positions from the input's grid; the predictor (and a
  classifier's attentive pooler, which peg_video does not model) are left out and reported.

``pos_enc``: ``None`` keeps the model's own encoding; ``"peg3d"`` / ``"peg3d-factorized"`` drop
the table (or the rotary encoding) and add a zero-initialised PEG3d, so before fine-tuning the
model equals the original with its table zeroed; ``"peg3d+rope-3d"`` (V-JEPA 2) keeps the rotary
encoding and adds the zero PEG3d; ``"none"`` drops the encoding.

Errors: a missing folder or ``config.json``, an unsupported ``model_type`` / option, or weights
that do not match the config are :class:`peg_core.interop.io.WeightsError` (``what`` + ``where``,
one line on the command line).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from peg_core.interop.io import LoadReport, WeightsError

from .models.vit import VideoTransformer

__all__ = ["HF_MODEL_TYPES", "export_hf", "from_hf", "hf_model_config", "read_hf_video_config"]

#: ``config.json`` model types :func:`from_hf` reads
HF_MODEL_TYPES = ("videomae", "timesformer", "vjepa2")

PathLike = str | os.PathLike

#: preprocessor files that may hold the normalisation a checkpoint expects, tried in order
PREPROCESSOR_FILES = ("video_preprocessor_config.json", "preprocessor_config.json")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{what} is not readable JSON ({type(e).__name__}: {e})", path) from None
    if not isinstance(obj, dict):
        raise WeightsError(f"{what} is not a JSON object", path)
    return obj


def _pair(x: Any) -> tuple[int, int]:
    return (int(x), int(x)) if isinstance(x, int | float) else (int(x[0]), int(x[1]))


def _mean_std(folder: Path) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """``image_mean`` / ``image_std`` of the folder's (video) preprocessor config, or ``(None, None)``."""
    for name in PREPROCESSOR_FILES:
        if (folder / name).is_file():
            pre = _read_json(folder / name, name)
            mean, std = pre.get("image_mean"), pre.get("image_std")
            if mean is not None and std is not None:
                return tuple(float(v) for v in mean), tuple(float(v) for v in std)
    return None, None


def _sizes(cfg: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The transformer's sizes and clip shape from a ``config.json`` of ``model_type``."""
    dim, heads = int(cfg.get("hidden_size", 768)), int(cfg.get("num_attention_heads", 12))
    patch = _pair(cfg.get("patch_size", 16))
    if model_type == "vjepa2":
        image = _pair(cfg.get("crop_size", 256))
        frames, tub = int(cfg.get("frames_per_clip", 64)), int(cfg.get("tubelet_size", 2))
        mlp_ratio = float(cfg.get("mlp_ratio", 4.0))
    else:
        image = _pair(cfg.get("image_size", 224))
        frames = int(cfg.get("num_frames", 16 if model_type == "videomae" else 8))
        tub = int(cfg.get("tubelet_size", 2)) if model_type == "videomae" else 1
        mlp_ratio = int(cfg.get("intermediate_size", 4 * dim)) / dim
    eps_default = 1e-12 if model_type == "videomae" else 1e-6
    return {
        "embed_dim": dim,
        "depth": int(cfg.get("num_hidden_layers", 12)),
        "num_heads": heads,
        "mlp_ratio": mlp_ratio,
        "norm_eps": float(cfg.get("layer_norm_eps", eps_default)),
        "num_frames": frames,
        "image_size": image,
        "tubelet": (tub, *patch),
        "hidden_act": cfg.get("hidden_act", "gelu"),
    }


def read_hf_video_config(folder: PathLike) -> dict[str, Any]:
    """The folder's model in peg_video's terms (``config.json``, plus the preprocessor config if any).

    Returns a dict with ``model_type``, ``architecture`` (the ``architectures[0]`` class name or
    ``None``), ``classifier`` (bool), ``embed_dim``, ``depth``, ``num_heads``, ``mlp_ratio``,
    ``norm_eps``, ``num_frames``, ``image_size`` ``(H, W)``, ``tubelet`` ``(t, p, p)``,
    ``num_classes`` (0 for an encoder), ``id2label`` (``{int: str}``), ``mean`` / ``std``
    (3-tuples from ``preprocessor_config.json`` / ``video_preprocessor_config.json``, else
    ``None``) and ``config`` (the raw ``config.json``).

    Raises :class:`WeightsError` for a missing folder or ``config.json``, JSON that does not
    parse, or a ``model_type`` outside :data:`HF_MODEL_TYPES`.
    """
    raise NotImplementedError


def hf_model_config(
    folder: PathLike, pos_enc: str | None = None, *, num_classes: int | None = None, **options: Any
) -> dict[str, Any]:
    """JSON-safe :func:`peg_video.build_video_model` keywords of the model :func:`from_hf` builds.

    ``num_classes=None`` keeps the folder's classifier size (0, pooled features, for an encoder);
    ``options`` are further :class:`VideoTransformer` keywords (``drop_path_rate``, ``peg_at``,
    ``peg_kernel_size``, ...); ones that would change the mapped architecture are a ``ValueError``.
    """
    raise NotImplementedError


def from_hf(
    folder: PathLike, pos_enc: str | None = None, *, num_classes: int | None = None, **options: Any
) -> tuple[VideoTransformer, LoadReport]:
    """Build the video transformer a Hugging Face folder describes and load its weights.

    Args:
        folder: a ``save_pretrained`` folder of VideoMAE (classifier, ``VideoMAEModel`` or
            ``VideoMAEForPreTraining``), TimeSformer or V-JEPA 2 (``VJEPA2Model``, or the
            encoder of ``VJEPA2ForVideoClassification``).
        pos_enc: ``None`` (the model's own encoding), ``"peg3d"``, ``"peg3d-factorized"``,
            ``"peg3d+rope-3d"`` (rotary models) or ``"none"`` (module docstring).
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
    raise NotImplementedError


def export_hf(model_or_checkpoint: VideoTransformer | PathLike, out_dir: PathLike) -> Path:
    """Write a VideoMAE-layout folder (``config.json`` + ``model.safetensors``); returns ``out_dir``.

    ``model_or_checkpoint`` is a :class:`VideoTransformer` or a peg_video training checkpoint
    (its class names become ``id2label``).  The model must be what VideoMAE can express: joint
    attention, tubelet Conv3d, ``pos_enc="sinusoid-1d"``, gelu MLP, and mean pooling with
    ``fc_norm`` (eps 1e-5) or the final norm with ``global_pool="first"``.  A full ``qkv`` bias
    is written as ``q_bias`` / ``v_bias``: the key bias adds the same score to every key of a
    query, which the softmax removes, so the outputs do not change.
    ``VideoMAEForVideoClassification.from_pretrained(out_dir)`` then gives the same logits.

    Raises ``ValueError`` naming the option VideoMAE cannot express.
    """
    raise NotImplementedError
