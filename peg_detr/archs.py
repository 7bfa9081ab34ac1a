"""The detector architectures ``--arch`` names: one :class:`Arch` entry each, the one place that lists them.

Everything that differs between the detectors at the level of a run (which builder, which
defaults, which flags reach the builder, how a Hugging Face folder starts it, which training recipe
family it follows) is a field here; the command lines, the task, the loader, the predictor and the
exporter read the entry instead of comparing ``arch`` strings.

Two training *families* exist, because the detectors came in two generations:

* ``"detr"``: DETR's recipe (short side multi-scale with a long-side cap, StepLR, no EMA, the
  padding mask reaches the model);
* ``"rtdetr"``: RT-DETR's and its successors' (square inputs at ``--val-size``, the collate draws
  the batch's square side, AdamW with backbone / norm groups, warm-up, weight EMA, denoising needs
  the targets in the forward, ``--labels contiguous`` recipes, a minimum input side from the query
  selection).  D-FINE, DEIM and DEIMv2 belong here: they keep RT-DETR's encoder and recipe.

Adding an architecture is one :func:`register_arch` call next to its builder's import below.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from peg_core.registry import EncodingSupport

from .configs import DEIMV2_DEFAULTS, DFINE_DEFAULTS, RTDETR_DEFAULTS
from .data import RTDETR_SIZE
from .interop.hf_deimv2 import deimv2_from_hf_config, export_hf_deimv2
from .interop.hf_detr import export_hf_detr
from .interop.hf_dfine import dfine_from_hf_config, export_hf_dfine
from .interop.hf_rtdetr import export_hf_rtdetr, load_rtdetr_backbone, rtdetr_from_hf_config
from .models import BACKBONES, DETR, DETR_ENCODINGS, PostProcess, build_detr
from .models.deimv2 import DEIMV2_SIZES, DINOV3_VITS, DEIMv2, build_deimv2, deimv2_training_parts
from .models.dfine import (
    DFINE,
    DFINE_BACKBONES,
    DFINE_ENCODINGS,
    DFINE_SIZES,
    build_dfine,
    dfine_training_parts,
)
from .models.dfine.backbone import HGNETV2_BACKBONES
from .models.rtdetr import AIFI_ENCODINGS, RTDETR
from .models.rtdetr.build import RTDETR_BACKBONES, build_rtdetr, rtdetr_training_parts

__all__ = ["ARCHS", "Arch", "Family", "arch_named", "arch_of", "arch_of_model", "register_arch"]

Family = Literal["detr", "rtdetr"]
#: builder(backbone, pos_enc, **options) -> (model, criterion, postprocessor)
Builder = Callable[..., tuple[nn.Module, nn.Module, nn.Module]]

# argparse dests forwarded to DETR's builder as keywords when set (None: the builder's default)
_DETR_OPTIONS = (
    "backbone_weights", "hidden_dim", "num_heads", "enc_layers", "dec_layers", "dim_feedforward", "dropout",
    "decoder_key_pos", "learned_grid", "pos_interpolation",
)  # fmt: skip
# the same for the RT-DETR family (DETR's decoder-key option does not apply)
RTDETR_OPTIONS = (
    "backbone_weights", "hidden_dim", "num_heads", "enc_layers", "dec_layers", "dim_feedforward", "dropout",
    "encoder_expansion", "num_denoising", "label_noise_ratio", "box_noise_scale", "learned_grid",
    "pos_interpolation",
)  # fmt: skip


@dataclass(frozen=True)
class Arch:
    """One ``--arch``: what a run, a checkpoint and a Hugging Face folder of it are built with.

    Attributes:
        name: the ``--arch`` value, recorded in ``model_config["arch"]``.
        title: the name in messages and reports (``"RT-DETR"``).
        family: the training recipe family (module docstring).
        build: the builder, ``build(backbone, pos_enc, **options) -> (model, criterion, postprocessor)``.
        backbones: the backbone names ``build`` takes.
        backbone, pos_enc: the builder's defaults when a config does not say.
        options: the ``train`` argparse destinations forwarded to ``build`` when set.
        model_cls: the model's class (:func:`arch_of_model` tells a built model's arch by it).
        encodings: what ``--pos-enc`` accepts for it (the registry's support set).
        eval_size: the side a predictor uses when the run recorded none (DETR 800, RT-DETR 640).
        hf_model_types: the ``config.json`` ``model_type`` values ``--init FOLDER`` reads as this arch.
        from_hf_config: ``(config, pos_enc, **encoder_options) -> model`` for a resumed
            ``--init FOLDER`` run, whose ``model_config`` holds the folder's config.json; None when
            the arch starts from a folder through the official checkpoint loader instead (DETR).
        postprocess: ``model -> postprocessor`` of a model not built by ``build`` (a Hugging Face
            folder's, for inference).
        training_parts: ``model -> (criterion, postprocessor)`` of such a model, to train it; None:
            the arch's folders are read into a model ``build`` made (DETR's official loader).
        load_backbone: ``(model.backbone, source) -> LoadReport`` for ``--backbone-weights`` given
            as a folder of this family (RT-DETR: a Hugging Face RT-DETR folder's ResNet-vd); None:
            plain weights files only, read by the builder.
        export_hf: ``(model, out_dir, classes, *, size) -> folder`` of ``export-hf`` (``size``: the
            side of the folder's ``preprocessor_config.json``, the run's ``--val-size``; ``classes[i]``: label
            ``i``'s name, ``""`` for an unused id); None: not exportable.
        fuse: whether ``export`` folds conv + BN and RepVGG branches by default.
        recipe_defaults: the ``train`` defaults when ``--arch`` is given without ``--config``.
        sizes: ``--model-size`` presets, ``name -> builder keywords`` (flags and a recipe's values
            win over them); empty: the arch has none.
        loss_options: the ``train`` destinations that shape the loss rather than the model
            (``training_parts`` takes them as keywords; a run records them in its ``model_config``).
    """

    name: str
    title: str
    family: Family
    build: Builder
    backbones: tuple[str, ...]
    backbone: str
    pos_enc: str
    options: tuple[str, ...]
    model_cls: type[nn.Module]
    encodings: EncodingSupport
    eval_size: int
    hf_model_types: tuple[str, ...] = ()
    from_hf_config: Callable[..., nn.Module] | None = None
    postprocess: Callable[[nn.Module], nn.Module] = lambda model: PostProcess()
    training_parts: Callable[[nn.Module], tuple[nn.Module, nn.Module]] | None = None
    load_backbone: Callable[[nn.Module, Any], Any] | None = None
    export_hf: Callable[..., Any] | None = None
    fuse: bool = False
    recipe_defaults: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    loss_options: tuple[str, ...] = ()

    @property
    def square_inputs(self) -> bool:
        """Square ``--val-size`` inputs and the RT-DETR recipe (the ``rtdetr`` family)."""
        return self.family == "rtdetr"


#: ``--arch`` -> its entry, in the order ``--help`` lists them
ARCHS: dict[str, Arch] = {}


def register_arch(arch: Arch) -> Arch:
    """Add ``arch`` (a second entry of the same name is a programming error)."""
    if arch.name in ARCHS:
        raise ValueError(f"arch {arch.name!r} is registered twice")
    ARCHS[arch.name] = arch
    return arch


def arch_named(name: str | None) -> Arch:
    """The entry of ``name`` (``None``: ``detr``, the default); an unknown name is a ``ValueError`` listing them."""
    arch = ARCHS.get(name or "detr")
    if arch is None:
        raise ValueError(f"unknown arch {name!r}; choose from {sorted(ARCHS)}")
    return arch


def arch_of(args: argparse.Namespace | dict[str, Any]) -> Arch:
    """The entry of parsed arguments or a ``model_config`` (``arch`` missing: ``detr``)."""
    name = args.get("arch") if isinstance(args, dict) else getattr(args, "arch", None)
    return arch_named(name)


def arch_of_model(model: nn.Module) -> Arch:
    """The entry of a built model, by class; later (more specific) entries win over their bases."""
    for arch in reversed(ARCHS.values()):
        if isinstance(model, arch.model_cls):
            return arch
    raise TypeError(f"{type(model).__name__} is none of the registered detectors ({sorted(ARCHS)})")


def _export_hf_rtdetr(model: nn.Module, out: Any, classes: list[str], size: int | None = None) -> Any:
    """RT-DETR's folder names only the labels in use (COCO's category ids are sparse)."""
    return export_hf_rtdetr(model, out, {i: name for i, name in enumerate(classes) if name}, size=size)


register_arch(
    Arch(
        name="detr",
        title="DETR",
        family="detr",
        build=build_detr,
        backbones=tuple(BACKBONES),
        backbone="resnet50",
        pos_enc="peg",
        options=_DETR_OPTIONS,
        model_cls=DETR,
        encodings=DETR_ENCODINGS,
        eval_size=800,
        hf_model_types=("detr",),
        export_hf=export_hf_detr,
    )
)
register_arch(
    Arch(
        name="rtdetr",
        title="RT-DETR",
        family="rtdetr",
        build=build_rtdetr,
        backbones=RTDETR_BACKBONES,
        backbone="r50vd",
        pos_enc="sincos",
        options=RTDETR_OPTIONS,
        model_cls=RTDETR,
        encodings=AIFI_ENCODINGS,
        eval_size=RTDETR_SIZE,
        hf_model_types=("rt_detr",),
        from_hf_config=rtdetr_from_hf_config,
        postprocess=lambda model: rtdetr_training_parts(model)[1],
        training_parts=rtdetr_training_parts,
        load_backbone=load_rtdetr_backbone,
        export_hf=_export_hf_rtdetr,
        fuse=True,
        recipe_defaults=RTDETR_DEFAULTS,
    )
)


def _export_hf_dfine(model: nn.Module, out: Any, classes: list[str], size: int | None = None) -> Any:
    return export_hf_dfine(model, out, {i: name for i, name in enumerate(classes) if name}, size=size)


#: ``--model-size tiny``: the CPU demo's D-FINE (the tiny ResNet-vd, width 32, D-FINE's other settings)
_DFINE_TINY: dict[str, Any] = dict(
    backbone="tiny", hidden_dim=32, num_heads=2, dim_feedforward=64, dec_layers=2, encoder_expansion=0.5,
    depth_mult=0.34, num_points=[3, 6, 3],
)  # fmt: skip

register_arch(
    Arch(
        name="dfine",
        title="D-FINE",
        family="rtdetr",
        build=build_dfine,
        backbones=DFINE_BACKBONES,
        backbone="hgnetv2_b4",
        pos_enc="sincos",
        options=(
            *RTDETR_OPTIONS,
            "decoder_activation",
            "mlp_activation",
            "cls_loss",
            "freeze_backbone_bn",
            "backbone_freeze_at",
        ),
        model_cls=DFINE,
        encodings=DFINE_ENCODINGS,
        eval_size=RTDETR_SIZE,
        hf_model_types=("d_fine",),
        from_hf_config=dfine_from_hf_config,
        postprocess=lambda model: dfine_training_parts(model)[1],
        training_parts=dfine_training_parts,
        export_hf=_export_hf_dfine,
        fuse=True,
        recipe_defaults=DFINE_DEFAULTS,
        sizes={**DFINE_SIZES, "tiny": _DFINE_TINY},
        loss_options=("cls_loss",),
    )
)


def _export_hf_deimv2(model: nn.Module, out: Any, classes: list[str], size: int | None = None) -> Any:
    return export_hf_deimv2(model, out, {i: name for i, name in enumerate(classes) if name}, size=size)


#: ``--model-size tiny``: the CPU demo's DEIMv2 (a 4-block, 32-wide DINOv3 ViT with the STA, width 32)
_DEIMV2_TINY: dict[str, Any] = dict(
    backbone="vit_tiny", vit_options=dict(embed_dim=32, depth=4, num_heads=2, num_reg_tokens=2),
    vit_out_indices=[1, 2, 3], sta_inplanes=8, hidden_dim=32, num_heads=2, dec_heads=2, enc_dim_feedforward=64,
    dim_feedforward=64, dec_layers=2, encoder_expansion=0.5, depth_mult=0.34,
)  # fmt: skip

register_arch(
    Arch(
        name="deimv2",
        title="DEIMv2",
        family="rtdetr",
        build=build_deimv2,
        backbones=(*DINOV3_VITS, *HGNETV2_BACKBONES),
        backbone="vit_tiny",
        pos_enc="sincos",
        options=RTDETR_OPTIONS,
        model_cls=DEIMv2,
        encodings=AIFI_ENCODINGS,
        eval_size=RTDETR_SIZE,
        hf_model_types=("deimv2",),
        from_hf_config=deimv2_from_hf_config,
        postprocess=lambda model: deimv2_training_parts(model)[1],
        training_parts=deimv2_training_parts,
        export_hf=_export_hf_deimv2,
        fuse=True,
        recipe_defaults=DEIMV2_DEFAULTS,
        sizes={**DEIMV2_SIZES, "tiny": _DEIMV2_TINY},
    )
)
