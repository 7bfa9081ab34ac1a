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
  RF-DETR too: square inputs whose side the collate draws, AdamW with a backbone group, EMA; it
  has no denoising (its forward takes the targets and ignores them) and its own augmentation
  (:attr:`Arch.train_transforms`).

Adding an architecture is a typed config (:class:`~peg_detr.models.config.DetectorConfig`), a
builder taking it and one :func:`register_arch` call, from this package or from outside it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from peg_core.registry import EncodingSupport

from .configs import DEIMV2_DEFAULTS, DFINE_DEFAULTS, RFDETR_DEFAULTS, RTDETR_DEFAULTS
from .data import RTDETR_SIZE
from .data.transforms import make_rfdetr_train_transforms
from .interop import load_official_checkpoint
from .interop.hf import FROM_HF
from .interop.hf_deimv2 import export_hf_deimv2
from .interop.hf_detr import export_hf_detr
from .interop.hf_dfine import export_hf_dfine
from .interop.hf_rfdetr import export_hf_rfdetr
from .interop.hf_rtdetr import export_hf_rtdetr, load_rtdetr_backbone
from .models import BACKBONES, DETR, DETRConfig, PostProcess, build_detr
from .models.config import DetectorConfig
from .models.deimv2 import DINOV3_VITS, DEIMv2, DEIMv2Config, build_deimv2, deimv2_training_parts
from .models.dfine import DFINE, DFINE_BACKBONES, DFineConfig, build_dfine, dfine_training_parts
from .models.dfine.backbone import HGNETV2_BACKBONES
from .models.rfdetr import RFDETR, RFDETR_BACKBONES, RFDETRConfig, build_rfdetr, rfdetr_training_parts
from .models.rtdetr import RTDETR, RTDETRConfig
from .models.rtdetr.build import RTDETR_BACKBONES, build_rtdetr, rtdetr_training_parts

__all__ = ["ARCHS", "Arch", "Family", "arch_named", "arch_of", "arch_of_model", "register_arch"]

Family = Literal["detr", "rtdetr"]
#: build(config) -> (model, criterion, postprocessor)
Builder = Callable[..., tuple[nn.Module, nn.Module, nn.Module]]


@dataclass(frozen=True)
class Arch:
    """One ``--arch``: what a run, a checkpoint and a Hugging Face folder of it are built with.

    Attributes:
        name: the ``--arch`` value, recorded in ``model_config["arch"]``.
        family: the training recipe family (module docstring).
        build: the builder, ``build(config) -> (model, criterion, postprocessor)``; ``config`` an
            instance of ``config`` (its ``to_dict()`` becomes ``model.build_config``).
        config: the family's typed config (:class:`~peg_detr.models.config.DetectorConfig`): the
            defaults, ``--model-size`` presets, flags and Hugging Face names the entry's derived
            attributes (:attr:`options`, :attr:`sizes`, :attr:`loss_options`, ...) read.
        backbones: the backbone names ``build`` takes.
        model_cls: the model's class (:func:`arch_of_model` tells a built model's arch by it).
        eval_size: the side a predictor uses when the run recorded none (DETR 800, RT-DETR 640).
        postprocessor: ``model -> postprocessor`` of a model not built by ``build`` (a Hugging Face
            folder's, for inference); None: ``training_parts``'s, or DETR's :class:`PostProcess`
            without them (:meth:`postprocess`).
        training_parts: ``model -> (criterion, postprocessor)`` of such a model, to train it; None:
            the arch's folders are read into a model ``build`` made (DETR's).
        init_file: ``(model, path, *, num_classes) -> LoadReport`` for ``train --init FILE`` given a
            weights file that is neither a Hugging Face folder nor a ``peg_detr train`` checkpoint
            (DETR: an official facebookresearch checkpoint, :func:`~peg_detr.interop.load_official_checkpoint`);
            None: the arch starts only from those two, and such a file is refused in one line.
        load_backbone: ``(model.backbone, source) -> LoadReport`` for ``--backbone-weights`` given
            as a folder of this family (RT-DETR: a Hugging Face RT-DETR folder's ResNet-vd); None:
            plain weights files only, read by the builder.
        export_hf: ``(model, out_dir, classes, *, size) -> folder`` of ``export-hf`` (``size``: the
            side of the folder's ``preprocessor_config.json``, the run's ``--val-size``; ``classes[i]``: label
            ``i``'s name, ``""`` for an unused id); None: not exportable.
        fuse: whether ``export`` folds conv + BN and RepVGG branches by default.
        recipe_defaults: the ``train`` defaults when ``--arch`` is given without ``--config``.
        train_transforms: ``(size, strong=True) -> transforms`` of the ``rtdetr`` family's training
            images (a ``size`` x ``size`` image in ``[0, 1]``; ``strong=False``: the plain epochs of
            ``--no-aug-epochs``); None: RT-DETR's.
    """

    name: str
    family: Family
    build: Builder
    config: type[DetectorConfig]
    backbones: tuple[str, ...]
    model_cls: type[nn.Module]
    eval_size: int
    postprocessor: Callable[[nn.Module], nn.Module] | None = None
    training_parts: Callable[[nn.Module], tuple[nn.Module, nn.Module]] | None = None
    init_file: Callable[..., Any] | None = None
    load_backbone: Callable[[nn.Module, Any], Any] | None = None
    export_hf: Callable[..., Any] | None = None
    fuse: bool = False
    recipe_defaults: dict[str, Any] = field(default_factory=dict)
    train_transforms: Callable[..., Any] | None = None

    def postprocess(self, model: nn.Module) -> nn.Module:
        """The post-processor of ``model`` (one this arch's ``build`` did not make: a Hugging Face folder's)."""
        if self.postprocessor is not None:
            return self.postprocessor(model)
        if self.training_parts is not None:
            return self.training_parts(model)[1]
        return PostProcess()

    @property
    def title(self) -> str:
        """The name in messages and reports (``"RT-DETR"``): the config's ``TITLE``."""
        return self.config.TITLE

    @property
    def hf_model_types(self) -> tuple[str, ...]:
        """The ``config.json`` ``model_type`` values ``--init FOLDER`` reads as this arch (from :data:`FROM_HF`)."""
        return tuple(kind for kind, fmt in FROM_HF.items() if fmt.arch == self.name)

    @property
    def from_hf_config(self) -> Callable[..., nn.Module] | None:
        """``(config, pos_enc, **encoder_options) -> model`` for a resumed ``--init FOLDER`` run, whose
        ``model_config`` holds the folder's config.json (from :data:`FROM_HF`); None when the arch's
        folders are read into a model its builder made (DETR: the official checkpoint loader)."""
        return next((f.from_config for f in FROM_HF.values() if f.arch == self.name and f.from_config), None)

    @property
    def backbone(self) -> str:
        """The backbone when a config does not name one (the config's default)."""
        return self.config.default("backbone")

    @property
    def pos_enc(self) -> str:
        """The encoding when a config does not name one (the config's default)."""
        return self.config.default("pos_enc")

    @property
    def options(self) -> tuple[str, ...]:
        """The ``train`` argparse destinations that set the config's fields (a flag's dest is the field's name)."""
        return tuple(self.config.flags())

    @property
    def encodings(self) -> EncodingSupport:
        """What ``--pos-enc`` accepts for it (the registry's support set, the config's)."""
        return self.config.ENCODINGS

    @property
    def sizes(self) -> Mapping[str, Mapping[str, Any]]:
        """``--model-size`` presets, ``name -> config overrides`` (flags and a recipe's values win); empty: none."""
        return self.config.SIZES

    @property
    def loss_options(self) -> tuple[str, ...]:
        """The destinations that shape the loss rather than the model (``training_parts`` takes them as keywords)."""
        return self.config.loss_fields()

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


register_arch(
    Arch(
        name="detr",
        family="detr",
        build=build_detr,
        config=DETRConfig,
        backbones=tuple(BACKBONES),
        model_cls=DETR,
        eval_size=800,
        init_file=load_official_checkpoint,
        export_hf=export_hf_detr,
    )
)
register_arch(
    Arch(
        name="rtdetr",
        family="rtdetr",
        build=build_rtdetr,
        config=RTDETRConfig,
        backbones=RTDETR_BACKBONES,
        model_cls=RTDETR,
        eval_size=RTDETR_SIZE,
        training_parts=rtdetr_training_parts,
        load_backbone=load_rtdetr_backbone,
        export_hf=export_hf_rtdetr.for_classes,
        fuse=True,
        recipe_defaults=RTDETR_DEFAULTS,
    )
)
register_arch(
    Arch(
        name="dfine",
        family="rtdetr",
        build=build_dfine,
        config=DFineConfig,
        backbones=DFINE_BACKBONES,
        model_cls=DFINE,
        eval_size=RTDETR_SIZE,
        training_parts=dfine_training_parts,
        export_hf=export_hf_dfine.for_classes,
        fuse=True,
        recipe_defaults=DFINE_DEFAULTS,
    )
)
register_arch(
    Arch(
        name="deimv2",
        family="rtdetr",
        build=build_deimv2,
        config=DEIMv2Config,
        backbones=(*DINOV3_VITS, *HGNETV2_BACKBONES),
        model_cls=DEIMv2,
        eval_size=RTDETR_SIZE,
        training_parts=deimv2_training_parts,
        export_hf=export_hf_deimv2.for_classes,
        fuse=True,
        recipe_defaults=DEIMV2_DEFAULTS,
    )
)
register_arch(
    Arch(
        name="rfdetr",
        family="rtdetr",
        build=build_rfdetr,
        config=RFDETRConfig,
        backbones=RFDETR_BACKBONES,
        model_cls=RFDETR,
        eval_size=560,  # the default config's (RF-DETR base's) resolution
        training_parts=rfdetr_training_parts,
        export_hf=export_hf_rfdetr.for_classes,
        recipe_defaults=RFDETR_DEFAULTS,
        train_transforms=make_rfdetr_train_transforms,
    )
)
