"""DataLoaders of either back-end, sharded over the ranks, yielding :class:`~peg_core.engine.SampleBatch`."""

from __future__ import annotations

import argparse
from pathlib import Path

from torch.utils.data import DataLoader, DistributedSampler

from peg_core.dist import DistInfo
from peg_core.engine import SkipBroken
from peg_core.engine.accum import step_batch_size
from peg_core.errors import InputError

from .annotations import Annotations
from .clip import ClipSpec
from .kinetics import ClipBatches, KineticsVideoDataset
from .transforms import RRC_RATIO, RRC_SCALE, ClipTransformConfig

__all__ = ["LoaderOptionError", "make_loader", "repeated_aug", "transform_config"]


class LoaderOptionError(InputError):
    """Data options that exclude each other (a flip on SSv2, the peg back-end's options on pytorchvideo).

    A library error (:class:`~peg_core.errors.InputError`): ``what`` says why, ``where`` names the
    options as the command line spells them; the command line prints it as one line.
    """


def transform_config(args: argparse.Namespace, clip: ClipSpec | None = None) -> ClipTransformConfig:
    """The spatial recipe of ``args`` (``scale_jitter``, ``test_scale``, ``num_crops``, ``hflip``,
    ``rand_augment``, ``random_erasing``, ``train_crop``, ``rrc_scale``, ``rrc_ratio``) with the crop and
    normalisation of the run's clip (``clip``; by default the one ``args`` records, :meth:`ClipSpec.of_run`).

    A flip is refused for SSv2 here too (not only by the parser), so no other way of building
    the arguments can train it with flipped "left to right" clips.
    """
    if args.hflip and getattr(args, "dataset", "kinetics") == "ssv2":
        raise LoaderOptionError(
            "horizontal flips contradict SSv2's left / right labels", "--hflip with --dataset ssv2"
        )
    clip = ClipSpec.of_run(args) if clip is None else clip
    return ClipTransformConfig(
        crop=clip.crop,
        train_scale=tuple(args.scale_jitter),  # --scale-jitter
        test_scale=args.test_scale,
        num_crops=args.num_crops,
        hflip=bool(args.hflip),
        # the run's normalisation (an --init folder's); runs from before --mean / --std: Kinetics'
        mean=clip.mean,
        std=clip.std,
        # runs from before these flags: off
        rand_augment=getattr(args, "rand_augment", None),
        random_erasing=float(getattr(args, "random_erasing", 0.0) or 0.0),
        train_crop=getattr(args, "train_crop", None) or "jitter",
        rrc_scale=tuple(getattr(args, "rrc_scale", None) or RRC_SCALE),
        rrc_ratio=tuple(getattr(args, "rrc_ratio", None) or RRC_RATIO),
    )


def repeated_aug(args: argparse.Namespace) -> int:
    """``--repeated-aug K``: training clips per video and visit (1: off; runs from before the flag: 1)."""
    return int(getattr(args, "repeated_aug", 1) or 1)


def _check_pytorchvideo(args: argparse.Namespace, cfg: ClipTransformConfig) -> None:
    """The pytorchvideo back-end has its own train pipeline: the peg back-end's options are refused."""
    if getattr(args, "sampling", "stride") != "stride":
        raise LoaderOptionError("segment sampling needs the peg back-end", "--data-backend pytorchvideo")
    peg_only = {"--rand-augment": cfg.rand_augment, "--random-erasing": cfg.random_erasing,
                "--repeated-aug": repeated_aug(args) > 1,
                "--train-crop rrc": cfg.train_crop == "rrc"}  # fmt: skip
    flags = [flag for flag, on in peg_only.items() if on]
    if flags:
        raise LoaderOptionError(f"no {', '.join(flags)} in this back-end (the peg back-end has them)",
                        "--data-backend pytorchvideo")  # fmt: skip


def make_loader(
    args: argparse.Namespace,
    ann: Annotations,
    mode: str,
    dist: DistInfo,
    list_dir: Path,
    clip: ClipSpec | None = None,
) -> tuple[DataLoader, object]:
    """``(loader, dataset)`` of ``mode`` (``"train"`` / ``"test"``) for ``args.data_backend``.

    Clips are the run's :class:`~peg_video.data.clip.ClipSpec` (``clip``; by default the one
    ``args`` records): its frames, stride, crop and normalisation.

    Test batches hold ``batch_size // views`` videos (at least one), so a batch is about as
    heavy as a training one.  Training batches hold ``batch_size`` videos, which are
    ``K * batch_size`` clips with ``--repeated-aug K`` (VideoMAE's count): an epoch is
    ``ceil(ceil(videos / world_size) / batch_size)`` steps whatever ``K``.  The pytorchvideo
    back-end writes its ``path label`` list into ``list_dir``.  Call ``dataset.set_epoch(epoch)``
    (and the sampler's) before each epoch.
    """
    clip = ClipSpec.of_run(args) if clip is None else clip
    cfg = transform_config(args, clip)
    views = args.num_clips * args.num_crops if mode == "test" else 1
    # a training batch is one optimizer step's: --grad-accum-steps micro-batches of --batch-size
    batch = step_batch_size(args) if mode == "train" else max(1, args.batch_size // views)
    common = {
        "batch_size": batch,
        "num_workers": args.workers,
        "pin_memory": dist.device.type == "cuda",
        "collate_fn": ClipBatches(),
    }
    if args.data_backend == "pytorchvideo":
        _check_pytorchvideo(args, cfg)
        from .pytorchvideo_data import build_pytorchvideo_dataset

        ds = build_pytorchvideo_dataset(
            ann,
            Path(list_dir) / f"{mode}_pytorchvideo_rank{dist.rank}.txt",
            mode,
            clip.num_frames,
            clip.stride,
            cfg,
            num_clips=args.num_clips,
            world_size=dist.world_size,
        )
        return DataLoader(ds, **common), ds
    ds = KineticsVideoDataset(
        ann,
        mode,
        clip.num_frames,
        clip.stride,
        num_clips=args.num_clips,
        transform=cfg,
        seed=args.seed,
        sampling=getattr(args, "sampling", "stride"),
        repeats=repeated_aug(args) if mode == "train" else 1,
    )
    sampler = DistributedSampler(
        ds, num_replicas=dist.world_size, rank=dist.rank, shuffle=mode == "train", seed=args.seed
    )
    return DataLoader(SkipBroken(ds), sampler=sampler, **common), ds
