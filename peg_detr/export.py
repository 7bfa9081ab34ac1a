"""``python -m peg_detr export CKPT OUT.onnx``: a trained detector as an ONNX graph with dynamic sizes.

    python -m peg_detr export runs/detr/checkpoint.pth detr.onnx --check

The graph takes ``images`` ``(B, 3, H, W)`` float32, normalised with the
ImageNet mean/std, one un-padded batch (every image of the batch has the same
size; there is no padding-mask input), and returns ``pred_logits``
``(B, Q, K+1)`` (the last class is no-object) and ``pred_boxes`` ``(B, Q, 4)``
cxcywh in ``[0, 1]`` of the image.  ``B``, ``H`` and ``W`` are dynamic (``H``, ``W`` at
least twice the backbone's stride): every
position encoding (``peg``, ``sine``, ``learned``, ``sincos``, ``none``)
computes its codes from the input's grid inside the graph, and a learned table
is resized to it there.  ``--height/--width`` only set the example input the
graph is traced with.  The checkpoint's categories are stored in the model's
metadata (``peg_categories``, JSON), and which category each logit stands for in
``peg_labels`` (``{"mode", "labels": [{"label", "id", "name"}]}``: ``--labels``).

An RT-DETR checkpoint (``--arch rtdetr``) exports the same way: inputs in ``[0, 1]`` (RT-DETR's
pipeline does not normalise), ``pred_logits`` ``(B, Q, K)`` sigmoid logits (no no-object class),
the weight EMA when the run kept one.  Its anchors and, with ``sincos``, its AIFI table are built
from the input's size inside the graph; with ``peg`` nothing depends on a size at all, so the
graph runs at any ``H``, ``W`` (at least 64: two stride-32 cells).  By default (``--fuse``) an
RT-DETR is fused for deployment first (:func:`peg_detr.models.rtdetr.fuse_for_deploy`: every
conv + batch norm folded, every RepVGG block one 3×3 conv); the report's ``fused`` counts the
fused convolutions, and ``--check`` compares onnxruntime with the *unfused* PyTorch model.
``--no-fuse`` exports the training form; ``--fuse`` on a DETR checkpoint is an error.

``python -m peg_detr export-hf CKPT DIR`` (:func:`main_hf`) writes the checkpoint's model as a
Hugging Face folder instead: a DETR with ``--pos-enc sine`` through
:func:`peg_detr.interop.export_hf_detr`, an RT-DETR, D-FINE or DEIMv2 with ``sincos`` (its EMA
weights) through :func:`peg_detr.interop.export_hf_rtdetr` / ``export_hf_dfine`` /
``export_hf_deimv2``, with the ``preprocessor_config.json`` transformers' ``pipeline`` reads at the
run's ``--val-size`` (:mod:`peg_detr.interop.hf_processor`).  This module reads the checkpoint; the
library functions take the model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg_core.engine import UserError, add_overwrite_arg, check_output_folder, image_side, new_parser
from peg_core.errors import require
from peg_core.export.cli import add_export_args, check_output_path
from peg_core.export.onnx import compare_onnxruntime, export_onnx
from peg_core.interop.io import WeightsError

from .archs import arch_named, arch_of_model
from .interop.hf_processor import hf_side
from .labels import LabelMap
from .model import load_model, only_named
from .models.common import mask_unnamed
from .models.rtdetr import fuse_for_deploy, fusion_stats

__all__ = [
    "HF_EXPORT_FILES",
    "DetrForExport",
    "build_hf_parser",
    "build_parser",
    "deploy_form",
    "main",
    "main_hf",
]


def side_arg(text: str) -> int:
    """``argparse`` type: an example image side, at least 16 pixels."""
    value = image_side(text)
    if value < 16:
        raise argparse.ArgumentTypeError(f"expected at least 16 pixels, got {text!r}")
    return value


class DetrForExport(nn.Module):
    """``images (B, 3, H, W) -> (pred_logits (B, Q, K+1), pred_boxes (B, Q, 4))``; no auxiliary outputs.

    (RT-DETR: ``pred_logits`` ``(B, Q, K)``, sigmoid classes.)  ``named`` ``(K,)`` bool: the labels
    that stand for a category; the others' logits are the lowest float32 (sigmoid and softmax 0), so
    a deployment reading the graph never reports an id without a category.
    """

    def __init__(self, detr: nn.Module, named: Tensor | None = None) -> None:
        super().__init__()
        self.detr = detr
        self.named = None if named is None or bool(named.all()) else named

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        out = self.detr(images)
        logits = mask_unnamed(out["pred_logits"], self.named, torch.finfo(torch.float32).min)
        return logits, out["pred_boxes"]


def build_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_detr export", __doc__)
    add_export_args(p)
    p.add_argument("--height", type=side_arg, default=256, help="example input height (the graph takes any)")
    p.add_argument("--width", type=side_arg, default=320, help="example input width (the graph takes any)")
    p.add_argument(
        "--fuse",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fold conv + BN and RepVGG branches before exporting (default: on for --arch rtdetr)",
    )
    return p


def deploy_form(model: nn.Module, arch: str, fuse: bool | None) -> tuple[nn.Module, dict[str, int] | None]:
    """The module to export and the fusion counts (None: not fused); ``fuse=None``: the arch's default
    (:attr:`peg_detr.archs.Arch.fuse`: the RT-DETR family fuses)."""
    if not arch_named(arch).fuse:
        if fuse:
            raise UserError(
                f"applies to the RT-DETR family only (this checkpoint is --arch {arch})", "--fuse"
            )
        return model, None
    if fuse is False:
        return model, None
    fused = fuse_for_deploy(model)  # a copy: the unfused model stays the --check reference
    return fused, fusion_stats(fused).as_dict()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_output_path(args.out, args.checkpoint, args.overwrite)  # nothing the user owns
    loaded = load_model(args.checkpoint)
    model, meta = loaded.model.cpu().eval(), loaded.meta
    exported, fused = deploy_form(model, loaded.config.get("arch", "detr"), args.fuse)
    label_map = LabelMap.from_meta(meta)
    named = label_map.named(int(loaded.config["num_classes"])) if label_map.categories else None
    wrapper = DetrForExport(exported, named).eval()
    # Batch 2: a batch of 1 would be traced as a constant (PyTorch specialises sizes 0 and 1).
    example = torch.randn(2, 3, args.height, args.width, generator=torch.Generator().manual_seed(0))
    # At least two feature cells per side: a one-cell side would be traced as a constant.
    least = 2 * getattr(model.backbone, "stride", 32)  # RT-DETR's ResNet-vd: stride 32
    if min(args.height, args.width) < least:
        raise UserError(
            f"the example image must be at least {least} pixels per side (2 × the backbone's stride)",
            f"--height {args.height} --width {args.width}",
        )
    dim = torch.export.Dim
    dynamic = (
        {
            0: dim("batch", min=1, max=1024),
            2: dim("height", min=least, max=8192),
            3: dim("width", min=least, max=8192),
        },
    )
    metadata = {
        "peg_task": "detect",
        "peg_categories": json.dumps(meta.get("categories", [])),
        "peg_labels": json.dumps(LabelMap.from_meta(meta).to_json()),  # label -> category id, name
    }
    export_onnx(
        wrapper, example, args.out, dynamic, "images", ["pred_logits", "pred_boxes"], args.opset, metadata
    )
    result: dict[str, Any] = {"onnx": str(args.out), "opset": args.opset, "example": list(example.shape)}
    result["fused"] = fused
    if args.check:
        with torch.no_grad():
            expected = DetrForExport(model, named)(example)
        result["max_abs_diff"] = compare_onnxruntime(args.out, {"images": example}, expected)
    print(json.dumps(result))
    return 0


#: what ``export-hf`` writes (and what a Hugging Face folder holds: refused there without --overwrite)
HF_EXPORT_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "preprocessor_config.json")


def build_hf_parser() -> argparse.ArgumentParser:
    """Arguments of ``export-hf``: the checkpoint and the folder to write."""
    p = new_parser(
        "python -m peg_detr export-hf",
        "Write a peg_detr checkpoint as a Hugging Face folder (config.json, model.safetensors and the\n"
        "preprocessor_config.json that pipeline('object-detection') reads): DETR with --pos-enc sine;\n"
        "RT-DETR, D-FINE and DEIMv2 with --pos-enc sincos (their EMA weights).",
    )
    p.add_argument(
        "checkpoint",
        type=Path,
        help="training checkpoint of python -m peg_detr train (DETR: sine; RT-DETR, D-FINE, DEIMv2: sincos)",
    )
    p.add_argument("out", type=Path, help="output folder (loads with AutoModelForObjectDetection.from_pretrained: "
                   "Detr / RTDetr / DFine / Deimv2ForObjectDetection; a Hugging Face model there is refused)")  # fmt: skip
    add_overwrite_arg(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    return p


def main_hf(argv: list[str] | None = None) -> Path:
    """``python -m peg_detr export-hf CKPT DIR``: the checkpoint's model (as ``eval`` loads it) as a folder."""
    a = build_hf_parser().parse_args(argv)
    # an existing Hugging Face folder (its config.json and weights) is the user's: refused, before any work
    check_output_folder(a.out, HF_EXPORT_FILES, command="export-hf", inputs=[a.checkpoint],
                        overwrite=a.overwrite, create=False)  # fmt: skip
    require("safetensors.torch", "hf", "peg-detr", what="export-hf")  # said first; nothing written
    loaded = load_model(a.checkpoint)  # RT-DETR: the EMA weights, as eval reads them
    model = loaded.model.cpu()
    arch = arch_of_model(model)
    kind = arch.title
    try:
        if arch.export_hf is None:
            raise ValueError(f"peg_detr has no Hugging Face export for {arch.title} yet")
        # labels without a category (id gaps) are left out: the folder's id2label names categories only
        label_map = LabelMap.from_meta(loaded.meta)
        named = (
            label_map.named(len(loaded.classes))
            if label_map.categories
            else torch.ones(len(loaded.classes), dtype=torch.bool)
        )
        model, classes = only_named(model, loaded.classes, named)
        # the side the run evaluates at (its --val-size), as predict reads it: the folder's processor's
        size = next(
            (int(s["val_size"]) for s in (loaded.meta, loaded.args) if s.get("val_size")), arch.eval_size
        )
        out = arch.export_hf(model, a.out, classes, size=size)  # the run's --labels names
    except WeightsError as e:
        raise UserError(e.what, e.where) from None
    except ValueError as e:  # a model Hugging Face cannot hold: refused before anything is written
        raise UserError(
            f"cannot export to Hugging Face {kind}: {' '.join(str(e).split())}", a.checkpoint
        ) from None
    except OSError as e:
        raise UserError(f"output folder is not writable ({e.strerror or e})", a.out) from None
    print(f"wrote {out / 'config.json'}, {out / 'model.safetensors'} and {out / 'preprocessor_config.json'}")
    if arch.square_inputs and hf_side(size) != size:  # transformers' RT-DETR family: multiples of 32 only
        print(f"note: the folder's processor resizes to {hf_side(size)} px, not the run's {size} px: transformers' "
              f"{kind} runs only at sides that are multiples of 32 (predict and export run at any)")  # fmt: skip
    return out
