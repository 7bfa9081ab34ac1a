"""Time peg_detr's RT-DETR against transformers' ``RTDetrForObjectDetection`` with the same weights.

    python tools/bench_rtdetr.py                 # the default R50vd config, 640x640, batch 2, 1 thread
    python tools/bench_rtdetr.py --small --size 320 --rounds 2   # a small ResNet config, seconds

A randomly initialised ``RTDetrForObjectDetection`` (``anchor_image_size=None``: anchors for the
actual input) is saved with ``save_pretrained`` and rebuilt by :func:`peg_detr.from_hf`, so both
models hold the same weights.  Two measurements, in one process, one intra-op thread:

* ``eval``: ``torch.no_grad`` forward in eval mode;
* ``eval_fused``: the same, of peg_detr's model after :func:`~peg_detr.models.rtdetr.fuse_for_deploy`
  (what ``export`` writes: every conv + BN folded, RepVGG blocks merged) against the same
  transformers eval forward;
* ``train``: forward with targets (denoising queries on), the loss, ``backward``.

The rounds interleave the two implementations (ours, theirs, ours, ...) after one warm-up call
each, so slow drifts of the machine hit both; the script prints a Markdown table of the medians
and the ratio ours / transformers (below 1.0: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["hf_config", "main", "make_pair", "run_bench"]


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


def make_pair(small: bool, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """``(ours, our criterion, transformers' model)`` with the same random weights."""
    from transformers import RTDetrForObjectDetection

    from peg_detr import from_hf
    from peg_detr.models.rtdetr.build import rtdetr_training_parts

    torch.manual_seed(seed)
    theirs = RTDetrForObjectDetection(hf_config(small)).eval()
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        loaded = from_hf(folder)
    ours = loaded[0] if isinstance(loaded, tuple) else loaded
    criterion, _ = rtdetr_training_parts(ours)
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
    ours, criterion, theirs, images, targets
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Per measurement: ``(ours, theirs)`` zero-argument calls."""
    from peg_detr.models.rtdetr import fuse_for_deploy

    hf_labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]

    def ours_eval() -> None:
        ours.eval()
        with torch.no_grad():
            ours(images)

    def theirs_eval() -> None:
        theirs.eval()
        with torch.no_grad():
            theirs(pixel_values=images)

    def ours_train() -> None:
        ours.train()
        losses = criterion(ours(images, targets), targets)
        sum(losses[k] * w for k, w in criterion.weight_dict.items() if k in losses).backward()
        ours.zero_grad(set_to_none=True)

    def theirs_train() -> None:
        theirs.train()
        theirs(pixel_values=images, labels=hf_labels).loss.backward()
        theirs.zero_grad(set_to_none=True)

    fused = fuse_for_deploy(ours)

    def fused_eval() -> None:
        with torch.no_grad():
            fused(images)

    return {
        "eval": (ours_eval, theirs_eval),
        "eval_fused": (fused_eval, theirs_eval),
        "train": (ours_train, theirs_train),
    }


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_bench(small: bool, size: int, batch: int, rounds: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """``{"eval": {"ours": s, "transformers": s, "ratio": r}, "train": {...}}``: median seconds per call."""
    ours, criterion, theirs = make_pair(small, seed)
    images = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))
    table = {}
    for name, (a, b) in _calls(ours, criterion, theirs, images, _targets(batch, seed)).items():
        a(), b()  # warm-up (allocator, first-call paths)
        times: dict[str, list[float]] = {"ours": [], "transformers": []}
        for _ in range(rounds):
            times["ours"].append(_seconds(a))
            times["transformers"].append(_seconds(b))
        med = {k: statistics.median(v) for k, v in times.items()}
        table[name] = {**med, "ratio": med["ours"] / med["transformers"]}
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="a small ResNet config instead of the default R50vd")
    p.add_argument("--size", type=int, default=640, help="square input side")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--json", action="store_true", help="print the table as JSON instead of Markdown")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    table = run_bench(args.small, args.size, args.batch, args.rounds)
    if args.json:
        print(json.dumps(table))
        return 0
    config = "small ResNet" if args.small else "R50vd (default RTDetrConfig)"
    print(f"{config}, {args.size}x{args.size}, batch {args.batch}, {args.threads} thread(s), "
          f"median of {args.rounds} interleaved rounds")  # fmt: skip
    print("\n| measurement | peg_detr (s) | transformers (s) | ratio |\n|---|---|---|---|")
    for name, row in table.items():
        print(f"| {name} | {row['ours']:.3f} | {row['transformers']:.3f} | {row['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
