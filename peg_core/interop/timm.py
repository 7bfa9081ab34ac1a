"""This project's CPVT in timm's model registry: ``import peg_core.interop.timm``, then ``timm.create_model``.

Names (no CPVT exists in timm itself; weights are never downloaded, only local files)::

    cpvt_tiny, cpvt_small, cpvt_base            class token + PEG after block 0 (the paper's CPVT-Ti/S/B,
                                                DeiT-style, global_pool="token")
    cpvt_tiny_gap, cpvt_small_gap, cpvt_base_gap no class token, mean of the grid tokens (CPVT-GAP,
                                                global_pool="avg"; the default of peg_core's own cpvt_tiny)

``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path))`` loads
``path``: a ``checkpoint.pth`` written by ``python -m peg_core train`` (its ``model`` entry),
or a bare state dict, as ``.pth`` (``torch.load(weights_only=True)``) or ``.safetensors``.
A head of another size than ``num_classes`` is left out and freshly initialised, as timm does.

The models are :class:`TimmCPVT`, a :class:`~peg_core.models.cpvt.CPVT` whose
``forward_features`` returns the tokens alone, as timm's helpers expect; the
state dict is the same as CPVT's.

timm's backbone API, as its ViTs have it: ``timm.create_model("cpvt_tiny", features_only=True,
out_indices=(3, 7, 11))`` is timm's feature getter around the model (``feature_info`` lists
``module`` / ``num_chs`` / ``reduction`` per block; it calls ``forward_intermediates`` and prunes the
blocks past the last index), returning ``(B, C, ceil(H / 16), ceil(W / 16))`` maps at any input
size (default ``out_indices``: the last 3 blocks).  ``model.forward_intermediates(x, indices=...,
norm=..., output_fmt="NCHW" | "NLC", intermediates_only=...)`` and
``model.prune_intermediate_layers(indices)`` are there on the plain model too
(:meth:`~peg_core.models.cpvt.CPVT.forward_intermediates`).

timm is an optional dependency (``pip install 'peg-core[timm]'``); ``import peg_core``
and ``import peg_core.interop`` never import it.  A file that does not fit is a
:class:`~peg_core.interop.io.WeightsError` (a ``ValueError``) naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..errors import require

require("timm", "timm", what="peg_core.interop.timm")  # names the extra, not just the missing module
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # noqa: E402
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model  # noqa: E402
from timm.models._features import FeatureGetterNet  # noqa: E402

from ..models.cpvt import CPVT  # noqa: E402
from .io import WeightsError, load_state_strict, read_state_file, strip_prefixes, unwrap_state_dict  # noqa: E402

__all__ = ["TimmCPVT", "load_weights_file"]

#: registered name -> (embed_dim, num_heads, global_pool); depth 12, patch 16 for all
_ARCHS: dict[str, tuple[int, int, str]] = {
    "cpvt_tiny": (192, 3, "token"),
    "cpvt_small": (384, 6, "token"),
    "cpvt_base": (768, 12, "token"),
    "cpvt_tiny_gap": (192, 3, "avg"),
    "cpvt_small_gap": (384, 6, "avg"),
    "cpvt_base_gap": (768, 12, "avg"),
}


def _cfg() -> dict[str, Any]:
    # No url / hf_hub_id: only pretrained_cfg_overlay=dict(file=...) gives weights, read by
    # TimmCPVT.load_pretrained (peg checkpoints, head adapted to the size of the built head).
    return {
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "fixed_input_size": False,  # any size runs (padded to a multiple of the patch)
        "interpolation": "bicubic",
        "crop_pct": 0.875,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "paper_ids": "arXiv:2102.10882",
    }


# register_model reads this module-level name (it must be called default_cfgs).
default_cfgs = generate_default_cfgs({name: _cfg() for name in _ARCHS})


def load_weights_file(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a state dict from ``.safetensors`` or a torch file (``weights_only=True``, never unpickled code).

    Accepts a bare state dict or a peg ``checkpoint.pth`` (its ``model`` entry), with any
    ``module.`` / ``_orig_mod.`` prefix; raises :class:`~peg_core.interop.io.WeightsError`
    naming the file otherwise (a checkpoint of another task included).
    """
    obj = read_state_file(path, "pretrained weights")
    wrapped = isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping)
    if wrapped and obj.get("task", "classify") != "classify":
        raise WeightsError(
            f"pretrained weights are a {obj['task']!r} checkpoint, not an image classifier", path
        )
    return strip_prefixes(unwrap_state_dict(obj, where=path))


class TimmCPVT(CPVT):
    """:class:`CPVT` with timm's method contract (``forward_features`` -> tokens ``(B, P + h*w, C)``)."""

    def forward_features(self, x: Tensor) -> Tensor:  # type: ignore[override]
        """Image ``(B, 3, H, W)`` -> normed tokens ``(B, P + h*w, C)``; ``h = ceil(H/patch)``."""
        return super().forward_features(x)[0]

    def forward(self, x: Tensor) -> Tensor:
        """Image ``(B, 3, H, W)``, any ``H, W`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x))

    def load_pretrained(self, checkpoint_path: str | os.PathLike) -> None:
        """Load a weights file (see :func:`load_weights_file`); what ``pretrained=True`` runs.

        The head is kept as built when the file's head has another shape (other ``num_classes``);
        everything else must match exactly.
        """
        state = load_weights_file(checkpoint_path)
        if "pos_embed" in state and self.pos_enc_kind == "peg":
            raise WeightsError(
                "pretrained weights hold a learned position table (pos_embed); convert them first with "
                "'python -m peg_core to-cpvt'",
                checkpoint_path,
            )
        has_cls = "cls_token" in state
        if has_cls != (self.cls_token is not None):
            hint = "cpvt_* (class token)" if has_cls else "cpvt_*_gap (no class token)"
            raise WeightsError(f"pretrained weights fit {hint}, not this model", checkpoint_path)
        mine = self.state_dict()
        head = [k for k in mine if k.startswith("head.")]
        if any(k not in state or state[k].shape != mine[k].shape for k in head) or (
            not head and any(k.startswith("head.") for k in state)
        ):
            # other number of classes: keep this model's fresh head, load the rest
            state = {k: v for k, v in state.items() if not k.startswith("head.")}
            state.update({k: mine[k] for k in head})
        load_state_strict(self, state, checkpoint_path)


def _create(name: str, pretrained: bool, **kwargs: Any) -> TimmCPVT:
    dim, heads, pool = _ARCHS[name]
    for key, value in (
        ("embed_dim", dim),
        ("num_heads", heads),
        ("depth", 12),
        ("patch_size", 16),
        ("global_pool", pool),
    ):
        kwargs.setdefault(key, value)  # overridable, e.g. depth=2 for a quick test
    # timm's own loader would drop the head whenever num_classes differs from the cfg's 1000 (even
    # for a 10-class file built with num_classes=10), so the model is built bare and loads the file itself.
    # features_only=True: timm's getter wraps the model (forward_intermediates), as for its own ViTs.
    out_indices = kwargs.pop("out_indices", 3)
    if pretrained and kwargs.pop("features_only", False):
        # the file is read into the whole model (its loader knows the head), then the getter wraps it
        return FeatureGetterNet(_create(name, True, **kwargs), out_indices)
    model = build_model_with_cfg(
        TimmCPVT, name, False, feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **kwargs
    )
    if pretrained:
        file = model.pretrained_cfg.get("file")
        if not file:
            raise RuntimeError(
                f"{name} has no downloadable weights; pass pretrained_cfg_overlay=dict(file='weights.pth')"
            )
        model.load_pretrained(file)
    return model


@register_model
def cpvt_tiny(pretrained: bool = False, **kwargs: Any) -> TimmCPVT:
    """CPVT-Ti, class token (DeiT-tiny shape: 192 wide, 12 blocks, 3 heads, patch 16)."""
    return _create("cpvt_tiny", pretrained, **kwargs)


@register_model
def cpvt_small(pretrained: bool = False, **kwargs: Any) -> TimmCPVT:
    """CPVT-S, class token (384 wide, 6 heads)."""
    return _create("cpvt_small", pretrained, **kwargs)


@register_model
def cpvt_base(pretrained: bool = False, **kwargs: Any) -> TimmCPVT:
    """CPVT-B, class token (768 wide, 12 heads)."""
    return _create("cpvt_base", pretrained, **kwargs)


@register_model
def cpvt_tiny_gap(pretrained: bool = False, **kwargs: Any) -> TimmCPVT:
    """CPVT-Ti-GAP: no class token, mean of the grid tokens."""
    return _create("cpvt_tiny_gap", pretrained, **kwargs)


@register_model
def cpvt_small_gap(pretrained: bool = False, **kwargs: Any) -> TimmCPVT:
    """CPVT-S-GAP: no class token, mean of the grid tokens."""
    return _create("cpvt_small_gap", pretrained, **kwargs)


@register_model
def cpvt_base_gap(pretrained: bool = False, **kwargs: Any) -> TimmCPVT:
    """CPVT-B-GAP: no class token, mean of the grid tokens."""
    return _create("cpvt_base_gap", pretrained, **kwargs)
