"""The three experiments of ``python -m tools.study``: one per package, same protocol.

Each ``run_*`` trains the task's model once per position encoding (same data,
budget and seed), evaluates every trained model at the training size and at
other sizes with the same weights, evaluates a learned table once per resize
mode, measures the encoding's parameters and FLOPs at the training size
(:mod:`tools.study_cost`) and returns a :class:`TaskResult`.

Everything goes through the packages' own public code paths: the classifier
through :mod:`tools.classify`, DETR through ``python -m peg_detr train`` /
``peg_detr.engine.evaluate``, the video model through ``python -m peg_video
train`` / ``eval``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from peg_core.utils import atomic_save, load_checkpoint, seed_everything

from .study_cost import encoding_cost

__all__ = ["BUDGETS", "MODES", "Budget", "Row", "TaskResult", "run_classify", "run_detect", "run_video"]

#: resize modes a learned table is evaluated with at other sizes (the first is each model's default)
MODES = ("bicubic", "bilinear", "nearest")


@dataclass(frozen=True)
class Budget:
    """Training budget of one encoding (identical for every encoding of a task)."""

    epochs: int
    n_train: int
    n_val: int
    train_size: int  # classify: image side; detect: image short side; video: crop side
    batch_size: int = 8


#: (task, quick) -> budget; the full ones fit --task all in ~15 min on 2 CPU cores
BUDGETS: dict[tuple[str, bool], Budget] = {
    ("classify", False): Budget(epochs=6, n_train=2048, n_val=512, train_size=48, batch_size=32),
    ("classify", True): Budget(epochs=1, n_train=64, n_val=32, train_size=32, batch_size=32),
    ("detect", False): Budget(epochs=6, n_train=1024, n_val=100, train_size=80, batch_size=4),
    ("detect", True): Budget(epochs=1, n_train=8, n_val=4, train_size=64, batch_size=4),
    ("video", False): Budget(epochs=24, n_train=240, n_val=60, train_size=32, batch_size=8),
    ("video", True): Budget(epochs=1, n_train=12, n_val=6, train_size=32, batch_size=4),
}
IMAGE_SCALES = (0.75, 1.0, 1.5, 2.0)


@dataclass
class Row:
    """One line of a task table: an encoding (and resize mode for a learned table)."""

    label: str
    encoding: str
    mode: str | None
    scores: dict[str, float]  # test-size label -> metric
    params: int
    flops: int
    extra: dict[str, dict[str, float]] = field(default_factory=dict)  # other metrics per size


@dataclass
class TaskResult:
    task: str
    metric: str
    train_size: str
    sizes: list[str]
    rows: list[Row]
    budget: dict[str, Any]
    data: str
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rows_for(
    enc: str, evaluate_at: callable, modes: tuple[str | None, ...], params: int, flops: int
) -> list[Row]:
    rows = []
    for mode in modes:
        scores, extra = evaluate_at(mode)
        label = enc if mode is None else f"{enc} ({mode})"
        rows.append(Row(label, enc, mode, scores, params, flops, extra))
    return rows


def _modes(enc: str) -> tuple[str | None, ...]:
    return MODES if enc == "learned" else (None,)


# ------------------------------------------------------------------------------------------- classify


def run_classify(out: Path, quick: bool, seed: int, data: Path | None = None, epochs: int | None = None):
    """CPVT (small, :data:`tools.classify.DEMO_CONFIG`) with peg / sincos / learned / none."""
    from peg_core.data import make_shape_splits

    from .classify import DEMO_CONFIG, evaluate_sizes, scaled_sizes, train_classifier

    budget = BUDGETS["classify", quick]
    epochs = epochs or budget.epochs
    size = budget.train_size
    if data is None:
        splits = make_shape_splits(budget.n_train, budget.n_val, seed=seed)
        train_data, val = splits, splits[1]
        data_name = f"generated shapes ({budget.n_train} train / {budget.n_val} val)"
    else:
        train_data, val = data, data / "val"
        data_name = str(data)
    sizes = scaled_sizes(size, IMAGE_SCALES)
    labels = [f"{s} px" for s in sizes]
    rows: list[Row] = []
    for enc in ("peg", "sincos", "learned", "none"):
        model, _ = train_classifier(
            enc, epochs=epochs, seed=seed, img_size=size, data=train_data, n_train=budget.n_train,
            n_val=budget.n_val, batch_size=budget.batch_size, out_dir=out / enc,
        )  # fmt: skip
        x = torch.zeros(1, 3, size, size)
        cost = encoding_cost(
            {"pos_enc": model.pos_enc, "pos_blocks": model.pos_blocks}, lambda m=model, x=x: m(x)
        )

        def evaluate_at(mode, model=model):
            by_size = evaluate_sizes(model, val, sizes, mode=mode)
            return {lab: by_size[s] for lab, s in zip(labels, sizes)}, {}

        rows += _rows_for(enc, evaluate_at, _modes(enc), cost.params, cost.flops)
        print(f"[study classify] {enc}: " + _fmt_scores(rows[-1].scores), flush=True)
    return TaskResult(
        "classify", "top-1", f"{size} px", labels, rows,
        {**asdict(budget), "epochs": epochs, "model": _describe(DEMO_CONFIG)}, data_name,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------- detect


def _detr_eval(
    ckpt_path: Path, coco: Path, sizes: list[int], mode: str | None, batch: int
) -> dict[int, dict]:
    """COCO numbers of a ``peg_detr`` checkpoint at each short side (learned table resized with ``mode``)."""
    from torch.utils.data import DataLoader

    from peg_detr.data import CocoDetr, collate_detr, make_val_transforms, resolve_coco_paths, scaled_max_size
    from peg_detr.engine import evaluate
    from peg_detr.train import build_model_from_args

    ckpt = load_checkpoint(ckpt_path)
    model, _, post = build_model_from_args(dict(ckpt["model_kwargs"]))
    model.load_state_dict(ckpt["model"])
    pos = model.transformer.encoder.pos
    if mode is not None:
        pos.interpolation = mode
    img_dir, ann = resolve_coco_paths(coco, "val", None)
    table = {}
    for s in sizes:
        ds = CocoDetr(img_dir, ann, make_val_transforms(s, scaled_max_size(s)))
        loader = DataLoader(ds, batch, collate_fn=collate_detr)
        table[s] = evaluate(
            model, post, loader, ds.coco, torch.device("cpu"), show_progress=False, verbose=False
        )
    return table


def run_detect(out: Path, quick: bool, seed: int, data: Path | None = None, epochs: int | None = None):
    """Tiny DETR (``demo_tiny`` recipe) with peg / sine / learned / none in the encoder."""
    from peg_detr.data import SyntheticSpec, make_synthetic_coco
    from peg_detr.train import build_model_from_args
    from peg_detr.train import main as train_main

    budget = BUDGETS["detect", quick]
    epochs = epochs or budget.epochs
    size = budget.train_size
    if data is None:
        data = out / "data"
        spec = SyntheticSpec(size=size, num_classes=3, min_objects=1, max_objects=3)
        make_synthetic_coco(data, budget.n_train, budget.n_val, seed=seed, spec=spec)
        data_name = f"synthetic COCO shapes ({budget.n_train} train / {budget.n_val} val, {size} px)"
    else:
        data_name = str(data)
    sizes = [round(size * s) for s in IMAGE_SCALES]
    labels = [f"{s} px" for s in sizes]
    rows: list[Row] = []
    for enc in ("peg", "sine", "learned", "none"):
        run_dir = out / enc
        argv = [
            "--config", "demo_tiny", "--coco-path", str(data), "--output-dir", str(run_dir),
            "--pos-enc", enc, "--epochs", str(epochs), "--lr-drop", str(max(1, epochs * 5 // 6)),
            "--total-batch-size", str(budget.batch_size), "--seed", str(seed),
            # one training size (no multi-scale, no crop): every other test size is unseen
            "--train-scales", str(size), "--crop-resize", "", "--val-size", str(size),
            "--max-size", str(2 * size), "--eval-sizes", str(size), "--eval-every", "0",
            "--num-workers", "0", "--no-progress", "--device", "cpu",
        ]  # fmt: skip
        train_main(argv)
        ckpt = run_dir / "checkpoint.pth"
        model, _, _ = build_model_from_args(dict(load_checkpoint(ckpt)["model_kwargs"]))
        enc_mods = model.transformer.encoder
        n_layers = len(enc_mods.layers)
        x = [torch.zeros(3, size, size)]
        model.eval()
        cost = encoding_cost(
            {"pos": enc_mods.pos, "pegs": enc_mods.pegs}, lambda m=model, x=x: m(x), qk_uses=n_layers
        )

        def evaluate_at(mode, ckpt=ckpt):
            table = _detr_eval(ckpt, data, sizes, mode, budget.batch_size)
            scores = {lab: table[s]["ap50"] for lab, s in zip(labels, sizes)}
            return scores, {"ap": {lab: table[s]["ap"] for lab, s in zip(labels, sizes)}}

        rows += _rows_for(enc, evaluate_at, _modes(enc), cost.params, cost.flops)
        print(f"[study detect] {enc}: " + _fmt_scores(rows[-1].scores), flush=True)
    notes = [
        "Decoder cross-attention keys use DETR's sine codes for every encoder variant "
        "(peg_detr's default `decoder_key_pos=sine`), so the rows differ in the encoder only.",
        "The learned table of peg_detr is built for an 800x1333 image and resized to each image's "
        "feature grid, so it is interpolated even at the training size.",
    ]
    return TaskResult(
        "detect", "AP50", f"{size} px", labels, rows,
        {**asdict(budget), "epochs": epochs, "model": "DETR demo_tiny (tiny backbone, 2+2 layers, dim 64)"},
        data_name, notes=notes,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- video


def _video_views(train_frames: int, crop: int, tubelet_hw: int) -> list[tuple[str, int, int]]:
    """(label, frames, crop): half, same and double clip length, then a larger crop."""
    big = crop + 2 * tubelet_hw
    return [
        (f"{train_frames // 2} fr", train_frames // 2, crop),
        (f"{train_frames} fr", train_frames, crop),
        (f"{train_frames * 2} fr", train_frames * 2, crop),
        (f"{train_frames} fr, {big} px", train_frames, big),
    ]


def _video_eval(ckpt_path: Path, frames: int, crop: int, mode: str | None, batch: int) -> dict[str, Any]:
    """``python -m peg_video eval`` on a checkpoint; a learned table resized with ``mode``.

    The eval command rebuilds the model and transforms from the arguments saved in the checkpoint,
    so a resize mode goes into a copy of it (``model_opts``), and so does a training scale raised
    to the test crop (the transform config checks it even when only evaluating).
    """
    from peg_video.train import build_eval_parser, evaluate_checkpoint

    ckpt = load_checkpoint(ckpt_path)
    saved = ckpt["args"]
    path = ckpt_path
    if mode is not None or min(saved["train_scale"]) < crop:
        if mode is not None:
            saved["model_opts"] = {**saved.get("model_opts", {}), "pos_interpolation": mode}
        saved["train_scale"] = [max(crop, s) for s in saved["train_scale"]]
        path = ckpt_path.with_name(f"checkpoint_eval_{mode or 'default'}_{crop}.pt")
        atomic_save(ckpt, path)
    argv = ["--checkpoint", str(path), "--num-frames", str(frames), "--crop", str(crop)]
    argv += ["--batch-size", str(batch), "--device", "cpu", "--no-progress", "--workers", "0"]
    return evaluate_checkpoint(build_eval_parser().parse_args(argv))


def run_video(out: Path, quick: bool, seed: int, data: Path | None = None, epochs: int | None = None):
    """Tiny video ViT (``synthetic_tiny``) with peg3d / peg3d-factorized / learned / none.

    ``data``: a folder with ``train.csv`` + ``val.csv`` (or ``train.txt`` + ``val.txt``) and the videos.
    """
    from peg_video.configs import CONFIGS
    from peg_video.data.synthetic import SyntheticSpec, make_synthetic_kinetics
    from peg_video.train import build_model, parse_args, train

    budget = BUDGETS["video", quick]
    epochs = epochs or budget.epochs
    if data is None:
        data = out / "data"
        make_synthetic_kinetics(
            data, SyntheticSpec(num_train=budget.n_train, num_val=budget.n_val, seed=seed)
        )
        data_name = f"synthetic Kinetics moving shapes ({budget.n_train} train / {budget.n_val} val videos)"
    else:
        data_name = str(data)
    ann = {split: _annotation(data, split) for split in ("train", "val")}
    cfg = CONFIGS["synthetic_tiny"]
    frames, crop = cfg["num_frames"], budget.train_size
    views = _video_views(frames, crop, cfg["tubelet"][1])
    rows: list[Row] = []
    for enc in ("peg3d", "peg3d-factorized", "learned", "none"):
        run_dir = out / enc
        argv = [
            "--config", "synthetic_tiny", "--train-ann", str(ann["train"]), "--val-ann", str(ann["val"]),
            "--pos-enc", enc,
            "--out", str(run_dir), "--epochs", str(epochs), "--batch-size", str(budget.batch_size),
            "--crop", str(crop), "--seed", str(seed), "--eval-every", "0", "--device", "cpu", "--no-progress",
        ]  # fmt: skip
        report = train(parse_args(argv))
        ckpt_path = Path(report["checkpoint"])
        ckpt = load_checkpoint(ckpt_path)
        seed_everything(seed)
        model = build_model(dict(ckpt["args"]), len(ckpt["classes"])).eval()
        x = torch.zeros(1, 3, frames, crop, crop)
        cost = encoding_cost(
            {"pos_enc": model.pos_enc, "pos_blocks": model.pos_blocks}, lambda m=model, x=x: m(x)
        )

        def evaluate_at(mode, ckpt_path=ckpt_path):
            res = {lab: _video_eval(ckpt_path, t, c, mode, budget.batch_size) for lab, t, c in views}
            return {k: v["top1"] for k, v in res.items()}, {"top5": {k: v["top5"] for k, v in res.items()}}

        rows += _rows_for(enc, evaluate_at, _modes(enc), cost.params, cost.flops)
        print(f"[study video] {enc}: " + _fmt_scores(rows[-1].scores), flush=True)
    notes = [
        "Clip length changes the number of frames at the training stride (2); "
        f"the larger crop shows {views[-1][2]} px instead of {crop} px. "
        "A learned table's temporal part is resized linearly, its spatial part with the mode shown."
    ]
    return TaskResult(
        "video", "top-1", views[1][0], [v[0] for v in views], rows,
        {**asdict(budget), "epochs": epochs, "model": _describe(cfg["model_opts"], f"video {cfg['model']}")},
        data_name, notes=notes,
    )  # fmt: skip


def _annotation(root: Path, split: str) -> Path:
    for ext in ("csv", "txt"):
        if (root / f"{split}.{ext}").is_file():
            return root / f"{split}.{ext}"
    raise FileNotFoundError(f"{root} has no {split}.csv or {split}.txt (Kinetics CSV or 'path label' list)")


def _describe(cfg: dict[str, Any], name: str = "CPVT demo") -> str:
    """``CPVT demo (embed_dim 64, depth 4, ...)`` from a model configuration."""
    return f"{name} (" + ", ".join(f"{k} {v}" for k, v in cfg.items()) + ")"


def _fmt_scores(scores: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in scores.items())


TASKS = {"classify": run_classify, "detect": run_detect, "video": run_video}


def timed(fn, *args, **kwargs) -> TaskResult:
    t0 = time.time()
    result = fn(*args, **kwargs)
    result.seconds = round(time.time() - t0, 1)
    return result
