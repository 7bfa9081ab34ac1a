"""DETR as a :mod:`peg_core.engine` task: model, loss, COCO data and evaluation; the engine does the rest.

:class:`DetectTask` hands :func:`~peg_core.engine.fit` the model built from the
flags (``model_config`` in the checkpoint), AdamW with the backbone at its own
learning rate (:func:`optimizer_groups`), DETR's StepLR (stepped per epoch), the training step (forward
under autocast, Hungarian matching and losses in float32) and the COCO
evaluation at every ``--eval-sizes``.  Paths and annotation files are checked
when the run is set up, before any epoch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler

from peg_core.engine import (
    EvalParts,
    RunContext,
    SkipBroken,
    StepOutput,
    TrainParts,
    UserError,
    param_groups,
    skipping_collate,
)

from .data import (
    CocoDetr,
    collate_detr,
    infer_num_classes,
    load_coco_annotations,
    make_train_transforms,
    make_val_transforms,
    resolve_coco_paths,
    scaled_max_size,
)
from .evaluation import evaluate_coco
from .model import build_model, load_model, model_config_from_args
from .models import load_official_checkpoint
from .structures import targets_to, to_float

__all__ = ["DetectTask", "ValSets", "optimizer_groups", "run_args", "weighted_loss"]

#: argument names of checkpoints written before the shared vocabulary -> today's
_RENAMED_ARGS = {"coco_path": "data_root", "nheads": "num_heads", "pretrained": "init"}


def weighted_loss(loss_dict: dict[str, Tensor], weight_dict: dict[str, float]) -> Tensor:
    """DETR's total loss: sum of the losses that have a weight in ``weight_dict``."""
    terms = [loss_dict[k] * weight_dict[k] for k in loss_dict if k in weight_dict]
    if not terms:
        raise KeyError(f"no loss in {sorted(loss_dict)} has a weight in {sorted(weight_dict)}")
    return torch.stack(terms).sum()


def optimizer_groups(model: nn.Module, lr_backbone: float, weight_decay: float) -> list[dict[str, Any]]:
    """DETR's AdamW groups ``[main, backbone]``: the backbone at ``lr_backbone``, every parameter decayed.

    DETR decays all parameters (norms and biases too), as in the paper.  The order is the one
    checkpoints written before the shared optimiser hold, so their optimiser states still load.
    """
    return param_groups(model, weight_decay, decay_1d=True, lr_by_prefix={"backbone.": lr_backbone})


def run_args(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The training run's stored ``args``, with the names of older checkpoints (``coco_path``) renamed."""
    run = ckpt.get("args") if isinstance(ckpt.get("args"), dict) else {}
    return {_RENAMED_ARGS.get(k, k): v for k, v in run.items()}


def _split_paths(data_root: Path, split: str, ann_json: str | None) -> tuple[Path, Path]:
    """``(image folder, annotation json)`` of a split; a missing one is a :class:`UserError`."""
    if not Path(data_root).is_dir():
        raise UserError("--data-root folder not found", data_root)
    img_dir, ann = resolve_coco_paths(data_root, split, ann_json)
    if not ann.is_file():
        raise UserError("annotation file not found" + (f" (--{split}-json)" if ann_json else ""), ann)
    if not img_dir.is_dir():
        raise UserError(f"image folder of the {split} split not found", img_dir)
    return img_dir, ann


def _check_categories(val: ValSets, num_classes: int) -> None:
    too_large = [c["id"] for c in val.categories if c["id"] >= num_classes]
    if too_large:
        raise UserError(
            f"validation category ids {too_large[:5]} do not fit the model's {num_classes} classes "
            "(labels are category ids; pass a larger --num-classes)",
            val.ann_path,
        )


def per_process_batch(args: argparse.Namespace, world_size: int) -> int:
    """``--batch-size``, else ``--total-batch-size`` split over the processes."""
    if args.batch_size:
        return args.batch_size
    total = args.total_batch_size
    if total % world_size:
        raise UserError(
            f"not divisible by the {world_size} processes; pass --batch-size (per process) instead",
            f"--total-batch-size {total}",
        )
    return total // world_size


class ValSets:
    """The validation split at each evaluation size: one checked annotation file, one dataset per size.

    The numbers at ``val_size`` (the first size when it is not among them) are the headline.
    """

    def __init__(
        self,
        data_root: Path,
        val_json: str | None,
        sizes: list[int],
        val_size: int,
        backend: str = "faster",
    ) -> None:
        self.backend = backend  # COCO evaluation backend (peg_detr.evaluation.BACKENDS)
        img_dir, self.ann_path = _split_paths(data_root, "val", val_json)
        annotations = load_coco_annotations(self.ann_path)
        self.categories = annotations.categories
        self.headline = val_size if val_size in sizes else sizes[0]
        self.sets = {
            s: CocoDetr(img_dir, annotations, make_val_transforms(s, scaled_max_size(s))) for s in sizes
        }

    def evaluate(
        self, model: nn.Module, postprocessor: nn.Module, ctx: RunContext, batch_size: int, workers: int
    ) -> dict[str, Any]:
        """``{**stats at the headline size, "size", "images", "excluded", "sizes": {"800": stats, ...}}``."""
        table: dict[str, dict[str, float]] = {}
        for size, ds in self.sets.items():
            sampler = DistributedSampler(ds, ctx.dist.world_size, ctx.dist.rank, shuffle=False)
            # Its own generator: creating the iterator must not draw from the global RNG (exact resume).
            loader = DataLoader(
                SkipBroken(ds), batch_size, sampler=sampler, collate_fn=skipping_collate(collate_detr),
                num_workers=workers, generator=torch.Generator().manual_seed(0),
            )  # fmt: skip
            split = "val" if size == self.headline else f"val_{size}"
            table[str(size)] = evaluate_coco(
                model, postprocessor, loader, ds.coco, ctx, split, len(ds), self.backend
            )
        head = table[str(self.headline)]
        excluded = len(self.sets[self.headline]) - int(head["images"])
        return {**head, "size": self.headline, "excluded": excluded, "sizes": table}


def summary(metrics: dict[str, Any]) -> str:
    """``ap 0.301, ap50 0.700 at 80 px on 100 images``, and a table when several sizes were evaluated."""
    text = f"ap {metrics['ap']:.3f}, ap50 {metrics['ap50']:.3f} at {metrics['size']} px on {metrics['images']} images"
    if metrics.get("excluded"):
        text += f" ({metrics['excluded']} unreadable images left out, listed in report.json)"
    if len(metrics["sizes"]) > 1:
        rows = [
            f"{s:>10} | {m['ap']:.4f} | {m['ap50']:.4f} | {m['ap75']:.4f}"
            for s, m in metrics["sizes"].items()
        ]
        text += "\nshort side |   AP   |  AP50  |  AP75\n" + "\n".join(rows)
    return text


class _Step:
    """One training step: forward under autocast, matching and losses in float32."""

    def __init__(self, criterion: nn.Module) -> None:
        self.criterion = criterion

    def __call__(self, net: nn.Module, data: Any, ctx: RunContext) -> StepOutput:
        samples, targets = data
        with ctx.autocast():
            outputs = net(samples.to(ctx.device))
        loss_dict = self.criterion(to_float(outputs), targets_to(targets, ctx.device))
        weights = self.criterion.weight_dict
        logs = {k: v.detach() for k, v in loss_dict.items() if k in weights}
        return StepOutput(weighted_loss(loss_dict, weights), logs)


def _train_set(args: argparse.Namespace) -> tuple[CocoDetr, Path]:
    """The augmented training split and its (checked) annotation file."""
    img_dir, ann = _split_paths(args.data_root, "train", args.train_json)
    transforms = make_train_transforms(
        args.train_scales,
        args.max_size,
        crop_resize=args.crop_resize or None,
        crop_size=tuple(args.crop_size),
    )
    return CocoDetr(img_dir, load_coco_annotations(ann), transforms), ann


def _train_loader(
    ds: CocoDetr, batch: int, args: argparse.Namespace, ctx: RunContext
) -> tuple[DataLoader, Callable[[int], None]]:
    """The loader and its ``on_epoch_start``: order and worker seeds are functions of (seed, epoch)."""
    sampler = DistributedSampler(ds, ctx.dist.world_size, ctx.dist.rank, shuffle=True, seed=args.seed)
    generator = torch.Generator()
    loader = DataLoader(
        SkipBroken(ds), batch, sampler=sampler, collate_fn=skipping_collate(collate_detr),
        num_workers=args.workers, drop_last=True, generator=generator,
    )  # fmt: skip

    def on_epoch_start(epoch: int) -> None:
        sampler.set_epoch(epoch)
        generator.manual_seed(args.seed * 1000 + epoch)

    return loader, on_epoch_start


class DetectTask:
    """DETR on COCO-format data for :func:`~peg_core.engine.fit` / :func:`~peg_core.engine.evaluate_checkpoint`."""

    name = "detect"

    def setup_train(
        self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any] | None
    ) -> TrainParts:
        # --init may be a Hugging Face folder; --backbone-weights is one state-dict file
        for flag, path, found in (
            ("--init", args.init, Path.exists),
            ("--backbone-weights", args.backbone_weights, Path.is_file),
        ):
            if path is not None and not found(path):
                raise UserError(f"{flag} file not found", path)
        batch = per_process_batch(args, ctx.dist.world_size)
        train_ds, ann = _train_set(args)
        if len(train_ds) < batch * ctx.dist.world_size:
            raise UserError(
                f"{len(train_ds)} training images are fewer than one batch ({batch} per process)", ann
            )
        val = ValSets(
            args.data_root, args.val_json, args.eval_sizes or [args.val_size], args.val_size,
            getattr(args, "coco_eval_backend", "faster"),
        )  # fmt: skip
        num_classes = args.num_classes
        if num_classes is None:
            num_classes = infer_num_classes(train_ds.categories, ann)
            ctx.print(f"--num-classes not given: using {num_classes} (max category id in {ann.name} + 1)")
        _check_categories(val, num_classes)

        model, criterion, postprocessor = build_model(model_config_from_args(args, num_classes))
        if args.init is not None and ckpt is None:  # a resumed run has its own weights
            load_official_checkpoint(model, args.init, num_classes=num_classes)
        model.to(ctx.device)
        criterion.to(ctx.device).train()
        groups = optimizer_groups(model, args.lr_backbone, args.weight_decay)
        optimizer = torch.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)
        loader, on_epoch_start = _train_loader(train_ds, batch, args, ctx)
        return TrainParts(
            model=model,
            optimizer=optimizer,
            train_loader=loader,
            train_size=len(train_ds),
            step=_Step(criterion),
            evaluate=lambda m, c: val.evaluate(m, postprocessor, c, batch, args.workers),
            scheduler=torch.optim.lr_scheduler.StepLR(optimizer, args.lr_drop),
            scheduler_interval="epoch",
            model_config=dict(model.build_config),
            meta=dict(
                categories=train_ds.categories,
                num_classes=num_classes,
                val_size=args.val_size,
                batch_size=batch,
            ),
            on_epoch_start=on_epoch_start,
            summary=summary,
        )

    def setup_eval(self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any]) -> EvalParts:
        run = run_args(ckpt)
        data_root, val_json = args.data_root, args.val_json
        if data_root is None:
            if not run.get("data_root"):
                raise UserError(
                    "--data-root is required (the checkpoint does not name its data)", args.checkpoint
                )
            data_root, val_json = Path(run["data_root"]), val_json or run.get("val_json")
        mode = getattr(args, "pos_interpolation", None)
        loaded = load_model(ckpt, args.checkpoint, pos_interpolation=mode)
        model, postprocessor, meta = loaded.model, loaded.postprocess, loaded.meta
        val_size = args.val_size or int(meta.get("val_size") or 800)
        val = ValSets(
            data_root, val_json, args.eval_sizes or [val_size], val_size,
            getattr(args, "coco_eval_backend", "faster"),
        )  # fmt: skip
        _check_categories(val, int(ckpt["model_config"]["num_classes"]))
        model.to(ctx.device)
        batch = args.batch_size or int(meta.get("batch_size") or 1)
        return EvalParts(
            model, lambda m, c: val.evaluate(m, postprocessor.to(c.device), c, batch, args.workers), summary
        )
