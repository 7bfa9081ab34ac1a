"""Named training recipes for ``python -m peg_detr train --config NAME``.

A recipe sets argparse defaults; any flag given on the command line wins.
``total_batch_size`` is split over the processes (``torchrun``), so the same
recipe reproduces the paper's batch on 8 or 16 GPUs.

Published COCO val2017 box AP the reproductions compare to:

* ``detr_r50_500ep``: DETR-R50, sine, 500 epochs, lr drop at 400, batch 64 -> **42.0 AP**
  (Carion et al., 2020, Table 1).
* ``cpvt_{sine,none,peg}_50ep``: DETR-R50 trained 50 epochs with the CPVT recipe (AdamW lr 1e-4,
  backbone 2e-5, batch 32, lr drop at 40) -> sine **33.7**, none **32.8**, PEG **33.9** AP
  (Chu et al., "Conditional Positional Encodings for Vision Transformers", detection table).
* ``demo_tiny``: the embedded synthetic shapes set on a CPU (see ``peg_detr.demo``); no published number.
* ``rtdetr_{r18vd,r50vd}_6x`` (``--arch rtdetr``): RT-DETR with its sin-cos AIFI encoder, 72 epochs,
  AdamW lr 1e-4 (backbone 1e-5), weight decay 1e-4, batch 16, EMA 0.9999, square multi-scale
  training 480..800 step 32, evaluated at 640 -> R18vd **46.5**, R50vd **53.1** AP
  (lyuwenyu/RT-DETR README); ``*_peg`` are the same recipes with a PEG in AIFI (no published number).
* ``rtdetr_demo_tiny``: RT-DETR with the tiny backbone on the synthetic shapes, seconds on a CPU.

* ``rfdetr_{n,s,m,l,base}_coco`` (``--arch rfdetr``): RF-DETR's published sizes (``--model-size``) with
  rf-detr's ``TrainConfig`` (roboflow/rf-detr ``rfdetr/config.py``): AdamW lr 1e-4, ViT 1.5e-4,
  weight decay 1e-4, batch 4 x gradient accumulation 4, EMA 0.993 (tau 100), 13 Group DETR groups,
  decoder dropout 0 (rf-detr ``main.py``'s default; transformers' ``RfDetrConfig`` says 0.1),
  100 epochs at a constant lr, rf-detr's expanded multi-scale sides (multiples of patch x windows
  around the resolution) -> N **48.4**, S **53.0**, M **54.7**, L **56.5**, base **53.3** COCO AP
  (roboflow/rf-detr README and its documentation's model table, rfdetr.roboflow.com).  Not reproduced: the ViT's layer-wise lr decay (0.8) and the
  decoder's lr factor (0.7).  ``rfdetr_demo_tiny``: the tiny size on the synthetic shapes, a minute on a CPU.

The RT-DETR recipes train ``--labels contiguous`` (label k = the k-th category by id, 80 for COCO),
as lyuwenyu/RT-DETR does; DETR's and ``rtdetr_demo_tiny`` use the category ids as labels.

:data:`DEFAULTS` are the ``train`` defaults without a recipe (DETR's recipe); keys are argparse
destinations (``train_scales`` is ``--train-sizes``).
"""

from __future__ import annotations

from typing import Any

from peg_core.interop.resolve import PublicModel

from .data import RTDETR_TRAIN_SIZES
from .models.config import DetectorConfig
from .models.deimv2.config import DEIMv2Config
from .models.dfine.config import DFineConfig
from .models.rfdetr.config import RFDETRConfig
from .models.rtdetr.config import RTDETRConfig

__all__ = [
    "CONFIGS",
    "DEFAULTS",
    "DESCRIPTIONS",
    "DFINE_DEFAULTS",
    "FINETUNE_CONFIGS",
    "PUBLIC_MODELS",
    "PUBLISHED_AP",
    "RFDETR_DEFAULTS",
    "RTDETR_DEFAULTS",
]

#: the multi-scale training sides of DETR (short side, long side <= 1333) and of the RT-DETR family
#: (square): 480..800 step 32, defined once (peg_detr.data.RTDETR_TRAIN_SIZES)
_SIDES = ",".join(map(str, RTDETR_TRAIN_SIZES))


def _sides(times_640: int) -> str:
    """The training sides with 640 ``times_640`` times (D-FINE's collate repeats it ``scale_ori_repeat`` times)."""
    return ",".join(map(str, sorted([*(s for s in RTDETR_TRAIN_SIZES if s != 640), *[640] * times_640])))


def _model_of(config: type[DetectorConfig], size: str) -> dict[str, Any]:
    """The flags a recipe states for the ``--model-size`` preset ``size`` of ``config``: the size, its backbone,
    encoding and query count (DETR's train defaults name theirs, and a recipe's values win over its preset)."""
    preset = config.SIZES[size]
    return {
        "model_size": size,
        **{k: preset.get(k, config.default(k)) for k in ("backbone", "pos_enc", "num_queries")},
    }


# DETR's multi-scale training sizes (short side 480..800 step 32, long side <= 1333).
_DETR_DATA: dict[str, Any] = {
    "train_scales": _SIDES,
    "max_size": 1333,
    "crop_resize": "400,500,600",
    "crop_size": "384,600",
    "val_size": 800,
}

_DETR_MODEL: dict[str, Any] = {
    "backbone": "resnet50",
    "hidden_dim": 256,
    "num_heads": 8,
    "enc_layers": 6,
    "dec_layers": 6,
    "dim_feedforward": 2048,
    "dropout": 0.1,
    "num_queries": 100,
}

_CPVT: dict[str, Any] = {
    **_DETR_DATA,
    **_DETR_MODEL,
    "lr": 1e-4,
    "lr_backbone": 2e-5,
    "weight_decay": 1e-4,
    "epochs": 50,
    "lr_drop": 40,
    "total_batch_size": 32,
    "clip_max_norm": 0.1,
}

CONFIGS: dict[str, dict[str, Any]] = {
    "detr_r50_500ep": {
        **_DETR_DATA,
        **_DETR_MODEL,
        "pos_enc": "sine",
        "decoder_key_pos": "sine",
        "lr": 1e-4,
        "lr_backbone": 1e-5,
        "weight_decay": 1e-4,
        "epochs": 500,
        "lr_drop": 400,
        "total_batch_size": 64,
        "clip_max_norm": 0.1,
    },
    "cpvt_peg_50ep": {**_CPVT, "pos_enc": "peg"},
    "cpvt_sine_50ep": {**_CPVT, "pos_enc": "sine", "decoder_key_pos": "sine"},
    "cpvt_none_50ep": {**_CPVT, "pos_enc": "none"},
    # A few minutes on two CPU cores for the synthetic shapes (80 px images, 3 classes, 1-3 objects):
    # small images and batch 4 buy many optimiser steps, which DETR's matching needs more than pixels.
    "demo_tiny": {
        "backbone": "tiny",
        "pos_enc": "peg",
        "hidden_dim": 64,
        "num_heads": 4,
        "enc_layers": 2,
        "dec_layers": 2,
        "dim_feedforward": 128,
        "dropout": 0.0,
        "num_queries": 10,
        "train_scales": "64,80,96",
        "max_size": 160,
        "crop_resize": "",
        "crop_size": "48,64",
        "val_size": 80,
        "lr": 5e-4,
        "lr_backbone": 5e-4,
        "weight_decay": 1e-4,
        "epochs": 8,
        "lr_drop": 6,
        "total_batch_size": 4,
        "clip_max_norm": 0.1,
        "eval_every": 0,
    },
}

# RT-DETR's 6x recipe (lyuwenyu/RT-DETR configs/rtdetr/rtdetr_r50vd_6x_coco.yml and its includes).
# lr_drop 1000: RT-DETR's MultiStepLR milestone [1000], i.e. a constant lr after the warm-up.
_RTDETR_6X: dict[str, Any] = {
    "arch": "rtdetr",
    "pos_enc": "sincos",
    "hidden_dim": 256,
    "num_heads": 8,
    "enc_layers": 1,
    "dim_feedforward": 1024,
    "dropout": 0.0,
    "num_queries": RTDETRConfig.default("num_queries"),
    "num_denoising": 100,
    "label_noise_ratio": 0.5,
    "box_noise_scale": 1.0,
    "train_scales": _SIDES,
    "val_size": 640,
    "lr": 1e-4,
    "lr_backbone": 1e-5,
    "weight_decay": 1e-4,
    "epochs": 72,
    "lr_drop": 1000,
    "warmup_steps": 2000,
    "total_batch_size": 16,
    "clip_max_norm": 0.1,
    "ema_decay": 0.9999,
    "ema_warmups": 2000,
    # label k = the k-th category by id (80 for COCO), as RT-DETR trains (remap_mscoco_category)
    "labels": "contiguous",
    # RT-DETR's 6x recipe augments every epoch (rtdetr_pytorch's Compose has no policy); the
    # stop_epoch policy, 71 of 72 epochs, came with RT-DETRv2 (--no-aug-epochs 1 gives it).
    "no_aug_epochs": 0,
}
# R18vd: 3 decoder layers and CSP expansion 0.5 (rtdetr_r18vd_6x_coco.yml); R50vd: 6 and 1.0.
# Both train the backbone at lr 1e-5: rtdetr_r18vd_6x_coco.yml sets lr 0.00001 on both of its
# backbone groups (norms and the rest), include/optimizer.yml (R50vd) on ``backbone``.
_RTDETR_R18VD = {
    **_RTDETR_6X,
    "backbone": "r18vd",
    "dec_layers": 3,
    "encoder_expansion": 0.5,
    "lr_backbone": 1e-5,
}
_RTDETR_R50VD = {**_RTDETR_6X, "backbone": "r50vd", "dec_layers": 6, "encoder_expansion": 1.0}

CONFIGS.update(
    {
        "rtdetr_r18vd_6x": _RTDETR_R18VD,
        "rtdetr_r50vd_6x": _RTDETR_R50VD,
        "rtdetr_r18vd_6x_peg": {**_RTDETR_R18VD, "pos_enc": "peg"},
        "rtdetr_r50vd_6x_peg": {**_RTDETR_R50VD, "pos_enc": "peg"},
        # Seconds on a CPU for the synthetic shapes (make-data): tiny backbone, width 32, 2 decoder
        # layers; square sides that are multiples of the stride 32, a short EMA warm-up.  One epoch
        # of RT-DETRv2's plain augmentation (flip and resize: its stop_epoch policy from the start) at
        # lr 1e-3: with the strong one, one epoch is a coin flip (peg_detr.demo says how it was measured).
        "rtdetr_demo_tiny": {
            **_RTDETR_6X,
            "backbone": "tiny",
            "pos_enc": "peg",
            "hidden_dim": 32,
            "num_heads": 2,
            "dim_feedforward": 64,
            "dec_layers": 2,
            "encoder_expansion": 0.5,
            "num_queries": 20,
            "num_denoising": 10,
            "train_scales": "64,96,128",
            "val_size": 96,
            "lr": 1e-3,
            "lr_backbone": 1e-3,
            "epochs": 1,
            "no_aug_epochs": 1,
            "lr_drop": 1000,
            "warmup_steps": 10,
            "total_batch_size": 4,
            "ema_decay": 0.99,
            "ema_warmups": 20,
            "eval_every": 0,
            # category ids as labels: the demo's (README) numbers were measured with them
            "labels": "ids",
        },
    }
)

# D-FINE (Peterande/D-FINE configs/dfine/: include/{optimizer,dataloader,dfine_hgnetv2}.yml and
# dfine_hgnetv2_{n,s,m,l,x}_coco.yml).  The model of each size is --model-size's preset
# (peg_detr.models.dfine.DFINE_SIZES); a recipe sets only what is not the model's.  lr_drop 1000:
# D-FINE's MultiStepLR milestone [500] never reached, i.e. a constant lr after the 500-step warm-up.
# The 640 side repeats scale_ori_repeat times among the multi-scale sides (D-FINE's collate does so).
# The preset's backbone, encoding and query count are stated by _model_of.
_DFINE_BASE: dict[str, Any] = {
    "arch": "dfine", "enc_layers": 1, "dropout": 0.0, "num_denoising": 100, "label_noise_ratio": 0.5,
    "box_noise_scale": 1.0, "val_size": 640, "lr": 2e-4, "lr_backbone": 2e-5, "weight_decay": 1e-4, "lr_drop": 1000,
    "warmup_steps": 500, "total_batch_size": 64, "clip_max_norm": 0.1, "ema_decay": 0.9999, "ema_warmups": 1000,
    "labels": "contiguous",
}  # fmt: skip
#: each size's schedule: its epochs (the last ``no_aug_epochs`` without the strong augmentation and
#: multi-scale), its learning rates, the 640 side's repeats (N: batch 64 as the others, dfine_hgnetv2_n_coco.yml)
_DFINE_SCHEDULES: dict[str, dict[str, Any]] = {
    "n": dict(epochs=160, no_aug_epochs=12, lr=8e-4, lr_backbone=4e-4, weight_decay=1e-4, train_scales=_sides(times_640=0)),
    "s": dict(epochs=130, no_aug_epochs=10, lr=2.5e-4, lr_backbone=1.25e-4, weight_decay=1.25e-4,
              train_scales=_sides(times_640=20)),
    "m": dict(epochs=130, no_aug_epochs=10, lr=2.5e-4, lr_backbone=2.5e-5, weight_decay=1.25e-4,
              train_scales=_sides(times_640=6)),
    "l": dict(epochs=80, no_aug_epochs=8, lr=2.5e-4, lr_backbone=1.25e-5, weight_decay=1.25e-4,
              train_scales=_sides(times_640=4)),
    "x": dict(epochs=80, no_aug_epochs=8, lr=2.5e-4, lr_backbone=2.5e-6, weight_decay=1.25e-4,
              train_scales=_sides(times_640=4)),
}  # fmt: skip
_DFINE_RECIPES = {
    size: {**_DFINE_BASE, **_model_of(DFineConfig, size), **schedule}
    for size, schedule in _DFINE_SCHEDULES.items()
}
CONFIGS.update({f"dfine_{size}": recipe for size, recipe in _DFINE_RECIPES.items()})
CONFIGS.update({f"dfine_{size}_peg": {**recipe, "pos_enc": "peg"} for size, recipe in _DFINE_RECIPES.items()})
# Seconds on a CPU for the synthetic shapes: rtdetr_demo_tiny's training with D-FINE's decoder and losses
CONFIGS["dfine_demo_tiny"] = {
    **CONFIGS["rtdetr_demo_tiny"], "arch": "dfine", "model_size": "tiny", "backbone": "tiny",
}  # fmt: skip
# Seconds on a CPU for the synthetic shapes: the same schedule with DEIMv2's decoder and a tiny DINOv3 ViT
CONFIGS["deimv2_demo_tiny"] = {
    **CONFIGS["rtdetr_demo_tiny"], "arch": "deimv2", "model_size": "tiny", "backbone": "vit_tiny",
}  # fmt: skip
#: ``train --arch dfine`` without ``--config``: D-FINE-L's recipe
DFINE_DEFAULTS: dict[str, Any] = {k: v for k, v in _DFINE_RECIPES["l"].items() if k != "arch"}

# DEIM on D-FINE (ShihuaHuang95/DEIM configs/base/deim.yml on top of the D-FINE recipes, read in
# public copies of the repository): dense one-to-one matching (mosaic and mixup at 0.5 from epoch 4),
# MAL (gamma 1.5), SiLU in the decoder and its heads, the backbone unfrozen, DEIM's flat-cosine lr
# (2,000 warm-up steps, down to 0.5x), about half of D-FINE's epochs.  Per size (epochs, the
# mosaic / mixup end, the last unaugmented epochs, flat epochs, lr, backbone lr, weight decay): N, S
# and X from their deim_hgnetv2_*_coco.yml; M and L's files were not available here, so they take
# deim.yml's schedule (X's) with D-FINE-M / L's learning rates.
_DEIM_BASE: dict[str, Any] = {
    "cls_loss": "mal", "decoder_activation": "silu", "mlp_activation": "silu", "freeze_backbone_bn": False,
    "backbone_freeze_at": -1, "mosaic_prob": 0.5, "mixup_prob": 0.5, "lr_schedule": "flatcosine",
    "lr_gamma": 0.5, "warmup_steps": 2000, "total_batch_size": 32,
}  # fmt: skip


#: each size's schedule: epochs, the mosaic / mixup window, the last unaugmented epochs, flat epochs, lrs
_DEIM_SCHEDULES: dict[str, dict[str, Any]] = {
    "n": dict(epochs=160, aug_window=[4, 78], no_aug_epochs=12, flat_epochs=7800, lr=8e-4, lr_backbone=4e-4,
              weight_decay=1e-4, lr_gamma=1.0),  # flat_epoch 7800: a flat lr
    "s": dict(epochs=132, aug_window=[4, 64], no_aug_epochs=12, flat_epochs=64, lr=4e-4, lr_backbone=2e-4,
              weight_decay=1e-4),
    "m": dict(epochs=58, aug_window=[4, 29], no_aug_epochs=8, flat_epochs=29, lr=2.5e-4, lr_backbone=2.5e-5,
              weight_decay=1.25e-4),
    "l": dict(epochs=58, aug_window=[4, 29], no_aug_epochs=8, flat_epochs=29, lr=2.5e-4, lr_backbone=1.25e-5,
              weight_decay=1.25e-4),
    "x": dict(epochs=58, aug_window=[4, 29], no_aug_epochs=8, flat_epochs=29, lr=2.5e-4, lr_backbone=2.5e-6,
              weight_decay=1.25e-4),
}  # fmt: skip


def _deim(size: str) -> dict[str, Any]:
    """DEIM's recipe of ``size`` on D-FINE's model of that size (its schedule's window opens mosaic and mixup)."""
    schedule = dict(_DEIM_SCHEDULES[size])
    window = schedule.pop("aug_window")
    return {**_DFINE_RECIPES[size], **_DEIM_BASE, "mosaic_epochs": window, "mixup_epochs": window, **schedule}


_DEIM_RECIPES = {size: _deim(size) for size in _DEIM_SCHEDULES}
CONFIGS.update({f"deim_dfine_{size}": recipe for size, recipe in _DEIM_RECIPES.items()})
CONFIGS.update(
    {f"deim_dfine_{size}_peg": {**recipe, "pos_enc": "peg"} for size, recipe in _DEIM_RECIPES.items()}
)

# DEIMv2 (Intellindust-AI-Lab/DEIMv2 configs/deimv2/deimv2_dinov3_s_coco.yml, read in a public copy):
# the S model (--model-size s: DINOv3 ViT-Tiny + STA), AdamW lr 5e-4 (ViT 2.5e-5), weight decay 1e-4,
# 132 epochs with DEIM's flat-cosine schedule (flat to 64, the last 12 unaugmented), mosaic and mixup.
_DEIMV2_S: dict[str, Any] = {
    **_DFINE_BASE, "arch": "deimv2", **_model_of(DEIMv2Config, "s"), "total_batch_size": 32,
    "lr": 5e-4, "lr_backbone": 2.5e-5, "weight_decay": 1e-4, "epochs": 132, "no_aug_epochs": 12,
    "lr_schedule": "flatcosine", "flat_epochs": 64, "lr_gamma": 0.5, "warmup_steps": 2000,
    "train_scales": _sides(times_640=20),
}  # fmt: skip
CONFIGS["deimv2_s"] = _DEIMV2_S
CONFIGS["deimv2_s_peg"] = {**_DEIMV2_S, "pos_enc": "peg"}
# The other published sizes: their --model-size preset with S's schedule (their own config files were
# not available here).  The preset's backbone, encoding (the lite encoder of atto / femto / pico has
# no attention: none) and query count are the recipe's, since a recipe's values win over its preset.
_DEIMV2_OTHERS = ("atto", "femto", "pico", "n", "m", "l")
for _size in _DEIMV2_OTHERS:
    CONFIGS[f"deimv2_{_size}"] = {**_DEIMV2_S, **_model_of(DEIMv2Config, _size)}
    if CONFIGS[f"deimv2_{_size}"]["pos_enc"] != "none":
        CONFIGS[f"deimv2_{_size}_peg"] = {**CONFIGS[f"deimv2_{_size}"], "pos_enc": "peg"}
del _size
#: ``train --arch deimv2`` without ``--config``: DEIMv2-S's recipe
DEIMV2_DEFAULTS: dict[str, Any] = {k: v for k, v in _DEIMV2_S.items() if k != "arch"}


def _rfdetr_sides(size: str) -> str:
    """rf-detr's expanded multi-scale sides of a size (``compute_multi_scale_scales``): multiples of
    ``patch x windows`` at offsets -5..5 from the resolution's, at least two of them."""
    preset, unit_of = RFDETRConfig.SIZES[size], RFDETRConfig.default
    unit = preset.get("patch_size", unit_of("patch_size")) * preset.get("num_windows", unit_of("num_windows"))
    base = _RFDETR_RESOLUTION[size] // unit
    return ",".join(str((base + k) * unit) for k in range(-5, 6) if base + k >= 2)


#: each published size's training and evaluation resolution (rf-detr's ``RFDETR*Config.resolution``)
_RFDETR_RESOLUTION = {"n": 384, "s": 512, "m": 576, "l": 704, "base": 560}
# The decoder's dropout: 0, as rf-detr trains (roboflow/rf-detr rfdetr/main.py: ``--dropout`` and
# ``populate_args(dropout=0)`` default to 0, which build_transformer passes to every decoder layer,
# and neither ModelConfig nor TrainConfig in rfdetr/config.py sets it); RFDETRConfig's 0.1 is
# transformers' RfDetrConfig default, kept there so that Hugging Face folders read as written.
_RFDETR_BASE: dict[str, Any] = {
    "arch": "rfdetr", "lr": 1e-4, "lr_backbone": 1.5e-4, "weight_decay": 1e-4, "total_batch_size": 16,
    "grad_accum_steps": 4, "epochs": 100, "lr_drop": 100, "warmup_steps": 0, "ema_decay": 0.993, "ema_warmups": 100,
    "clip_max_norm": 0.1, "no_aug_epochs": 0, "labels": "ids", "dropout": 0.0,
}  # fmt: skip
_RFDETR_RECIPES = {
    size: {
        **_RFDETR_BASE,
        **_model_of(RFDETRConfig, size),
        "val_size": side,
        "train_scales": _rfdetr_sides(size),
    }
    for size, side in _RFDETR_RESOLUTION.items()
}
CONFIGS.update({f"rfdetr_{size}_coco": recipe for size, recipe in _RFDETR_RECIPES.items()})
CONFIGS.update({f"rfdetr_{size}_coco_peg": {**r, "pos_enc": "peg"} for size, r in _RFDETR_RECIPES.items()})
# A minute on a CPU for the synthetic shapes: the tiny RF-DETR (4-block ViT of width 48, patch 8) at
# rtdetr_demo_tiny's sides and schedule, with RF-DETR's augmentation, a PEG after block 0 instead of
# the table, and its own learning rates (tuned on the shapes).
CONFIGS["rfdetr_demo_tiny"] = {
    **CONFIGS["rtdetr_demo_tiny"], "arch": "rfdetr", "model_size": "tiny",
    **{k: RFDETRConfig.SIZES["tiny"].get(k, RFDETRConfig.default(k)) for k in ("backbone", "num_queries")},
    "pos_enc": "peg", "lr": 1e-3, "lr_backbone": 1e-3, "epochs": 2, "no_aug_epochs": 0,
}  # fmt: skip
#: ``train --arch rfdetr`` without ``--config``: RF-DETR base's recipe
RFDETR_DEFAULTS: dict[str, Any] = {k: v for k, v in _RFDETR_RECIPES["base"].items() if k != "arch"}


# Fine-tuning a pretrained detector on a small set of your own (--init FOLDER / hub id / checkpoint):
# each family's COCO recipe, shorter, at half its learning rates, with a short warm-up and EMA warm-up
# for a few hundred steps, and (RT-DETR family) the last epochs without the strong augmentation.
# Modelled on how the references fine-tune, not a published recipe: facebookresearch/detr #9 (start
# from the COCO weights, keep the lrs, tens of epochs), Peterande/D-FINE's configs/dfine/custom (the
# recipe's lrs, "72 + 2n" epochs, the last ones unaugmented), RT-DETR's and DEIM's own fine-tunes
# from Objects365 (short schedules at the same or lower lr).  Batch 8: small sets, one or two GPUs.
def _finetune(recipe: dict[str, Any], epochs: int, no_aug: int, **extra: Any) -> dict[str, Any]:
    tuned = {**recipe, "epochs": epochs, "lr": recipe["lr"] / 2, "lr_backbone": recipe["lr_backbone"] / 2,
             "total_batch_size": 8, **extra}  # fmt: skip
    if recipe.get("arch", "detr") != "detr":
        tuned.update(no_aug_epochs=no_aug, warmup_steps=200, ema_warmups=200)
    return tuned


FINETUNE_CONFIGS: dict[str, dict[str, Any]] = {
    "detr_finetune": _finetune(CONFIGS["detr_r50_500ep"], 50, 0, lr_drop=40),
    "rtdetr_finetune": _finetune(_RTDETR_R50VD, 36, 4),
    "dfine_finetune": _finetune(_DFINE_RECIPES["l"], 40, 4),
    "deimv2_finetune": _finetune(_DEIMV2_S, 40, 4, flat_epochs=20),
    "rfdetr_finetune": _finetune(_RFDETR_RECIPES["base"], 40, 0),
}
CONFIGS.update(FINETUNE_CONFIGS)

#: ``train --arch rtdetr`` without ``--config``: the R50vd 6x recipe's values instead of DETR's
RTDETR_DEFAULTS: dict[str, Any] = {k: v for k, v in _RTDETR_R50VD.items() if k != "arch"}

#: defaults of the detector's train flags (DETR's recipe); --config recipes and explicit flags override them
DEFAULTS: dict[str, Any] = {
    "epochs": 300, "lr": 1e-4, "lr_backbone": 1e-5, "weight_decay": 1e-4, "lr_drop": 200, "clip_max_norm": 0.1,
    "total_batch_size": 2, "train_scales": _SIDES, "max_size": 1333,
    "crop_resize": "400,500,600", "crop_size": "384,600", "val_size": 800, "backbone": "resnet50",
    "pos_enc": "peg", "num_queries": 100, "labels": "ids",
}  # fmt: skip

#: RF-DETR's published COCO val2017 AP50:95 (roboflow/rf-detr README; L: rfdetr.roboflow.com's model table)
_RFDETR_AP = {"n": "48.4 COCO AP", "s": "53.0 COCO AP", "m": "54.7 COCO AP", "l": "56.5 COCO AP",
              "base": "53.3 COCO AP"}  # fmt: skip

#: one line per recipe for ``python -m peg_detr configs``
DESCRIPTIONS: dict[str, str] = {
    "detr_r50_500ep": "DETR-R50 as published: sine encoder, 500 epochs, lr drop at 400, batch 64 (42.0 COCO AP)",
    "cpvt_peg_50ep": "CPVT's detection recipe with a PEG encoder: 50 epochs, batch 32 (33.9 COCO AP)",
    "cpvt_sine_50ep": "CPVT's detection recipe with DETR's sine encoder (33.7 COCO AP)",
    "cpvt_none_50ep": "CPVT's detection recipe without encoder positions (32.8 COCO AP)",
    "demo_tiny": "tiny backbone and transformer for the synthetic shapes (make-data): minutes on a CPU",
    "rtdetr_r18vd_6x": "RT-DETR-R18vd as published: sin-cos AIFI, 72 epochs, batch 16, EMA (46.5 COCO AP)",
    "rtdetr_r50vd_6x": "RT-DETR-R50vd as published: sin-cos AIFI, 72 epochs, batch 16, EMA (53.1 COCO AP)",
    "rtdetr_r18vd_6x_peg": "rtdetr_r18vd_6x with a PEG in AIFI instead of the sin-cos table (any input size)",
    "rtdetr_r50vd_6x_peg": "rtdetr_r50vd_6x with a PEG in AIFI instead of the sin-cos table (any input size)",
    "rtdetr_demo_tiny": "RT-DETR with a tiny backbone and a PEG for the synthetic shapes: seconds on a CPU",
    **{f"dfine_{s}": f"D-FINE-{s.upper()} as published: HGNetv2 {b[-2:].upper()}, sin-cos AIFI, {r['epochs']} epochs, "
       f"batch 64, EMA ({ap} COCO AP)" for (s, r), ap in zip(_DFINE_RECIPES.items(), (42.8, 48.5, 52.3, 54.0, 55.8))
       for b in [r["backbone"]]},
    **{f"dfine_{s}_peg": f"dfine_{s} with a PEG in AIFI instead of the sin-cos table (any input size)" for s in _DFINE_RECIPES},
    "dfine_demo_tiny": "D-FINE with a tiny backbone and a PEG for the synthetic shapes: seconds on a CPU",
    "detr_finetune": "fine-tune a DETR-R50 (--init) on your data: 50 epochs, half the lrs, lr drop at 40, batch 8",
    "rtdetr_finetune": "fine-tune an RT-DETR-R50vd (--init) on your data: 36 epochs (last 4 plain), half the lrs, batch 8",
    "dfine_finetune": "fine-tune a D-FINE-L (--init) on your data: 40 epochs (last 4 plain), half the lrs, batch 8",
    "deimv2_finetune": "fine-tune a DEIMv2-S (--init) on your data: 40 epochs (last 4 plain), half the lrs, batch 8",
    "rfdetr_finetune": "fine-tune an RF-DETR base (--init) on your data: 40 epochs, half the lrs, batch 8",
    **{f"rfdetr_{s}_coco": f"RF-DETR-{s.upper() if len(s) == 1 else 'Base'} as published: windowed DINOv2-S, its table, "
       f"{r['val_size']} px, batch 16, EMA ({_RFDETR_AP[s]}; roboflow/rf-detr README)" for s, r in _RFDETR_RECIPES.items()},
    **{f"rfdetr_{s}_coco_peg": f"rfdetr_{s}_coco with a zero PEG after ViT block 0 instead of the table (any input size)"
       for s in _RFDETR_RECIPES},
    "rfdetr_demo_tiny": "RF-DETR with a 4-block ViT and a PEG for the synthetic shapes: a minute on a CPU",
    "deimv2_demo_tiny": "DEIMv2 with a 4-block DINOv3 ViT and a PEG for the synthetic shapes: a minute on a CPU",
    **{f"deim_dfine_{s}": f"DEIM-D-FINE-{s.upper()}: D-FINE-{s.upper()} trained with dense one-to-one matching and "
       f"MAL, {r['epochs']} epochs, flat-cosine lr ({ap} COCO AP)" for (s, r), ap in zip(_DEIM_RECIPES.items(),
                                                                            (43.0, 49.0, 52.7, 54.7, 56.5))},
    **{f"deim_dfine_{s}_peg": f"deim_dfine_{s} with a PEG in AIFI instead of the sin-cos table" for s in _DEIM_RECIPES},
    "deimv2_s": "DEIMv2-S: DINOv3 ViT-Tiny + STA, sin-cos AIFI, 132 epochs, flat-cosine lr (50.9 COCO AP)",
    "deimv2_s_peg": "deimv2_s with a PEG in AIFI instead of the sin-cos table (any input size)",
    **{f"deimv2_{s}": f"DEIMv2-{s.capitalize() if len(s) > 1 else s.upper()}: its model with deimv2_s's schedule "
       f"({ap} COCO AP)" for s, ap in zip(_DEIMV2_OTHERS, (23.8, 31.0, 38.5, 43.0, 53.0, 56.0))},
    **{f"deimv2_{s}_peg": f"deimv2_{s} with a PEG in AIFI instead of the sin-cos table" for s in ("n", "m", "l")},
}  # fmt: skip

PUBLISHED_AP: dict[str, float] = {
    "detr_r50_500ep": 42.0,
    "cpvt_sine_50ep": 33.7,
    "cpvt_none_50ep": 32.8,
    "cpvt_peg_50ep": 33.9,
    # lyuwenyu/RT-DETR README (COCO val2017, 640x640, 72 epochs)
    "rtdetr_r18vd_6x": 46.5,
    "rtdetr_r50vd_6x": 53.1,
    # Peterande/D-FINE README (COCO val2017, 640x640, trained on COCO only)
    **dict(zip((f"dfine_{s}" for s in "nsmlx"), (42.8, 48.5, 52.3, 54.0, 55.8))),
    # ShihuaHuang95/DEIM README
    **dict(zip((f"deim_dfine_{s}" for s in "nsmlx"), (43.0, 49.0, 52.7, 54.7, 56.5))),
    # roboflow/rf-detr README and documentation (COCO val2017 AP50:95)
    **{
        f"rfdetr_{s}_coco": ap
        for s, ap in (("n", 48.4), ("s", 53.0), ("m", 54.7), ("l", 56.5), ("base", 53.3))
    },
    # Intellindust-AI-Lab/DEIMv2 README
    "deimv2_s": 50.9,
    **dict(
        zip(
            (f"deimv2_{s}" for s in ("atto", "femto", "pico", "n", "m", "l")),
            (23.8, 31.0, 38.5, 43.0, 53.0, 56.0),
        )
    ),
}


_DETR = "DETR (DetrConfig, timm ResNet backbone: peg_detr.from_hf)"
_RTDETR = "RT-DETR (RTDetrConfig, RTDetrResNet-vd backbone: peg_detr.from_hf)"
_RT_SOURCE = "lyuwenyu/RT-DETR README, COCO val2017 at 640x640, 72 epochs"
_RFDETR = "RF-DETR (RfDetrConfig, windowed DINOv2 backbone: peg_detr.from_hf)"
_RF_SOURCE = "roboflow/rf-detr README / rfdetr.roboflow.com, COCO val2017 at the size's resolution"


def _run(init: str, recipe: str, out: str) -> str:
    return (f"python -m peg_detr train --config {recipe} --init {init} --data-root /data/coco "
            f"--output-dir runs/{out}")  # fmt: skip


#: ``python -m peg_detr models``: public Hugging Face detectors ``train --init`` / ``from_hf`` read
PUBLIC_MODELS: tuple[PublicModel, ...] = (
    PublicModel(_DETR, "facebook/detr-resnet-50", f"{PUBLISHED_AP['detr_r50_500ep']} COCO AP",
                "facebookresearch/detr README, COCO val2017, 500 epochs",
                _run("facebook/detr-resnet-50", "cpvt_peg_50ep", "peg_from_detr")),
    PublicModel(_RTDETR, "PekingU/rtdetr_r18vd", f"{PUBLISHED_AP['rtdetr_r18vd_6x']} COCO AP", _RT_SOURCE,
                _run("PekingU/rtdetr_r18vd", "rtdetr_r18vd_6x_peg", "rtdetr_r18vd_peg")),
    PublicModel(_RTDETR, "PekingU/rtdetr_r50vd", f"{PUBLISHED_AP['rtdetr_r50vd_6x']} COCO AP", _RT_SOURCE,
                _run("PekingU/rtdetr_r50vd", "rtdetr_r50vd_6x_peg", "rtdetr_r50vd_peg")),
    *(PublicModel(_RFDETR, f"Roboflow/rf-detr-{name}", f"{PUBLISHED_AP[f'rfdetr_{size}_coco']} COCO AP", _RF_SOURCE,
                  _run(f"Roboflow/rf-detr-{name}", f"rfdetr_{size}_coco_peg", f"rfdetr_{size}_peg"))
      for size, name in (("n", "nano"), ("s", "small"), ("l", "large"), ("base", "base"))),
)  # fmt: skip
