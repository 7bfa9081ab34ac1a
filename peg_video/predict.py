"""``python -m peg_video predict``: classify video files with a trained checkpoint (:class:`Predictor`; flags: ``peg_video.cli``).

    python -m peg_video predict --checkpoint runs/video/checkpoint.pth a.mp4 b.mp4 [--top-k 5]

Each video is seen as the training run's test views (``--num-clips`` × ``--num-crops``); the
softmax of the views is averaged.  Prints one line per video (``PATH: class p, ...``, or
``PATH: skipped (<reason>)`` for a missing or unreadable one) and a closing line; ``--json`` prints
the report (``{"command": "predict", "predictions": [...], ...}``) instead, and ``--output FILE``
writes it.  Exit status 0 when a video was read, 1 when none could be.
In Python::

    from peg_video.predict import Predictor
    predictor = Predictor.from_checkpoint("runs/video/checkpoint.pth", device="cpu", top_k=3)
    print(predictor.predict_files(["a.mp4"])[0].line())

``from_checkpoint`` also takes a Hugging Face video classifier (VideoMAE / TimeSformer / V-JEPA 2),
as a folder or a hub id (``"MCG-NJU/videomae-small-finetuned-kinetics"``, fetched once into the hub
cache): its ``id2label`` names the classes, and a video is seen as ``train --init FOLDER`` would
see it (the folder's frames, crop and normalisation).

``predictor(inputs)`` also takes clips already at the model's input: a ``(C, T, H, W)`` tensor
or the views of one video ``(V, C, T, H, W)`` (normalised as in training).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from peg_core.engine import LoadedModel
from peg_core.engine.predict_cli import predict_device, predict_paths
from peg_core.engine.predictor import ClassPrediction, FilePredictor, check_int, resolve_device
from peg_core.errors import InputError
from peg_core.interop.io import WeightsError
from peg_core.interop.resolve import resolve_weights

from .configs import DEFAULTS, folder_clip
from .data import Annotations, KineticsVideoDataset, VideoRecord
from .data.loaders import transform_config
from .interop.hf import hf_build_config, load_hf_model, read_hf_video_config
from .model import check_clip_fits, load_model

__all__ = ["Prediction", "Predictor", "predict"]

#: the video model's result: ``top`` = ``[(class name, probability), ...]``, best first
Prediction = ClassPrediction
#: view options a prediction may change (default: the training run's)
VIEW_OPTIONS = ("num_frames", "num_clips", "num_crops")


class Predictor(FilePredictor):
    """A video model restored from a ``peg_video train`` checkpoint; ``predictor(inputs) -> list[Prediction]``.

    ``views``: ``num_frames``, ``num_clips``, ``num_crops`` (default: the training run's test views).
    A clip that does not split into the model's tubelets is a :class:`UserError` here, before
    any video is decoded.  Bad options are a ``TypeError`` / ``ValueError`` naming them, and a
    device this machine lacks one ``ValueError``, before the checkpoint is read.

    In-memory inputs are float clips at the model's input, normalised as in training (``(pixels
    in [0, 1] - mean) / std``): ``(C, T, H, W)`` or the views of one video ``(V, C, T, H, W)``,
    checked by :func:`peg_core.engine.predictor.as_clip` (NaN, 0-255 pixels, other channel counts
    and clips that do not split into the model's tubelets are a ``ValueError`` naming the argument).
    """

    input_kind = "clip"

    def __init__(
        self, checkpoint: str | os.PathLike, device: str = "cpu", top_k: int = 5, **views: int | None
    ) -> None:
        unknown = sorted(set(views) - set(VIEW_OPTIONS))
        if unknown:
            raise TypeError(f"unknown view options {unknown}; expected some of {VIEW_OPTIONS}")
        self.device = resolve_device(device)
        top_k = check_int(top_k, "top_k")
        views = {k: v if v is None else check_int(v, k) for k, v in views.items()}
        if views.get("num_crops") not in (None, 1, 3):
            raise ValueError(f"num_crops must be 1 or 3, got {views['num_crops']}")
        loaded = _load(checkpoint)
        self.model = loaded.model.to(self.device).eval()
        self.classes = loaded.classes
        self.top_k = min(top_k, len(self.classes))
        self.run_args = argparse.Namespace(
            **{**loaded.args, **{k: v for k, v in views.items() if v is not None}}
        )
        check_clip_fits(self.model, self.run_args)
        spatial = transform_config(self.run_args)
        # a normalised pixel lies in [(0 - mean) / std, (1 - mean) / std] of its channel
        self.clip_range = (
            min(-m / s for m, s in zip(spatial.mean, spatial.std)),
            max((1 - m) / s for m, s in zip(spatial.mean, spatial.std)),
        )

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device: str = "cpu", **options: Any) -> Predictor:
        """``options``: ``top_k`` (5) and the view options ``num_frames``, ``num_clips``, ``num_crops``.

        ``path`` may also be a Hugging Face VideoMAE / TimeSformer / V-JEPA 2 classifier folder or hub
        id (its ``id2label`` names the classes; an encoder without a classifier is refused).
        """
        return cls(path, device, **options)

    def read(self, path: str) -> torch.Tensor:
        """The test views ``(V, C, T, S, S)`` of the video in ``path``; :class:`BrokenSample` when unreadable."""
        run = self.run_args
        ds = KineticsVideoDataset(
            Annotations([VideoRecord(Path(path), 0)], self.classes), "test", run.num_frames, run.stride, run.num_clips,
            transform_config(run), sampling=getattr(run, "sampling", None) or "stride",  # SSv2: segments
        )  # fmt: skip
        return ds[0]["video"]

    def prepare(self, item: torch.Tensor) -> torch.Tensor:
        """A checked clip or views (:meth:`normalise`'s) -> views ``(V, C, T, H, W)``."""
        views = item.unsqueeze(0) if item.dim() == 4 else item  # one clip: one view
        tubelet = getattr(self.model, "tubelet", None)  # transformers only (X3D has none)
        if tubelet is not None and any(n % t for n, t in zip(views.shape[-3:], tubelet)):
            raise InputError(f"a clip of (T, H, W) = {tuple(views.shape[-3:])} does not split into the "
                             f"model's tubelets {tuple(tubelet)}")  # fmt: skip
        return views

    def run(self, paths: list[str | None], items: list[torch.Tensor]) -> list[Prediction]:
        out = []
        for path, views in zip(paths, items):  # one video at a time: its views are the batch
            probs = self.model(views.to(self.device)).float().softmax(-1).mean(0)  # (K,)
            top = probs.topk(self.top_k)
            out.append(Prediction(path, top=[(self.classes[j], round(p, 4)) for p, j in
                                              zip(top.values.tolist(), top.indices.tolist())]))  # fmt: skip
        return out

    def skipped(self, path: str, reason: str) -> Prediction:
        return Prediction(path, skipped=reason)


def _load(checkpoint: str | os.PathLike) -> LoadedModel:
    """A training checkpoint (:func:`load_model`), or a Hugging Face video folder / hub id (:func:`_load_hf`)."""
    path = resolve_weights(checkpoint, kind="folder").path  # a Path or an existing path stays itself
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf(path)
    return load_model(checkpoint)


def _load_hf(folder: Path) -> LoadedModel:
    """The classifier of a Hugging Face video folder, its ``id2label`` as the classes, and the run
    arguments :func:`_folder_run` gives it; an encoder (no classifier) is one :class:`WeightsError`."""
    info = read_hf_video_config(folder)
    if not info["classifier"]:
        raise WeightsError(
            f"a {info['architecture'] or info['model_type']} has no classifier to predict classes with; "
            "fine-tune it first (python -m peg_video train --init FOLDER)",
            info["config_file"],
        )
    config = hf_build_config(info)
    model, _ = load_hf_model(info, config)
    classes = [info["id2label"][i] for i in range(info["num_classes"])]
    return LoadedModel(model, config, classes, {}, _folder_run(info))


def _folder_run(info: dict[str, Any]) -> dict[str, Any]:
    """The run arguments of a folder: the parser's defaults and views, the folder's clip
    (:func:`peg_video.configs.folder_clip`, as ``train --init FOLDER`` reads it)."""
    clip = folder_clip(info)
    return {**DEFAULTS, **clip, "tubelet": list(clip["tubelet"]), "mean": list(clip["mean"]),
            "std": list(clip["std"]), "sampling": "stride", "dataset": "kinetics"}  # fmt: skip


def predict(args: argparse.Namespace) -> list[Prediction]:
    """Top-k classes of each of ``args.files`` (:func:`peg_video.cli.build_predict_parser`), in order.

    Unreadable videos come back skipped; the verb (:func:`peg_core.engine.predict_cli.finish_predict`)
    lists them and says when none could be read.
    """
    device = predict_device(args.device)
    views = {k: getattr(args, k) for k in VIEW_OPTIONS}
    # the text typed (argparse made it a Path): a hub id is resolved, as from Python
    predictor = Predictor.from_checkpoint(os.fspath(args.checkpoint), device, top_k=args.top_k, **views)
    from .task import check_clip_memory  # the clip's largest tensor, before any video is decoded

    run = predictor.run_args
    check_clip_memory(predictor.model, run, run.num_clips * run.num_crops, args, device)
    return predict_paths(predictor, args.files)
