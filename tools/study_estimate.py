"""GPU hours per cell of ``python -m tools.study`` on the real data sets, estimated from the models' FLOPs.

A cell trains one row with one seed.  Its compute is about three forward passes per training
sample (forward, and a backward of about twice the forward), so

    GPU-hours per cell = 3 x forward FLOPs per sample x training samples x epochs
                         / (peak FLOP/s x sustained fraction) / 3600

with the forward FLOPs measured here (``torch.utils.flop_counter.FlopCounterMode``, FLOPs = 2 x
multiply-adds of matrix products and convolutions, as in :mod:`tools.study_cost`) on the meta
device (shapes only, nothing computed), and the throughput an assumption: 40% of an H200's 989
dense bf16 TFLOP/s (``--tflops``, ``--utilisation``).  Evaluation is left out: the test sizes of
one cell on the validation split cost well under 1% of its training.

The compute estimate is a lower bound: small models (CPVT-Ti at 224 px) need the images faster
than a data loader decodes them, so the table also gives the *input floor*, the hours to read
the samples at an assumed loader rate (``--image-rate`` images/s, ``--clip-rate`` clips/s).

    python -m tools.study_estimate                   # the Markdown table
    python -m tools.study_estimate --utilisation 0.3 --seeds 5
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

if __package__ in (None, ""):  # run as a script: make the repository root importable
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.study_tasks import cells_of, classify_specs, plan_detect, plan_video

__all__ = [
    "H200_BF16_TFLOPS",
    "Workload",
    "cpvt_flops",
    "detr_flops",
    "estimate_table",
    "gpu_hours",
    "input_hours",
    "main",
    "video_flops",
    "workloads",
]

#: an H200's dense bf16 tensor-core peak (TFLOP/s; 1,979 is the 2:4-sparse figure)
H200_BF16_TFLOPS = 989.0
#: the fraction of the peak a training run sustains (an assumption: good large-model runs reach 40-50%)
UTILISATION = 0.4
#: training forward + backward = 3 forward passes (the backward computes two products per forward one)
PASSES = 3
#: loader rates of the input floor (assumptions: JPEG decoding / video decoding on ~16 CPU cores)
IMAGE_RATE, CLIP_RATE = 3000.0, 300.0

IMAGENET100_TRAIN = 126_689
COCO_TRAIN2017 = 118_287
#: Mini-Kinetics-200 (Xie et al., 2018, "Rethinking spatiotemporal feature learning"): 200 classes of
#: Kinetics-400, 400 training clips each; a subset whose head-to-head fits in GPU-days
MINI_KINETICS_TRAIN = 80_000


@dataclass(frozen=True)
class Workload:
    """One cell of the head-to-head on real data: ``flops`` per training sample (one forward)."""

    task: str
    model: str
    data: str
    samples: int  # training images / clips per epoch
    epochs: int
    flops: float
    cells: int  # trained cells of the head-to-head (rows x seeds)
    video: bool = False  # samples are clips (the clip loader rate)


def gpu_hours(flops: float, samples: int, epochs: int, tflops: float = H200_BF16_TFLOPS,
              utilisation: float = UTILISATION) -> float:  # fmt: skip
    """``PASSES x flops x samples x epochs / (tflops x 1e12 x utilisation)`` seconds, in hours."""
    if tflops <= 0 or not 0 < utilisation <= 1:
        raise ValueError(f"tflops must be > 0 and utilisation in (0, 1]; got {tflops}, {utilisation}")
    return PASSES * flops * samples * epochs / (tflops * 1e12 * utilisation) / 3600


def input_hours(samples: int, epochs: int, rate: float) -> float:
    """Hours to read ``samples x epochs`` samples at ``rate`` samples/s (the loader's floor)."""
    return samples * epochs / rate / 3600


def _forward_flops(model: nn.Module, x: torch.Tensor | list[torch.Tensor]) -> int:
    """FLOPs (2 x multiply-adds) of one forward of ``model`` on ``x`` under FlopCounterMode."""
    model.eval().requires_grad_(False)  # no autograd graph: FlopCounterMode's module hooks need none
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def cpvt_flops(arch: str = "cpvt_tiny", size: int = 224, num_classes: int = 100) -> int:
    """Forward FLOPs of a PEG CPVT (``cpvt_tiny`` / ``cpvt_small`` / ``cpvt_base``) on one ``size`` image."""
    from peg_core import models

    with torch.device("meta"):  # shapes only: nothing is allocated or computed
        model = getattr(models, arch)(pos_enc="peg", num_classes=num_classes)
    return _forward_flops(model, torch.zeros(1, 3, size, size, device="meta"))


def detr_flops(height: int = 800, width: int = 1333, backbone: str = "resnet50") -> int:
    """Forward FLOPs of DETR (``backbone``, a PEG in the encoder, 100 queries) on one ``height x width`` image."""
    from peg_detr.models import build_detr

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")  # "starts from random weights": no weights are needed to count
        model, _, _ = build_detr(backbone, "peg")
    return _forward_flops(model, [torch.zeros(3, height, width, device="meta")])


def video_flops(name: str = "vit_small", frames: int = 16, crop: int = 224, num_classes: int = 200) -> int:
    """Forward FLOPs of a PEG3d video ViT (``vit_small`` / ``vit_base``, tubelet 2x16x16) on one clip."""
    from peg_video.models.registry import build_video_model

    # built on the CPU (its drop-path schedule reads a tensor's values), counted on the meta device
    model = build_video_model(name, "peg3d", num_classes=num_classes, num_frames=frames, img_size=crop)
    return _forward_flops(model.to("meta"), torch.zeros(1, 3, frames, crop, crop, device="meta"))


def _trained_rows(task: str) -> int:
    """The encoding rows a task trains per seed in the head-to-head (no ablations, every encoding)."""
    if task == "classify":
        return sum(1 for s in classify_specs(224, 100) if s.same_as is None)  # the plan would write data
    with tempfile.TemporaryDirectory() as tmp:  # the plan of a user's data set: nothing of it is read
        if task == "detect":
            plan = plan_detect(Path(tmp), False, [0], data=Path(tmp) / "coco")
        else:  # the video plan writes its small VideoMAE stand-in folder under tmp
            plan = plan_video(Path(tmp), False, [0], data=Path(tmp) / "kinetics")
    return len(cells_of(plan))


def workloads(seeds: int = 3, measure: Callable[[str], float] | None = None) -> list[Workload]:
    """The head-to-head on ImageNet-100, COCO and Mini-Kinetics, ``seeds`` seeds per row.

    ``measure(key)``: the forward FLOPs of ``key`` (``cpvt_tiny``, ``cpvt_small``, ``detr_r50``,
    ``vit_small``, ``vit_base``); default: counted on the meta device.
    """

    def counted(key: str) -> float:
        if key.startswith("cpvt"):
            return cpvt_flops(key)
        if key == "detr_r50":
            return detr_flops()
        return video_flops(key)

    measure = measure or counted
    c, d, v = (_trained_rows(t) * seeds for t in ("classify", "detect", "video"))
    imagenet = f"ImageNet-100 ({IMAGENET100_TRAIN:,} train images), 224 px"
    coco = f"COCO train2017 ({COCO_TRAIN2017:,} images), 800x1333"
    kinetics = f"Mini-Kinetics-200 ({MINI_KINETICS_TRAIN:,} train clips), 16x224 px"
    return [
        Workload("classify", "CPVT-Ti (cpvt_tiny)", imagenet, IMAGENET100_TRAIN, 100, measure("cpvt_tiny"), c),
        Workload("classify", "CPVT-S (cpvt_small)", imagenet, IMAGENET100_TRAIN, 100, measure("cpvt_small"), c),
        Workload("detect", "DETR-R50, PEG (cpvt_peg_50ep)", coco, COCO_TRAIN2017, 50, measure("detr_r50"), d),
        Workload("video", "video ViT-S (vit_small)", kinetics, MINI_KINETICS_TRAIN, 50, measure("vit_small"), v,
                 video=True),
        Workload("video", "video ViT-B (vit_base)", kinetics, MINI_KINETICS_TRAIN, 50, measure("vit_base"), v,
                 video=True),
    ]  # fmt: skip


def _hours(h: float) -> str:
    """``0.067``, ``2.5``, ``37``: two significant digits, no exponent."""
    return f"{h:.2g}" if h < 10 else f"{h:.0f}"


def estimate_table(
    rows: Sequence[Workload], tflops: float = H200_BF16_TFLOPS, utilisation: float = UTILISATION,
    image_rate: float = IMAGE_RATE, clip_rate: float = CLIP_RATE,
) -> str:  # fmt: skip
    """The Markdown table of ``rows`` and the assumptions under it."""
    head = ("| task | model | data | epochs | GFLOPs / sample (forward) | est. GPU-hours per cell | "
            "input floor (h) | cells in the head-to-head | GPU-hours in all |")  # fmt: skip
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for w in rows:
        h = gpu_hours(w.flops, w.samples, w.epochs, tflops, utilisation)
        floor = input_hours(w.samples, w.epochs, clip_rate if w.video else image_rate)
        lines.append(f"| {w.task} | {w.model} | {w.data} | {w.epochs} | {w.flops / 1e9:.1f} | {_hours(h)} | "
                     f"{_hours(floor)} | {w.cells} | {_hours(h * w.cells)} |")  # fmt: skip
    sustained = tflops * utilisation
    lines += [
        "",
        f"GPU-hours per cell = {PASSES} x forward FLOPs x samples x epochs / ({sustained:,.1f} TFLOP/s sustained: "
        f"{100 * utilisation:.0f}% of {tflops:,.0f} dense bf16 TFLOP/s, an H200), training only. FLOPs = 2 x "
        "multiply-adds, counted on the meta device (the published DETR-R50 figure, 86 GFLOPs, counts a "
        "multiply-add as one FLOP and averages over validation images smaller than 800x1333). Input floor: the "
        f"samples read at {image_rate:,.0f} images/s or {clip_rate:,.0f} clips/s (assumed loader rates); a cell "
        "takes at least the larger of the two. Cells: every encoding row (no ablations) x seeds.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    """``python -m tools.study_estimate``: print the estimate table; returns it."""
    p = argparse.ArgumentParser(prog="python -m tools.study_estimate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--tflops", type=float, default=H200_BF16_TFLOPS, help="peak TFLOP/s of one GPU")
    p.add_argument("--utilisation", type=float, default=UTILISATION, help="sustained fraction of the peak")
    p.add_argument("--seeds", type=int, default=3, help="seeds per row")
    p.add_argument("--image-rate", type=float, default=IMAGE_RATE, help="loader images/s (input floor)")
    p.add_argument("--clip-rate", type=float, default=CLIP_RATE, help="loader clips/s (input floor)")
    args = p.parse_args(argv)
    if args.tflops <= 0 or not 0 < args.utilisation <= 1 or args.seeds < 1:
        p.error("--tflops must be > 0, --utilisation in (0, 1], --seeds >= 1")
    if args.image_rate <= 0 or args.clip_rate <= 0:
        p.error("--image-rate and --clip-rate must be > 0")
    text = estimate_table(
        workloads(args.seeds), args.tflops, args.utilisation, args.image_rate, args.clip_rate
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
