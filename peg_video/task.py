"""The video task for ``peg_core.engine``: what ``fit`` / ``evaluate_checkpoint`` need from peg_video.

Only the video-specific parts live here: annotations and classes, the model (:mod:`peg_video.model`,
its keywords stored as the checkpoint's ``model_config``), AdamW with linear warm-up and a
per-step cosine decay (``peg_core.engine``'s; per-layer lrs with ``--layer-decay``), label smoothing,
Mixup / CutMix (:mod:`peg_video.mix`), the training step and the
multi-view evaluation.
The engine does the rest (resume, DDP, AMP, clipping, checkpoints, logs, broken videos).

Data order, random clips and crops are functions of (seed, epoch, index) (``on_epoch_start``
sets the epoch of the sampler and the dataset), so a resumed run continues exactly.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from peg_core.engine import (
    EvalParts,
    RunContext,
    StepOutput,
    TrainParts,
    UserError,
    param_groups_for_run,
    peg_kwargs,
    warmup_cosine,
)
from peg_core.engine.cli import class_map_arg
from peg_core.engine.memory import check_memory
from peg_core.engine.recipes import apply_position_recipe
from peg_core.errors import InputError

from .data import Annotations, is_kinetics_csv, load_annotations, read_class_map, write_class_map
from .data.clip import ClipSpec
from .data.datasets import SPLIT_DATASETS, load_dataset
from .data.loaders import make_loader, repeated_aug
from .evaluation import evaluate_views
from .mix import build_clip_mix, mix_seed
from .model import (
    build_model,
    check_clip_fits,
    checkpoint_run,
    init_line,
    init_weights,
    load_model,
    model_config_from_args,
    model_from_hf_folder,
)
from .models.vit import tubelet_misfits

__all__ = ["VideoTask", "input_record", "load_data", "resize_clips"]


def _classes_beside_list(path: Path) -> list[str] | None:
    """Class names of an integer-labelled list from a ``classes.json`` next to it, if any."""
    beside = Path(path).parent / "classes.json"
    if Path(path).is_file() and not is_kinetics_csv(path) and beside.is_file():
        return read_class_map(beside)
    return None


def _load_official(
    args: argparse.Namespace, classes: list[str] | None, train: bool
) -> tuple[Annotations | None, Annotations, list[str]]:
    """Training (when ``train``) and test annotations of ``--dataset`` under ``--data-root``."""
    train_ann = None
    split = args.split if args.split in (1, 2, 3) else 1
    if train:
        train_ann = load_dataset(args.dataset, args.data_root, "train", split, classes)
        classes = train_ann.classes
    val_ann = load_dataset(args.dataset, args.data_root, "test", split, classes)
    where = f"--dataset {args.dataset} --data-root {args.data_root}"
    for ann in (train_ann, val_ann):
        if ann is not None and not any(r.path.is_file() for r in ann.records):
            raise UserError(
                f"none of the {len(ann.records)} listed videos exists (the first would be {ann.records[0].path})",
                where,
            )
    return train_ann, val_ann, val_ann.classes


def load_data(
    args: argparse.Namespace, classes: list[str] | None = None, train: bool = True
) -> tuple[Annotations | None, Annotations | None, list[str]]:
    """Training / validation annotations of ``args`` with one class list (the training set's).

    ``--dataset kinetics`` reads ``--train-ann`` / ``--val-ann``; the others read their official
    files under ``--data-root`` (the training list only when ``train``).
    """
    if getattr(args, "dataset", "kinetics") != "kinetics":
        return _load_official(args, classes, train)
    if classes is None and getattr(args, "classes", None) is not None:
        classes = read_class_map(args.classes)
    train_ann = val_ann = None
    if getattr(args, "train_ann", None) is not None:
        classes = classes or _classes_beside_list(args.train_ann)
        train_ann = load_annotations(args.train_ann, args.train_root, classes)
        classes = train_ann.classes
    if getattr(args, "val_ann", None) is not None:
        classes = classes or _classes_beside_list(args.val_ann)
        val_ann = load_annotations(args.val_ann, args.val_root, classes)
        classes = val_ann.classes
    if classes is None:
        raise UserError("no annotations given", "--train-ann / --val-ann")
    for flag, ann in (("--train-ann", train_ann), ("--val-ann", val_ann)):
        if ann is not None and not any(r.path.is_file() for r in ann.records):
            # A wrong video folder: say so now, not after an epoch of failed decodes.
            raise UserError(
                f"none of the {len(ann.records)} videos of {flag} exists (the first would be "
                f"{ann.records[0].path}); check {flag.replace('-ann', '-root')}",
                getattr(args, flag[2:].replace("-", "_")),
            )
    return train_ann, val_ann, classes


def _is_hf_folder(args: argparse.Namespace) -> bool:
    return getattr(args, "init", None) is not None and Path(args.init).is_dir()


def _build_train_model(
    args: argparse.Namespace, classes: list[str], ckpt: dict[str, Any] | None, clip: ClipSpec
) -> tuple[nn.Module, dict[str, Any], str | None]:
    """``(model, model_config, init line)`` of a training run.

    ``--init FOLDER`` builds the folder's model (:func:`peg_video.model.model_from_hf_folder`;
    a resumed run rebuilds it from its checkpoint's ``model_config``, without the folder); any
    other run builds from the flags and, when new, loads ``--init PATH`` into it.
    """
    num_classes = len(classes)
    if _is_hf_folder(args):
        if ckpt is not None:
            config = dict(ckpt["model_config"])
            return build_model(config), config, None
        opts = {**args.model_opts, **{k: v for k, v in peg_kwargs(args).items() if k != "peg_separable"}}
        try:
            model, config, report = model_from_hf_folder(
                args.init, args.pos_enc, num_classes, opts, classes, class_map_arg(args)
            )
        except InputError:
            raise
        except ValueError as e:  # a --class-map entry naming no class
            raise UserError(str(e), args.class_map or args.init) from None
        return model, config, f"Hugging Face init from {args.init}: {report}"
    config = model_config_from_args(args, num_classes, clip)
    try:
        model = build_model(config)
    except (ValueError, TypeError) as e:  # the constructors' checks of sizes and keywords
        raise UserError(f"cannot build the model ({e})", f"--arch {args.arch}") from None
    init = None
    if ckpt is None and args.init is not None:
        try:
            init = init_line(init_weights(model, args.init, args.init_source, classes, class_map_arg(args)))
        except InputError:
            raise
        except ValueError as e:  # a --class-map entry naming no class
            raise UserError(str(e), args.class_map or args.init) from None
    return model, config, init


def input_record(args: argparse.Namespace) -> dict[str, Any]:
    """The input pipeline a run trains with (the checkpoint's ``meta["input"]``; ``args`` has it too)."""
    clip = ClipSpec.of_run(args)
    return {
        "num_frames": clip.num_frames,
        "sampling": getattr(args, "sampling", "stride"),
        "stride": clip.stride,
        "crop": clip.crop,
        "test_scale": args.test_scale,
        "mean": list(clip.mean),
        "std": list(clip.std),
    }


def _init_record(args: argparse.Namespace) -> dict[str, Any]:
    """``meta["init"]``: where a run's starting weights came from (absent without ``--init``)."""
    if getattr(args, "init", None) is None:
        return {}
    kind = "hugging-face folder" if _is_hf_folder(args) else "checkpoint"
    return {
        "init": {
            "path": str(args.init),
            "kind": kind,
            "model_type": args.arch if kind != "checkpoint" else None,
        }
    }


def summary_all_splits(metrics: dict[str, Any]) -> str:
    """Console lines of ``eval --split all``: each split's top-1 / top-5 and their mean."""
    lines = [f"{name} top1 {metrics[name]['top1']:.4f} top5 {metrics[name]['top5']:.4f} "
             f"({metrics[name]['num_videos']} videos)" for name in ("split1", "split2", "split3")]  # fmt: skip
    lines.append(f"mean  top1 {metrics['mean']['top1']:.4f} top5 {metrics['mean']['top5']:.4f}")
    if metrics.get("trained_split") is not None:
        lines.append(
            f"(one checkpoint, trained on split {metrics['trained_split']}: its training videos are in the "
            "other splits' test lists; the published protocol trains one model per split)"
        )
    return "\n".join(lines)


def summary(metrics: dict[str, Any]) -> str:
    """One console line of the multi-view metrics."""
    return (
        f"val top1 {metrics['top1']:.4f} top5 {metrics['top5']:.4f} "
        f"mean class acc {metrics['mean_class_accuracy']:.4f} clip top1 {metrics['clip_top1']:.4f} "
        f"({metrics['num_videos']} videos, {metrics['num_views']} views)"
    )


def check_clip_memory(
    model: nn.Module, run: argparse.Namespace, clips: int, args: argparse.Namespace, device: Any = "cpu"
) -> None:
    """Refuse, before any video is decoded, a clip (``--num-frames``, ``--crop``) whose largest tensor in a batch
    of ``clips`` clips would not fit the memory limit (:func:`peg_core.engine.memory.check_memory`)."""
    clip = ClipSpec.of_run(run)
    check_memory(model, (clips, 3, clip.num_frames, clip.crop, clip.crop), args=args, device=device,
                 where=f"--num-frames {clip.num_frames} --crop {clip.crop}")  # fmt: skip


class VideoTask:
    """``peg_core.engine`` hooks of ``python -m peg_video train|eval``."""

    name = "video"

    def setup_train(
        self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any] | None
    ) -> TrainParts:
        resumed_classes = (ckpt.get("meta") or {}).get("classes") if ckpt is not None else None
        train_ann, val_ann, classes = load_data(args, resumed_classes)
        if ctx.is_main:
            write_class_map(classes, ctx.out_dir / "classes.json")
        clip = ClipSpec.of_run(args)  # the run's clip, for the model and the data alike
        model, config, init = _build_train_model(args, list(classes), ckpt, clip)
        if init is not None:
            ctx.print(init)
        model.to(ctx.device)
        # a micro-batch's clips: refused before any video is decoded when they cannot fit
        check_clip_memory(model, args, args.batch_size * repeated_aug(args), args, ctx.device)
        optimizer = torch.optim.AdamW(param_groups_for_run(model, args), lr=args.lr)
        apply_position_recipe(  # before the scheduler, which records each group's lr
            optimizer,
            model,
            freeze=getattr(args, "freeze_pos", False),
            lr_scale=getattr(args, "pos_lr_scale", None),
        )
        _check_recipe_sizes(model, args)
        train_loader, train_ds = make_loader(args, train_ann, "train", ctx.dist, ctx.out_dir, clip)
        steps = len(train_loader)
        scheduler = warmup_cosine(
            optimizer, int(args.warmup_epochs * steps), args.epochs * steps, args.min_lr / args.lr
        )
        mix = build_clip_mix(len(classes), getattr(args, "mixup", 0.0), getattr(args, "cutmix", 0.0),
                             args.label_smoothing)  # fmt: skip
        # with a mix the smoothing is in its soft targets already
        criterion = nn.CrossEntropyLoss(label_smoothing=0.0 if mix is not None else args.label_smoothing)

        def step(net: nn.Module, batch: dict[str, Any], ctx: RunContext) -> StepOutput:
            video = batch["video"].to(ctx.device, non_blocking=True)  # (B, C, T, S, S)
            labels = batch["label"].to(ctx.device, non_blocking=True)  # (B,)
            targets = labels  # (B,), or soft (B, K) when mixed
            if mix is not None:  # scheduler.last_epoch: the global step, restored on a resume
                video, targets = mix(video, labels, mix_seed(args.seed, ctx.dist.rank, scheduler.last_epoch))
            with ctx.autocast():
                logits = net(video)  # (B, K)
            loss = criterion(logits.float(), targets)  # float32 outside autocast
            # accuracy against the unmixed labels (the clip that dominates a mix, mostly)
            return StepOutput(loss, {"acc": (logits.argmax(1) == labels).float().mean()})

        def on_epoch_start(epoch: int) -> None:
            sampler = getattr(train_loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            train_ds.set_epoch(epoch)

        repeats = repeated_aug(args)  # a step holds repeats x batch_size clips, an epoch keeps its steps
        ctx.print(
            f"training {args.arch}/{args.pos_enc} on {len(train_ann.records)} videos, {len(classes)} classes, "
            f"{args.epochs} epochs x {steps} steps{f' ({repeats} clips per video)' if repeats > 1 else ''}, "
            f"world size {ctx.dist.world_size}, device {ctx.device}"
        )
        return TrainParts(
            model=model,
            optimizer=optimizer,
            train_loader=train_loader,
            train_size=len(train_ann.records),
            step=step,
            evaluate=self._evaluator(args, val_ann, len(classes), ctx) if val_ann is not None else None,
            scheduler=scheduler,
            scheduler_interval="step",
            model_config=config,
            meta={"classes": classes, "input": input_record(args), **_init_record(args)},
            on_epoch_start=on_epoch_start,
            summary=summary,
            resize_batch=partial(resize_clips, device=ctx.device),
            monitor="top1",
        )

    def setup_eval(self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any]) -> EvalParts:
        path = args.checkpoint
        overrides = _eval_overrides(args, checkpoint_run(ckpt, path)[0])
        loaded = load_model(ckpt, path, **overrides)
        model, classes = loaded.model, loaded.classes
        run = _eval_args(args, loaded.args)
        check_clip_fits(model, run)
        views = run.num_clips * run.num_crops  # a test batch: batch_size // views videos of views clips
        check_clip_memory(model, run, max(1, (run.batch_size or 1) // views) * views, args, ctx.device)
        if args.split is not None and run.dataset not in SPLIT_DATASETS:
            raise UserError(f"{run.dataset} has no official splits (only {', '.join(SPLIT_DATASETS)})",
                            f"--split {run.split}")  # fmt: skip
        if run.dataset != "kinetics" and args.val_ann is not None:
            raise UserError(f"the checkpoint reads --dataset {run.dataset}; add --dataset kinetics to evaluate "
                            "a Kinetics-format file", f"--val-ann {args.val_ann}")  # fmt: skip
        if run.split == "all":
            return EvalParts(model.to(ctx.device), self._all_splits(run, classes, ctx), summary_all_splits)
        if run.dataset == "kinetics" and run.val_ann is None:
            raise UserError("no validation annotations: give --val-ann", path)
        _, val_ann, classes = load_data(run, classes, train=False)
        evaluate = self._evaluator(run, val_ann, len(classes), ctx)

        def evaluate_with_clip(model: nn.Module, ctx: RunContext) -> dict[str, Any]:
            return {**evaluate(model, ctx), "num_frames": run.num_frames, "crop": run.crop}

        return EvalParts(model.to(ctx.device), evaluate_with_clip, summary)

    def _all_splits(self, run: argparse.Namespace, classes: list[str], ctx: RunContext):
        """An evaluation of one model on the three official test lists, with their mean."""
        evaluators = {}
        for split in (1, 2, 3):  # every list is read (and checked) before any video is decoded
            _, val_ann, _ = load_data(
                argparse.Namespace(**{**vars(run), "split": split}), classes, train=False
            )
            evaluators[f"split{split}"] = self._evaluator(
                run, val_ann, len(classes), ctx, f"val_split{split}"
            )
        trained = getattr(run, "trained_split", None)

        def evaluate(model: nn.Module, ctx: RunContext) -> dict[str, Any]:
            per_split = {name: fn(model, ctx) for name, fn in evaluators.items()}
            mean = {k: sum(m[k] for m in per_split.values()) / 3 for k in ("top1", "top5")}
            return {**per_split, "mean": mean, **mean, "trained_split": trained,
                    "num_frames": run.num_frames, "crop": run.crop}  # fmt: skip

        return evaluate

    @staticmethod
    def _evaluator(
        args: argparse.Namespace, val_ann: Annotations, num_classes: int, ctx: RunContext, split: str = "val"
    ):
        loader, _ = make_loader(args, val_ann, "test", ctx.dist, ctx.out_dir)

        def evaluate(model: nn.Module, ctx: RunContext) -> dict[str, Any]:
            return evaluate_views(
                model, loader, ctx, num_classes, len(val_ann.records), args.reduction, split
            )

        return evaluate


def _eval_overrides(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """``model_config`` entries that ``eval`` flags replace: ``--pos-interpolation`` of a learned table."""
    if args.pos_interpolation is None:
        return {}
    if config.get("pos_enc") != "learned":
        raise UserError(f"only a learned table is resized; the checkpoint's position encoding is "
                        f"{config.get('pos_enc')!r}", f"--pos-interpolation {args.pos_interpolation}")  # fmt: skip
    return {"pos_interpolation": args.pos_interpolation}


def _eval_args(args: argparse.Namespace, saved: dict[str, Any]) -> argparse.Namespace:
    """The training run's data and view options, overridden by those given to ``eval``."""
    # Checkpoints from before --dataset read Kinetics-format files with stride sampling.
    merged = {"dataset": "kinetics", "data_root": None, "split": None, "sampling": "stride", **saved}
    merged["trained_split"] = saved.get("split") if merged["dataset"] in SPLIT_DATASETS else None
    merged.update({k: v for k, v in vars(args).items() if v is not None})
    run = argparse.Namespace(**merged)
    for key in ("val_ann", "val_root", "classes", "data_root"):
        setattr(run, key, Path(merged[key]) if merged.get(key) else None)
    run.train_ann = run.train_root = None
    run.test_scale = max(run.test_scale, run.crop)  # a larger eval crop scales the short side with it
    return run


def resize_clips(batch: dict[str, Any], size: int, device: torch.device | None = None) -> dict[str, Any]:
    """The batch with its clips ``(B, C, T, H, W)`` at ``size × size`` (multi-scale / progressive recipes).

    Frames are resampled independently (bilinear, antialiased), on ``device`` when given.
    """
    video = batch["video"]
    if device is not None:
        video = video.to(device, non_blocking=True)
    b, c, t, h, w = video.shape
    if (h, w) != (size, size):
        frames = video.reshape(b, c * t, h, w)  # interpolation is per channel: fold T into C
        frames = F.interpolate(frames, (size, size), mode="bilinear", antialias=True, align_corners=False)
        video = frames.reshape(b, c, t, size, size)
    return {**batch, "video": video}


def _check_recipe_sizes(model: nn.Module, args: argparse.Namespace) -> None:
    """Recipe sizes must split into the transformer's tubelets (checked before any video is read)."""
    tubelet = getattr(model, "tubelet", None)
    for flag in ("train_sizes", "progressive_sizes"):
        sizes = getattr(args, flag, None) or []
        bad = [s for s in sizes if tubelet is not None and tubelet_misfits((tubelet[0], s, s), tubelet)]
        if bad:
            raise UserError(f"sizes must be multiples of the tubelet {tuple(tubelet)}",
                            f"--{flag.replace('_', '-')} {','.join(map(str, sizes))}")  # fmt: skip
