"""A tiny model of each registered detector arch: the one place the tests build them from.

Built through :func:`peg_detr.model.build_model` (the entry a run and a checkpoint use), from a
``model_config`` dict: when the builders' signature changes, only that call changes.  The tiny
backbones (the tiny ResNet-vd; DEIMv2: its ``--model-size tiny``, a 4-block DINOv3 ViT) keep the
graphs small (RF-DETR: its ``--model-size tiny``, a 4-block windowed ViT); ``hf=True`` swaps in the smallest backbone the arch's Hugging Face export takes
(DETR: ResNet-18; D-FINE: HGNetv2-B0).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from peg_detr.archs import ARCHS
from peg_detr.model import build_model

#: ``--arch`` -> the builder settings of its tiny model (``pos_enc`` included: the arch's exportable default)
TINY: dict[str, dict[str, Any]] = {
    "detr": dict(
        backbone="tiny", pos_enc="sine", hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=2,
        dim_feedforward=64, num_queries=10,
    ),
    "rtdetr": dict(
        backbone="tiny", pos_enc="sincos", hidden_dim=32, num_heads=2, dim_feedforward=64, dec_layers=2,
        encoder_expansion=0.5, num_queries=20, num_denoising=10,
    ),
    "dfine": dict(
        backbone="tiny", pos_enc="sincos", hidden_dim=32, num_heads=2, dec_layers=2, dim_feedforward=64,
        num_queries=20, max_num_bins=8, encoder_expansion=0.5, depth_mult=0.34, num_denoising=10,
    ),
    "deimv2": dict(**ARCHS["deimv2"].sizes["tiny"], pos_enc="sincos", num_queries=20, num_denoising=10),
    # its --model-size tiny (a 4-block ViT of width 48, patch 8, 2 x 2 windows, 3 groups); the table: exportable
    "rfdetr": dict(**ARCHS["rfdetr"].sizes["tiny"], pos_enc="learned"),
}  # fmt: skip
#: what ``hf=True`` changes: a backbone the arch's Hugging Face export takes (the tiny ones have none there)
HF_EXPORTABLE: dict[str, dict[str, Any]] = {
    "detr": dict(backbone="resnet18"),
    "dfine": dict(backbone="hgnetv2_b0", hidden_dim=64, num_heads=4),
}
NUM_CLASSES = 3


def tiny_config(arch: str, hf: bool = False, **overrides: Any) -> dict[str, Any]:
    """The ``model_config`` of ``arch``'s tiny model (``hf``: one ``export_hf`` takes; ``overrides`` win)."""
    extra = HF_EXPORTABLE.get(arch, {}) if hf else {}
    return {"arch": arch, **TINY[arch], **extra, "num_classes": NUM_CLASSES, **overrides}


def tiny_model(
    arch: str, hf: bool = False, seed: int = 0, **overrides: Any
) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``(model, criterion, postprocessor)`` of ``arch``'s tiny model, its weights drawn from ``seed``.

    ``hf``: with a backbone the arch's Hugging Face export takes (larger: DETR's ResNet-18).
    """
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # a random ResNet-18 is what the tests want (DETR warns of it)
        warnings.filterwarnings("ignore", "resnet18 backbone starts from random weights")
        return build_model(tiny_config(arch, hf, **overrides))


@torch.no_grad()
def perturb(model: nn.Module, seed: int) -> nn.Module:
    """Every float tensor of the state dict moved (zero-initialised heads included), norms near 1.

    A fresh model's box heads output zero offsets and its norms are identities: a mix-up of keys
    there would go unnoticed.  Constants of the architecture (D-FINE's ``up`` / ``reg_scale``) stay.
    """
    g = torch.Generator().manual_seed(seed)
    for name, t in model.state_dict().items():
        if not t.is_floating_point() or name.endswith(("up", "reg_scale", "num_points_scale")):
            continue
        if name.endswith("running_var"):
            t.copy_(torch.rand(t.shape, generator=g) + 0.5)
        else:
            t.add_(torch.randn(t.shape, generator=g) * 0.1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d) or "FrozenBatchNorm" in type(module).__name__:
            module.weight.copy_(torch.rand(module.weight.shape, generator=g) + 0.5)
    return model
