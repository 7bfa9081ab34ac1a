"""The detector from a json-safe config, and back from a training checkpoint (eval, predict, study).

A training checkpoint stores ``model_config`` (every keyword of
:func:`~peg_detr.build_detr` but the backbone weights file, as recorded by the
builder) and ``meta`` (``categories``, ``num_classes``, ``val_size``, ...), so
``eval`` and ``predict`` rebuild exactly the trained model without the run's flags.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from torch import nn

from peg_core.engine import UserError, load_model_state, read_state_file

from .models import build_detr

__all__ = ["build_model", "model_from_checkpoint"]


def build_model(
    config: dict[str, Any], source: Any = "model options"
) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``build_detr(**config)`` -> ``(model, criterion, postprocessor)``; bad settings are a :class:`UserError`.

    ``source`` names where ``config`` came from (the flags, or a checkpoint path) in the message.
    """
    kw = dict(config)
    hidden, heads = kw.get("hidden_dim", 256), kw.get("nheads", 8)
    if hidden % heads:
        raise UserError(f"--hidden-dim {hidden} is not divisible by --nheads {heads}", source)
    weights = kw.get("backbone_weights")
    if weights is not None:  # missing / empty / not a torch file: one line, before building
        read_state_file(weights, what="backbone weights")
    try:
        return build_detr(kw.pop("backbone", "resnet50"), kw.pop("pos_enc", "peg"), **kw)
    except (ValueError, TypeError) as e:  # build_detr checks its arguments; TypeError: an unknown key
        raise UserError(f"invalid model settings ({' '.join(str(e).split())})", source) from None


def model_from_checkpoint(
    ckpt: dict[str, Any], path: str | os.PathLike
) -> tuple[nn.Module, nn.Module, dict[str, Any]]:
    """``(model with the checkpoint's weights, postprocessor, meta)`` of a ``detect`` training checkpoint."""
    config = ckpt.get("model_config")
    if not isinstance(config, dict) or "num_classes" not in config:
        raise UserError(
            "checkpoint has no detector model_config (not written by `python -m peg_detr train`?)", path
        )
    with warnings.catch_warnings():  # "ResNet starts from random weights": the checkpoint's weights follow
        warnings.simplefilter("ignore", UserWarning)
        model, _, postprocessor = build_model(config, path)
    load_model_state(model, ckpt["model"], path)
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    return model, postprocessor, meta
