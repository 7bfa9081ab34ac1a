"""Time peg_detr's RT-DETR, D-FINE, DEIMv2 and RF-DETR against transformers' models with the same weights.

    python tools/bench_rtdetr.py                 # RT-DETR R50vd (default RTDetrConfig), 640x640, batch 2, 1 thread
    python tools/bench_rtdetr.py --model dfine   # D-FINE-S (HGNetv2 B0, hidden 256, 3 decoder layers, 300 queries)
    python tools/bench_rtdetr.py --model deimv2  # DEIMv2-S-like (DINOv3 ViT-Tiny layout + STA, hidden 192)
    python tools/bench_rtdetr.py --model rfdetr  # RF-DETR-N (windowed DINOv2-S, patch 16, 2 decoder layers), 384x384
    python tools/bench_rtdetr.py --model all --small --size 320 --rounds 2   # small configs, seconds

Per family a randomly initialised transformers model (``RTDetrForObjectDetection``,
``DFineForObjectDetection``, ``Deimv2ForObjectDetection``, ``RfDetrForObjectDetection``; anchors
for the actual input) is saved
with ``save_pretrained`` and rebuilt by :func:`peg_detr.from_hf` (DEIMv2: its reader,
:func:`peg_detr.interop.hf_deimv2.deimv2_from_hf`), so both models hold the same
weights.  Three measurements, in one process, one intra-op thread:

* ``eval``: ``torch.no_grad`` forward in eval mode;
* ``eval_fused``: the same, of peg_detr's model after :func:`~peg_detr.models.rtdetr.fuse_for_deploy`
  (what ``export`` writes: every conv + BN folded, RepVGG blocks merged) against the same
  transformers eval forward (not for RF-DETR: it has no batch norm to fold);
* ``train``: forward with targets (denoising queries on), each library's own loss on the same
  targets (transformers: ``labels=``; ours: the criterion of the arch's ``training_parts``), ``backward``.

The rounds interleave the two implementations (ours, theirs, ours, ...) after one warm-up call
each, so slow drifts of the machine hit both; the script prints, per family, a Markdown table of
the medians and the ratio ours / transformers (below 1.0: ours is faster).  ``--clock cpu`` times
each call by the process's CPU time instead of the wall clock: on a machine shared with other jobs
a call that waits for a core does not count the wait (with one intra-op thread the two agree on an
idle machine).  ``--json`` prints the
table (one family) or ``{family: table}`` (``--model all``).

Configs: ``--small`` builds each family in about a second (RT-DETR: a small ResNet; D-FINE: a
tiny HGNetv2; DEIMv2: a 3-block DINOv3 ViT).  The default D-FINE is D-FINE-S exactly
(:data:`peg_detr.models.dfine.DFINE_SIZES` ``"s"`` written as a ``DFineConfig``); the default
DEIMv2 is DEIMv2-S's layout (ViT-Tiny: hidden 192, 12 blocks, 3 heads, maps from blocks 5 / 8 / 11,
STA, hidden 192, 4 decoder layers, 300 queries) in transformers' DINOv3 backbone, which normalises
the selected blocks' outputs (the published S does not: a few LayerNorms more on both sides).
The default RF-DETR is RF-DETR-N exactly (:data:`peg_detr.models.rfdetr.RFDETR_SIZES` ``"n"``
written as an ``RfDetrConfig``: DINOv2-S, patch 16, 2 x 2 windows, a 24 x 24 table, 2 decoder
layers, 300 queries, 13 Group DETR groups in training, dropout 0.1), timed at its native 384 x 384
unless ``--size`` says otherwise; ``--small`` is a 4-block ViT of width 32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from peg_detr import from_hf
from peg_detr.archs import ARCHS
from peg_detr.interop.hf_deimv2 import deimv2_from_hf
from peg_detr.interop.hf_dfine import dfine_hf_config
from peg_detr.interop.hf_rfdetr import rfdetr_hf_config
from peg_detr.models.common import IMAGENET_MEAN, IMAGENET_STD
from peg_detr.models.dfine import DFINE_SIZES, build_dfine
from peg_detr.models.rfdetr import RFDETRConfig, build_rfdetr
from peg_detr.models.rtdetr import fuse_for_deploy

# transformers (the reference, a test extra) is imported where a config or model is built

__all__ = ["CLOCKS", "FAMILIES", "Family", "hf_config", "main", "make_pair", "run_bench"]


def hf_config(small: bool) -> Any:
    """The default ``RTDetrConfig`` (ResNet-50-vd, 300 queries), or a small ResNet one that builds in < 1 s."""
    from transformers import RTDetrConfig, RTDetrResNetConfig

    if not small:
        return RTDetrConfig(anchor_image_size=None, num_labels=80)
    backbone = RTDetrResNetConfig(
        layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=32,
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    return RTDetrConfig(
        backbone_config=backbone, encoder_hidden_dim=64, d_model=64, encoder_in_channels=[64, 128, 256],
        decoder_in_channels=[64, 64, 64], anchor_image_size=None, num_queries=100, num_labels=80,
    )  # fmt: skip


def dfine_config(small: bool) -> Any:
    """D-FINE-S as a ``DFineConfig``, or a tiny HGNetv2 one (widths 16-64, hidden 32) that builds in < 1 s."""
    import transformers

    if not small:
        # the published S settings, through the one mapping (transformers' defaults are D-FINE-L)
        return transformers.DFineConfig.from_dict(dfine_hf_config(build_dfine(**DFINE_SIZES["s"])[0]))
    backbone = transformers.HGNetV2Config(
        stem_channels=[3, 8, 8], stage_in_channels=[8, 16, 32, 64], stage_mid_channels=[8, 8, 16, 16],
        stage_out_channels=[16, 32, 64, 64], hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1],
        stage_num_blocks=[1, 1, 1, 1], stage_numb_of_layers=[2, 2, 2, 2],
        stage_downsample=[False, True, True, True], stage_light_block=[False, False, True, True],
        stage_kernel_size=[3, 3, 5, 5], use_learnable_affine_block=True, out_indices=[2, 3, 4],
    )  # fmt: skip
    return transformers.DFineConfig(
        backbone_config=backbone, encoder_in_channels=[32, 64, 64], encoder_hidden_dim=32, d_model=32,
        decoder_in_channels=[32, 32, 32], encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
        decoder_attention_heads=4, decoder_layers=3, num_queries=100, max_num_bins=8, decoder_n_points=[3, 4, 2],
        num_labels=80, hidden_expansion=0.5, depth_mult=0.34, lqe_hidden_dim=16,
    )  # fmt: skip


def deimv2_config(small: bool) -> Any:
    """DEIMv2-S's layout in transformers' DINOv3 backbone, or a 3-block ViT one that builds in < 1 s."""
    import transformers

    if small:
        vit = transformers.DINOv3ViTConfig(
            hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, patch_size=16,
            num_register_tokens=2, out_indices=[1, 2, 3], apply_layernorm=False, layerscale_value=0.5,
        )  # fmt: skip
        width = dict(
            encoder_hidden_dim=32, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_layers=2
        )
        return transformers.Deimv2Config(
            backbone_config=vit, encoder_in_channels=[32] * 3, decoder_in_channels=[32] * 3,
            encoder_attention_heads=2, decoder_attention_heads=2, spatial_tuning_adapter_inplanes=8,
            encoder_has_trailing_conv=False, depth_mult=0.34, num_queries=100, num_labels=80, **width,
        )  # fmt: skip
    # DEIMv2-S (peg_detr.models.deimv2.DEIMV2_SIZES["s"]): ViT-Tiny, STA 16, hidden 192, FFN 512
    vit = transformers.DINOv3ViTConfig(
        hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768, patch_size=16,
        num_register_tokens=4, out_indices=[5, 8, 11],
    )  # fmt: skip
    return transformers.Deimv2Config(
        backbone_config=vit, encoder_in_channels=[192] * 3, decoder_in_channels=[192] * 3, encoder_hidden_dim=192,
        d_model=192, encoder_ffn_dim=512, decoder_ffn_dim=512, encoder_attention_heads=8, decoder_attention_heads=8,
        decoder_layers=4, num_queries=300, decoder_n_points=[3, 6, 3], hidden_expansion=0.34, depth_mult=0.67,
        spatial_tuning_adapter_inplanes=16, encoder_has_trailing_conv=False, num_labels=80,
    )  # fmt: skip


def rfdetr_config(small: bool) -> Any:
    """RF-DETR-N as an ``RfDetrConfig``, or a 4-block ViT of width 32 (patch 8, hidden 32) that builds in < 1 s."""
    import transformers

    if not small:
        # the published N settings, through the one mapping (transformers' defaults are the base size)
        model = build_rfdetr(RFDETRConfig.preset("n"))[0]
        return transformers.RfDetrConfig.from_dict(rfdetr_hf_config(model))
    backbone = dict(
        model_type="rf_detr_dinov2", hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=96,
        patch_size=8, num_windows=2, out_features=["stage2", "stage4"],
    )  # fmt: skip
    return transformers.RfDetrConfig(
        backbone_config=backbone, d_model=32, decoder_ffn_dim=64, decoder_layers=2, decoder_self_attention_heads=2,
        decoder_cross_attention_heads=4, decoder_n_points=2, num_queries=50, group_detr=3, num_labels=80,
        c2f_num_blocks=1,
    )  # fmt: skip


@dataclass(frozen=True)
class Family:
    """One detector family to compare: how to build transformers' model and how to read it into ours.

    ``config(small)``: the transformers config; ``hf_class``: the ``transformers`` model class name;
    ``loader(folder)``: ``(our model, report)`` from a ``save_pretrained`` folder; ``arch``: the
    :data:`peg_detr.archs.ARCHS` entry whose ``training_parts`` gives our criterion; ``labels``:
    the two config descriptions (small, default) for the table's title; ``size``: the default square
    side of the default config (RF-DETR-N: its 384 training resolution); ``fused``: whether
    :func:`~peg_detr.models.rtdetr.fuse_for_deploy` applies (an ``eval_fused`` row).
    """

    config: Callable[[bool], Any]
    hf_class: str
    loader: Callable[[str], tuple[torch.nn.Module, Any]]
    arch: str
    labels: tuple[str, str]
    size: int = 640
    fused: bool = True


#: the families ``--model`` chooses from (``all``: every one, in this order)
FAMILIES: dict[str, Family] = {
    "rtdetr": Family(
        hf_config,
        "RTDetrForObjectDetection",
        from_hf,
        "rtdetr",
        ("small ResNet", "R50vd (default RTDetrConfig)"),
    ),
    "dfine": Family(
        dfine_config, "DFineForObjectDetection", from_hf, "dfine", ("D-FINE tiny HGNetv2", "D-FINE-S")
    ),
    "deimv2": Family(
        deimv2_config,
        "Deimv2ForObjectDetection",
        deimv2_from_hf,
        "deimv2",
        ("DEIMv2 tiny DINOv3", "DEIMv2-S layout (DINOv3 ViT-Tiny)"),
    ),
    "rfdetr": Family(
        rfdetr_config,
        "RfDetrForObjectDetection",
        from_hf,
        "rfdetr",
        ("RF-DETR tiny ViT", "RF-DETR-N (windowed DINOv2-S, patch 16)"),
        size=384,
        fused=False,
    ),
}


def make_pair(
    small: bool, seed: int = 0, model: str = "rtdetr"
) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """``(ours, our criterion, transformers' model)`` of family ``model`` with the same random weights."""
    import transformers

    family = FAMILIES[model]
    torch.manual_seed(seed)
    theirs = getattr(transformers, family.hf_class)(family.config(small)).eval()
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours, _ = family.loader(folder)
    criterion, _ = ARCHS[family.arch].training_parts(ours)
    return ours.eval(), criterion, theirs


def _targets(batch: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Five boxes per image, normalised cxcywh, labels < 80."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        centres = torch.rand(5, 2, generator=g) * 0.6 + 0.2
        sides = torch.rand(5, 2, generator=g) * 0.3 + 0.05
        out.append(
            {"labels": torch.randint(0, 80, (5,), generator=g), "boxes": torch.cat([centres, sides], 1)}
        )
    return out


def _calls(
    ours, criterion, theirs, images, targets, fused: bool = True, theirs_images: torch.Tensor | None = None
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Per measurement: ``(ours, theirs)`` zero-argument calls (``fused``: with the ``eval_fused`` one).

    ``images`` ``(B, 3, H, W)``: our input; ``theirs_images``: transformers' when it differs (a
    standardised copy), else ``images``.
    """
    pixels = images if theirs_images is None else theirs_images
    hf_labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]

    def ours_eval() -> None:
        ours.eval()
        with torch.no_grad():
            ours(images)

    def theirs_eval() -> None:
        theirs.eval()
        with torch.no_grad():
            theirs(pixel_values=pixels)

    def ours_train() -> None:
        ours.train()
        losses = criterion(ours(images, targets), targets)
        sum(losses[k] * w for k, w in criterion.weight_dict.items() if k in losses).backward()
        ours.zero_grad(set_to_none=True)

    def theirs_train() -> None:
        theirs.train()
        theirs(pixel_values=pixels, labels=hf_labels).loss.backward()
        theirs.zero_grad(set_to_none=True)

    calls = {"eval": (ours_eval, theirs_eval)}
    if fused:
        deploy = fuse_for_deploy(ours)

        def fused_eval() -> None:
            with torch.no_grad():
                deploy(images)

        calls["eval_fused"] = (fused_eval, theirs_eval)
    calls["train"] = (ours_train, theirs_train)
    return calls


#: ``--clock``: the timer of one call (wall clock, or this process's CPU time)
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def _seconds(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def run_bench(
    small: bool,
    size: int | None,
    batch: int,
    rounds: int,
    seed: int = 0,
    model: str = "rtdetr",
    clock: str = "wall",
) -> dict[str, dict[str, float]]:
    """``{"eval": {"ours": s, "transformers": s, "ratio": r}, "train": {...}}``: median seconds per call of family ``model``.

    ``size``: the square side (None: the family's :attr:`Family.size`); ``clock``: a :data:`CLOCKS` name.
    """
    family = FAMILIES[model]
    ours, criterion, theirs = make_pair(small, seed, model)
    side = family.size if size is None else size
    images = torch.rand(batch, 3, side, side, generator=torch.Generator().manual_seed(seed))
    if model == "rfdetr":
        # transformers' model takes the standardised image (its processor normalises); ours
        # standardises [0, 1] pixels itself, so both see the same pixels (the cost is the same
        # two elementwise ops either way: timed on our side, done once here for theirs)
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
        theirs_images = (images - mean) / std
    else:
        theirs_images = images
    calls = _calls(ours, criterion, theirs, images, _targets(batch, seed), family.fused, theirs_images)
    table = {}
    for name, (a, b) in calls.items():
        a(), b()  # warm-up (allocator, first-call paths)
        times: dict[str, list[float]] = {"ours": [], "transformers": []}
        for _ in range(rounds):
            times["ours"].append(_seconds(a, CLOCKS[clock]))
            times["transformers"].append(_seconds(b, CLOCKS[clock]))
        med = {k: statistics.median(v) for k, v in times.items()}
        table[name] = {**med, "ratio": med["ours"] / med["transformers"]}
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", choices=[*FAMILIES, "all"], default="rtdetr", help="the family (all: each in turn)"
    )
    p.add_argument(
        "--small", action="store_true", help="small configs (seconds) instead of the published sizes"
    )
    p.add_argument(
        "--size", type=int, default=None, help="square input side (default: 640; RF-DETR-N: 384, its own)"
    )
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument(
        "--clock", choices=list(CLOCKS), default="wall",
        help="time calls by the wall clock or by this process's CPU time (a machine shared with other jobs)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the table as JSON instead of Markdown")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = list(FAMILIES) if args.model == "all" else [args.model]
    tables = {
        m: run_bench(args.small, args.size, args.batch, args.rounds, model=m, clock=args.clock)
        for m in models
    }
    if args.json:
        print(json.dumps(tables if args.model == "all" else tables[args.model]))
        return 0
    for i, (model, table) in enumerate(tables.items()):
        config = FAMILIES[model].labels[0 if args.small else 1]
        side = FAMILIES[model].size if args.size is None else args.size
        print(("\n" if i else "") + f"{config}, {side}x{side}, batch {args.batch}, {args.threads} thread(s), "
              f"median of {args.rounds} interleaved rounds" + (", CPU time" if args.clock == "cpu" else ""))  # fmt: skip
        print("\n| measurement | peg_detr (s) | transformers (s) | ratio |\n|---|---|---|---|")
        for name, row in table.items():
            print(f"| {name} | {row['ours']:.3f} | {row['transformers']:.3f} | {row['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
