"""The detector from a json-safe config, and back from a training checkpoint (eval, predict, study).

A training checkpoint stores ``model_config`` (``arch`` and every keyword of
:func:`~peg_detr.build_detr` but the backbone weights file, as recorded by the
builder) and ``meta`` (``categories``, ``num_classes``, ``val_size``, ...), so
``eval`` and ``predict`` rebuild exactly the trained model without the run's flags.
Configs written before the shared vocabulary (``nheads``) are read with today's names.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from peg_core.engine import LoadedModel, UserError, checkpoint_and_where, load_model_state, read_state_file
from peg_core.engine.cli import peg_kwargs

from .models import build_detr

__all__ = ["ARCHS", "build_model", "load_model", "model_config_from_args", "upgrade_config"]

#: ``--arch`` -> the builder of ``(model, criterion, postprocessor)`` (the real-time DETR joins later)
ARCHS = {"detr": build_detr}
#: old model_config keys -> today's builder keywords
_RENAMED = {"nheads": "num_heads"}
# argparse dests forwarded to the builder as keywords when set (None: the builder's default)
_MODEL_OPTIONS = (
    "backbone_weights", "hidden_dim", "num_heads", "enc_layers", "dec_layers", "dim_feedforward", "dropout",
    "decoder_key_pos", "learned_grid", "pos_interpolation",
)  # fmt: skip


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stored ``model_config`` with old key names (``nheads``) renamed."""
    return {_RENAMED.get(k, k): v for k, v in config.items()}


def build_model(
    config: dict[str, Any], source: Any = "model options"
) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``ARCHS[arch](**config)`` -> ``(model, criterion, postprocessor)``; bad settings are a :class:`UserError`.

    ``source`` names where ``config`` came from (the flags, or a checkpoint path) in the message.
    ``model.build_config`` records ``arch`` and the builder's keywords.
    """
    kw = upgrade_config(config)
    arch = kw.pop("arch", "detr")
    if arch not in ARCHS:
        raise UserError(f"unknown arch {arch!r}; choose from {sorted(ARCHS)}", source)
    hidden, heads = kw.get("hidden_dim", 256), kw.get("num_heads", 8)
    if hidden % heads:
        raise UserError(f"--hidden-dim {hidden} is not divisible by --num-heads {heads}", source)
    weights = kw.get("backbone_weights")
    if weights is not None:  # missing / empty / not a torch file: one line, before building
        read_state_file(weights, what="backbone weights")
    try:
        model, criterion, postprocessor = ARCHS[arch](
            kw.pop("backbone", "resnet50"), kw.pop("pos_enc", "peg"), **kw
        )
    except (ValueError, TypeError) as e:  # the builder checks its arguments; TypeError: an unknown key
        raise UserError(f"invalid model settings ({' '.join(str(e).split())})", source) from None
    model.build_config = {"arch": arch, **model.build_config}
    return model, criterion, postprocessor


def model_config_from_args(args: argparse.Namespace, num_classes: int) -> dict[str, Any]:
    """The ``model_config`` of parsed ``train`` flags (unset options: the builder's default)."""
    kw: dict[str, Any] = {
        "arch": getattr(args, "arch", None) or "detr",
        "backbone": args.backbone,
        "pos_enc": args.pos_enc,
        "num_classes": num_classes,
        "num_queries": args.num_queries,
        "dilation": args.dilation,
        "aux_loss": args.aux_loss,
        **peg_kwargs(args),
    }
    for name in _MODEL_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            kw[name] = str(value) if isinstance(value, Path) else value
    return kw


def load_model(
    checkpoint: str | os.PathLike | Mapping[str, Any],
    where: str | os.PathLike | None = None,
    **overrides: Any,
) -> LoadedModel:
    """The detector of a ``peg_detr train`` checkpoint with its weights, and its box post-processing.

    Args:
        checkpoint: the checkpoint's path, or the checkpoint already read (``where`` names its file).
        overrides: stored config values that leave the weights' shapes alone, e.g.
            ``pos_interpolation="nearest"`` (``eval --pos-interpolation``); ``None`` values are ignored.

    Returns:
        A :class:`~peg_core.engine.LoadedModel` whose ``classes[i]`` is the name of category id ``i``
        (``""`` for an id the data set does not use: COCO's ids are sparse) and whose ``postprocess``
        turns the model's outputs into boxes in pixels.
    """
    ckpt, where = checkpoint_and_where(checkpoint, where, "detect")
    config = ckpt.get("model_config")
    if not isinstance(config, dict) or "num_classes" not in config:
        raise UserError(
            "checkpoint has no detector model_config (not written by `python -m peg_detr train`?)", where
        )
    config = {**config, **{k: v for k, v in overrides.items() if v is not None}}
    with warnings.catch_warnings():  # "ResNet starts from random weights": the checkpoint's weights follow
        warnings.simplefilter("ignore", UserWarning)
        model, _, postprocessor = build_model(config, where)
    load_model_state(model, ckpt["model"], where)
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    names = {int(c["id"]): str(c["name"]) for c in meta.get("categories", []) if isinstance(c, dict)}
    classes = [names.get(i, "") for i in range(int(config["num_classes"]))]
    args = ckpt.get("args") if isinstance(ckpt.get("args"), dict) else {}
    return LoadedModel(model.eval(), config, classes, meta, dict(args), postprocessor)
