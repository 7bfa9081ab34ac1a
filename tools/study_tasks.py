"""The three experiments of ``python -m tools.study``: one per package, same protocol.

Each ``run_*`` trains the task's model once per position encoding (same data,
budget and seed), evaluates every trained model at the training size and at
other sizes with the same weights, evaluates a learned table once per resize
mode, measures the encoding's parameters and FLOPs at the training size
(:mod:`tools.study_cost`) and returns a :class:`TaskResult`.

Everything goes through the packages' own public code paths: the classifier
through ``python -m peg_core train`` / ``eval``, DETR through ``python -m peg_detr train`` /
``eval``, the video model through ``python -m peg_video
train`` / ``eval``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from peg_core.utils import seed_everything

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
    """CPVT (small, :data:`peg_core.classify.DEMO_CONFIG`) with peg / sincos / learned / none.

    Trained and evaluated by ``python -m peg_core train`` / ``eval`` (their functions, in process).
    """
    from peg_core.classify import DEMO_CONFIG, load_classifier, scaled_sizes
    from peg_core.classify.cli import evaluate, train

    budget = BUDGETS["classify", quick]
    epochs = epochs or budget.epochs
    size = budget.train_size
    common = ["--device", "cpu", "--no-progress"]
    argv = [*common, "--seed", str(seed), "--epochs", str(epochs), "--img-size", str(size),
            "--batch-size", str(budget.batch_size), "--eval-every", "0"]  # fmt: skip
    if data is None:
        argv += ["--n-train", str(budget.n_train), "--n-val", str(budget.n_val)]
        data_name = f"generated shapes ({budget.n_train} train / {budget.n_val} val)"
    else:
        argv += ["--data", str(data)]
        data_name = str(data)
    sizes = scaled_sizes(size, IMAGE_SCALES)
    labels = [f"{s} px" for s in sizes]
    rows: list[Row] = []
    for enc in ("peg", "sincos", "learned", "none"):
        run_dir = out / enc
        train([*argv, "--pos-enc", enc, "--output-dir", str(run_dir)])
        ckpt = run_dir / "checkpoint.pth"
        model, _ = load_classifier(ckpt)
        x = torch.zeros(1, 3, size, size)
        cost = encoding_cost(
            {"pos_enc": model.pos_enc, "pos_blocks": model.pos_blocks}, lambda m=model, x=x: m(x)
        )

        def evaluate_at(mode, ckpt=ckpt, run_dir=run_dir):
            eval_argv = [*common, "--checkpoint", str(ckpt), "--eval-sizes", ",".join(map(str, sizes)),
                         "--output-dir", str(run_dir / f"eval_{mode or 'default'}")]  # fmt: skip
            if mode is not None:
                eval_argv += ["--pos-interpolation", mode]
            by_size = evaluate(eval_argv)["eval"]["top1_by_size"]
            return {lab: by_size[str(s)] for lab, s in zip(labels, sizes)}, {}

        rows += _rows_for(enc, evaluate_at, _modes(enc), cost.params, cost.flops)
        print(f"[study classify] {enc}: " + _fmt_scores(rows[-1].scores), flush=True)
    return TaskResult(
        "classify", "top-1", f"{size} px", labels, rows,
        {**asdict(budget), "epochs": epochs, "model": _describe(DEMO_CONFIG)}, data_name,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------- detect


def _detr_eval(
    ckpt_path: Path, coco: Path, sizes: list[int], mode: str | None, batch: int
) -> dict[str, dict]:
    """COCO numbers of a ``peg_detr`` checkpoint per short side (``"80"``: stats; learned table resized by ``mode``)."""
    from peg_core.engine import evaluate_checkpoint
    from peg_detr.evaluate import parse_eval_args
    from peg_detr.task import DetectTask

    def set_mode(model: torch.nn.Module) -> None:
        if mode is not None:
            model.transformer.encoder.pos.interpolation = mode

    args = parse_eval_args([
        "--checkpoint", str(ckpt_path), "--coco-path", str(coco), "--eval-sizes", ",".join(map(str, sizes)),
        "--batch-size", str(batch), "--output-dir", str(ckpt_path.parent / f"eval_{mode or 'default'}"),
        "--workers", "0", "--no-progress", "--device", "cpu",
    ])  # fmt: skip
    return evaluate_checkpoint(DetectTask(adjust_model=set_mode), args)["eval"]["sizes"]


def run_detect(out: Path, quick: bool, seed: int, data: Path | None = None, epochs: int | None = None):
    """Tiny DETR (``demo_tiny`` recipe) with peg / sine / learned / none in the encoder."""
    from peg_core.engine import read_checkpoint
    from peg_detr.data import SyntheticSpec, make_synthetic_coco
    from peg_detr.model_io import model_from_checkpoint
    from peg_detr.train import main as train

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
            "--workers", "0", "--no-progress", "--device", "cpu",
        ]  # fmt: skip
        train(argv)
        ckpt = run_dir / "checkpoint.pth"
        model, _, _ = model_from_checkpoint(read_checkpoint(ckpt, "detect"), ckpt)
        enc_mods = model.transformer.encoder
        n_layers = len(enc_mods.layers)
        x = [torch.zeros(3, size, size)]
        model.eval()
        cost = encoding_cost(
            {"pos": enc_mods.pos, "pegs": enc_mods.pegs}, lambda m=model, x=x: m(x), qk_uses=n_layers
        )

        def evaluate_at(mode, ckpt=ckpt):
            table = _detr_eval(ckpt, data, sizes, mode, budget.batch_size)
            scores = {lab: table[str(s)]["ap50"] for lab, s in zip(labels, sizes)}
            return scores, {"ap": {lab: table[str(s)]["ap"] for lab, s in zip(labels, sizes)}}

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
    """``python -m peg_video eval`` on a checkpoint at ``frames`` x ``crop``; a learned table resized with ``mode``.

    Each view writes its ``report.json`` to its own folder beside the checkpoint.
    """
    from peg_video.train import evaluate, parse_eval_args

    out = ckpt_path.parent / f"eval_{frames}fr_{crop}px_{mode or 'default'}"
    argv = ["--checkpoint", str(ckpt_path), "--num-frames", str(frames), "--crop", str(crop)]
    argv += ["--batch-size", str(batch), "--device", "cpu", "--no-progress", "--workers", "0"]
    argv += ["--output-dir", str(out)] + (["--pos-interpolation", mode] if mode is not None else [])
    return evaluate(parse_eval_args(argv))["eval"]


def run_video(out: Path, quick: bool, seed: int, data: Path | None = None, epochs: int | None = None):
    """Tiny video ViT (``synthetic_tiny``) with peg3d / peg3d-factorized / learned / none.

    ``data``: a folder with ``train.csv`` + ``val.csv`` (or ``train.txt`` + ``val.txt``) and the videos.
    """
    from peg_core.engine import read_checkpoint
    from peg_video.configs import CONFIGS
    from peg_video.data.synthetic import SyntheticSpec, make_synthetic_kinetics
    from peg_video.task import build_model
    from peg_video.train import parse_args, train

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
            "--output-dir", str(run_dir), "--epochs", str(epochs), "--batch-size", str(budget.batch_size),
            "--crop", str(crop), "--seed", str(seed), "--eval-every", "0", "--device", "cpu", "--no-progress",
        ]  # fmt: skip
        report = train(parse_args(argv))
        ckpt_path = Path(report["checkpoint"])
        ckpt = read_checkpoint(ckpt_path, "video")
        seed_everything(seed)
        model = build_model(dict(ckpt["model_config"])).eval()
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
