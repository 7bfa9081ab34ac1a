"""Named training recipes for ``python -m peg_video train --config NAME``.

A recipe only sets defaults; any command-line flag overrides it.  Keys are the
``train`` parser's argparse destinations (``--clip-max-norm`` -> ``clip_max_norm``;
``model_opts`` holds the model keywords that ``--model-opt KEY=VALUE`` adds to).  The Kinetics-400
recipes follow the usual ViT-S 16×4 setting (16 frames at stride 4, 224 crop, tubelet
2×16×16, AdamW, 5 warm-up epochs then cosine, label smoothing 0.1, 3 clips × 3 crops at
test), varying only the position encoding, so the three runs isolate its effect.

Published Kinetics-400 top-1 (views as in each paper) to compare with:

============================================  ======  =========================================
model                                         top-1   note
============================================  ======  =========================================
UniFormer-S 16×4                              80.8    3D depthwise-conv position embedding
                                                      (the PEG idea), ImageNet-1k init
VideoMAE ViT-B 16×4                           81.5    self-supervised pre-training on K400
TimeSformer (divided space-time, 8×32)        77.9    ImageNet-21k init
============================================  ======  =========================================

These recipes have not been trained to completion in this repository (no GPUs on the
build machines); they are the recipes, not reproduced numbers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONFIGS", "PUBLISHED_K400_TOP1"]

PUBLISHED_K400_TOP1 = {"UniFormer-S 16x4": 80.8, "VideoMAE ViT-B": 81.5, "TimeSformer": 77.9}

_K400_VIT_S: dict[str, Any] = {
    "model": "vit_small",
    "num_frames": 16,
    "stride": 4,
    "crop": 224,
    "train_scale": [256, 320],
    "test_scale": 224,
    "tubelet": [2, 16, 16],
    "num_clips": 3,
    "num_crops": 3,
    "hflip": True,
    "epochs": 100,
    "batch_size": 16,
    "lr": 1e-3,
    "min_lr": 1e-5,
    "weight_decay": 0.05,
    "warmup_epochs": 5,
    "label_smoothing": 0.1,
    "clip_max_norm": 1.0,
    "amp": "bf16",
    "workers": 8,
    "eval_every": 5,
    "model_opts": {"drop_path_rate": 0.1},
}

CONFIGS: dict[str, dict[str, Any]] = {
    "k400_vit_s_16x4_peg3d": {**_K400_VIT_S, "pos_enc": "peg3d"},
    "k400_vit_s_16x4_learned": {**_K400_VIT_S, "pos_enc": "learned"},
    "k400_vit_s_16x4_none": {**_K400_VIT_S, "pos_enc": "none"},
    "k400_x3d_xs": {
        **_K400_VIT_S,
        "model": "x3d_xs",
        "pos_enc": "none",
        "num_frames": 4,
        "stride": 12,
        "crop": 160,
        "train_scale": [182, 228],
        "test_scale": 182,
        "lr": 1.6e-3,
        "model_opts": {},
    },
    # The embedded synthetic set (python -m peg_video make-data): seconds per epoch on a CPU.
    "synthetic_tiny": {
        "model": "vit_tiny",
        "pos_enc": "peg3d",
        "num_frames": 8,
        "stride": 2,
        "crop": 32,
        "train_scale": [32, 36],
        "test_scale": 32,
        "tubelet": [2, 8, 8],
        "num_clips": 2,
        "num_crops": 1,
        "hflip": False,  # a flip turns "move left" into "move right"
        "epochs": 24,
        "batch_size": 8,
        "lr": 3e-3,
        "min_lr": 1e-5,
        "weight_decay": 0.05,
        "warmup_epochs": 1,
        "label_smoothing": 0.0,
        "clip_max_norm": 1.0,
        "amp": "off",
        "workers": 0,
        "eval_every": 8,
        "model_opts": {"embed_dim": 64, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0, "peg_at": "all"},
    },
}
