"""DETR as a :mod:`peg_core.engine` task: model, loss, COCO data and evaluation; the engine does the rest.

:class:`DetectTask` hands :func:`~peg_core.engine.fit` the model built from the
flags (``model_config`` in the checkpoint), AdamW with the backbone at its own
learning rate (:func:`optimizer_groups`), DETR's StepLR (stepped per epoch), the training step (forward
under autocast, Hungarian matching and losses in float32) and the COCO
evaluation at every ``--eval-sizes``.  Paths and annotation files are checked
when the run is set up, before any epoch.

``--arch rtdetr`` changes five things and nothing else of the engine's run: RT-DETR's
augmentation with one multi-scale side per batch (:class:`~peg_detr.data.MultiScaleCollate`),
targets passed to the forward (denoising queries), AdamW without decay on norms and biases,
a per-step linear warm-up, and a weight EMA (:class:`EmaModel`) that is evaluated and
checkpointed beside the live weights.
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
    read_state_file,
    refuse_changed_on_resume,
    refuse_without_effect,
    skipping_collate,
)
from peg_core.engine.accum import accum_steps
from peg_core.engine.cli import class_map_arg, peg_kwargs
from peg_core.engine.distributed import get_world_size, reduce_sum
from peg_core.engine.ema import EmaModel, warmup_ema_decay
from peg_core.engine.memory import check_memory
from peg_core.engine.optim import LR_SCHEDULES, flat_cosine_lr, warmup_step_lr
from peg_core.interop.hf_folder import read_hf_config
from peg_core.interop.io import WeightsError
from peg_core.peg import PEG2d

from .archs import ARCHS, arch_named, arch_of, arch_of_model
from .data import (
    CocoDetr,
    LabelMap,
    MultiScaleCollate,
    StopEpochTransforms,
    collate_detr,
    infer_num_classes,
    make_rtdetr_train_transforms,
    make_rtdetr_val_transforms,
    make_train_transforms,
    make_val_transforms,
    match_label_names,
    scaled_max_size,
)
from .data.dense_o2o import MixupCollate, Mosaic, MosaicDataset, dense_o2o_from_args, make_mosaic_transforms
from .data.layouts import DataSplit, layout_from_args
from .evaluation import evaluate_coco
from .interop import from_hf, hf_label_names, hf_num_labels
from .model import build_model, load_model, model_config_from_args, relabel, set_named
from .structures import targets_to, to_float

__all__ = [
    "LR_SCHEDULES",
    "DetectTask",
    "EmaModel",
    "ValSets",
    "flat_cosine_lr",
    "optimizer_groups",
    "recorded_label_map",
    "resolve_label_map",
    "run_args",
    "warmup_ema_decay",
    "warmup_step_lr",
    "weighted_loss",
]

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


def rtdetr_optimizer_groups(
    model: nn.Module, lr_backbone: float, weight_decay: float
) -> list[dict[str, Any]]:
    """RT-DETR's AdamW groups: the backbone at ``lr_backbone``; norms and biases not decayed.

    Groups ``[main, main_no_decay, backbone, backbone_no_decay]`` (empty ones dropped).  This is
    the published RT-DETR recipe, lyuwenyu/RT-DETR ``rtdetr_pytorch/configs/rtdetr/``:
    ``include/optimizer.yml`` (``rtdetr_r50vd_6x_coco.yml``) puts ``backbone`` at lr 1e-5 and
    exempts the encoder's and decoder's biases and norm weights (``bias|norm.*weight``) from the
    1e-4 decay; ``rtdetr_r18vd_6x_coco.yml`` repeats that and, its backbone norms being trainable
    (``freeze_norm: False``), exempts them too, at the same lr 1e-5.  R50vd's backbone norms are
    frozen (buffers), so one rule covers both: every 1-d parameter (a norm's weight or bias, any
    bias) is not decayed; the backbone is at ``lr_backbone`` either way.  (RT-DETRv2's
    ``rtdetrv2_pytorch`` configs differ: they exempt only norm / bn parameters and decay biases.)
    """
    return param_groups(model, weight_decay, decay_1d=False, lr_by_prefix={"backbone.": lr_backbone})


def run_args(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The training run's stored ``args``, with the names of older checkpoints (``coco_path``) renamed."""
    run = ckpt.get("args") if isinstance(ckpt.get("args"), dict) else {}
    return {_RENAMED_ARGS.get(k, k): v for k, v in run.items()}


def _eval_data_flags(args: argparse.Namespace, run: dict[str, Any]) -> argparse.Namespace:
    """``eval``'s data flags (``--data-root``, ``--val-json``, ``--val-ann``, ``--val-images``), else the run's.

    Given ``--data-root`` or ``--val-ann``, the command's flags say where the data is; otherwise the
    run's recorded ones do, and its layout is detected again.
    """
    keys = ("data_root", "val_json", "val_ann", "val_images")
    flags = argparse.Namespace(**{k: getattr(args, k, None) for k in keys})
    if flags.data_root is None and flags.val_ann is None:
        if not run.get("data_root") and not run.get("val_ann"):
            raise UserError(
                "--data-root is required (the checkpoint does not name its data)", args.checkpoint
            )
        for k in keys:
            setattr(flags, k, getattr(flags, k) or run.get(k))
    return flags


def _check_categories(val: ValSets, num_classes: int) -> None:
    """Every validation category has a label of the ``num_classes``-way classifier (a UserError otherwise)."""
    if val.label_map.mode == "contiguous":
        too_large = val.label_map.check_fits(num_classes)
        why = f"--labels contiguous has {len(val.label_map.categories)} labels"
    else:
        too_large = [c["id"] for c in val.categories if c["id"] >= num_classes]
        why = "labels are category ids"
    if too_large:
        raise UserError(
            f"validation category ids {too_large[:5]} do not fit the model's {num_classes} classes "
            f"({why}; pass a larger --num-classes)",
            val.ann_path,
        )


def _folder_labels(
    args: argparse.Namespace, ckpt: dict[str, Any] | None
) -> tuple[list[str] | None, int] | None:
    """``(id2label names or None, class count)`` of a Hugging Face ``--init`` folder; None without one or on resume."""
    init = getattr(args, "init", None)
    if ckpt is not None or init is None or not (Path(init) / "config.json").is_file():
        return None
    try:
        config = read_hf_config(init)
        where = Path(init) / "config.json"
        return hf_label_names(config, where), hf_num_labels(config, where)
    except WeightsError as e:
        raise UserError(e.what, e.where) from e
    except ValueError as e:
        raise UserError(f"invalid Hugging Face folder ({e})", init) from None


def resolve_label_map(
    args: argparse.Namespace,
    categories: list[dict[str, Any]],
    ann: Path,
    ckpt: dict[str, Any] | None,
    ctx: RunContext,
) -> tuple[LabelMap, int]:
    """The run's :class:`LabelMap` of the training ``categories`` and its classifier size.

    The mode is ``--labels`` (a resumed run: its checkpoint's, and another ``--labels`` on the command
    line is a :class:`UserError` naming both); a Hugging Face ``--init`` folder
    whose ``id2label`` names are the categories' (case-insensitive; in id order: ``contiguous``,
    at their ids: ``ids``) decides it instead, said in one line.  ``--num-classes`` defaults to
    the map's size.  A start with other classes is rebuilt for these labels (:func:`_init_model`).
    """
    mode = getattr(args, "labels", None) or "ids"
    if ckpt is not None:  # written before meta["labels"]: ids, the only mode there was
        mode = LabelMap.from_meta(ckpt.get("meta") or {}).mode
        if "labels" in getattr(args, "cli_flags", ()):  # the labels' meaning is the checkpoint's
            refuse_changed_on_resume("labels", mode, args.labels)
    folder = _folder_labels(args, ckpt)
    found = match_label_names(folder[0], categories) if folder and folder[0] else None
    if found is not None:
        ctx.print(
            f"--init {args.init}: its {folder[1]} label names are the categories of {ann.name}: --labels {found}"
        )
        mode = found
    label_map = LabelMap.from_categories(categories, mode)
    num_classes = args.num_classes
    if num_classes is None:
        num_classes = infer_num_classes(categories, ann, mode)
        what = f"max category id in {ann.name} + 1" if mode == "ids" else f"categories in {ann.name}"
        ctx.print(f"--num-classes not given: using {num_classes} ({what})")
    return label_map, num_classes


def recorded_label_map(ckpt: dict[str, Any], requested: str | None, where: Any) -> LabelMap:
    """The checkpoint's :class:`LabelMap`; a ``requested`` ``--labels`` other than its mode is a UserError.

    A classifier's labels mean what its training made them: reading a ``contiguous`` model's label
    ``k`` as category id ``k`` (or the reverse) would silently give every detection a wrong
    category, so there is no re-mapping to honour, only the recorded mode to confirm.
    """
    label_map = LabelMap.from_meta(ckpt.get("meta") or {})
    if requested is not None and requested != label_map.mode:
        raise UserError(
            f"the checkpoint was trained with --labels {label_map.mode}; --labels {requested} would mis-label "
            f"its detections (leave --labels out: the checkpoint's map is used)",
            where,
        )
    return label_map


def per_process_batch(args: argparse.Namespace, world_size: int) -> int:
    """``--batch-size``, else ``--total-batch-size`` split over the processes and ``--grad-accum-steps``.

    ``--total-batch-size`` is the optimizer step's batch (the recipes' number), so 32 on one process with
    ``--grad-accum-steps 4`` runs micro-batches of 8, as on 4 processes without accumulation.
    """
    if args.batch_size:
        return args.batch_size
    total, steps = args.total_batch_size, accum_steps(args)
    if total % (world_size * steps):
        split = f"the {world_size} processes" + (f" x {steps} accumulation steps" if steps > 1 else "")
        raise UserError(
            f"not divisible by {split}; pass --batch-size (per process) instead",
            f"--total-batch-size {total}",
        )
    return total // (world_size * steps)


def _val_transforms(arch: str, size: int) -> Callable:
    """DETR: short side ``size`` (long side capped at DETR's ratio); the RT-DETR family: a ``size`` × ``size`` square."""
    if arch_named(arch).square_inputs:
        return make_rtdetr_val_transforms(size)
    return make_val_transforms(size, scaled_max_size(size))


class ValSets:
    """The validation split at each evaluation size: one checked annotation file, one dataset per size.

    ``val``: the split as its layout gives it (:meth:`peg_detr.data.layouts.DataLayout.split`).
    The numbers at ``val_size`` (the first size when it is not among them) are the headline.
    """

    def __init__(
        self,
        val: DataSplit,
        sizes: list[int],
        val_size: int,
        backend: str = "faster",
        arch: str = "detr",
        label_map: LabelMap | None = None,
    ) -> None:
        self.backend = backend  # COCO evaluation backend (peg_detr.evaluation.BACKENDS)
        img_dir, self.ann_path, annotations = val.images, val.source, val.annotations
        self.categories = annotations.categories
        # the run's labels (those of the training categories); predictions go back to category ids
        self.label_map = label_map or LabelMap.from_categories(self.categories, "ids")
        self.headline = val_size if val_size in sizes else sizes[0]
        self.sets = {
            s: CocoDetr(img_dir, annotations, _val_transforms(arch, s), self.label_map) for s in sizes
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
                model, postprocessor, loader, ds.coco, ctx, split, len(ds), self.backend, self.label_map
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


def step_num_boxes(ctx: RunContext) -> Tensor | None:
    """The box normaliser of the micro-batch being run under ``--grad-accum-steps`` (None without accumulation).

    The large batch normalises its box losses by its boxes summed over processes / world size; a
    micro-batch whose loss the engine scales by its ``share`` of the step's samples is normalised
    by ``share x`` that count of the whole step, so the shares' sum is the large batch's loss.
    """
    micro = ctx.micro
    if micro is None:
        return None
    _, targets = micro.step_batch
    count = torch.full((), float(sum(len(t["labels"]) for t in targets)), device=ctx.device)
    return torch.clamp(reduce_sum(count) / get_world_size(), min=1) * micro.share


class _Step:
    """One training step: forward under autocast, matching and losses in float32."""

    def __init__(self, criterion: nn.Module, with_targets: bool = False) -> None:
        self.criterion = criterion
        self.with_targets = with_targets  # RT-DETR builds its denoising queries from the targets

    def __call__(self, net: nn.Module, data: Any, ctx: RunContext) -> StepOutput:
        samples, targets = data
        targets = targets_to(targets, ctx.device)
        with ctx.autocast():
            if self.with_targets:
                outputs = net(samples.to(ctx.device), targets)
            else:
                outputs = net(samples.to(ctx.device))
        loss_dict = self.criterion(to_float(outputs), targets, num_boxes=step_num_boxes(ctx))
        weights = self.criterion.weight_dict
        logs = {k: v.detach() for k, v in loss_dict.items() if k in weights}
        return StepOutput(weighted_loss(loss_dict, weights), logs)


def check_side_memory(
    model: nn.Module, arch: str, sides: list[int], flag: str, batch: int, args: Any, device: Any = "cpu"
) -> None:
    """Refuse, before any image is read, a side of ``flag`` whose largest tensor (a batch of ``batch`` images
    at that side: square for the RT-DETR family, DETR's 800 / 1333 shape else) would not fit the memory
    limit (:func:`peg_core.engine.memory.check_memory`)."""
    square = arch_named(arch).square_inputs
    for side in sorted(set(sides), reverse=True):
        h, w = (side, side) if square else (side, scaled_max_size(side))

        def images(h: int = h, w: int = w) -> list[Tensor]:
            return [torch.zeros(3, h, w, device=device) for _ in range(batch)]

        check_memory(model, images, where=f"{flag} {side}", args=args, device=device)


def _check_input_sides(model: nn.Module, sides: list[int], flag: str) -> None:
    """RT-DETR: every square side of ``flag`` gives its query selection enough encoder cells.

    Checked when the run is set up, so a too small ``--eval-sizes`` fails before any other size
    is evaluated (an :class:`~peg_core.errors.InputError` naming the flag and the smallest side).
    """
    if arch_of_model(model).square_inputs:
        for side in sides:
            model.check_input_size(side, side, f"{flag} {side}")


def _sizes_flag(args: argparse.Namespace) -> str:
    """The flag the evaluation sizes come from: ``--eval-sizes``, else ``--val-size`` (given or the run's)."""
    return "--eval-sizes" if args.eval_sizes else "--val-size"


def rtdetr_stop_epoch(args: argparse.Namespace) -> int | None:
    """The first epoch without the strong augmentation and multi-scale (``--no-aug-epochs N``), or None.

    ``epochs - N``: RT-DETRv2's ``stop_epoch`` (71 of 72 epochs in its 6x recipes).  A DETR run
    refuses the flag (its augmentation has no such policy).
    """
    n = getattr(args, "no_aug_epochs", None) or 0
    if not n:
        return None
    if arch_of(args).family != "rtdetr":
        raise UserError("applies to the RT-DETR family only (--arch rtdetr and its successors)",
                        f"--no-aug-epochs {n}")  # fmt: skip
    return max(args.epochs - n, 0)


def _train_set(
    args: argparse.Namespace, label_map: LabelMap | None = None, train: DataSplit | None = None
) -> tuple[CocoDetr | MosaicDataset, Path]:
    """The augmented training split and the file it is described by (``train``: the split already read)."""
    train = train or layout_from_args(args, ("train",)).split("train")
    stop = rtdetr_stop_epoch(args)
    if arch_of(args).square_inputs:  # square at --val-size; the collate draws the batch's side
        make = arch_of(args).train_transforms or make_rtdetr_train_transforms
        transforms = make(args.val_size)
        if stop is not None:
            plain = make(args.val_size, strong=False)
            transforms = StopEpochTransforms(transforms, plain, stop)
    else:
        transforms = make_train_transforms(
            args.train_scales,
            args.max_size,
            crop_resize=args.crop_resize or None,
            crop_size=tuple(args.crop_size),
        )
    # seeded: a sample's augmentation is a function of (seed, epoch, index), whatever --workers says
    ds = CocoDetr(train.images, train.annotations, transforms, label_map, seed=args.seed)
    dense = dense_o2o_from_args(args)  # DEIM's mosaic: None (no wrapper) unless --mosaic-prob asks for it
    if dense is not None and dense.uses_mosaic:
        # tiles at half the training side (DEIM: 320 for 640); RT-DETR-family mosaics skip the
        # zoom-out and IoU crop, as DEIM's; DETR's own pipeline follows its mosaics
        follow = make_mosaic_transforms(args.val_size) if arch_of(args).square_inputs else None
        ds = MosaicDataset(ds, dense, Mosaic(output_size=max(args.val_size // 2, 1)), follow)
    return ds, train.source


def _train_loader(
    ds: CocoDetr | MosaicDataset, batch: int, args: argparse.Namespace, ctx: RunContext
) -> tuple[DataLoader, Callable[[int], None]]:
    """The loader and its ``on_epoch_start``: order and worker seeds are functions of (seed, epoch)."""
    sampler = DistributedSampler(ds, ctx.dist.world_size, ctx.dist.rank, shuffle=True, seed=args.seed)
    generator = torch.Generator()
    collate = (
        MultiScaleCollate(args.train_scales or (), rtdetr_stop_epoch(args), seed=args.seed)
        if arch_of(args).square_inputs
        else collate_detr
    )
    dense = dense_o2o_from_args(args)  # DEIM's mixup: before the multi-scale resize, as DEIM's collate
    if dense is not None and dense.uses_mixup:
        collate = MixupCollate(collate, dense, seed=args.seed)
    loader = DataLoader(
        SkipBroken(ds), batch, sampler=sampler, collate_fn=skipping_collate(collate),
        num_workers=args.workers, drop_last=True, generator=generator,
    )  # fmt: skip

    def on_epoch_start(epoch: int) -> None:
        sampler.set_epoch(epoch)
        ds.set_epoch(epoch)
        generator.manual_seed(args.seed * 1000 + epoch)
        # --no-aug-epochs: before this epoch's iterator (and its workers' copies) is made
        for policy in (ds.transforms, collate):
            if isinstance(policy, (StopEpochTransforms, MultiScaleCollate, MixupCollate)):
                policy.set_epoch(epoch)

    return loader, on_epoch_start


def _init_model(
    args: argparse.Namespace,
    label_map: LabelMap,
    num_classes: int,
    ckpt: dict[str, Any] | None,
    ctx: RunContext,
) -> tuple[nn.Module, nn.Module, nn.Module, dict[str, Any] | None]:
    """The model from the flags, or from ``--init`` rebuilt for the data's labels; ``(model, criterion, post, classes)``.

    ``--init`` takes a Hugging Face folder (or hub id, already fetched), a checkpoint of
    ``peg_detr train`` or an official DETR file.  A folder or a checkpoint names its classes, so
    the model is rebuilt for the data's ``num_classes`` labels keeping the rows of every class the
    data shares with it by name (:func:`peg_detr.model.relabel`; ``--class-map`` adds synonyms);
    ``classes`` is what was kept, for the run's ``meta``.  A resumed run has its own weights.
    """
    init = args.init if ckpt is None else None
    if ckpt is not None and (run_args(ckpt).get("init") or "hf_config" in (ckpt.get("model_config") or {})):
        # resuming a run that started from --init: the start's architecture, recorded, not the flags'
        return *build_model(ckpt["model_config"], "the resumed checkpoint"), None
    if init is None:
        return *build_model(model_config_from_args(args, num_classes)), None
    class_map = class_map_arg(args)
    if (Path(init) / "config.json").is_file():
        start, start_names = _from_hf_folder(args, ctx), _folder_names(init)
    else:
        obj = read_state_file(init, what="--init checkpoint")
        if not (isinstance(obj, dict) and obj.get("task") == "detect" and "model_config" in obj):
            arch = arch_of(args)
            if arch.init_file is None:  # before any model is built
                raise UserError(f"--arch {arch.name} starts from a Hugging Face folder or a checkpoint of "
                                "peg_detr train; this is neither", init)  # fmt: skip
            if class_map is not None:  # a bare weights file (an official DETR file) names no classes
                refuse_without_effect(args, ["class_map"], {"class_map": f"--init {init} names no classes "
                                      "(an official DETR file; a folder or a peg_detr checkpoint does)"})  # fmt: skip
            model, criterion, postprocessor = build_model(model_config_from_args(args, num_classes))
            arch.init_file(model, init, num_classes=num_classes)
            return model, criterion, postprocessor, None
        start, start_names = _from_checkpoint(args, obj, ctx)
    try:
        model, criterion, postprocessor, report = relabel(
            start, label_map.names(num_classes), start_names, class_map, init
        )
    except ValueError as e:  # a --class-map entry naming no class
        raise UserError(str(e), getattr(args, "class_map", None) or init) from None
    ctx.print(f"--init {init}: {report.classes.line()}")
    return model, criterion, postprocessor, report.classes.to_json()


def _folder_names(folder: Path) -> list[str] | None:
    """``id2label`` names of a Hugging Face folder (None without one)."""
    where = Path(folder) / "config.json"
    try:
        return hf_label_names(read_hf_config(folder), where)
    except WeightsError as e:
        raise UserError(e.what, e.where) from e


def _from_checkpoint(
    args: argparse.Namespace, ckpt: dict[str, Any], ctx: RunContext
) -> tuple[nn.Module, list[str]]:
    """``--init CHECKPOINT`` of ``peg_detr train``: its model (the recorded config) and its class names.

    The checkpoint's architecture is kept; ``--pos-enc`` (and the PEG flags), when typed, replace
    its encoder's encoding as they do for a folder: the other weights load, a new PEG starts at zero.
    """
    config = dict(ckpt["model_config"])
    arch = arch_of(config)
    if (
        arch.name != arch_of(args).name
    ):  # the run's recipe (data pipeline, losses, schedule) is another family's
        raise UserError(f"the checkpoint holds a {arch.title}, not a {arch_of(args).title}; use --arch {arch.name} "
                        f"(or a {arch.name} recipe)", args.init)  # fmt: skip
    typed = set(getattr(args, "cli_flags", ()))
    encoding = {"pos_enc": args.pos_enc, **peg_kwargs(args)}
    changed = {k: v for k, v in encoding.items() if k in typed and v is not None and config.get(k) != v}
    loaded = load_model(ckpt, args.init)
    start = loaded.model
    if changed:
        start = _with_encoding(start, {**loaded.config, **changed}, args.init, ctx)
    names = LabelMap.from_meta(loaded.meta).names(int(loaded.config["num_classes"]))
    return start.train(), names


def _with_encoding(model: nn.Module, config: dict[str, Any], where: Any, ctx: RunContext) -> nn.Module:
    """``model`` rebuilt from ``config`` (another encoding): its weights where they fit, a new PEG at zero."""
    fresh, _, _ = build_model(config, where)
    own, state = fresh.state_dict(), model.state_dict()
    fits = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    fresh.load_state_dict(fits, strict=False)
    new = sorted(own.keys() - fits.keys())
    with torch.no_grad():  # a new PEG adds nothing until trained: the start computes what it did
        for name, module in fresh.named_modules():
            if isinstance(module, PEG2d) and any(k.startswith(f"{name}.") for k in new):
                for p in module.parameters():
                    p.zero_()
    ctx.print(f"--init {where}: encoding {config.get('pos_enc')}; {len(fits)} tensors loaded, {len(new)} new")
    return fresh


def _from_hf_folder(args: argparse.Namespace, ctx: RunContext) -> nn.Module:
    """``--init FOLDER``: the detector a Hugging Face folder describes, with the folder's classes.

    The folder fixes the architecture (backbone, widths); ``--pos-enc`` still applies
    (``peg`` adds a zero-initialised PEG, so training starts from what the folder computes).
    """
    arch = arch_of(args)
    try:
        kind = read_hf_config(args.init).get("model_type")
    except WeightsError as e:
        raise UserError(e.what, e.where) from e
    if kind not in arch.hf_model_types:  # before any model is built: name the arch whose folders these are
        found = next((a for a in ARCHS.values() if kind in a.hf_model_types), None)
        what, use = (found.title, f"; use --arch {found.name}") if found else (f"model_type {kind!r}", "")
        raise UserError(f"the folder holds a {what}, not a {arch.title}{use}", args.init)
    try:
        model, report = from_hf(args.init, pos_enc=args.pos_enc)
    except WeightsError as e:
        raise UserError(e.what, e.where) from e
    except ValueError as e:  # settings peg_detr lacks
        raise UserError(f"invalid Hugging Face folder ({e})", args.init) from None
    ctx.print(f"--init {args.init}: {str(report).splitlines()[0]}")
    # the loss flags (DEIM's --cls-loss mal) shape the criterion of the folder's model, and a resumed run's
    losses = {k: getattr(args, k) for k in arch.loss_options if getattr(args, k, None) is not None}
    # num_classes too: eval / predict read it from every detector's model_config
    model.build_config = {**model.build_config, **losses, "num_classes": model.num_classes}
    return model.train()


def _rtdetr_optimization(
    model: nn.Module, args: argparse.Namespace, steps_per_epoch: int
) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """RT-DETR's AdamW, warm-up schedule (per step) and weight EMA; returns ``(trained model, opt, sched)``.

    The trained model is an :class:`EmaModel` when ``--ema-decay`` > 0; the optimiser holds the
    live model's parameters only (same group order with or without the EMA).
    """
    groups = rtdetr_optimizer_groups(model, args.lr_backbone, args.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)
    if getattr(args, "lr_schedule", None) == "flatcosine":
        factor = flat_cosine_lr(args.warmup_steps or 0, (args.flat_epochs or 0) * steps_per_epoch,
                                args.epochs * steps_per_epoch, (args.no_aug_epochs or 0) * steps_per_epoch,
                                0.5 if args.lr_gamma is None else args.lr_gamma)  # fmt: skip
    else:
        factor = warmup_step_lr(args.warmup_steps or 0, args.lr_drop * steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    if not args.ema_decay:
        return model, optimizer, scheduler
    trained = EmaModel(model, args.ema_decay, args.ema_warmups or 2000)
    # after every optimiser step that ran (a GradScaler-skipped step does not move the average)
    optimizer.register_step_post_hook(lambda *_: trained.update())
    return trained, optimizer, scheduler


class DetectTask:
    """DETR on COCO-format data for :func:`~peg_core.engine.fit` / :func:`~peg_core.engine.evaluate_checkpoint`."""

    name = "detect"

    def setup_train(
        self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any] | None
    ) -> TrainParts:
        # --init may be a Hugging Face folder; --backbone-weights is one state-dict file (RT-DETR: or a folder)
        backbone_found = Path.exists if arch_of(args).load_backbone is not None else Path.is_file
        for flag, path, found in (
            ("--init", args.init, Path.exists),
            ("--backbone-weights", args.backbone_weights, backbone_found),
        ):
            if path is not None and not found(path):
                raise UserError(f"{flag} file not found", path)
        batch = per_process_batch(args, ctx.dist.world_size)
        data = layout_from_args(args)  # COCO, Roboflow, YOLO or --train-ann / --val-ann
        train, val_split = data.split("train"), data.split("val")
        ctx.print(data.describe())
        ann = train.source
        label_map, num_classes = resolve_label_map(args, train.annotations.categories, ann, ckpt, ctx)
        train_ds, _ = _train_set(args, label_map, train)
        accum = accum_steps(args)
        if len(train_ds) < batch * accum * ctx.dist.world_size:
            per_step = f"{batch} x --grad-accum-steps {accum}" if accum > 1 else str(batch)
            raise UserError(
                f"{len(train_ds)} training images are fewer than one batch ({per_step} per process); pass a "
                "smaller --batch-size (per process) or --total-batch-size"
                + (" or --grad-accum-steps" if accum > 1 else ""),
                ann,
            )
        val = ValSets(
            val_split, args.eval_sizes or [args.val_size], args.val_size,
            getattr(args, "coco_eval_backend", "faster"), arch_of(args).name, label_map,
        )  # fmt: skip
        _check_categories(val, num_classes)

        model, criterion, postprocessor, kept = _init_model(args, label_map, num_classes, ckpt, ctx)
        set_named(
            postprocessor, label_map.named(num_classes)
        )  # evaluation never names an id without a category
        _check_input_sides(model, args.train_scales or [], "--train-sizes")
        _check_input_sides(model, args.eval_sizes or [args.val_size], _sizes_flag(args))
        model.to(ctx.device)
        # a side whose largest tensor cannot fit is refused before any step
        check_side_memory(
            model, arch_of(args).name, args.train_scales or [], "--train-sizes", batch, args, ctx.device
        )
        check_side_memory(model, arch_of(args).name, args.eval_sizes or [args.val_size], _sizes_flag(args), batch, args,
                          ctx.device)  # fmt: skip
        criterion.to(ctx.device).train()
        # one optimizer step's batch: the engine splits it into --grad-accum-steps micro-batches
        loader, on_epoch_start = _train_loader(train_ds, batch * accum, args, ctx)
        rtdetr = arch_of(args).family == "rtdetr"
        if rtdetr:
            trained, optimizer, scheduler = _rtdetr_optimization(model, args, len(loader))
            evaluated = trained.averaged if isinstance(trained, EmaModel) else trained
        else:
            trained, evaluated = model, model
            groups = optimizer_groups(model, args.lr_backbone, args.weight_decay)
            optimizer = torch.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_drop)
        return TrainParts(
            model=trained,
            optimizer=optimizer,
            train_loader=loader,
            train_size=len(train_ds),
            step=_Step(criterion, with_targets=rtdetr),
            evaluate=lambda m, c: val.evaluate(evaluated, postprocessor, c, batch, args.workers),
            scheduler=scheduler,
            scheduler_interval="step" if rtdetr else "epoch",
            model_config=dict(model.build_config),
            meta=dict(
                categories=train_ds.categories,
                labels=label_map.to_json(),  # label -> category id and name, for eval / predict / export
                **({"init_classes": kept} if kept is not None else {}),  # what --init's classes gave
                num_classes=num_classes,
                val_size=args.val_size,
                batch_size=batch,
            ),
            on_epoch_start=on_epoch_start,
            summary=summary,
            monitor="ap",  # COCO AP at --val-size
        )

    def setup_eval(self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any]) -> EvalParts:
        flags = _eval_data_flags(args, run_args(ckpt))  # where the data is: the flags', else the run's
        label_map = recorded_label_map(ckpt, getattr(args, "labels", None), args.checkpoint)
        mode = getattr(args, "pos_interpolation", None)
        pos_enc = (ckpt.get("model_config") or {}).get("pos_enc")
        if mode is not None and pos_enc != "learned":  # only a learned table is resized
            refuse_without_effect(args, ["pos_interpolation"], {"pos_interpolation": f"has no effect without a "
                                  f"learned table (the checkpoint's pos_enc {pos_enc})"})  # fmt: skip
        loaded = load_model(ckpt, args.checkpoint, pos_interpolation=mode)
        model, postprocessor, meta = loaded.model, loaded.postprocess, loaded.meta
        val_size = args.val_size or int(meta.get("val_size") or 800)
        data = layout_from_args(flags, ("val",))  # the recorded --data-root's layout, detected again
        val_split = data.split("val")
        ctx.print(data.describe())
        val = ValSets(
            val_split, args.eval_sizes or [val_size], val_size,
            getattr(args, "coco_eval_backend", "faster"), loaded.config.get("arch", "detr"), label_map,
        )  # fmt: skip
        _check_categories(val, int(ckpt["model_config"]["num_classes"]))
        _check_input_sides(model, args.eval_sizes or [val_size], _sizes_flag(args))
        model.to(ctx.device)
        batch = args.batch_size or int(meta.get("batch_size") or 1)
        if args.eval_sizes or args.val_size:  # the sides the user gave
            arch = str(loaded.config.get("arch", "detr"))
            check_side_memory(
                model, arch, args.eval_sizes or [val_size], _sizes_flag(args), batch, args, ctx.device
            )
        return EvalParts(
            model, lambda m, c: val.evaluate(m, postprocessor.to(c.device), c, batch, args.workers), summary
        )
