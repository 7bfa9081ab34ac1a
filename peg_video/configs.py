"""Named training recipes for ``python -m peg_video train --config NAME``.

A recipe only sets defaults; any command-line flag overrides it.  Keys are the
``train`` parser's argparse destinations (``--clip-max-norm`` -> ``clip_max_norm``,
``--scale-jitter`` -> ``scale_jitter``; ``model_opts`` holds the other builder keywords that
``--model-opt KEY=VALUE`` adds to).  The model keys (``model_opts``, ``num_heads`` and the PEG
group ``peg_*``) belong to the recipe's ``arch``: with another ``--arch`` only the explicit
flags apply (:data:`MODEL_KEYS`).  The Kinetics-400
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

Other data sets (``--dataset``, read from their official files under ``--data-root``):

* ``ssv2_vit_s_16_*``: Something-Something v2, 16 frames by **segment** sampling (one per
  sixteenth of the video, TSN / TSM style), **no horizontal flip** (labels say "left to
  right"), 2 clips × 3 crops at test (VideoMAE's SSv2 views).  Published SSv2 top-1, from the
  VideoMAE model zoo (MCG-NJU/VideoMAE ``MODEL_ZOO.md``, SSv2 table, 16×2×3 views, self-supervised
  pre-training on SSv2 only): ViT-S 66.8, ViT-B 70.8.  TimeSformer (Bertasius et al. 2021, the
  SSv2 comparison table) and ViViT (Arnab et al. 2021, its SSv2 state-of-the-art table) report
  theirs with ImageNet-21k / Kinetics initialisation; see those tables.
* ``ucf101_vit_s_16x4_peg3d`` / ``hmdb51_vit_s_16x4_peg3d``: the Kinetics clip (16×4) with
  flips, 5 clips × 3 crops at test, official split 1 by default (``--split``); ``eval --split all``
  reports the three test lists and their mean.  Published: VideoMAE model zoo, UCF101 table,
  ViT-B pre-trained on UCF101 alone, 91.3 top-1; HMDB51: the HMDB51 row of the same paper's
  (Tong et al. 2022) comparison table.  Kinetics-pretrained models are far higher on both,
  so compare like with like.

Fine-tuning pre-trained weights (``train --config NAME --init FOLDER``, a downloaded VideoMAE
ViT-S folder; the model comes from the folder):

* ``k400_videomae_s_ft`` / ``ssv2_videomae_s_ft`` keep the folder's fixed sinusoid table
  (``--pos-enc table``); ``*_peg3d`` drop it for a zero-initialised PEG3d (``peg_video.from_hf``).
* The schedule is the ViT-S fine-tuning of MCG-NJU/VideoMAE (``scripts/kinetics|ssv2/
  videomae_vit_small_patch16_224_*/finetune.sh`` with the defaults of ``run_class_finetuning.py``):
  AdamW, 5 warm-up epochs then cosine to 1e-6, weight decay 0.05, label smoothing 0.1, drop path
  0.1, no gradient clipping; 16 frames at stride 4 (SSv2: 16 segments, no flip), 224 crop, test
  short side 224; Kinetics 150 epochs, base lr 5e-4, 5 clips x 3 crops; SSv2 40 epochs, base lr
  1e-3, 2 clips x 3 crops.  The scripts run 32 processes x 12 videos (a total batch of 384
  videos, 768 clips with the repeated augmentation below) and scale the base lr by total
  batch / 256, so ``lr`` here is base x 1.5 with ``batch_size`` 12 (videos) per process: with
  fewer processes scale ``--lr`` by the same rule.
* Layer-wise lr decay (``--layer-decay``: 0.75, ``run_class_finetuning.py``'s default, on
  Kinetics; 0.7 in the SSv2 ViT-S script) and Mixup 0.8 / CutMix 1.0 (``--mixup`` / ``--cutmix``,
  the script defaults: one of the two per batch, label smoothing applied before mixing) are set.
* The scripts' augmentations are set (defaults of ``run_class_finetuning.py`` and
  ``--num_sample 2`` of both ViT-S scripts): RandAugment ``--aa rand-m7-n4-mstd0.5-inc1`` as
  ``--rand-augment m7-n4`` (torchvision's v2 RandAugment, one draw for all frames of a clip;
  magnitude 7 of 10; torchvision has no magnitude noise ``mstd0.5``, and its op set differs a
  little from timm's increasing one: no Invert / SolarizeAdd, an Identity, posterize to 5 bits
  at m7, where timm's increasing posterize keeps 2), random erasing ``--reprob 0.25 --remode pixel
  --recount 1`` as ``--random-erasing 0.25`` (one box of normal noise, the same box in every
  frame as VideoMAE's cube erasing; the noise too, where VideoMAE draws it per frame), and
  repeated augmentation ``--num_sample 2`` as ``--repeated-aug 2``: each video gives two
  clips per visit (one temporal clip, augmented twice), so a step holds 2 x 12 clips per
  process and an epoch keeps its number of steps, as in VideoMAE, whose lr rule counts videos.
* The training crop is VideoMAE's random-resized crop (``spatial_sampling(..., scale=[0.08, 1.0],
  aspect_ratio=[0.75, 1.3333], motion_shift=False)`` of its Kinetics / SSv2 datasets) as
  ``--train-crop rrc``: one box for every frame of a clip, 8 %..100 % of the frame's area, width /
  height 0.75..1.3333 (``--rrc-scale`` / ``--rrc-ratio``), resized to 224; then the flip (Kinetics
  only; SSv2 keeps no flip).  ``scale_jitter``'s 320 is then only the short side larger videos are
  decoded at.
* Still different: VideoMAE crops the frames as stored and resizes the box bilinearly without
  antialiasing (here: from frames decoded at short side 320 at most, with antialiasing), and its
  RandAugment runs on the full frames before the crop (here: on the crop, bilinear, not bicubic).
* Published top-1 with the folder's own table (:data:`PUBLISHED_FINETUNE_TOP1`): MCG-NJU/VideoMAE
  ``MODEL_ZOO.md``, ViT-S: Kinetics-400 79.0 (1600-epoch pre-training, 16x5x3 views),
  Something-Something V2 66.8 (2400-epoch pre-training, 16x2x3).
"""

from __future__ import annotations

from typing import Any

from peg_core.interop.resolve import PublicModel

__all__ = [
    "CONFIGS",
    "DEFAULTS",
    "DESCRIPTIONS",
    "FINETUNE_CONFIGS",
    "MODEL_KEYS",
    "PUBLIC_MODELS",
    "PUBLISHED_FINETUNE_TOP1",
    "PUBLISHED_K400_TOP1",
    "PUBLISHED_TOP1",
    "VIDEOMAE_INPUT",
    "VIDEOMAE_MEAN",
    "VIDEOMAE_STD",
    "folder_clip",
    "videomae_views",
]

PUBLISHED_K400_TOP1 = {"UniFormer-S 16x4": 80.8, "VideoMAE ViT-B": 81.5, "TimeSformer": 77.9}
#: data set -> {model: top-1}; source: VideoMAE model zoo (MCG-NJU/VideoMAE MODEL_ZOO.md)
PUBLISHED_TOP1 = {
    "ssv2": {"VideoMAE ViT-S 16x2x3": 66.8, "VideoMAE ViT-B 16x2x3": 70.8},
    "ucf101": {"VideoMAE ViT-B (UCF101 pre-training)": 91.3},
}

_K400_VIT_S: dict[str, Any] = {
    "arch": "vit_small",
    "num_frames": 16,
    "stride": 4,
    "crop": 224,
    "scale_jitter": [256, 320],
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

# SSv2: uniform segments over the whole video, never flipped (left / right are in the labels),
# 2 clips x 3 crops at test (VideoMAE's SSv2 views).
_SSV2_PROTOCOL: dict[str, Any] = {"dataset": "ssv2", "sampling": "segment", "hflip": False, "num_clips": 2,
                                  "num_crops": 3}  # fmt: skip
_SSV2_VIT_S: dict[str, Any] = {**_K400_VIT_S, **_SSV2_PROTOCOL, "epochs": 50}
# VideoMAE fine-tuning (MCG-NJU/VideoMAE run_class_finetuning.py and the ViT-S scripts, see the
# module docstring): the input a downloaded VideoMAE folder expects, and the schedule.
#: ImageNet mean / std: what VideoMAE's fine-tuning normalises with (imagenet_default_mean_and_std)
VIDEOMAE_MEAN = (0.485, 0.456, 0.406)
VIDEOMAE_STD = (0.229, 0.224, 0.225)
#: the clip ``train --init FOLDER`` reads by default: 16 frames at stride 4, 224 crop, test short side 224
VIDEOMAE_INPUT: dict[str, Any] = {"num_frames": 16, "stride": 4, "crop": 224, "scale_jitter": [256, 320],
                                  "test_scale": 224}  # fmt: skip


def videomae_views(crop: int) -> dict[str, Any]:
    """VideoMAE's views for a ``crop``: its scale jitter (256..320 for 224) scaled with the crop, and
    the test short side at the crop (VideoMAE's ``short_side_size``)."""
    return {"scale_jitter": [round(s * crop / VIDEOMAE_INPUT["crop"]) for s in VIDEOMAE_INPUT["scale_jitter"]],
            "test_scale": crop}  # fmt: skip


def folder_clip(info: dict[str, Any]) -> dict[str, Any]:
    """The clip a Hugging Face video folder is read with when no flag or recipe says otherwise.

    ``info``: :func:`peg_video.interop.hf.read_hf_video_config`'s.  The folder's frames and crop
    (else :data:`VIDEOMAE_INPUT`'s), VideoMAE's stride, the folder's tubelet and normalisation (else
    ImageNet's, as VideoMAE fine-tunes) and :func:`videomae_views` of the crop.  ``train --init
    FOLDER`` and the ``Predictor`` of a folder both take it from here.
    """
    crop = min(info["image_size"]) if info.get("image_size") else VIDEOMAE_INPUT["crop"]
    return {
        "num_frames": info.get("num_frames") or VIDEOMAE_INPUT["num_frames"],
        "stride": VIDEOMAE_INPUT["stride"],
        "crop": crop,
        "tubelet": tuple(info["tubelet"]),
        "mean": tuple(float(v) for v in info.get("mean") or VIDEOMAE_MEAN),
        "std": tuple(float(v) for v in info.get("std") or VIDEOMAE_STD),
        **videomae_views(crop),
    }


_VIDEOMAE_S_FT: dict[str, Any] = {
    **_K400_VIT_S,
    **VIDEOMAE_INPUT,
    "mean": list(VIDEOMAE_MEAN),  # the folder's preprocessor_config.json wins when it has one
    "std": list(VIDEOMAE_STD),
    "batch_size": 12,  # videos; x 32 processes = the scripts' total batch of 384
    "epochs": 150,
    "lr": 5e-4 * 384 / 256,  # base lr 5e-4, scaled by total batch / 256 as run_class_finetuning does
    "min_lr": 1e-6,
    "clip_max_norm": 0.0,  # --clip_grad None
    "num_clips": 5,
    "num_crops": 3,
    "layer_decay": 0.75,  # --layer_decay's default in run_class_finetuning.py
    "mixup": 0.8,  # --mixup / --cutmix defaults (switch prob 0.5, batch mode)
    "cutmix": 1.0,
    "rand_augment": "m7-n4",  # --aa rand-m7-n4-mstd0.5-inc1 (run_class_finetuning.py default)
    "random_erasing": 0.25,  # --reprob 0.25 --remode pixel --recount 1 (its defaults)
    "repeated_aug": 2,  # --num_sample 2 (both ViT-S scripts): 2 clips per video, 24 per step
    "train_crop": "rrc",  # spatial_sampling's scale [0.08, 1.0], aspect_ratio [0.75, 1.3333]: the defaults
    # as _K400_VIT_S: weight decay 0.05, 5 warm-up epochs, label smoothing 0.1, drop path 0.1
}
_SSV2_VIDEOMAE_S_FT: dict[str, Any] = {
    **_VIDEOMAE_S_FT,
    **_SSV2_PROTOCOL,
    "epochs": 40,
    "lr": 1e-3 * 384 / 256,  # base lr 1e-3 (the SSv2 ViT-S script)
    "layer_decay": 0.7,  # --layer_decay 0.7 (the SSv2 ViT-S script)
}

# UCF101 / HMDB51: ~10k / ~7k videos per split: a shorter schedule, 5 clips x 3 crops at test.
_SMALL_SET: dict[str, Any] = {"pos_enc": "peg3d", "split": 1, "epochs": 50, "num_clips": 5, "eval_every": 5}

CONFIGS: dict[str, dict[str, Any]] = {
    "k400_vit_s_16x4_peg3d": {**_K400_VIT_S, "pos_enc": "peg3d"},
    "k400_vit_s_16x4_learned": {**_K400_VIT_S, "pos_enc": "learned"},
    "k400_vit_s_16x4_none": {**_K400_VIT_S, "pos_enc": "none"},
    "k400_x3d_xs": {
        **_K400_VIT_S,
        "arch": "x3d_xs",
        "pos_enc": "none",
        "num_frames": 4,
        "stride": 12,
        "crop": 160,
        "scale_jitter": [182, 228],
        "test_scale": 182,
        "lr": 1.6e-3,
        "model_opts": {},
    },
    **{f"ssv2_vit_s_16_{pos}": {**_SSV2_VIT_S, "pos_enc": pos} for pos in ("peg3d", "learned", "none")},
    "ucf101_vit_s_16x4_peg3d": {**_K400_VIT_S, **_SMALL_SET, "dataset": "ucf101"},
    "hmdb51_vit_s_16x4_peg3d": {**_K400_VIT_S, **_SMALL_SET, "dataset": "hmdb51"},
    # Fine-tuning a downloaded VideoMAE ViT-S (train --init FOLDER): the folder's table or a PEG3d.
    "k400_videomae_s_ft": {**_VIDEOMAE_S_FT, "pos_enc": "table"},
    "k400_videomae_s_ft_peg3d": {**_VIDEOMAE_S_FT, "pos_enc": "peg3d"},
    "ssv2_videomae_s_ft": {**_SSV2_VIDEOMAE_S_FT, "pos_enc": "table"},
    "ssv2_videomae_s_ft_peg3d": {**_SSV2_VIDEOMAE_S_FT, "pos_enc": "peg3d"},
    # The embedded synthetic set (python -m peg_video make-data): seconds per epoch on a CPU.
    "synthetic_tiny": {
        "arch": "vit_tiny",
        "pos_enc": "peg3d",
        "num_frames": 8,
        "stride": 2,
        "crop": 32,
        "scale_jitter": [32, 36],
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
        "num_heads": 2,
        # A PEG3d before each of the two blocks (UniFormer's dynamic position embedding): the
        # recipe's old peg_at "all", written out since "all" now means after every block (0, 1).
        "peg_at": [-1, 0],
        "model_opts": {"embed_dim": 64, "depth": 2, "mlp_ratio": 2.0},
    },
}

#: one line per recipe for ``python -m peg_video configs``
DESCRIPTIONS: dict[str, str] = {
    "k400_vit_s_16x4_peg3d": "Kinetics-400, ViT-S 16x4 with a 3D PEG: 100 epochs, 3 clips x 3 crops at test",
    "k400_vit_s_16x4_learned": "the Kinetics-400 ViT-S 16x4 recipe with a learned space-time table",
    "k400_vit_s_16x4_none": "the Kinetics-400 ViT-S 16x4 recipe without position encoding",
    "k400_x3d_xs": "X3D-XS (pytorchvideo's CNN baseline) on Kinetics-400: 4 frames at stride 12, 160 px",
    "ssv2_vit_s_16_peg3d": "Something-Something v2, ViT-S, 16 segment-sampled frames, no flips, 3D PEG",
    "ssv2_vit_s_16_learned": "the SSv2 ViT-S recipe with a learned space-time table",
    "ssv2_vit_s_16_none": "the SSv2 ViT-S recipe without position encoding",
    "ucf101_vit_s_16x4_peg3d": "UCF101 split 1, ViT-S 16x4 with a 3D PEG: 50 epochs, 5 clips x 3 crops at test",
    "hmdb51_vit_s_16x4_peg3d": "HMDB51 split 1, ViT-S 16x4 with a 3D PEG: 50 epochs, 5 clips x 3 crops at test",
    "k400_videomae_s_ft": "fine-tune a VideoMAE ViT-S folder (--init) on Kinetics-400 with its own table: "
    "16x4 frames, 150 epochs, 5 clips x 3 crops",
    "k400_videomae_s_ft_peg3d": "the Kinetics-400 VideoMAE ViT-S fine-tuning with a zero-initialised 3D PEG "
    "instead of the table",
    "ssv2_videomae_s_ft": "fine-tune a VideoMAE ViT-S folder (--init) on SSv2 with its own table: 16 segments, "
    "no flips, 40 epochs, 2 clips x 3 crops",
    "ssv2_videomae_s_ft_peg3d": "the SSv2 VideoMAE ViT-S fine-tuning with a zero-initialised 3D PEG instead of "
    "the table",
    "synthetic_tiny": "the embedded synthetic set (make-data): a 2-block vit_tiny, seconds per epoch on a CPU",
}

#: recipes that fine-tune pre-trained weights: ``train --config NAME`` needs ``--init FOLDER``
FINETUNE_CONFIGS = (
    "k400_videomae_s_ft",
    "k400_videomae_s_ft_peg3d",
    "ssv2_videomae_s_ft",
    "ssv2_videomae_s_ft_peg3d",
)
#: recipe -> (published top-1, its source) of the same fine-tuning with the folder's own table
PUBLISHED_FINETUNE_TOP1: dict[str, tuple[float, str]] = {
    "k400_videomae_s_ft": (79.0, "MCG-NJU/VideoMAE MODEL_ZOO.md, Kinetics-400, ViT-S, 1600-epoch pre-training, 16x5x3"),
    "ssv2_videomae_s_ft": (66.8, "MCG-NJU/VideoMAE MODEL_ZOO.md, Something-Something V2, ViT-S, 2400-epoch "
                           "pre-training, 16x2x3"),
}  # fmt: skip

#: recipe keys that describe the recipe's own model (dropped, unless given as flags, with another --arch)
MODEL_KEYS = ("model_opts", "num_heads", "peg_at", "peg_kernel_size", "peg_separable", "peg_padding",
              "peg_dynamic", "peg_num_kernels", "pos_interpolation")  # fmt: skip

#: ``train`` defaults without ``--config``: the synthetic recipe's data and schedule with a
#: full-size vit_tiny (its model keys are the builder's defaults)
DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in CONFIGS["synthetic_tiny"].items() if k not in MODEL_KEYS},
    "model_opts": {},
}


_VIDEOMAE = "VideoMAE (VideoMAEConfig: peg_video.from_hf)"
_ZOO = "MCG-NJU/VideoMAE MODEL_ZOO.md"


def _run(init: str, recipe: str, data: str, out: str, pos_enc: str = "") -> str:
    extra = f" --pos-enc {pos_enc}" if pos_enc else ""
    return f"python -m peg_video train --config {recipe} --init {init}{extra} {data} --output-dir runs/{out}"


_K400 = "--train-ann /data/k400/train.csv --val-ann /data/k400/val.csv"

#: ``python -m peg_video models``: public Hugging Face video models ``train --init`` / ``from_hf`` read
PUBLIC_MODELS: tuple[PublicModel, ...] = (
    PublicModel(_VIDEOMAE, "MCG-NJU/videomae-small-finetuned-kinetics", "79.0 K400 top-1",
                f"{_ZOO}, ViT-S, 1600-epoch pre-training",
                _run("MCG-NJU/videomae-small-finetuned-kinetics", "k400_videomae_s_ft_peg3d", _K400, "k400_s_peg3d")),
    PublicModel("TimeSformer (TimesformerConfig: peg_video.from_hf)", "facebook/timesformer-base-finetuned-k400",
                "—", "—", _run("facebook/timesformer-base-finetuned-k400", "k400_videomae_s_ft", _K400,
                               "k400_timesformer_peg3d", "peg3d")),
    PublicModel("V-JEPA 2 (VJEPA2Config, 3-D RoPE: peg_video.from_hf)", "facebook/vjepa2-vitl-fpc64-256", "—", "—",
                _run("facebook/vjepa2-vitl-fpc64-256", "k400_videomae_s_ft", _K400, "k400_vjepa2_peg3d",
                     "peg3d+rope-3d")),
)  # fmt: skip
