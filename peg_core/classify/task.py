"""``ClassifyTask``: the CPVT classifier on :mod:`peg_core.engine` (model, loss, data, metrics only).

The engine (:func:`~peg_core.engine.fit`, :func:`~peg_core.engine.evaluate_checkpoint`) does the
rest: devices, DDP, AMP, clipping, resume, checkpoints, logs, broken samples, report.json.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ..engine import (
    EvalParts,
    RunContext,
    StepOutput,
    TrainParts,
    UserError,
    param_groups_for_run,
    refuse_without_effect,
    warmup_cosine,
)
from ..engine.accum import step_batch_size
from ..engine.broken import SkipBroken, skipping_collate
from ..engine.checkpoint import read_checkpoint
from ..engine.cli import class_map_arg
from ..engine.memory import check_memory
from ..engine.recipes import apply_position_recipe
from ..export.quantize import QUANTIZED_SUFFIX, load_quantized
from .data import NORMALIZE, FolderImages, ShapeImages, folder_transform, open_image_folder, open_val_split
from .metrics import accuracy
from .model import (
    OLD_ARG_NAMES,
    InitFile,
    build_checked,
    init_model_config,
    load_init_weights,
    load_model,
    model_config_from_args,
    read_init,
    refuse_unused_pos_flags,
    scaled_sizes,
    stored_args,
)
from .sampler import EpochShuffle
from .shapes import CLASS_NAMES, make_shape_splits, sample_scenes

__all__ = ["ClassifyTask", "classify_step", "data_settings", "resize_images", "run_data"]


def data_settings(args: argparse.Namespace, on_disk: bool) -> dict[str, Any]:
    """Normalisation, eval crop and augmentation: the flags, else the data kind's defaults.

    Generated scenes are whole images in ``2 rgb - 1`` (``half``) and are never cropped;
    a folder defaults to ImageNet statistics, a 0.875 centre crop and flip + random-resized crop.
    """
    normalize = args.normalize or ("imagenet" if on_disk else "half")
    mean, std = NORMALIZE[normalize]
    return {
        "mean": list(mean),
        "std": list(std),
        "crop_ratio": args.crop_ratio or (0.875 if on_disk else 1.0),
        "augment": (args.augment or "flip-crop") if on_disk else "none",
    }


def classify_step(net: nn.Module, batch: tuple[Tensor, Tensor], ctx: RunContext) -> StepOutput:
    """Cross entropy of ``net(images (B, 3, H, W))`` against ``labels (B,)``, computed in float32."""
    x, y = batch
    x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
    with ctx.autocast():
        logits = net(x)
    logits = logits.float()
    loss = F.cross_entropy(logits, y)
    return StepOutput(loss, {"acc": (logits.argmax(-1) == y).float().mean()})


def resize_images(
    batch: tuple[Tensor, Tensor], size: int, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """``(images (B, 3, H, W), labels)`` with the images at ``size × size`` (multi-scale / progressive).

    Moved to ``device`` first so the resampling runs there; bilinear with antialias, so a smaller
    size is a proper down-sampling rather than a skip of pixels.
    """
    x, y = batch
    if device is not None:
        x = x.to(device, non_blocking=True)
    if tuple(x.shape[-2:]) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x, y


def run_data(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The training run's data: ``meta["data"]`` (old key ``n_val`` read as ``num_val``), else its stored args.

    ``{"kind": "shapes", "seed", "num_val"}`` for the generated shapes, ``{"kind": "folder", "path"}``
    for an ImageFolder tree.
    """
    data = {OLD_ARG_NAMES.get(k, k): v for k, v in ((ckpt.get("meta") or {}).get("data") or {}).items()}
    if data.get("kind") is None:  # a checkpoint without meta.data: what the run's arguments say
        args = stored_args(ckpt)
        root = args.get("data_root")
        data = {"kind": "folder", "path": root} if root else {"kind": "shapes", **data}
        for name in ("seed", "num_val"):
            if args.get(name) is not None:
                data.setdefault(name, args[name])
    return data


def _summary(metrics: dict[str, Any]) -> str:
    text = f"val top1 {metrics['top1']:.4f}"
    if "top5" in metrics:
        text += f" top5 {metrics['top5']:.4f}"
    return text + f" loss {metrics['loss']:.4f} ({metrics['samples']} images)"


def _size_summary(metrics: dict[str, Any]) -> str:
    parts = []
    for size, top1 in metrics["top1_by_size"].items():
        top5 = metrics.get("top5_by_size", {}).get(size)
        parts.append(f"{size} px top1 {top1:.4f}" + (f" top5 {top5:.4f}" if top5 is not None else ""))
    return "; ".join(parts)


def _train_data(args: argparse.Namespace) -> tuple[Dataset, Dataset, list[str], dict[str, Any]]:
    """``(train, val at --img-size, class names, data settings for the checkpoint's meta)``."""
    on_disk = args.data_root is not None
    settings = data_settings(args, on_disk)
    mean, std = settings["mean"], settings["std"]
    if not on_disk:
        scenes = make_shape_splits(args.num_train, args.num_val, seed=args.seed)
        train, val = (ShapeImages(s, args.img_size, mean, std) for s in scenes)
        settings["data"] = {"kind": "shapes", "path": None, "seed": args.seed, "num_val": args.num_val}
        return train, val, list(CLASS_NAMES), settings
    folder = open_image_folder(args.data_root)
    crop = settings["crop_ratio"]
    train_tf = folder_transform(args.img_size, True, settings["augment"], crop, mean, std)
    val_tf = folder_transform(args.img_size, False, crop_ratio=crop, mean=mean, std=std)
    # The resolved path lets eval find the data again from another working directory.
    settings["data"] = {"kind": "folder", "path": str(Path(args.data_root).resolve())}
    classes = folder.classes
    return (
        FolderImages(folder.train, classes, train_tf),
        FolderImages(folder.val, classes, val_tf),
        classes,
        settings,
    )


def _model_config(
    args: argparse.Namespace, num_classes: int, ckpt: dict[str, Any] | None
) -> tuple[dict[str, Any], InitFile | None]:
    """The run's ``model_config`` and its ``--init`` file (read once; ``None`` when resuming or not given).

    A resumed run rebuilds the model it saved; an ``--init`` file that names its model gives the
    architecture, the command line's model flags replacing its entries.
    """
    config = model_config_from_args(args, num_classes)
    if ckpt is not None:  # resuming: the saved run's model, whatever the flags say
        saved = ckpt.get("model_config")
        return (dict(saved) if isinstance(saved, dict) and saved else config), None
    if args.init is None:
        return config, None
    init = read_init(args.init, getattr(args, "init_timm", None))
    if init.config is not None:
        config = init_model_config(config, init.config, getattr(args, "cli_flags", ()))
    # the file's encoding unless the file names no model or the command line picks the model / encoding
    explicit = getattr(args, "cli_flags", ())
    from_flags = init.config is None or "arch" in explicit or "pos_enc" in explicit
    pos_enc = config.get("pos_enc")
    source = f"--pos-enc {pos_enc}" if from_flags else f"pos_enc {pos_enc} of the --init file's model"
    refuse_unused_pos_flags(args, config, source)  # before any weights are loaded
    return config, init


class ClassifyTask:
    """Image classification with a CPVT on generated shapes or an ImageFolder tree."""

    name = "classify"

    # ------------------------------------------------------------------------------------ train

    def setup_train(
        self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any] | None
    ) -> TrainParts:
        train, val, classes, settings = _train_data(args)
        # generated shapes are in memory: nothing for DataLoader workers to do
        workers = args.workers if args.data_root is not None else 0
        # The data set-up draws nothing from the global RNG: the initialisation depends on --seed alone.
        config, init = _model_config(args, len(classes), ckpt)
        model = build_checked(config, f"--arch {args.arch}" if init is None else args.init).to(ctx.device)
        if init is not None:
            source = f" ({init.source})" if init.source else ""
            try:
                report = load_init_weights(model, args.init, init, classes, class_map_arg(args))
            except ValueError as e:  # a --class-map entry naming no class
                raise UserError(str(e), args.class_map or args.init) from None
            ctx.print(f"--init {args.init}{source}: {report.line()}")
        # the largest side of the run (its bias, table and activations) must fit: refused before any step
        sides = {"--img-size": [args.img_size], "--train-sizes": getattr(args, "train_sizes", None) or [],
                 "--progressive-sizes": getattr(args, "progressive_sizes", None) or []}  # fmt: skip
        flag, side = max(((f, s) for f, ss in sides.items() for s in ss if s), key=lambda fs: fs[1])
        check_memory(
            model, (args.batch_size, 3, side, side), where=f"{flag} {side}", args=args, device=ctx.device
        )
        # AdamW over [decayed, not decayed (norms, biases, cls token, learned table)], per layer
        # with --layer-decay
        optimizer = torch.optim.AdamW(
            param_groups_for_run(model, args), lr=args.lr, weight_decay=args.weight_decay
        )
        # before the scheduler: it records each group's lr (a scaled position group included)
        apply_position_recipe(
            optimizer,
            model,
            freeze=getattr(args, "freeze_pos", False),
            lr_scale=getattr(args, "pos_lr_scale", None),
        )

        sampler = EpochShuffle(len(train), args.seed, ctx.dist.rank, ctx.dist.world_size)  # type: ignore[arg-type]
        loader = DataLoader(
            SkipBroken(train),
            # one optimizer step's batch: --grad-accum-steps x --batch-size
            batch_size=step_batch_size(args),
            sampler=sampler,
            num_workers=workers,
            collate_fn=skipping_collate(torch.utils.data.default_collate),
            pin_memory=ctx.device.type == "cuda",
        )
        steps = len(loader)
        # at least one warm-up step: the first step runs at the full lr when --warmup-epochs is 0
        warmup = max(1, int(args.warmup_epochs * steps))
        scheduler = warmup_cosine(optimizer, warmup, args.epochs * steps)

        def evaluate(model: nn.Module, ctx: RunContext) -> dict[str, Any]:
            return accuracy(model, val, ctx, "val", args.batch_size, workers)

        meta = {"classes": classes, "img_size": args.img_size, **settings}
        return TrainParts(
            model=model,
            optimizer=optimizer,
            train_loader=loader,
            train_size=len(train),  # type: ignore[arg-type]
            step=classify_step,
            evaluate=evaluate,
            scheduler=scheduler,
            scheduler_interval="step",
            model_config=config,
            meta=meta,
            on_epoch_start=sampler.set_epoch,  # data order = f(seed, epoch): exact resume
            summary=_summary,
            resize_batch=partial(resize_images, device=ctx.device),
            monitor="top1",
        )

    # ------------------------------------------------------------------------------------- eval

    def read_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """A training checkpoint, or a quantized ``.pt2`` as ``{"quantized": module, "meta", "epoch"}``."""
        if Path(path).suffix != QUANTIZED_SUFFIX:
            return read_checkpoint(path, self.name)
        model, meta = load_quantized(path)
        return {"task": self.name, "quantized": model, "meta": meta, "epoch": meta.get("epoch")}

    def setup_eval(self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any]) -> EvalParts:
        path = Path(args.checkpoint)
        if "quantized" in ckpt:  # a .pt2 from 'peg_core quantize': CPU only, its own resize mode
            if ctx.device.type != "cpu":
                raise UserError("quantized models run on the CPU only", f"--device {ctx.device}")
            if getattr(args, "compile", False):  # an exported int8 graph, not the model torch.compile traces
                raise UserError("a quantized model runs as exported, not compiled", "--compile")
            model = ckpt["quantized"]
        else:
            model = load_model(ckpt, path, pos_interpolation=args.pos_interpolation).model.to(ctx.device)
        without = None  # why --pos-interpolation would change nothing
        if "quantized" in ckpt:
            without = "a quantized model keeps the resize mode it was exported with"
        elif model.pos_interpolation is None:  # only a learned table is resized
            pos_enc = (ckpt.get("model_config") or {}).get("pos_enc")
            without = f"has no effect without a learned table (the checkpoint's pos_enc {pos_enc})"
        if without is not None:
            given = [] if args.pos_interpolation is None else ["pos_interpolation"]
            refuse_without_effect(args, given, {"pos_interpolation": without})
        meta = ckpt["meta"]
        train_size = int(meta["img_size"] if "img_size" in meta else model.img_size[0])
        sizes = args.eval_sizes or scaled_sizes(train_size)
        if "quantized" in ckpt:  # sides its graph was not exported for: refused before any data is read
            model.check_sizes(sizes, f"--eval-sizes {','.join(map(str, sizes))}" if args.eval_sizes else path)
        elif args.eval_sizes:
            # a side whose attention bias / table cannot fit: refused before any data is read
            for s in sorted(set(sizes), reverse=True):
                check_memory(
                    model, (args.batch_size, 3, s, s), where=f"--eval-sizes {s}", args=args, device=ctx.device
                )
        val_at = self._eval_data(args, ckpt, path)

        def evaluate(model: nn.Module, ctx: RunContext) -> dict[str, Any]:
            by_size = {
                s: accuracy(model, val_at(s), ctx, f"val_{s}", args.batch_size, args.workers) for s in sizes
            }
            out: dict[str, Any] = {"train_size": train_size, "sizes": list(sizes)}
            if train_size in by_size:
                out["top1"] = by_size[train_size]["top1"]
            for key in ("top1", "top5", "loss"):
                if all(key in m for m in by_size.values()):
                    out[f"{key}_by_size"] = {str(s): m[key] for s, m in by_size.items()}
            out["samples"] = next(iter(by_size.values()))["samples"]
            return out

        return EvalParts(model, evaluate, _size_summary)

    def _eval_data(
        self, args: argparse.Namespace, ckpt: dict[str, Any], path: Path
    ) -> Callable[[int], Dataset]:
        """``size -> validation set shown at that size``; the data is checked here, before any work."""
        meta = ckpt["meta"]
        classes = meta["classes"]
        data = run_data(ckpt)
        mean, std = meta.get("mean", NORMALIZE["half"][0]), meta.get("std", NORMALIZE["half"][1])
        root = args.data_root or (data.get("path") if data.get("kind") == "folder" else None)
        if root is not None:
            samples = open_val_split(root, classes)
            crop = float(meta.get("crop_ratio", 0.875))

            def folder_at(size: int) -> Dataset:
                tf = folder_transform(size, False, crop_ratio=crop, mean=mean, std=std)
                return FolderImages(samples, classes, tf)

            return folder_at
        if sorted(classes) != sorted(CLASS_NAMES):
            raise UserError(
                "the checkpoint's classes are not the generated shapes; pass --data-root PATH", path
            )
        # make_shape_splits' validation scenes: seed + 1
        scenes = sample_scenes(args.num_val or int(data.get("num_val", 512)), int(data.get("seed", 0)) + 1)
        return lambda s: ShapeImages(scenes, s, mean, std, classes)
