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

The RT-DETR recipes train ``--labels contiguous`` (label k = the k-th category by id, 80 for COCO),
as lyuwenyu/RT-DETR does; DETR's and ``rtdetr_demo_tiny`` use the category ids as labels.

:data:`DEFAULTS` are the ``train`` defaults without a recipe (DETR's recipe); keys are argparse
destinations (``train_scales`` is ``--train-sizes``).
"""

from __future__ import annotations

from typing import Any

from peg_core.interop.resolve import PublicModel

__all__ = ["CONFIGS", "DEFAULTS", "DESCRIPTIONS", "PUBLIC_MODELS", "PUBLISHED_AP", "RTDETR_DEFAULTS"]

# DETR's multi-scale training sizes (short side 480..800 step 32, long side <= 1333).
_DETR_DATA: dict[str, Any] = {
    "train_scales": "480,512,544,576,608,640,672,704,736,768,800",
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
    "num_queries": 300,
    "num_denoising": 100,
    "label_noise_ratio": 0.5,
    "box_noise_scale": 1.0,
    "train_scales": ",".join(str(s) for s in range(480, 801, 32)),
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
        # layers; square sides that are multiples of the stride 32, a short EMA warm-up.
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
            "lr": 5e-4,
            "lr_backbone": 5e-4,
            "epochs": 2,
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

#: ``train --arch rtdetr`` without ``--config``: the R50vd 6x recipe's values instead of DETR's
RTDETR_DEFAULTS: dict[str, Any] = {k: v for k, v in _RTDETR_R50VD.items() if k != "arch"}

#: defaults of the detector's train flags (DETR's recipe); --config recipes and explicit flags override them
DEFAULTS: dict[str, Any] = {
    "epochs": 300, "lr": 1e-4, "lr_backbone": 1e-5, "weight_decay": 1e-4, "lr_drop": 200, "clip_max_norm": 0.1,
    "total_batch_size": 2, "train_scales": "480,512,544,576,608,640,672,704,736,768,800", "max_size": 1333,
    "crop_resize": "400,500,600", "crop_size": "384,600", "val_size": 800, "backbone": "resnet50",
    "pos_enc": "peg", "num_queries": 100, "labels": "ids",
}  # fmt: skip

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
}

PUBLISHED_AP: dict[str, float] = {
    "detr_r50_500ep": 42.0,
    "cpvt_sine_50ep": 33.7,
    "cpvt_none_50ep": 32.8,
    "cpvt_peg_50ep": 33.9,
    # lyuwenyu/RT-DETR README (COCO val2017, 640x640, 72 epochs)
    "rtdetr_r18vd_6x": 46.5,
    "rtdetr_r50vd_6x": 53.1,
}


_DETR = "DETR (DetrConfig, timm ResNet backbone: peg_detr.from_hf)"
_RTDETR = "RT-DETR (RTDetrConfig, RTDetrResNet-vd backbone: peg_detr.from_hf)"
_RT_SOURCE = "lyuwenyu/RT-DETR README, COCO val2017 at 640x640, 72 epochs"


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
)  # fmt: skip
