"""The experiments of ``python -m tools.study``: one per package, same protocol, several seeds.

A task is planned once (:func:`plan_classify`, :func:`plan_detect`, :func:`plan_video`: the data is
written here, so every seed and row sees the same data), then split into *cells*: one training
of one row (:class:`RowSpec`: an encoding, or an ablation of the PEG) with one seed.
:func:`run_cell` trains a cell, evaluates the trained model at the training size and at the
other sizes with the same weights (a learned table once per resize mode), measures the
encoding's parameters and FLOPs at the training size (:mod:`tools.study_cost`) and, when asked,
the int8 (PT2E) accuracy.  Cells are independent, so ``--jobs 2`` runs them in two processes.
:func:`assemble` turns a task's cells into a :class:`TaskResult`: the mean over seeds, the
sample standard deviation (``ddof=1``) and every per-seed value.

Everything goes through the packages' own public code paths: the classifier through
``python -m peg_core train`` / ``eval``, DETR through ``python -m peg_detr train`` / ``eval``, the
video model through ``python -m peg_video train`` / ``eval``.

Classification has two protocols (``--protocol``):

* ``quadrant``: the label is the shape *and* its quadrant, so a model must know where a patch
  is; a larger test image shows the same scene with more tokens, and the class depends on
  absolute position at the new size;
* ``scale``: the label is the shape alone (anywhere, any size, any hue); the test images are the
  same scenes rendered at the larger size (objects scale with the image), CPVT's protocol of
  training at 224 px and testing the same weights at 384 px.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from peg_core.engine.distributed import seed_everything

from .study_cost import encoding_cost

__all__ = [
    "ABLATIONS",
    "BUDGETS",
    "DETECT_ARCHS",
    "MODES",
    "PRETRAINED_GROUP",
    "PROTOCOLS",
    "RFDETR_EXTRA_ROWS",
    "RFDETR_ROWS",
    "ROTARY_ROWS",
    "RTDETR_EXTRA_ROWS",
    "RTDETR_FAMILY",
    "RTDETR_ROWS",
    "VIDEO_ROTARY_ROWS",
    "Budget",
    "CellResult",
    "Plan",
    "Row",
    "RowSpec",
    "TaskResult",
    "ablation_specs",
    "assemble",
    "cell_device",
    "cell_dir",
    "mean_std",
    "plan_classify",
    "plan_detect",
    "plan_detect_rfdetr",
    "plan_detect_rtdetr",
    "plan_video",
    "pretrained_specs",
    "run_cell",
    "write_videomae_stand_in",
]

#: resize modes a learned table is evaluated with at other sizes (the first is each model's default)
MODES = ("bicubic", "bilinear", "nearest")
#: ``--ablate`` axes: classification PEG variants, and ``video`` for the 3D PEG
ABLATIONS = ("kernel", "placement", "separable", "padding", "video")
PROTOCOLS = ("quadrant", "scale")
#: rotary rows of the image tasks (classify, detect) and of the video task
ROTARY_ROWS = ("rope-axial", "rope-mixed", "peg+rope-mixed")
VIDEO_ROTARY_ROWS = ("rope-3d", "peg3d+rope-3d")


@dataclass(frozen=True)
class Budget:
    """Training budget of one row (identical for every row and seed of a task)."""

    epochs: int
    n_train: int
    n_val: int
    train_size: int  # classify: image side; detect: image short side; video: crop side
    batch_size: int = 8


#: (task, quick) -> budget; the full ones fit the documented command in ~30 min on 2 CPU cores.
#: classify: batch 16 rather than the demo recipe's 32 (the same epochs, twice the steps): with 32
#: many rows stay on the shape-only plateau (top-1 ~0.25) for some seeds within 6 epochs.
BUDGETS: dict[tuple[str, bool], Budget] = {
    ("classify", False): Budget(epochs=6, n_train=2048, n_val=256, train_size=48, batch_size=16),
    ("classify", True): Budget(epochs=1, n_train=48, n_val=24, train_size=32, batch_size=16),
    ("detect", False): Budget(epochs=6, n_train=1024, n_val=100, train_size=80, batch_size=4),
    ("detect", True): Budget(epochs=1, n_train=8, n_val=4, train_size=64, batch_size=4),
    # RT-DETR (rtdetr_demo_tiny): 3 rows x 3 seeds in ~14 min with --jobs 2 on 2 CPU cores (4 epochs: seeds
    # spread +-0.1 AP50, no conclusion; 8 epochs for a table that can say something)
    ("detect-rtdetr", False): Budget(epochs=8, n_train=512, n_val=100, train_size=96, batch_size=4),
    ("detect-rtdetr", True): Budget(epochs=1, n_train=8, n_val=4, train_size=64, batch_size=4),
    # D-FINE (dfine_demo_tiny): RT-DETR's budget, so the two sections compare
    ("detect-dfine", False): Budget(epochs=8, n_train=512, n_val=100, train_size=96, batch_size=4),
    ("detect-dfine", True): Budget(epochs=1, n_train=8, n_val=4, train_size=64, batch_size=4),
    # RF-DETR (rfdetr_demo_tiny): RT-DETR's data and training side (96 px: 6 x 16, a multiple of its
    # patch x windows, the table's own 12 x 12 grid), so the three sections compare
    ("detect-rfdetr", False): Budget(epochs=8, n_train=512, n_val=100, train_size=96, batch_size=4),
    ("detect-rfdetr", True): Budget(epochs=1, n_train=8, n_val=4, train_size=64, batch_size=4),
    ("video", False): Budget(epochs=24, n_train=240, n_val=60, train_size=32, batch_size=8),
    ("video", True): Budget(epochs=1, n_train=12, n_val=6, train_size=32, batch_size=4),
}
IMAGE_SCALES = (0.75, 1.0, 1.5, 2.0)
#: the RT-DETR-family cells' lr and augmentation: multi-scale with the strong augmentation at 5e-4
STUDY_RTDETR_SCHEDULE = ("--lr", "5e-4", "--lr-backbone", "5e-4", "--no-aug-epochs", "0")
#: the extrapolation protocol's scales (``--test-scales``): 0.5x .. 4x of the training size / clip length
EXTRAPOLATION_SCALES = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
#: ``--aspect``: test grids of height : width 1 : 2 and 2 : 1 (the longer side twice the training size)
ASPECTS = ((1, 2), (2, 1))
#: the attention rows of the bias kinds and their PEG pairs (image tasks; video: no lookhere, peg3d pairs)
BIAS_ROWS = ("alibi-2d", "fire", "lookhere", "peg+alibi-2d", "peg+fire")
VIDEO_BIAS_ROWS = ("alibi-2d", "fire", "peg3d+alibi-2d", "peg3d+fire")
#: validation scenes / clips the attention diagnostics average over per test size
DIAGNOSE_IMAGES = 64
#: RT-DETR's multi-scale training sides as fractions of its size (480..800 around 640: 0.75x..1.25x)
RTDETR_TRAIN_SCALES = (0.75, 0.875, 1.0, 1.125, 1.25)
#: the RT-DETR rows of ``--task detect --arch rtdetr``; the others of :data:`RTDETR_EXTRA_ROWS` on ``--rows``
RTDETR_ROWS = ("peg", "sincos", "none")
RTDETR_EXTRA_ROWS = ("learned", *ROTARY_ROWS, *BIAS_ROWS)
#: ``--arch`` of the RT-DETR family -> (its demo recipe, its name, the model's description)
RTDETR_FAMILY: dict[str, tuple[str, str, str]] = {
    "rtdetr": ("rtdetr_demo_tiny", "RT-DETR",
               "RT-DETR rtdetr_demo_tiny (tiny backbone, dim 32, 1 AIFI layer, 2 decoder layers, 20 queries)"),
    "dfine": ("dfine_demo_tiny", "D-FINE",
              "D-FINE dfine_demo_tiny (tiny backbone, dim 32, 1 AIFI layer, 2 decoder layers, 20 queries, "
              "fine-grained distribution refinement)"),
}  # fmt: skip
#: the RF-DETR rows of ``--task detect --arch rfdetr`` (its own section ``detect-rfdetr``), all in the
#: windowed ViT: ``learned`` (RF-DETR's table, resized as transformers does), ``peg`` (a zero PEG
#: after block 0 replacing the table: CPVT's choice), ``none``; the others of :data:`RFDETR_EXTRA_ROWS`
#: on ``--rows``
RFDETR_ROWS = ("learned", "peg", "none")
RFDETR_EXTRA_ROWS = (*ROTARY_ROWS, *BIAS_ROWS)
#: ``--arch rfdetr``: its demo recipe and the model's description
RFDETR_STUDY = (
    "rfdetr_demo_tiny",
    "RF-DETR rfdetr_demo_tiny (4-block windowed ViT of width 48, patch 8, 2 x 2 windows, a 12 x 12 table; "
    "dim 32, 2 decoder layers, 3 Group DETR groups of 20 queries)",
)
#: the ``--arch`` values of the detect task beside DETR's, each with its own section ``detect-<arch>``
DETECT_ARCHS = (*RTDETR_FAMILY, "rfdetr")


# ------------------------------------------------------------------------------------------ results


@dataclass
class Row:
    """One line of a task table: a trained row (and resize mode for a learned table), over seeds.

    ``scores`` / ``extra`` are means over the seeds; ``std`` the sample standard deviation
    (``ddof=1``, empty for one seed); ``per_seed`` every seed's value per test size;
    ``int8`` the per-seed accuracy of the int8 model per test size (``--quantize int8``).
    """

    label: str
    encoding: str
    mode: str | None
    scores: dict[str, float]  # test-size label -> metric (mean over seeds)
    params: int
    flops: int
    extra: dict[str, dict[str, float]] = field(default_factory=dict)  # other metrics per size (means)
    std: dict[str, float] = field(default_factory=dict)
    per_seed: dict[str, list[float]] = field(default_factory=dict)
    group: str = "encoding"  # "encoding" or the ablation axis
    int8: dict[str, list[float]] = field(default_factory=dict)
    repeats: str | None = None  # the row whose trained models this row shows (an ablation's baseline)
    #: test-size label -> {"entropy": [per layer], "distance": [per layer]}, means over the seeds
    diagnostics: dict[str, dict[str, list[float]]] = field(default_factory=dict)


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
    seeds: list[int] = field(default_factory=lambda: [0])
    protocol: str | None = None
    chance: float | None = None  # the metric of a model that learned nothing (1 / classes; AP: 0)
    #: trained row -> its training seconds per cell (mean over the seeds)
    cell_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _folder_chance(train: Path) -> float | None:
    """Top-1 at chance of an ImageFolder ``train`` tree: 1 / its number of class folders."""
    try:
        n = sum(1 for p in train.iterdir() if p.is_dir())
    except OSError:
        return None
    return 1 / n if n else None


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``ddof=1``; ``None`` for a single value)."""
    values = [float(v) for v in values]
    mean = math.fsum(values) / len(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


# --------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class RowSpec:
    """A row to train: the encoding, the extra ``train`` flags, the resize modes to evaluate.

    ``same_as``: name of an identical row (the baseline of an ablation): nothing is trained, the
    row repeats that row's numbers.
    """

    name: str
    encoding: str
    argv: tuple[str, ...] = ()
    modes: tuple[str | None, ...] = (None,)
    group: str = "encoding"
    same_as: str | None = None

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "_", self.name).strip("_")


@dataclass
class Plan:
    """Everything the cells of one task need (picklable: cells may run in worker processes)."""

    task: str  # classify | detect | video
    key: str  # result name: classify, classify-scale, detect, video
    out: Path
    specs: list[RowSpec]
    seeds: list[int]
    budget: Budget
    epochs: int
    metric: str
    sizes: list[int]  # classify / detect: image sides
    labels: list[str]  # column labels, one per test size / view
    train_label: str
    data: dict[str, Any]
    data_name: str
    model: str
    quantize: bool = False
    protocol: str | None = None
    notes: list[str] = field(default_factory=list)
    views: list[tuple[str, int, int]] = field(default_factory=list)  # video: (label, frames, crop)
    chance: float | None = None  # the metric at chance (see TaskResult.chance)
    init: str | None = None  # video: the Hugging Face folder of the "from pre-trained weights" rows
    aspects: list[tuple[str, int, int]] = field(default_factory=list)  # classify: (label, height, width)
    diagnose: bool = False  # per-layer attention entropy / distance at every test size (ViT rows)
    train_args: tuple[str, ...] = ()  # --train-args: flags appended to every cell's train command (they win)


@dataclass
class CellResult:
    """One trained row with one seed: ``scores[mode][label]``, ``extra[mode][metric][label]``."""

    scores: dict[str, dict[str, float]]
    extra: dict[str, dict[str, dict[str, float]]]
    params: int
    flops: int
    int8: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    #: test-size label -> {"entropy": [per layer], "distance": [per layer]} (peg_core.models.probe)
    diagnostics: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def _modes(enc: str) -> tuple[str | None, ...]:
    return MODES if enc == "learned" else (None,)


def _quiet_parse(parse: Callable[[list[str]], Any], argv: Sequence[str]) -> Any | None:
    """``parse(argv)`` with argparse's error output swallowed; ``None`` when the flags are refused."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parse(list(argv))
        except SystemExit:
            return None


def classify_accepts(argv: Sequence[str]) -> bool:
    """Whether ``python -m peg_core train`` takes ``argv`` and builds a model from it."""
    from peg_core.classify.cli import parse_train_args
    from peg_core.classify.model import build_model, model_config_from_args

    args = _quiet_parse(parse_train_args, argv)
    if args is None:
        return False
    try:
        build_model(model_config_from_args(args, 12))
    except (ValueError, TypeError):
        return False
    return True


def _peg_blocks(depth: int) -> str:
    return "0" if depth == 1 else f"0-{depth - 1}"


def classify_specs(train_size: int, epochs: int, ablate: Sequence[str] = ()) -> list[RowSpec]:
    """Rows of a classification table: the encodings, then one group of rows per ablation axis.

    The baseline is the demo recipe's PEG (:data:`peg_core.classify.DEMO_CONFIG`: kernel 3,
    zero padding, full 3x3, after every block); an ablation row equal to it repeats its numbers.
    """
    from peg_core.classify import DEMO_CONFIG

    depth = int(DEMO_CONFIG["depth"])
    base_at = tuple(DEMO_CONFIG.get("peg_at", (0,)))
    lo, hi = round(train_size * 0.75), round(train_size * 1.25)
    # Progressive: 0.75x -> 1x in up to three stages (one stage per epoch at least).
    stages = [lo, (lo + train_size) // 2, train_size][-min(3, epochs) :]
    specs = [
        RowSpec("peg", "peg"),
        RowSpec("peg-dynamic", "peg", ("--peg-dynamic",)),
        RowSpec("sincos", "sincos"),
        RowSpec("learned", "learned", modes=MODES),
        RowSpec("none", "none"),
        # A learned table trained at several sizes: the usual fix for its size change.
        RowSpec("learned + multi-scale", "learned", ("--train-sizes", f"{lo},{train_size},{hi}")),
        RowSpec("learned + progressive", "learned", ("--progressive-sizes", ",".join(map(str, stages)))),
        *(RowSpec(e, e) for e in ROTARY_ROWS),
        *(RowSpec(e, e) for e in BIAS_ROWS),
    ]
    specs += ablation_specs(ablate, depth, base_at)
    return specs


def ablation_specs(ablate: Sequence[str], depth: int, base_at: Sequence[int]) -> list[RowSpec]:
    """The classification ablation rows of ``ablate`` (axes of :data:`ABLATIONS`) for a ``depth``-block CPVT.

    Every row changes one setting of the baseline PEG (kernel 3, full, zero padding, after blocks
    ``base_at``); a row whose setting is the baseline's gets ``same_as="peg"``.
    """
    specs: list[RowSpec] = []
    base_at = tuple(sorted(int(i) for i in base_at))
    if "kernel" in ablate:
        for k in (1, 3, 5, 7):
            same = "peg" if k == 3 else None
            specs.append(RowSpec(f"kernel {k}x{k}", "peg", ("--peg-kernel-size", str(k)), group="kernel",
                                 same_as=same))  # fmt: skip
    if "placement" in ablate:
        places = [("after block 0", (0,), "0"),
                  (f"after blocks {_peg_blocks(depth)}", tuple(range(depth)), "all"),
                  ("before block 0", (-1,), "-1")]  # fmt: skip
        for name, at, flag in places:
            same = "peg" if at == base_at else None
            specs.append(RowSpec(name, "peg", ("--peg-at", flag), group="placement", same_as=same))
    if "separable" in ablate:
        specs.append(RowSpec("full 3x3", "peg", group="separable", same_as="peg"))
        specs.append(RowSpec("separable 1x3+3x1", "peg", ("--peg-separable",), group="separable"))
    if "padding" in ablate:
        specs.append(RowSpec("zero padding", "peg", group="padding", same_as="peg"))
        specs.append(RowSpec("circular padding", "peg", ("--peg-padding", "circular"), group="padding"))
    return specs


def _available(specs: list[RowSpec], accepts: Callable[[Sequence[str]], bool], base: Sequence[str]) -> tuple[
    list[RowSpec], list[str]
]:  # fmt: skip
    """Specs whose flags the train command takes; a note per row left out."""
    kept, notes = [], []
    for spec in specs:
        if (
            spec.same_as is None
            and spec.argv
            and not accepts([*base, "--pos-enc", spec.encoding, *spec.argv])
        ):
            notes.append(
                f"Row `{spec.name}` left out: the train command does not take `{' '.join(spec.argv)}`."
            )
            continue
        kept.append(spec)
    return kept, notes


def _write_scene_folder(scenes: Any, root: Path, img_size: int, split: str) -> None:
    """``root/split/<class>/NNNNN.png``: the scenes rendered at ``img_size`` (one PNG per scene)."""
    from PIL import Image

    names = scenes.class_names
    for name in names:
        (root / split / name).mkdir(parents=True, exist_ok=True)
    pixels = ((scenes.images(img_size) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    for i, label in enumerate(scenes.labels.tolist()):
        Image.fromarray(pixels[i].permute(1, 2, 0).contiguous().numpy()).save(
            root / split / names[label] / f"{i:05d}.png"
        )


def plan_classify(
    out: Path, quick: bool, seeds: list[int], data: Path | None = None, epochs: int | None = None, *,
    protocol: str = "quadrant", ablate: Sequence[str] = (), quantize: bool = False,
    train_size: int | None = None, test_sizes: Sequence[int] | None = None,
    test_scales: Sequence[float] | None = None, aspect: bool = False, diagnose: bool = False,
) -> Plan:  # fmt: skip
    """CPVT (small, :data:`peg_core.classify.DEMO_CONFIG`) on generated shapes (``protocol``) or ``data``.

    Generated data is written once (scene seed = the first seed) as ImageFolder trees: ``train/``
    and ``val/`` at the training size, and ``at<S>/val/`` with the same validation scenes
    rendered at each test size ``S``.  A user's ``data`` is resized to each test size by ``eval``.
    ``test_scales``: test sizes as fractions of the training size (default :data:`IMAGE_SCALES`);
    ``aspect``: also the non-square grids of :data:`ASPECTS` (generated data: the same scenes rendered
    at ``H x W``); ``diagnose``: per-layer attention entropy and distance at every test size.
    """
    from peg_core.classify import DEMO_CONFIG, make_shape_splits, scaled_sizes

    budget = BUDGETS["classify", quick]
    size = train_size or budget.train_size
    sizes = list(test_sizes) if test_sizes else scaled_sizes(size, test_scales or IMAGE_SCALES)
    if size not in sizes:
        sizes = sorted([*sizes, size])
    key = "classify" if protocol == "quadrant" or data is not None else f"classify-{protocol}"
    root = out / "data"
    if data is None:
        labeling = "quadrant" if protocol == "quadrant" else "shape"
        train, val = make_shape_splits(budget.n_train, budget.n_val, seed=seeds[0], labeling=labeling)
        if not (root / "done").is_file():  # written last: a half-written tree is written again
            shutil.rmtree(root, ignore_errors=True)
            _write_scene_folder(train, root, size, "train")
            for s in sizes:
                _write_scene_folder(val, root / f"at{s}", s, "val")
            (root / "val").symlink_to((root / f"at{size}" / "val").resolve(), target_is_directory=True)
            (root / "done").write_text("ok\n")
        what = "shape and quadrant" if labeling == "quadrant" else "shape only, anywhere"
        data_name = (f"generated shapes, label = {what} ({budget.n_train} train / {budget.n_val} val; "
                     "test images: the same scenes rendered at each size)")  # fmt: skip
        info = {"root": str(root), "generated": True}
    else:
        data_name = f"{data} (resized to each test size)"
        info = {"root": str(data), "generated": False}
    epochs = epochs or budget.epochs
    axes = ablate if protocol == "quadrant" or data is not None else ()  # generated: the quadrant task only
    specs, notes = _available(classify_specs(size, epochs, axes), classify_accepts, ["--img-size", str(size)])
    if any(s.name == "peg-dynamic" for s in specs):
        notes.append(
            "peg-dynamic's FLOPs leave out its per-image depthwise convolution (a functional conv, which "
            "tools.study_cost's module hooks do not see); it costs about what the peg row's convs cost."
        )
    if axes and protocol == "quadrant" and data is None:
        notes.append("The ablation rows use the quadrant protocol only (the budget of the full run).")
    aspects = [(f"{size * h}x{size * w} px", size * h, size * w) for h, w in ASPECTS] if aspect else []
    if aspects and data is not None:
        notes.append("The aspect columns need generated data (the scenes rendered at H x W); left out.")
        aspects = []
    if aspects:
        notes.append(
            "Aspect columns: the validation scenes rendered at height x width 1:2 and 2:1 (the longer side "
            "twice the training size; shapes stretched with the canvas), evaluated in the study's process."
        )
    return Plan(
        task="classify", key=key, out=out, specs=specs, seeds=seeds, budget=budget, epochs=epochs, metric="top-1", sizes=sizes,
        labels=[f"{s} px" for s in sizes] + [a[0] for a in aspects], aspects=aspects, diagnose=diagnose,
        train_label=f"{size} px", data=info, data_name=data_name, model=_describe(DEMO_CONFIG),
        quantize=quantize, protocol=protocol if data is None else None, notes=notes,
        chance=_folder_chance(Path(info["root"]) / "train"),
    )  # fmt: skip


def _classify_cell(plan: Plan, spec: RowSpec, seed: int, run_dir: Path) -> CellResult:
    from peg_core.classify.cli import evaluate, train
    from peg_core.classify.model import load_model

    common = ["--device", cell_device(), "--no-progress", "--workers", "0"]
    size = int(plan.train_label.split()[0])
    argv = [*common, "--seed", str(seed), "--epochs", str(plan.epochs), "--img-size", str(size),
            "--batch-size", str(plan.budget.batch_size), "--eval-every", "0", "--data-root", plan.data["root"],
            "--pos-enc", spec.encoding, *spec.argv, "--output-dir", str(run_dir), "--overwrite"]  # fmt: skip
    if plan.data[
        "generated"
    ]:  # whole images in the scenes' own 2 rgb - 1 scaling; no flip (left/right classes)
        argv += ["--augment", "none", "--crop-ratio", "1", "--normalize", "half"]
    train([*argv, *plan.train_args])
    ckpt = run_dir / "checkpoint.pth"
    model = load_model(ckpt).model
    x = torch.zeros(1, 3, size, size)
    cost = encoding_cost({"pos_enc": model.pos_enc, "pos_blocks": model.pos_blocks, "rope": model.rope},
                         lambda: model(x), rotated=_attentions(model))  # fmt: skip

    def at_sizes(mode: str | None) -> dict[str, float]:
        flags = [*common, "--checkpoint", str(ckpt)] + (["--pos-interpolation", mode] if mode else [])
        if not plan.data["generated"]:  # one eval: the folder resized to every size
            rep = evaluate([*flags, "--eval-sizes", ",".join(map(str, plan.sizes)),
                            "--output-dir", str(run_dir / f"eval_{mode or 'default'}")])  # fmt: skip
            by_size = rep["eval"]["top1_by_size"]
            return {lab: by_size[str(s)] for lab, s in zip(plan.labels, plan.sizes)}
        scores = {}
        for lab, s in zip(plan.labels, plan.sizes):  # the scenes rendered at each size (not the aspects)
            rep = evaluate([*flags, "--eval-sizes", str(s), "--data-root", str(Path(plan.data["root"]) / f"at{s}"),
                            "--output-dir", str(run_dir / f"eval_{mode or 'default'}_{s}")])  # fmt: skip
            scores[lab] = rep["eval"]["top1_by_size"][str(s)]
        return scores

    scores = {str(m): at_sizes(m) for m in spec.modes}
    diagnostics = {}
    if plan.aspects or plan.diagnose:
        scenes = _val_scenes(plan)
        for m in spec.modes:
            loaded = load_model(ckpt, pos_interpolation=m).model
            for lab, h, w in plan.aspects:
                scores[str(m)][lab] = _scenes_top1(loaded, scenes, (h, w))
            if (
                plan.diagnose and m == spec.modes[0]
            ):  # one mode: a resize mode changes the table, not the probe
                grids = [(lab, (s, s)) for lab, s in zip(plan.labels, plan.sizes)]
                grids += [(lab, (h, w)) for lab, h, w in plan.aspects]
                diagnostics = {lab: _scenes_attention(loaded, scenes, hw) for lab, hw in grids}
    int8 = _classify_int8(plan, ckpt) if plan.quantize and spec.name in INT8_ROWS else {}
    return CellResult(scores, {}, cost.params, cost.flops, int8, diagnostics=diagnostics)


def _val_scenes(plan: Plan) -> Any:
    """The plan's generated validation scenes (the same ones its ``at<S>/val`` folders show)."""
    from peg_core.classify import make_shape_splits

    labeling = "shape" if plan.protocol == "scale" else "quadrant"
    return make_shape_splits(plan.budget.n_train, plan.budget.n_val, seed=plan.seeds[0], labeling=labeling)[1]


def _scene_batch(scenes: Any, hw: tuple[int, int]) -> torch.Tensor:
    """The scenes at ``H x W`` as the classifier sees their PNGs: 8-bit, then ``--normalize half`` (2x - 1)."""
    return ((scenes.images(hw) + 1) * 127.5).round().clamp(0, 255) / 127.5 - 1


@torch.no_grad()
def _scenes_top1(model: torch.nn.Module, scenes: Any, hw: tuple[int, int], batch: int = 64) -> float:
    """Top-1 of ``model`` on ``scenes`` rendered at ``H x W`` (no resize: the grid is ``H/p x W/p``).

    The model's class ``c`` is the ``c``-th class folder in sorted order (ImageFolder's rule).
    """
    names = scenes.class_names
    folder_index = {n: i for i, n in enumerate(sorted(names))}
    y = torch.tensor([folder_index[names[int(label)]] for label in scenes.labels])
    x = _scene_batch(scenes, hw)
    hits = sum(
        int((model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum()) for i in range(0, len(y), batch)
    )
    return hits / len(y)


@torch.no_grad()
def _scenes_attention(model: torch.nn.Module, scenes: Any, hw: tuple[int, int]) -> dict[str, list[float]]:
    """Per-layer attention entropy / distance of ``model`` on the first :data:`DIAGNOSE_IMAGES` scenes at ``H x W``."""
    from peg_core.models.probe import AttentionStats, attention_probe

    patch = model.patch_size
    stats = AttentionStats(
        (-(-hw[0] // patch), -(-hw[1] // patch)), num_prefix_tokens=model.num_prefix_tokens
    )
    x = _scene_batch(scenes.subset(slice(0, DIAGNOSE_IMAGES)), hw)
    with attention_probe(stats):
        model(x)
    return stats.summary()


INT8_ROWS = ("peg", "peg-dynamic", "learned", "sincos", "none")


def _attentions(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The ViT attentions of a CPVT / video model (where a rotary table rotates q and k)."""
    from peg_core.models.layers import Attention

    return [m for m in model.modules() if isinstance(m, Attention)]


def _classify_int8(plan: Plan, ckpt: Path) -> dict[str, float]:
    """Top-1 of the checkpoint quantized to int8 (PT2E, :mod:`peg_core.export.quantize`) at every test size.

    One dynamic-shape quantized graph, calibrated on the first 64 training images, serves every
    size; images whose side is not a multiple of the patch are zero-padded at the bottom / right
    first, as the float model does itself.
    """
    import torch.nn.functional as F

    from peg_core.classify.data import FolderImages, folder_transform, open_val_split, scan_split
    from peg_core.classify.model import load_model
    from peg_core.engine import read_checkpoint
    from peg_core.export.quantize import calibration_batches, quantize_int8

    checkpoint = read_checkpoint(ckpt, "classify")
    model = load_model(checkpoint, ckpt).model
    meta = checkpoint["meta"]
    classes, size, patch = meta["classes"], int(meta["img_size"]), int(model.patch_size)
    mean, std, crop = meta["mean"], meta["std"], float(meta.get("crop_ratio", 1.0))
    root = Path(plan.data["root"])

    def images_at(s: int, samples: list) -> FolderImages:
        return FolderImages(samples, classes, folder_transform(s, False, crop_ratio=crop, mean=mean, std=std))

    def pad(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, -x.shape[-1] % patch, 0, -x.shape[-2] % patch))

    calib = [pad(b) for b in calibration_batches(images_at(size, scan_split(root / "train", classes)[0]), 64)]
    qmodel = quantize_int8(model, calib, calib[0][:2])
    scores = {}
    for lab, s in zip(plan.labels, plan.sizes, strict=True):
        val = images_at(s, open_val_split(root / f"at{s}" if plan.data["generated"] else root, classes))
        correct = total = 0
        with torch.no_grad():
            for xb, yb in torch.utils.data.DataLoader(val, batch_size=128):
                correct += int((qmodel(pad(xb)).argmax(-1) == yb).sum())
                total += len(yb)
        scores[lab] = correct / max(1, total)
    return scores


# --------------------------------------------------------------------------------------------- detect


def _detr_eval(
    ckpt_path: Path, coco: Path, sizes: list[int], mode: str | None, batch: int
) -> dict[str, dict]:
    """COCO numbers of a ``peg_detr`` checkpoint per short side (``"80"``: stats; learned table resized by ``mode``)."""
    from peg_detr import cli

    argv = [
        "--checkpoint", str(ckpt_path), "--data-root", str(coco), "--eval-sizes", ",".join(map(str, sizes)),
        "--batch-size", str(batch), "--output-dir", str(ckpt_path.parent / f"eval_{mode or 'default'}"),
        "--workers", "0", "--no-progress", "--device", cell_device(),
    ] + (["--pos-interpolation", mode] if mode else [])  # fmt: skip
    return cli.evaluate(argv)["eval"]["sizes"]


def _detect_data(out: Path, data: Path | None, budget: Budget, size: int, seed: int) -> tuple[Path, str]:
    """``(COCO root, description)``: ``data``, or synthetic shapes written once under ``out/data``."""
    from peg_detr.data import SyntheticSpec, make_synthetic_coco

    if data is not None:
        return data, str(data)
    data = out / "data"
    if not (data / "annotations").is_dir():
        spec = SyntheticSpec(size=size, num_classes=3, min_objects=1, max_objects=3)
        make_synthetic_coco(data, budget.n_train, budget.n_val, seed=seed, spec=spec)
    return data, f"synthetic COCO shapes ({budget.n_train} train / {budget.n_val} val, {size} px)"


def _detect_sizes(
    size: int, test_sizes: Sequence[int] | None, test_scales: Sequence[float] | None = None
) -> list[int]:
    """Test sides: ``test_sizes``, or ``test_scales`` (default :data:`IMAGE_SCALES`) of ``size``; the
    training size always among them."""
    sizes = list(test_sizes) if test_sizes else [round(size * s) for s in (test_scales or IMAGE_SCALES)]
    return sizes if size in sizes else sorted([*sizes, size])


def plan_detect(
    out: Path, quick: bool, seeds: list[int], data: Path | None = None, epochs: int | None = None, *,
    train_size: int | None = None, test_sizes: Sequence[int] | None = None,
    test_scales: Sequence[float] | None = None, **_: Any,
) -> Plan:  # fmt: skip
    """Tiny DETR (``demo_tiny`` recipe) with peg / sine / learned / none / the rotary and bias rows in the encoder."""
    budget = BUDGETS["detect", quick]
    size = train_size or budget.train_size
    data, data_name = _detect_data(out, data, budget, size, seeds[0])
    sizes = _detect_sizes(size, test_sizes, test_scales)
    notes = [
        "Decoder cross-attention keys use DETR's sine codes for every encoder variant "
        "(peg_detr's default `decoder_key_pos=sine`), so the rows differ in the encoder only "
        "(the rotary rows too: RoPE rotates q and k of the encoder's self-attention; the bias rows add "
        "their bias to the encoder's self-attention logits).",
        "The learned table of peg_detr is built for an 800x1333 image and resized to each image's "
        "feature grid, so it is interpolated even at the training size.",
    ]
    specs = [
        RowSpec(e, e, modes=_modes(e)) for e in ("peg", "sine", "learned", "none", *ROTARY_ROWS, *BIAS_ROWS)
    ]
    return Plan(
        task="detect", key="detect", out=out, specs=specs, seeds=seeds, budget=budget,
        epochs=epochs or budget.epochs, metric="AP50", sizes=sizes, labels=[f"{s} px" for s in sizes],
        train_label=f"{size} px", data={"root": str(data)}, data_name=data_name,
        model="DETR demo_tiny (tiny backbone, 2+2 layers, dim 64)", notes=notes, chance=0.0,
    )  # fmt: skip


def _detect_cell(plan: Plan, spec: RowSpec, seed: int, run_dir: Path) -> CellResult:
    from peg_detr.cli import train
    from peg_detr.model import load_model as load_detector

    size, epochs, data = int(plan.train_label.split()[0]), plan.epochs, Path(plan.data["root"])
    argv = [
        "--config", "demo_tiny", "--data-root", str(data), "--output-dir", str(run_dir), "--overwrite",
        "--pos-enc", spec.encoding, *spec.argv, "--epochs", str(epochs), "--lr-drop", str(max(1, epochs * 5 // 6)),
        "--total-batch-size", str(plan.budget.batch_size), "--seed", str(seed),
        # one training size (no multi-scale, no crop): every other test size is unseen
        "--train-sizes", str(size), "--crop-resize", "", "--val-size", str(size),
        "--max-size", str(2 * size), "--eval-sizes", str(size), "--eval-every", "0",
        "--workers", "0", "--no-progress", "--device", cell_device(),
    ]  # fmt: skip
    train([*argv, *plan.train_args])
    ckpt = run_dir / "checkpoint.pth"
    model = load_detector(ckpt).model
    enc = model.transformer.encoder
    x = [torch.zeros(3, size, size)]
    model.eval()
    # peg_detr may compute a sine table once for the encoder and the decoder keys, outside
    # encoder.pos; for the count the encoder computes its own (the same adds into q and k).
    if getattr(model.transformer, "_share_sine", False):
        model.transformer._share_sine = False
    cost = encoding_cost({"pos": enc.pos, "pegs": enc.pegs, "rope": enc.rope}, lambda: model(x),
                         qk_uses=len(enc.layers), rotated=list(enc.layers))  # fmt: skip
    return CellResult(*_detect_scores(plan, spec, ckpt, data), cost.params, cost.flops)


def _detect_scores(plan: Plan, spec: RowSpec, ckpt: Path, data: Path) -> tuple[dict, dict]:
    """``(scores, extra)`` of :class:`CellResult`: AP50 and AP at every test size, per resize mode."""
    scores, extra = {}, {}
    for mode in spec.modes:
        table = _detr_eval(ckpt, data, plan.sizes, mode, plan.budget.batch_size)
        pairs = list(zip(plan.labels, plan.sizes, strict=True))
        scores[str(mode)] = {lab: table[str(s)]["ap50"] for lab, s in pairs}
        extra[str(mode)] = {"AP": {lab: table[str(s)]["ap"] for lab, s in pairs}}
    return scores, extra


def plan_detect_rtdetr(
    out: Path, quick: bool, seeds: list[int], data: Path | None = None, epochs: int | None = None, *,
    train_size: int | None = None, test_sizes: Sequence[int] | None = None, rows: Sequence[str] = (),
    arch: str = "rtdetr", test_scales: Sequence[float] | None = None, **_: Any,
) -> Plan:  # fmt: skip
    """Tiny RT-DETR (``rtdetr_demo_tiny``) with peg / sincos / none in AIFI, trained multi-scale.

    ``arch``: a detector of the RT-DETR family (:data:`RTDETR_FAMILY`: ``dfine`` trains
    ``dfine_demo_tiny`` the same way, in its own section ``detect-dfine``).

    ``rows``: :data:`RTDETR_EXTRA_ROWS` named there (``learned``, the rotary rows) are added.
    Square sides: trained at :data:`RTDETR_TRAIN_SCALES` of ``train_size`` (one side per batch),
    evaluated at ``test_sizes`` (default :data:`IMAGE_SCALES` of it).
    """
    config, title, description = RTDETR_FAMILY[arch]
    task = f"detect-{arch}"
    budget = BUDGETS[task, quick]
    size = train_size or budget.train_size
    data, data_name = _detect_data(out, data, budget, size, seeds[0])
    sizes = _detect_sizes(size, test_sizes, test_scales)
    train_sides = sorted({round(size * f) for f in RTDETR_TRAIN_SCALES})
    names = [*RTDETR_ROWS, *(e for e in RTDETR_EXTRA_ROWS if e in rows)]
    notes = [
        f"Trained as {title} is trained: one square side per batch from {', '.join(map(str, train_sides))} px "
        f"(RT-DETR: 480..800 around 640), RT-DETR's augmentation, EMA weights evaluated; the test sizes "
        f"{', '.join(f'{s} px' for s in sizes if s > max(train_sides))} are larger than any training side.",
        "`sincos` is RT-DETR's formula computed for each input's grid (not a table cached for one size); "
        "the rows differ in AIFI's position encoding only (the decoder's anchors follow the feature maps "
        "in every row).",
    ]
    return Plan(
        task=task, key=task, out=out, specs=[RowSpec(e, e, modes=_modes(e)) for e in names],
        seeds=seeds, budget=budget, epochs=epochs or budget.epochs, metric="AP50", sizes=sizes,
        labels=[f"{s} px" for s in sizes], train_label=f"{size} px",
        data={"root": str(data), "train_sides": train_sides, "config": config}, data_name=data_name,
        model=description,
        notes=notes, chance=0.0,
    )  # fmt: skip


def plan_detect_rfdetr(
    out: Path, quick: bool, seeds: list[int], data: Path | None = None, epochs: int | None = None, *,
    train_size: int | None = None, test_sizes: Sequence[int] | None = None, rows: Sequence[str] = (),
    test_scales: Sequence[float] | None = None, **_: Any,
) -> Plan:  # fmt: skip
    """Tiny RF-DETR (``rfdetr_demo_tiny``) with its table / a PEG after ViT block 0 / none, trained multi-scale.

    ``rows``: :data:`RFDETR_EXTRA_ROWS` named there (the rotary and bias rows) are added.  Square
    sides: trained at :data:`RTDETR_TRAIN_SCALES` of ``train_size`` rounded to multiples of the
    ViT's ``patch x windows`` (rf-detr trains at such sides only; one side per batch), evaluated at
    ``test_sizes`` (default :data:`IMAGE_SCALES` of it; a side that is no multiple is padded).
    """
    from peg_detr.configs import CONFIGS
    from peg_detr.models.rfdetr import RFDETRConfig

    config, description = RFDETR_STUDY
    preset = RFDETRConfig.preset(CONFIGS[config]["model_size"])
    unit, grid = preset.patch_size * preset.num_windows, preset.image_size // preset.patch_size
    task = "detect-rfdetr"
    budget = BUDGETS[task, quick]
    size = train_size or budget.train_size
    data, data_name = _detect_data(out, data, budget, size, seeds[0])
    sizes = _detect_sizes(size, test_sizes, test_scales)
    train_sides = sorted({max(unit, round(size * f / unit) * unit) for f in RTDETR_TRAIN_SCALES})
    names = [*RFDETR_ROWS, *(e for e in RFDETR_EXTRA_ROWS if e in rows)]
    padded = [s for s in sizes if s % unit]
    notes = [
        f"Trained as RF-DETR is trained: one square side per batch from {', '.join(map(str, train_sides))} px "
        f"(multiples of patch x windows = {unit} px around the training size, as rf-detr's expanded scales), "
        f"RF-DETR's augmentation (flip, then a square resize or DETR's resize-crop), 3 Group DETR groups, EMA "
        f"weights evaluated; the test sizes {', '.join(f'{s} px' for s in sizes if s > max(train_sides))} are "
        f"larger than any training side.",
        f"`learned` is RF-DETR's table for a {grid} x {grid} grid ({grid * preset.patch_size} px), resized "
        f"bicubically with anti-aliasing to each input's grid as transformers does; `peg` replaces it by a "
        f"zero-initialised PEG after ViT block 0 (CPVT); `none` has neither.  The rows differ in the ViT's "
        f"position encoding only.",
    ]
    if padded:
        notes.append(
            f"{', '.join(f'{s} px' for s in padded)}: no multiple of {unit} px, padded at the bottom / right "
            f"to the next one by the model (its padding's cells are no query proposals)."
        )
    return Plan(
        task=task, key=task, out=out, specs=[RowSpec(e, e) for e in names], seeds=seeds, budget=budget,
        epochs=epochs or budget.epochs, metric="AP50", sizes=sizes, labels=[f"{s} px" for s in sizes],
        train_label=f"{size} px", data={"root": str(data), "train_sides": train_sides, "config": config},
        data_name=data_name, model=description, notes=notes, chance=0.0,
    )  # fmt: skip


def _train_detector(
    plan: Plan, spec: RowSpec, seed: int, run_dir: Path, config: str, schedule: Sequence[str] = ()
) -> tuple[int, Path, Path, torch.nn.Module]:
    """Train ``config`` for one cell (the row's encoding, the plan's budget, sides and seed; ``schedule``:
    flags after the epochs); ``(training side, data root, checkpoint, the trained model in eval mode)``."""
    from peg_detr.cli import train
    from peg_detr.model import load_model as load_detector

    size, data = int(plan.train_label.split()[0]), Path(plan.data["root"])
    argv = [
        "--config", config, "--data-root", str(data), "--output-dir", str(run_dir), "--overwrite",
        "--pos-enc", spec.encoding, *spec.argv, "--epochs", str(plan.epochs), *schedule,
        "--total-batch-size", str(plan.budget.batch_size), "--seed", str(seed),
        "--train-sizes", ",".join(map(str, plan.data["train_sides"])), "--val-size", str(size),
        "--eval-sizes", str(size), "--eval-every", "0", "--workers", "0", "--no-progress", "--device", cell_device(),
    ]  # fmt: skip
    train([*argv, *plan.train_args])
    ckpt = run_dir / "checkpoint.pth"
    return size, data, ckpt, load_detector(ckpt).model.eval()


def _rfdetr_cell(plan: Plan, spec: RowSpec, seed: int, run_dir: Path) -> CellResult:
    """Train ``rfdetr_demo_tiny`` with the row's ViT encoding (the recipe's own lr), evaluate every test size."""
    size, data, ckpt, model = _train_detector(plan, spec, seed, run_dir, plan.data["config"])
    vit = model.backbone.vit
    x = torch.zeros(1, 3, size, size)
    cost = encoding_cost({"pos_enc": vit.pos_enc, "pos_blocks": vit.pos_blocks, "rope": vit.rope},
                         lambda: model(x), rotated=_attentions(vit))  # fmt: skip
    return CellResult(*_detect_scores(plan, spec, ckpt, data), cost.params, cost.flops)


def _rtdetr_cell(plan: Plan, spec: RowSpec, seed: int, run_dir: Path) -> CellResult:
    # the schedule the study's tables were measured with (the tiny recipes' one-epoch settings
    # since: lr 1e-3, no strong augmentation) so that its cells keep their settings
    config = plan.data.get("config", "rtdetr_demo_tiny")
    size, data, ckpt, model = _train_detector(plan, spec, seed, run_dir, config, STUDY_RTDETR_SCHEDULE)
    aifis = list(model.encoder.aifi)
    modules = {f"{k}{i}": getattr(a, k) for i, a in enumerate(aifis) for k in ("pos", "pegs", "rope")}
    x = torch.zeros(1, 3, size, size)
    cost = encoding_cost(modules, lambda: model(x), qk_uses=len(aifis[0].layers),
                         rotated=[layer.self_attn for a in aifis for layer in a.layers])  # fmt: skip
    return CellResult(*_detect_scores(plan, spec, ckpt, data), cost.params, cost.flops)


# ---------------------------------------------------------------------------------------------- video


def _video_views(
    train_frames: int, crop: int, tubelet: Sequence[int], scales: Sequence[float] | None = None
) -> list[tuple[str, int, int]]:
    """(label, frames, crop): the clip lengths, then a larger crop at the training length.

    Clip lengths: half, same and double by default, else ``scales`` of ``train_frames`` rounded to a
    multiple of the tubelet's time side (at least one tubelet); the training length is always among them.
    """
    tt, hw = int(tubelet[0]), int(tubelet[-1])
    big = crop + 2 * hw
    if scales is None:
        frames = [train_frames // 2, train_frames, train_frames * 2]
    else:
        frames = sorted({max(tt, round(train_frames * f / tt) * tt) for f in scales} | {train_frames})
    return [(f"{t} fr", t, crop) for t in frames] + [(f"{train_frames} fr, {big} px", train_frames, big)]


def _train_view(plan: Plan) -> tuple[str, int, int]:
    """The view at the training clip length and crop."""
    return next(v for v in plan.views if v[0] == plan.train_label)


def _video_eval(
    ckpt_path: Path,
    frames: int,
    crop: int,
    mode: str | None,
    batch: int,
    tubelet: Sequence[int] | None = None,
) -> dict[str, Any]:
    """``python -m peg_video eval`` on a checkpoint at ``frames`` x ``crop``; a learned table resized with ``mode``.

    Each view writes its ``report.json`` to its own folder beside the checkpoint.  With ``tubelet``
    the result also holds ``"attention"``: the per-layer entropy / distance over every test clip
    (:mod:`peg_core.models.probe`; joint attention on the ``(T', H', W')`` grid, divided attention on
    ``(H', W')`` and ``(T',)``).
    """
    from peg_core.models.probe import AttentionStats, attention_probe
    from peg_video import cli

    out = ckpt_path.parent / f"eval_{frames}fr_{crop}px_{mode or 'default'}"
    argv = ["--checkpoint", str(ckpt_path), "--num-frames", str(frames), "--crop", str(crop)]
    argv += ["--batch-size", str(batch), "--device", cell_device(), "--no-progress", "--workers", "0"]
    argv += ["--output-dir", str(out)] + (["--pos-interpolation", mode] if mode is not None else [])
    if tubelet is None:
        return cli.evaluate(argv)["eval"]
    grid = (frames // tubelet[0], -(-crop // tubelet[1]), -(-crop // tubelet[2]))
    stats = AttentionStats(grid, also=(grid[1:], grid[:1]))
    with attention_probe(stats):
        result = dict(cli.evaluate(argv)["eval"])
    result["attention"] = stats.summary()
    return result


def _video_chance(data: Path) -> float | None:
    """Top-1 at chance of a video folder: 1 / the classes of its training annotations."""
    from peg_video.data import load_annotations

    for name in ("train.csv", "train.txt"):
        if (data / name).is_file():
            try:
                return 1 / load_annotations(data / name).num_classes
            except (ValueError, OSError):
                return None
    return None


def plan_video(
    out: Path, quick: bool, seeds: list[int], data: Path | None = None, epochs: int | None = None, *,
    ablate: Sequence[str] = (), test_scales: Sequence[float] | None = None, diagnose: bool = False,
    config: str = "synthetic_tiny", train_size: int | None = None, **_: Any,
) -> Plan:  # fmt: skip
    """A video ViT recipe (default the tiny ``synthetic_tiny``) with peg3d / peg3d-factorized / learned / none /
    the rotary and bias rows.

    ``data``: a folder with ``train.csv`` + ``val.csv`` (or ``train.txt`` + ``val.txt``) and the videos.
    ``ablate`` with ``"video"`` adds the 3D PEG after the first block only (the recipe: before every block).
    ``test_scales``: clip lengths as fractions of the training length (default half, same, double);
    generated videos are then long enough for the longest clip (the default set's 24 frames otherwise).
    ``diagnose``: per-layer attention entropy and distance at every view.  ``config``: the
    ``peg_video`` recipe every cell trains (its clip length, stride and tubelet set the views);
    ``train_size``: the training crop (default: the budget's on generated data, the recipe's on ``data``).
    """
    from peg_video.configs import CONFIGS
    from peg_video.data.sampling import clip_span
    from peg_video.data.synthetic import SyntheticSpec, make_synthetic_kinetics

    budget = BUDGETS["video", quick]
    cfg = CONFIGS[config]
    crop = train_size or (budget.train_size if data is None else cfg["crop"])
    views = _video_views(cfg["num_frames"], crop, cfg["tubelet"], test_scales)
    if data is None:
        # long enough for the longest clip; a longer video keeps the default set's motion speed (its
        # motion takes the default 24 frames and goes on), so a training-length clip shows what it does there
        frames = max(SyntheticSpec.frames, clip_span(max(v[1] for v in views), cfg["stride"]))
        longer = frames > SyntheticSpec.frames
        data = out / (f"data_{frames}f_wrap" if longer else "data")
        if not (data / "val.csv").is_file() and not (data / "val.txt").is_file():
            spec = SyntheticSpec(num_train=budget.n_train, num_val=budget.n_val, seed=seeds[0], frames=frames,
                                 motion_frames=SyntheticSpec.frames if longer else None)  # fmt: skip
            make_synthetic_kinetics(data, spec)
        data_name = f"synthetic Kinetics moving shapes ({budget.n_train} train / {budget.n_val} val videos"
        data_name += (f", {frames} frames each, the motion at the speed of the {SyntheticSpec.frames}-frame set, "
                      "wrapping around the frame)" if longer else ")")  # fmt: skip
    else:
        data_name = str(data)
    encodings = ("peg3d", "peg3d-factorized", "learned", "none", *VIDEO_ROTARY_ROWS, *VIDEO_BIAS_ROWS)
    specs = [RowSpec(e, e, modes=_modes(e)) for e in encodings]
    if "video" in ablate:
        depth = cfg["model_opts"]["depth"]
        # the recipe's peg_at [-1, 0] .. [-1, depth-2]: a PEG3d at the input of every block
        specs += [
            RowSpec("full 3x3x3", "peg3d", group="video", same_as="peg3d"),
            RowSpec("factorized 3x3 + 3", "peg3d-factorized", group="video", same_as="peg3d-factorized"),
            RowSpec(f"full, before blocks {_peg_blocks(depth)}", "peg3d", group="video", same_as="peg3d"),
            RowSpec("full, after block 0", "peg3d", ("--peg-at", "0"), group="video"),
        ]
    specs += pretrained_specs()
    init = write_videomae_stand_in(out / "videomae_init", cfg, crop, seeds[0])
    notes = [
        f"Clip length changes the number of frames at the training stride ({cfg['stride']}); "
        f"the larger crop shows {views[-1][2]} px instead of {crop} px. "
        "A learned table's temporal part is resized linearly, its spatial part with the mode shown.",
        f"Rows *{PRETRAINED_GROUP}*: `train --init FOLDER` from a VideoMAE folder of the recipe's size "
        "(`save_pretrained` of a randomly initialised `VideoMAEForVideoClassification`, the stand-in for "
        "downloaded weights: nothing is downloaded, so these rows test the path, not the value of "
        "pre-training), with its fixed sinusoid table or a zero-initialised PEG3d, same budget and seeds.",
    ]
    return Plan(
        task="video", key="video", out=out, specs=specs, seeds=seeds, budget=budget,
        epochs=epochs or budget.epochs, metric="top-1", sizes=[], labels=[v[0] for v in views],
        train_label=f"{cfg['num_frames']} fr", data={"root": str(data), "config": config}, data_name=data_name,
        model=_describe(_video_model_keys(cfg), f"video {cfg['arch']}"), notes=notes, views=views,
        chance=_video_chance(data), init=str(init), diagnose=diagnose,
    )  # fmt: skip


#: the group of the video "from pre-trained weights" row pair
PRETRAINED_GROUP = "from pre-trained weights"


def pretrained_specs() -> list[RowSpec]:
    """The video rows fine-tuned from a VideoMAE folder: its own table, and a PEG3d in its place."""
    return [
        RowSpec("VideoMAE init, its table", "table", group=PRETRAINED_GROUP),
        RowSpec("VideoMAE init, peg3d", "peg3d", group=PRETRAINED_GROUP),
    ]


def write_videomae_stand_in(folder: Path, cfg: dict[str, Any], crop: int, seed: int) -> Path:
    """A random VideoMAE classifier of the recipe's size, ``save_pretrained`` into ``folder`` (once).

    Its ``preprocessor_config.json`` asks for the Kinetics normalisation the other rows train
    with, so the rows differ in their starting weights only.
    """
    if (folder / "config.json").is_file():
        return folder
    import transformers

    from peg_video.data.transforms import KINETICS_MEAN, KINETICS_STD

    opts, (t, p, _) = cfg["model_opts"], cfg["tubelet"]
    config = transformers.VideoMAEConfig(
        image_size=crop, patch_size=p, num_frames=cfg["num_frames"], tubelet_size=t,
        hidden_size=opts["embed_dim"], num_hidden_layers=opts["depth"], num_attention_heads=cfg["num_heads"],
        intermediate_size=int(opts["embed_dim"] * opts["mlp_ratio"]), num_labels=2,
    )  # fmt: skip
    seed_everything(seed)
    transformers.VideoMAEForVideoClassification(config).save_pretrained(folder)
    norm = {"image_processor_type": "VideoMAEImageProcessor", "image_mean": list(KINETICS_MEAN),
            "image_std": list(KINETICS_STD)}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(norm, indent=1))
    return folder


def _video_model_keys(cfg: dict[str, Any]) -> dict[str, Any]:
    """The recipe's model keywords (builder options, heads, PEG placement) for the table's caption."""
    return {**cfg["model_opts"], **{k: cfg[k] for k in ("num_heads", "peg_at") if k in cfg}}


def _video_cell(plan: Plan, spec: RowSpec, seed: int, run_dir: Path) -> CellResult:
    from peg_core.engine import read_checkpoint
    from peg_video import cli
    from peg_video.model import build_model

    root = Path(plan.data["root"])
    ann = {split: _annotation(root, split) for split in ("train", "val")}
    _, frames, crop = _train_view(plan)
    argv = [
        "--config", plan.data.get("config", "synthetic_tiny"), "--train-ann", str(ann["train"]), "--val-ann", str(ann["val"]),
        "--pos-enc", spec.encoding, *spec.argv, *(["--init", plan.init] if spec.group == PRETRAINED_GROUP else []),
        "--output-dir", str(run_dir), "--overwrite", "--epochs", str(plan.epochs), "--batch-size", str(plan.budget.batch_size),
        "--crop", str(crop), "--seed", str(seed), "--eval-every", "0", "--device", cell_device(), "--no-progress",
    ]  # fmt: skip
    report = cli.train([*argv, *plan.train_args])
    ckpt_path = Path(report["checkpoint"])
    ckpt = read_checkpoint(ckpt_path, "video")
    seed_everything(seed)
    model = build_model(dict(ckpt["model_config"])).eval()
    x = torch.zeros(1, 3, frames, crop, crop)
    cost = encoding_cost({"pos_enc": model.pos_enc, "pos_blocks": model.pos_blocks, "rope": model.rope},
                         lambda: model(x), rotated=_attentions(model))  # fmt: skip
    scores, extra, diagnostics = {}, {}, {}
    tubelet = tuple(ckpt["model_config"].get("tubelet") or (1, 1, 1))
    for mode in spec.modes:
        probe = tubelet if plan.diagnose and mode == spec.modes[0] else None
        res = {
            lab: _video_eval(ckpt_path, t, c, mode, plan.budget.batch_size, probe) for lab, t, c in plan.views
        }
        scores[str(mode)] = {k: v["top1"] for k, v in res.items()}
        extra[str(mode)] = {"top-5": {k: v["top5"] for k, v in res.items()}}
        diagnostics = diagnostics or {k: v["attention"] for k, v in res.items() if "attention" in v}
    return CellResult(scores, extra, cost.params, cost.flops, diagnostics=diagnostics)


def _annotation(root: Path, split: str) -> Path:
    for ext in ("csv", "txt"):
        if (root / f"{split}.{ext}").is_file():
            return root / f"{split}.{ext}"
    raise FileNotFoundError(f"{root} has no {split}.csv or {split}.txt (Kinetics CSV or 'path label' list)")


# ---------------------------------------------------------------------------------------------- cells

_CELLS = {
    "classify": _classify_cell,
    "detect": _detect_cell,
    "detect-rtdetr": _rtdetr_cell,
    "detect-dfine": _rtdetr_cell,
    "detect-rfdetr": _rfdetr_cell,
    "video": _video_cell,
}


#: the device of the cell being trained (:func:`run_cell` sets it; one cell at a time per process)
_DEVICE = "cpu"


def cell_device() -> str:
    """The device the current cell trains and evaluates on (``--device`` of the package commands)."""
    return _DEVICE


def cell_dir(plan: Plan, spec: RowSpec, seed: int) -> Path:
    """The run folder of one cell: its checkpoint, evaluations and ``cell.json``."""
    return plan.out / spec.slug / f"seed{seed}"


def run_cell(plan: Plan, spec: RowSpec, seed: int, threads: int = 1, device: str = "cpu") -> CellResult:
    """Train and evaluate one row with one seed under ``plan.out/<row>/seed<seed>`` on ``device``."""
    global _DEVICE
    _DEVICE = device
    torch.set_num_threads(threads)
    t0 = time.time()
    result = _CELLS[plan.task](plan, spec, seed, cell_dir(plan, spec, seed))
    result.seconds = round(time.time() - t0, 1)
    msg = ", ".join(f"{k} {v:.3f}" for k, v in next(iter(result.scores.values())).items())
    print(f"[study {plan.key}] {spec.name} seed {seed} ({result.seconds} s): {msg}", flush=True)
    return result


def assemble(plan: Plan, cells: dict[tuple[str, int], CellResult | None], seconds: float = 0.0) -> TaskResult:
    """The task's table: per row (and mode) the mean, sample std and per-seed values over the seeds.

    A row with a failed cell (``None``) is left out, with a note.
    """
    rows: list[Row] = []
    notes = list(plan.notes)
    for spec in plan.specs:
        source = spec.same_as or spec.name
        runs = [cells.get((source, s)) for s in plan.seeds]
        if any(r is None for r in runs):
            failed = [s for s, r in zip(plan.seeds, runs, strict=True) if r is None]
            notes.append(
                f"Row `{spec.name}` left out: its training failed for seed(s) {failed} (see the log)."
            )
            continue
        for mode in spec.modes:
            label = spec.name if mode is None else f"{spec.name} ({mode})"
            per_seed = {lab: [r.scores[str(mode)][lab] for r in runs] for lab in plan.labels}
            stats = {lab: mean_std(v) for lab, v in per_seed.items()}
            # the metrics every seed has (cells are checked one by one when reused: see study_runner.read_cell)
            metrics = [
                m
                for m in runs[0].extra.get(str(mode), {})
                if all(m in r.extra.get(str(mode), {}) for r in runs)
            ]
            extra = {m: {lab: mean_std([r.extra[str(mode)][m][lab] for r in runs])[0] for lab in plan.labels}
                     for m in metrics}  # fmt: skip
            has_int8 = all(r.int8 for r in runs)
            int8 = (
                {lab: [r.int8[lab] for r in runs] for lab in plan.labels}
                if has_int8 and mode in (None, "bicubic")
                else {}
            )
            rows.append(Row(
                label, spec.encoding, mode, {k: v[0] for k, v in stats.items()}, runs[0].params, runs[0].flops,
                extra, {k: v[1] for k, v in stats.items() if v[1] is not None}, per_seed, spec.group, int8, spec.same_as,
                _mean_diagnostics([r.diagnostics for r in runs]) if mode == spec.modes[0] else {},
            ))  # fmt: skip
    b = plan.budget
    budget = {**asdict(b), "epochs": plan.epochs, "model": plan.model, "seeds": plan.seeds}
    if plan.task == "classify":
        budget["train_size"] = int(plan.train_label.split()[0])
    return TaskResult(plan.key, plan.metric, plan.train_label, list(plan.labels), rows, budget, plan.data_name,
                      round(seconds, 1), notes, list(plan.seeds), plan.protocol, plan.chance)  # fmt: skip


def _mean_diagnostics(per_seed: list[dict[str, dict[str, list[float]]]]) -> dict[str, dict[str, list[float]]]:
    """Per test size and quantity, the per-layer mean over the seeds (sizes every seed has)."""
    if not per_seed or not all(per_seed):
        return {}
    out: dict[str, dict[str, list[float]]] = {}
    for lab in per_seed[0]:
        # a size every seed has, with the same quantities and depth (reused cells are checked one by one)
        if all(lab in d and d[lab].keys() == per_seed[0][lab].keys() for d in per_seed) and all(
            len({len(d[lab][q]) for d in per_seed}) == 1 for q in per_seed[0][lab]
        ):
            out[lab] = {q: [math.fsum(vals) / len(vals) for vals in zip(*(d[lab][q] for d in per_seed), strict=True)]
                        for q in per_seed[0][lab]}  # fmt: skip
    return out


def cells_of(plan: Plan) -> list[RowSpec]:
    """The specs that train (rows repeating another row train nothing)."""
    return [s for s in plan.specs if s.same_as is None]


def _describe(cfg: dict[str, Any], name: str = "CPVT demo") -> str:
    """``CPVT demo (embed_dim 64, depth 4, ...)`` from a model configuration."""
    return f"{name} (" + ", ".join(f"{k} {v}" for k, v in cfg.items()) + ")"


PLANS = {"classify": plan_classify, "detect": plan_detect, "video": plan_video}
TASKS = tuple(PLANS)
