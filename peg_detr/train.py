"""Train or evaluate DETR (PEG / sine / learned / none) on a COCO-format data set.

Single process::

    python -m peg_detr train --coco-path /data/coco --config cpvt_peg_50ep --output-dir runs/peg

Several GPUs / nodes (the recipe's ``total_batch_size`` is split over the processes)::

    torchrun --nproc_per_node 8 -m peg_detr train --coco-path /data/coco --config cpvt_peg_50ep ...

Evaluation only, at several input sizes::

    python -m peg_detr eval --coco-path /data/coco --resume runs/peg/checkpoint.pth --eval-sizes 512,800,1024

Every epoch writes ``checkpoint.pth`` atomically (``--save-every N`` also keeps
``checkpointNNNN.pth``); ``--resume auto`` continues from the output folder's
checkpoint exactly (model, optimizer, scheduler, AMP scaler, epoch and each
rank's RNG).  A NaN/inf loss stops the run before anything is overwritten.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

from peg_core.utils import (
    MetricLogger,
    all_gather_object,
    barrier,
    capture_rng_state,
    cleanup_distributed,
    init_distributed,
    is_main_process,
    load_checkpoint,
    restore_rng_state,
    save_training_state,
    seed_everything,
)

from .configs import CONFIGS, get_config
from .data import (
    CocoDetr,
    collate_detr,
    infer_num_classes,
    make_train_transforms,
    make_val_transforms,
    resolve_coco_paths,
    scaled_max_size,
)
from .engine import evaluate, train_one_epoch

__all__ = ["build_model_from_args", "build_parser", "main", "model_kwargs_from_args", "parse_args"]

# argparse dests forwarded to peg_detr.build_detr as options when set.
_MODEL_OPTIONS = (
    "backbone_weights",
    "hidden_dim",
    "nheads",
    "enc_layers",
    "dec_layers",
    "dim_feedforward",
    "dropout",
    "peg_at",
    "decoder_key_pos",
    "learned_grid",
)


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m peg_detr train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config", choices=sorted(CONFIGS), help="named recipe (peg_detr/configs.py); flags override it"
    )
    g = p.add_argument_group("data")
    g.add_argument("--coco-path", type=Path, help="folder with train2017/, val2017/, annotations/")
    g.add_argument(
        "--train-json", help="training annotation json (default annotations/instances_train2017.json)"
    )
    g.add_argument(
        "--val-json", help="validation annotation json (default annotations/instances_val2017.json)"
    )
    g.add_argument("--num-classes", type=int, help="classifier size; default: max category id + 1")
    g.add_argument("--train-scales", default="480,512,544,576,608,640,672,704,736,768,800")
    g.add_argument("--max-size", type=int, default=1333, help="long-side cap of the training resize")
    g.add_argument(
        "--crop-resize", default="400,500,600", help="sizes before the random crop; '' disables it"
    )
    g.add_argument("--crop-size", default="384,600", help="min,max side of the random crop")
    g.add_argument("--val-size", type=int, default=800, help="short side at evaluation")
    g.add_argument(
        "--eval-sizes", default="", help="comma-separated short sides to evaluate at (AP per size)"
    )
    g.add_argument("--num-workers", type=int, default=2)
    m = p.add_argument_group("model")
    m.add_argument("--backbone", default="resnet50", help="resnet50 | resnet101 | resnet18 | tiny")
    m.add_argument("--backbone-weights", help="local ImageNet weights for the ResNet (nothing is downloaded)")
    m.add_argument("--dilation", action="store_true", help="DC5: dilate the last ResNet stage")
    m.add_argument("--pos-enc", default="peg", help="encoder position encoding: peg | sine | learned | none")
    m.add_argument("--peg-at", help="comma-separated encoder layers followed by a PEG (default: 0)")
    m.add_argument("--decoder-key-pos", help="cross-attention key positions: sine | none | peg-output")
    m.add_argument(
        "--learned-grid",
        help="HxW feature grid the learned table is built for (default: that of an 800x1333 image)",
    )
    m.add_argument("--hidden-dim", type=int)
    m.add_argument("--nheads", type=int)
    m.add_argument("--enc-layers", type=int)
    m.add_argument("--dec-layers", type=int)
    m.add_argument("--dim-feedforward", type=int)
    m.add_argument("--dropout", type=float)
    m.add_argument("--num-queries", type=int, default=100)
    m.add_argument("--no-aux-loss", dest="aux_loss", action="store_false")
    m.add_argument("--pretrained", help="official DETR checkpoint (.pth) to start from")
    m.add_argument("--trust-pickle", action="store_true", help="allow full unpickling of --pretrained")
    t = p.add_argument_group("training")
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--lr-backbone", type=float, default=1e-5)
    t.add_argument("--weight-decay", type=float, default=1e-4)
    t.add_argument("--epochs", type=int, default=300)
    t.add_argument("--lr-drop", type=int, default=200, help="epoch at which the lr is divided by 10")
    t.add_argument(
        "--batch-size", type=int, help="images per process (default: total-batch-size / world size)"
    )
    t.add_argument("--total-batch-size", type=int, default=2, help="images per step over all processes")
    t.add_argument("--clip-max-norm", type=float, default=0.1)
    t.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none", help="autocast on GPU")
    t.add_argument("--device", default="auto", help="auto | cpu | cuda")
    t.add_argument("--threads", type=int, help="torch intra-op CPU threads (default: torch's choice)")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--find-unused-parameters", action="store_true", help="DDP flag; only for frozen branches")
    t.add_argument("--output-dir", type=Path, default=Path("runs/detr"))
    t.add_argument(
        "--resume", help="checkpoint to continue from, or 'auto' (OUTPUT_DIR/checkpoint.pth if any)"
    )
    t.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs (and after the last)")
    t.add_argument("--save-every", type=int, default=0, help="also keep checkpointNNNN.pth every N epochs")
    t.add_argument("--eval-only", action="store_true")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm bars")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``argv``; a ``--config`` recipe supplies defaults that explicit flags override."""
    parser = build_parser()
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        parser.set_defaults(**get_config(pre.config))
    return parser.parse_args(argv)


def model_kwargs_from_args(args: argparse.Namespace, num_classes: int) -> dict[str, Any]:
    """Keyword arguments of ``peg_detr.build_detr`` (json-safe; stored in the checkpoint for predict)."""
    kw: dict[str, Any] = {
        "backbone": args.backbone,
        "pos_enc": args.pos_enc,
        "num_classes": num_classes,
        "num_queries": args.num_queries,
        "dilation": args.dilation,
        "aux_loss": args.aux_loss,
    }
    for name in _MODEL_OPTIONS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "peg_at":
            value = _ints(value)
        elif name == "learned_grid":
            value = _grid(value)
        kw[name] = value
    return kw


def _grid(text: str) -> list[int]:
    """``"5x7"`` -> ``[5, 7]`` (a learned table's feature grid)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--learned-grid expects HxW with positive integers, e.g. 25x42; got {text!r}")
    return [int(p) for p in parts]


def build_model_from_args(kwargs: dict[str, Any]) -> tuple[nn.Module, nn.Module, nn.Module]:
    from . import build_detr

    kw = dict(kwargs)
    return build_detr(kw.pop("backbone"), kw.pop("pos_enc"), **kw)


def _train_dataset(args: argparse.Namespace) -> CocoDetr:
    img_dir, ann = resolve_coco_paths(args.coco_path, "train", args.train_json)
    crop_resize = _ints(args.crop_resize) if args.crop_resize else None
    tf = make_train_transforms(
        _ints(args.train_scales),
        args.max_size,
        crop_resize=crop_resize,
        crop_size=tuple(_ints(args.crop_size)),
    )
    return CocoDetr(img_dir, ann, tf)


def _val_dataset(args: argparse.Namespace, size: int) -> CocoDetr:
    img_dir, ann = resolve_coco_paths(args.coco_path, "val", args.val_json)
    return CocoDetr(img_dir, ann, make_val_transforms(size, scaled_max_size(size)))


def _per_process_batch(args: argparse.Namespace, world_size: int) -> int:
    if args.batch_size is not None:
        return args.batch_size
    if args.total_batch_size % world_size:
        raise SystemExit(
            f"--total-batch-size {args.total_batch_size} is not divisible by the {world_size} processes; "
            "pass --batch-size (per process) instead"
        )
    return args.total_batch_size // world_size


def _json_safe(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def _val_loader(ds: CocoDetr, batch_size: int, workers: int, distributed: bool) -> DataLoader:
    sampler = DistributedSampler(ds, shuffle=False) if distributed else SequentialSampler(ds)
    # Its own generator: creating the loader's iterator must not draw from the global RNG, or a run
    # that evaluates at an epoch would diverge from one that does not (and resume would not be exact).
    return DataLoader(
        ds,
        batch_size,
        sampler=sampler,
        collate_fn=collate_detr,
        num_workers=workers,
        generator=torch.Generator().manual_seed(0),
    )


def _evaluate_sizes(model, postprocessor, args, sizes, batch_size, device, distributed) -> dict[int, dict]:
    table: dict[int, dict] = {}
    for size in sizes:
        ds = _val_dataset(args, size)
        loader = _val_loader(ds, batch_size, args.num_workers, distributed)
        if is_main_process():
            print(f"evaluating at short side {size}", flush=True)
        table[size] = evaluate(
            model, postprocessor, loader, ds.coco, device, amp=args.amp, show_progress=args.progress
        )
    if len(sizes) > 1 and is_main_process():
        print("\nshort side |   AP   |  AP50  |  AP75")
        for size, s in table.items():
            print(f"{size:10d} | {s['ap']:.4f} | {s['ap50']:.4f} | {s['ap75']:.4f}")
    return table


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run training (or ``--eval-only``); return ``{"train": last epoch stats, "eval": {size: stats}}``."""
    args = parse_args(argv)
    if args.coco_path is None:
        raise SystemExit(
            "--coco-path is required (make a synthetic set with `python -m peg_detr make-data DIR`)"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    info = init_distributed(args.device)
    try:
        return _run(args, info)
    finally:
        cleanup_distributed()


def _run(args: argparse.Namespace, info) -> dict[str, Any]:
    device = info.device
    main_proc = is_main_process()
    seed_everything(args.seed, info.rank)
    batch_size = _per_process_batch(args, info.world_size)
    eval_sizes = _ints(args.eval_sizes) if args.eval_sizes else [args.val_size]

    resume_path = None
    if args.resume == "auto":
        candidate = args.output_dir / "checkpoint.pth"
        resume_path = candidate if candidate.is_file() else None
    elif args.resume:
        resume_path = Path(args.resume)
    ckpt = load_checkpoint(resume_path) if resume_path is not None else None

    split = "val" if args.eval_only else "train"
    ref_json = resolve_coco_paths(
        args.coco_path, split, args.val_json if args.eval_only else args.train_json
    )[1]
    train_ds = None if args.eval_only else _train_dataset(args)
    categories = train_ds.categories if train_ds is not None else _val_dataset(args, args.val_size).categories
    if ckpt is not None and "model_kwargs" in ckpt and args.eval_only:
        model_kwargs = dict(ckpt["model_kwargs"])
    else:
        num_classes = args.num_classes
        if num_classes is None:
            num_classes = infer_num_classes(categories)
            if main_proc:
                print(
                    f"--num-classes not given: using {num_classes} (max category id in {ref_json.name} + 1)"
                )
        model_kwargs = model_kwargs_from_args(args, num_classes)

    model, criterion, postprocessor = build_model_from_args(model_kwargs)
    # The builder records every setting it used; store that so predict/eval rebuild the same model.
    model_kwargs = dict(getattr(model, "build_config", model_kwargs))
    if args.pretrained and ckpt is None:
        from . import load_official_checkpoint

        load_official_checkpoint(
            model, args.pretrained, trust_pickle=args.trust_pickle, num_classes=model_kwargs["num_classes"]
        )
    model.to(device)
    criterion.to(device)
    from .models import param_groups

    optimizer = torch.optim.AdamW(
        param_groups(model, args.lr, args.lr_backbone, args.weight_decay),
        lr=args.lr,
        weight_decay=args.weight_decay,
    )
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_drop)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "fp16" and device.type == "cuda")
    if args.amp != "none" and device.type != "cuda" and main_proc:
        print(f"--amp {args.amp} applies on CUDA only; running in float32 on {device}")

    start_epoch = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        if not args.eval_only:
            optimizer.load_state_dict(ckpt["optimizer"])
            lr_scheduler.load_state_dict(ckpt["lr_scheduler"])
            if "scaler" in ckpt:
                scaler.load_state_dict(ckpt["scaler"])
            start_epoch = int(ckpt["epoch"]) + 1
            per_rank = ckpt.get("rng_per_rank")
            if per_rank is not None and len(per_rank) == info.world_size:
                restore_rng_state(per_rank[info.rank])
            else:  # different world size: keep the run reproducible, if not bit-identical
                seed_everything(args.seed + start_epoch, info.rank)
        if main_proc:
            print(f"resumed from {resume_path} (epoch {ckpt.get('epoch')})")

    model_without_ddp = model
    if info.distributed:
        model = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=args.find_unused_parameters,
        )

    if args.eval_only:
        table = _evaluate_sizes(model, postprocessor, args, eval_sizes, batch_size, device, info.distributed)
        return {"train": None, "eval": table}

    out = args.output_dir
    if main_proc:
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(json.dumps(_json_safe(args), indent=2) + "\n")
        label_map = {"num_classes": model_kwargs["num_classes"], "categories": categories}
        (out / "label_map.json").write_text(json.dumps(label_map, indent=2) + "\n")
    logger = MetricLogger(out, enabled=main_proc)

    sampler = DistributedSampler(train_ds, shuffle=True, seed=args.seed) if info.distributed else None
    loader_gen = torch.Generator()
    train_loader = DataLoader(
        train_ds,
        batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        generator=loader_gen,
        collate_fn=collate_detr,
        num_workers=args.num_workers,
        drop_last=True,
        persistent_workers=False,
    )
    result: dict[str, Any] = {"train": None, "eval": {}}
    steps_per_epoch = len(train_loader)
    t0 = time.time()
    try:
        for epoch in range(start_epoch, args.epochs):
            # Shuffling depends on (seed, epoch) only, so a resumed run sees the same order.
            loader_gen.manual_seed(args.seed * 1000 + epoch)
            if sampler is not None:
                sampler.set_epoch(epoch)
            stats = train_one_epoch(
                model,
                criterion,
                train_loader,
                optimizer,
                device,
                epoch,
                clip_max_norm=args.clip_max_norm,
                amp=args.amp,
                scaler=scaler,
                logger=logger,
                global_step=epoch * steps_per_epoch,
                show_progress=args.progress and main_proc,
            )
            lr_scheduler.step()
            logger.log(epoch, "train", **stats, lr=optimizer.param_groups[0]["lr"])
            result["train"] = stats
            if main_proc:
                print(f"epoch {epoch}: loss {stats['loss']:.4f} ({time.time() - t0:.0f} s)", flush=True)
            last = epoch + 1 == args.epochs
            if last or (args.eval_every > 0 and (epoch + 1) % args.eval_every == 0):
                result["eval"] = _evaluate_sizes(
                    model, postprocessor, args, eval_sizes, batch_size, device, info.distributed
                )
                for size, s in result["eval"].items():
                    logger.log(epoch, f"val_{size}", **s)
            _save(
                out, epoch, model_without_ddp, optimizer, lr_scheduler, scaler, args, model_kwargs, categories
            )
    except FloatingPointError as e:
        if main_proc:
            kept = out / "checkpoint.pth"
            where = (
                f"the last good checkpoint is {kept}" if kept.is_file() else "no checkpoint was written yet"
            )
            print(f"\nERROR: {e}\nTraining stopped; {where}.", file=sys.stderr, flush=True)
        raise
    finally:
        logger.close()
    return result


def _save(out, epoch, model, optimizer, lr_scheduler, scaler, args, model_kwargs, categories) -> None:
    rng_per_rank = all_gather_object(capture_rng_state())  # every rank's RNG, for an exact resume
    if is_main_process():
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": epoch,
            "args": _json_safe(args),
            "model_kwargs": model_kwargs,
            "categories": categories,
            "rng": rng_per_rank[0],
            "rng_per_rank": rng_per_rank,
        }
        save_training_state(out / "checkpoint.pth", **state)
        if args.save_every > 0 and (epoch + 1) % args.save_every == 0:
            save_training_state(out / f"checkpoint{epoch:04d}.pth", **state)
    barrier()


if __name__ == "__main__":
    main()
