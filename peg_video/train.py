"""Training and evaluation entry points of ``python -m peg_video train|eval``.

Single process (CPU or one GPU) or many processes under ``torchrun`` (DistributedDataParallel;
``peg_core.utils.init_distributed`` reads the torchrun variables).  AdamW with linear warm-up
and per-step cosine decay, label smoothing, bf16/fp16 autocast on GPU, gradient clipping.

Files in ``--out``: ``checkpoint.pt`` (atomic, written after every epoch: model, optimizer,
scheduler, scaler, epoch, the RNG state of every rank, arguments, classes), ``classes.json``
(class name <-> index), ``config.json``, ``log.jsonl`` and ``tb/`` (TensorBoard), and
``report.json`` (final metrics, the number of videos evaluated, the broken videos skipped).

``--resume out/checkpoint.pt`` continues exactly where the run stopped: data order, random
clips and augmentation are functions of (seed, epoch, index), and the RNG states are restored.
A NaN/inf loss stops the run with a message; the checkpoint of the last finished epoch stays.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from peg_core.utils import (
    DistInfo,
    MetricLogger,
    all_gather_object,
    barrier,
    capture_rng_state,
    cleanup_distributed,
    init_distributed,
    load_checkpoint,
    restore_rng_state,
    save_training_state,
    seed_everything,
)

from .configs import CONFIGS
from .data import (
    Annotations,
    ClipTransformConfig,
    KineticsVideoDataset,
    collate_clips,
    is_kinetics_csv,
    load_annotations,
    read_class_map,
    write_class_map,
)
from .engine import evaluate, train_one_epoch

__all__ = ["build_model", "build_parser", "evaluate_checkpoint", "make_loader", "parse_args", "train"]

_DEFAULTS: dict[str, Any] = {**CONFIGS["synthetic_tiny"], "model_opts": {}}


def _model_opt(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--model-opt expects key=value, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``train``; ``--config NAME`` supplies defaults that flags override."""
    p = argparse.ArgumentParser(
        prog="python -m peg_video train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", choices=sorted(CONFIGS), help="named defaults (see peg_video.configs)")
    g = p.add_argument_group("data")
    g.add_argument("--train-ann", type=Path, help="training annotations: Kinetics CSV or 'path label' list")
    g.add_argument("--val-ann", type=Path, help="validation annotations (same formats)")
    g.add_argument("--train-root", type=Path, help="folder of the training videos (default: beside the file)")
    g.add_argument("--val-root", type=Path, help="folder of the validation videos")
    g.add_argument(
        "--classes",
        type=Path,
        help="JSON class list; default: classes.json beside --train-ann "
        "for integer-labelled lists, else the sorted label names",
    )
    g.add_argument(
        "--data-backend",
        choices=("peg", "pytorchvideo"),
        default="peg",
        help="peg: this project's decord dataset; pytorchvideo: its labeled_video_dataset (decord)",
    )
    g.add_argument("--num-frames", type=int)
    g.add_argument("--stride", type=int)
    g.add_argument("--crop", type=int)
    g.add_argument("--train-scale", type=int, nargs=2, metavar=("MIN", "MAX"))
    g.add_argument("--test-scale", type=int)
    g.add_argument("--num-clips", type=int, help="test clips per video")
    g.add_argument("--num-crops", type=int, choices=(1, 3), help="test crops per clip")
    g.add_argument("--hflip", action=argparse.BooleanOptionalAction)
    g.add_argument("--workers", type=int)
    m = p.add_argument_group("model")
    m.add_argument("--model", help="vit_tiny | vit_small | vit_base | x3d_xs | x3d_s | x3d_m")
    m.add_argument("--pos-enc", help="peg3d | peg3d-factorized | learned | sincos | none")
    m.add_argument("--tubelet", type=int, nargs=3, metavar=("T", "H", "W"))
    m.add_argument(
        "--model-opt",
        type=_model_opt,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra build_video_model keyword (repeatable), e.g. depth=4",
    )
    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=int)
    o.add_argument("--batch-size", type=int, help="clips per process")
    o.add_argument("--lr", type=float)
    o.add_argument("--min-lr", type=float)
    o.add_argument("--weight-decay", type=float)
    o.add_argument("--warmup-epochs", type=float)
    o.add_argument("--label-smoothing", type=float)
    o.add_argument("--clip-grad", type=float, help="max gradient norm (0: off)")
    o.add_argument("--amp", choices=("none", "bf16", "fp16"), help="autocast dtype on GPU (ignored on CPU)")
    r = p.add_argument_group("run")
    r.add_argument("--out", type=Path, default=Path("runs/video"))
    r.add_argument("--resume", type=Path, help="checkpoint.pt to continue from")
    r.add_argument(
        "--stop-after-epoch",
        type=int,
        help="leave after this many epochs, as a job time limit "
        "would (continue with --resume; the schedule stays the one of --epochs)",
    )
    r.add_argument("--eval-every", type=int, help="evaluate every N epochs (0: only at the end)")
    r.add_argument("--reduction", choices=("mean", "sum", "max", "logits"), default="mean")
    r.add_argument("--device", default="auto")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--find-unused-parameters", action="store_true")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``train`` arguments, filling unset ones from ``--config`` then the synthetic defaults."""
    args = build_parser().parse_args(argv)
    if args.train_ann is None:
        raise SystemExit(
            "train: --train-ann is required (make a set with: python -m peg_video make-data OUT)"
        )
    base = {**_DEFAULTS, **(CONFIGS[args.config] if args.config else {})}
    if args.model is not None and args.model != base["model"]:
        base["model_opts"] = {}  # the configuration's model options belong to its own model
    for key, value in base.items():
        if key != "model_opts" and getattr(args, key, None) is None:
            setattr(args, key, value)
    args.model_opts = {**base.get("model_opts", {}), **dict(args.model_opt)}
    args.tubelet, args.train_scale = tuple(args.tubelet), tuple(args.train_scale)
    return args


def _args_dict(args: argparse.Namespace) -> dict[str, Any]:
    """JSON / ``weights_only``-safe copy of the arguments."""
    out = {}
    for k, v in vars(args).items():
        if isinstance(v, Path):
            v = str(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    out.pop("model_opt", None)
    return out


def _classes_beside_list(path: Path) -> list[str] | None:
    """Class names of an integer-labelled list from a ``classes.json`` next to it, if any."""
    beside = Path(path).parent / "classes.json"
    if Path(path).is_file() and not is_kinetics_csv(path) and beside.is_file():
        return read_class_map(beside)
    return None


def load_data(
    args: argparse.Namespace, classes: list[str] | None = None
) -> tuple[Annotations | None, Annotations | None, list[str]]:
    """Training / validation annotations with one class list (the training set's)."""
    if classes is None and args.classes is not None:
        classes = read_class_map(args.classes)
    train_ann = None
    if getattr(args, "train_ann", None) is not None:
        classes = classes or _classes_beside_list(args.train_ann)
        train_ann = load_annotations(args.train_ann, args.train_root, classes)
        classes = train_ann.classes
    val_ann = None
    if args.val_ann is not None:
        classes = classes or _classes_beside_list(args.val_ann)
        val_ann = load_annotations(args.val_ann, args.val_root, classes)
        classes = val_ann.classes
    if classes is None:
        raise ValueError("no annotations given")
    return train_ann, val_ann, classes


def transform_config(args: argparse.Namespace) -> ClipTransformConfig:
    return ClipTransformConfig(
        crop=args.crop,
        train_scale=tuple(args.train_scale),
        test_scale=args.test_scale,
        num_crops=args.num_crops,
        hflip=bool(args.hflip),
    )


def make_loader(
    args: argparse.Namespace, ann: Annotations, mode: str, info: DistInfo, num_frames: int | None = None
) -> tuple[DataLoader, Any, int]:
    """``(loader, dataset, batches_per_epoch)`` for either back-end, sharded over the ranks."""
    num_frames = num_frames or args.num_frames
    cfg = transform_config(args)
    views = args.num_clips * args.num_crops if mode == "test" else 1
    batch = args.batch_size if mode == "train" else max(1, args.batch_size // views)
    common = {"num_workers": args.workers, "pin_memory": info.device.type == "cuda"}
    if args.data_backend == "pytorchvideo":
        from .data.pytorchvideo_data import build_pytorchvideo_dataset, collate_pytorchvideo

        ds = build_pytorchvideo_dataset(
            ann,
            Path(args.out) / f"{mode}_pytorchvideo_rank{info.rank}.txt",
            mode,
            num_frames,
            args.stride,
            cfg,
            num_clips=args.num_clips,
            distributed=info.distributed,
        )
        collate = partial(collate_pytorchvideo, num_crops=args.num_crops if mode == "test" else None)
        per_rank = math.ceil(len(ann.records) / info.world_size) * (args.num_clips if mode == "test" else 1)
        return DataLoader(ds, batch_size=batch, collate_fn=collate, **common), ds, math.ceil(per_rank / batch)
    ds = KineticsVideoDataset(
        ann, mode, num_frames, args.stride, num_clips=args.num_clips, transform=cfg, seed=args.seed
    )
    sampler = DistributedSampler(
        ds, num_replicas=info.world_size, rank=info.rank, shuffle=mode == "train", seed=args.seed
    )
    loader = DataLoader(ds, batch_size=batch, sampler=sampler, collate_fn=collate_clips, **common)
    return loader, ds, len(loader)


def _set_epoch(loader: DataLoader, dataset: Any, epoch: int) -> None:
    if isinstance(loader.sampler, DistributedSampler):
        loader.sampler.set_epoch(epoch)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    sampler = getattr(dataset, "video_sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


def build_model(args: argparse.Namespace | dict, num_classes: int) -> nn.Module:
    """The model named in the arguments (``peg_video.build_video_model``)."""
    from . import build_video_model

    a = args if isinstance(args, dict) else vars(args)
    return build_video_model(
        a["model"],
        pos_enc=a["pos_enc"],
        num_classes=num_classes,
        num_frames=a["num_frames"],
        img_size=a["crop"],
        tubelet=tuple(a["tubelet"]),
        **a["model_opts"],
    )


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases, norms, tokens and learned position tables (PEG convs do decay)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim <= 1 or "token" in name or "pos_embed" in name or name.startswith("pos_enc.")
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _print(info: DistInfo, *msg: Any) -> None:
    if info.rank == 0:
        print(*msg, flush=True)


def _report_skipped(
    info: DistInfo, logger: MetricLogger, step: int, tag: str, skipped: dict[str, str]
) -> None:
    if skipped:
        logger.log(
            step,
            f"{tag}_skipped",
            count=len(skipped),
            videos=[{"path": p, "reason": r} for p, r in sorted(skipped.items())],
        )
        for path, reason in sorted(skipped.items()):
            _print(info, f"[{tag}] skipped broken video {path}: {reason}")


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run training (see the module docstring); returns the final report."""
    info = init_distributed(args.device)
    try:
        return _train(args, info)
    finally:
        cleanup_distributed()


def _train(args: argparse.Namespace, info: DistInfo) -> dict[str, Any]:
    seed_everything(args.seed, info.rank)
    out, main = Path(args.out), info.rank == 0
    train_ann, val_ann, classes = load_data(args)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        write_class_map(classes, out / "classes.json")
        (out / "config.json").write_text(json.dumps(_args_dict(args), indent=1) + "\n")
    model = build_model(args, len(classes)).to(info.device)
    optimizer = torch.optim.AdamW(_param_groups(model, args.weight_decay), lr=args.lr)
    train_loader, train_ds, steps_per_epoch = make_loader(args, train_ann, "train", info)
    val_loader = make_loader(args, val_ann, "test", info)[0] if val_ann is not None else None
    total, warmup = args.epochs * steps_per_epoch, int(args.warmup_epochs * steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, partial(_lr_lambda, warmup=warmup, total=total, min_ratio=args.min_lr / args.lr)
    )
    use_scaler = args.amp == "fp16" and info.device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda") if use_scaler else None
    start_epoch, step, metrics = 0, 0, {}
    if args.resume is not None:
        ckpt = load_checkpoint(args.resume)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        start_epoch, step, metrics = ckpt["epoch"] + 1, ckpt["step"], ckpt.get("metrics", {})
        ranks = ckpt.get("rng_ranks") or [ckpt["rng"]]
        restore_rng_state(ranks[info.rank] if info.rank < len(ranks) else ranks[0])
        _print(info, f"resumed from {args.resume} at epoch {start_epoch}, step {step}")
    net = model
    if info.distributed:
        ids = [info.device.index] if info.device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=ids, find_unused_parameters=args.find_unused_parameters
        )
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    logger = MetricLogger(out, enabled=main)
    show = main and not args.no_progress
    train_skipped: dict[str, str] = {}
    _print(
        info,
        f"training {args.model}/{args.pos_enc} on {len(train_ann.records)} videos, {len(classes)} classes, "
        f"{args.epochs} epochs x {steps_per_epoch} steps, world size {info.world_size}, device {info.device}",
    )
    try:
        for epoch in range(start_epoch, args.epochs):
            _set_epoch(train_loader, train_ds, epoch)
            stats, step = train_one_epoch(
                net,
                train_loader,
                optimizer,
                scheduler,
                criterion,
                info.device,
                step,
                amp=args.amp,
                scaler=scaler,
                clip_grad=args.clip_grad,
                logger=logger,
                show_progress=show,
                desc=f"epoch {epoch + 1}/{args.epochs}",
            )
            epoch_skipped = {p: r for part in all_gather_object(stats.pop("skipped")) for p, r in part}
            train_skipped.update(epoch_skipped)
            logger.log(
                epoch, "train", lr=optimizer.param_groups[0]["lr"], skipped=len(epoch_skipped), **stats
            )
            _report_skipped(info, logger, epoch, "train", epoch_skipped)
            _print(info, f"epoch {epoch + 1}: loss {stats['loss']:.4f} acc {stats['acc']:.3f}")
            last = epoch + 1 == args.epochs
            if val_loader is not None and (last or (args.eval_every and (epoch + 1) % args.eval_every == 0)):
                metrics = evaluate(
                    model, val_loader, len(classes), info.device, args.reduction, args.amp, show_progress=show
                )
                logger.log(epoch, "val", **{k: v for k, v in metrics.items() if k != "skipped_videos"})
                _report_skipped(
                    info, logger, epoch, "val", {d["path"]: d["reason"] for d in metrics["skipped_videos"]}
                )
                _print(
                    info,
                    f"epoch {epoch + 1}: val top1 {metrics['top1']:.4f} top5 {metrics['top5']:.4f} "
                    f"({metrics['num_videos']} videos, {metrics['num_views']} views, {metrics['skipped']} skipped)",
                )
            rng_ranks = all_gather_object(capture_rng_state())
            if main:
                save_training_state(
                    out / "checkpoint.pt",
                    model=model.state_dict(),
                    optimizer=optimizer.state_dict(),
                    scheduler=scheduler.state_dict(),
                    scaler=scaler.state_dict() if scaler else None,
                    epoch=epoch,
                    step=step,
                    args=_args_dict(args),
                    classes=classes,
                    metrics=metrics,
                    rng=rng_ranks[0],
                    rng_ranks=rng_ranks,
                )
            barrier()
            if args.stop_after_epoch is not None and epoch + 1 >= args.stop_after_epoch and not last:
                _print(info, f"stopping after epoch {epoch + 1} (--stop-after-epoch); resume with --resume")
                break
    except FloatingPointError as e:
        logger.log(step, "error", message=str(e))
        logger.close()
        _print(info, f"ERROR: {e}")
        raise
    logger.close()
    report = {
        **metrics,
        "epochs": args.epochs,
        "steps": step,
        "videos_evaluated": metrics.get("num_videos", 0),
        "train_skipped": len(train_skipped),
        "train_skipped_videos": [{"path": p, "reason": r} for p, r in sorted(train_skipped.items())],
        "checkpoint": str(out / "checkpoint.pt"),
    }
    if main:
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def build_eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m peg_video eval",
        description="Multi-view evaluation of a checkpoint; data and view options "
        "default to the ones it was trained with.",
    )
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--val-ann", type=Path)
    p.add_argument("--val-root", type=Path)
    p.add_argument("--data-backend", choices=("peg", "pytorchvideo"))
    p.add_argument("--num-frames", type=int, help="clip length (may differ from training)")
    p.add_argument("--stride", type=int)
    p.add_argument("--crop", type=int, help="crop size (may differ from training)")
    p.add_argument("--test-scale", type=int)
    p.add_argument("--num-clips", type=int)
    p.add_argument("--num-crops", type=int, choices=(1, 3))
    p.add_argument("--batch-size", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--reduction", choices=("mean", "sum", "max", "logits"))
    p.add_argument(
        "--pos-interpolation",
        choices=("nearest", "bilinear", "bicubic"),
        help="resize mode of a learned table's spatial part at another crop (default: the trained one)",
    )
    p.add_argument("--amp", choices=("none", "bf16", "fp16"))
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, help="write the metrics to OUT/eval_report.json")
    p.add_argument("--no-progress", action="store_true")
    return p


def evaluate_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate a training checkpoint; unset options come from its saved arguments."""
    info = init_distributed(args.device)
    try:
        ckpt = load_checkpoint(args.checkpoint)
        saved = dict(ckpt["args"])
        if args.pos_interpolation is not None:
            saved["model_opts"] = {**saved.get("model_opts", {}), "pos_interpolation": args.pos_interpolation}
        model = build_model(saved, len(ckpt["classes"]))
        model.load_state_dict(ckpt["model"])
        model.to(info.device)
        merged = dict(saved)
        merged.update({k: v for k, v in vars(args).items() if v is not None and k in saved})
        merged["out"] = str(args.out or args.checkpoint.parent)
        if merged.get("test_scale", 0) < merged["crop"]:
            merged["test_scale"] = merged["crop"]
        ns = argparse.Namespace(**merged)
        for key in ("val_ann", "val_root", "train_ann", "train_root", "classes"):
            setattr(ns, key, Path(merged[key]) if merged.get(key) else None)
        ns.train_ann = None
        _, val_ann, classes = load_data(ns, classes=list(ckpt["classes"]))
        loader = make_loader(ns, val_ann, "test", info)[0]
        metrics = evaluate(
            model,
            loader,
            len(classes),
            info.device,
            ns.reduction,
            ns.amp,
            show_progress=info.rank == 0 and not args.no_progress,
        )
        metrics["num_frames"], metrics["crop"] = ns.num_frames, ns.crop
        if info.rank == 0:
            for item in metrics["skipped_videos"]:
                print(f"[eval] skipped broken video {item['path']}: {item['reason']}")
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "eval_report.json").write_text(json.dumps(metrics, indent=1) + "\n")
        return metrics
    finally:
        cleanup_distributed()


def main_train(argv: list[str] | None = None) -> int:
    try:
        report = train(parse_args(argv))
    except FloatingPointError:
        return 2
    except (FileNotFoundError, ValueError) as e:  # bad paths / annotations: a message, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    keys = ("top1", "top5", "mean_class_accuracy", "clip_top1", "videos_evaluated", "train_skipped")
    print(json.dumps({k: report.get(k) for k in keys}))
    return 0


def main_eval(argv: list[str] | None = None) -> int:
    try:
        metrics = evaluate_checkpoint(build_eval_parser().parse_args(argv))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in metrics.items() if k != "skipped_videos"}))
    return 0


if __name__ == "__main__":
    sys.exit(main_train())
