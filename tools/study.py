"""Does each position encoding hold up when the input size changes?  One command per package.

For each task the same model is trained once per row (a position encoding, or an ablation of
the PEG) and seed (same data, budget and seeds for every row), then evaluated at the training
size and at other sizes without fine-tuning; a learned table is evaluated once per resize mode
(bicubic / bilinear / nearest).  Writes, under ``--out``:

* ``report.md``: per task a table of mean ± sample standard deviation over the seeds (encoding x
  test size, plus the encoding's parameters and FLOPs at the training size), one table per
  ablation axis, the int8 accuracy drop (``--quantize int8``), and sentences that read the
  tables (generated from the numbers),
* ``<task>.png``: the metric against test size, one line per encoding, error bars = std,
* ``study.json``: every number, per seed (also AP next to AP50, top-5 next to top-1),

and prints the tables.  Tasks and rows:

* ``classify``: CPVT classifier on generated shapes; ``peg``, ``peg-dynamic``, ``sincos``, ``learned``,
  ``none``, ``learned + multi-scale``, ``learned + progressive``, the rotary ``rope-axial``,
  ``rope-mixed`` and ``peg+rope-mixed``; test sizes 0.75x, 1x, 1.5x, 2x;
  two protocols (``--protocol``): ``quadrant`` (the label needs absolute position) and ``scale``
  (the label is the shape; test images are the same scenes rendered larger, CPVT's 224 -> 384);
* ``detect``: tiny DETR on synthetic COCO; ``peg``, ``sine``, ``learned``, ``none`` and the same
  rotary rows (in the encoder); same scales;
* ``detect --arch rtdetr``: tiny RT-DETR (``rtdetr_demo_tiny``) on synthetic COCO, trained multi-scale as
  RT-DETR is; ``peg``, ``sincos``, ``none`` in AIFI (``--rows`` adds ``learned`` and the rotary rows);
  same scales, its own section ``detect-rtdetr`` (``--arch both``: DETR's and RT-DETR's);
* ``detect --arch rfdetr``: tiny RF-DETR (``rfdetr_demo_tiny``) on synthetic COCO, trained multi-scale at
  multiples of its patch x windows; ``learned`` (RF-DETR's table), ``peg`` (after ViT block 0, replacing
  the table) and ``none`` in its windowed ViT; same scales, its own section ``detect-rfdetr``;
* ``video``: tiny video ViT on synthetic Kinetics; ``peg3d``, ``peg3d-factorized``, ``learned``,
  ``none``, ``rope-3d``, ``peg3d+rope-3d``; half, same and double clip length, and a larger crop.

    python -m tools.study --task all --seeds 3 --ablate kernel,placement,separable,padding,video \\
        --protocol both --quantize int8 --jobs 2    # the documented run, ~30 min on 2 CPU cores
    python -m tools.study --task classify --quick    # seconds (what the tests run)
    python -m tools.study --task classify --data /data/imagenet100 --train-size 160 --test-sizes 128,160,224
    python -m tools.study --task detect --data /data/coco --epochs 50
    python -m tools.study --task detect --arch rtdetr --seeds 3 --jobs 2    # ~14 min on 2 CPU cores
    python -m tools.study --task detect --arch rfdetr --seeds 3 --jobs 2
    python -m tools.study --task all --extrapolate --seeds 3 --jobs 2 --protocol both   # 0.5x-4x, aspect,
        # clip length, attention diagnostics, the bias rows: ~2 h of cell time (docs/study.md: the extrapolation run)
    python -m tools.study --task video --data /data/k400 --video-config k400_vit_s_16x4_peg3d --epochs 50 \
        --train-args "--batch-size 64 --workers 8"    # a GPU node: one cell per GPU; a rerun resumes

Every row also has the attention-bias encodings (``alibi-2d``, ``fire``, ``lookhere``, ``peg+alibi-2d``,
``peg+fire``; video without ``lookhere``, with ``peg3d`` pairs).  ``--extrapolate``: test sizes 0.5x-4x
(video: clip lengths), classification at 1:2 and 2:1, and per-layer attention entropy / distance
(``peg_core.models.probe``), tabled, plotted and read by a sentence.  Cells run one per visible GPU
(``--devices``) or ``--jobs`` CPU workers; a finished cell's ``cell.json`` is reused by a rerun with the
same ``--out`` (``--retrain`` trains it again).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peg_core.engine.cli import image_side, image_side_list, int_in
from peg_core.engine.command import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, ArgumentParser, UserError
from peg_core.errors import InputError
from peg_video.configs import CONFIGS as VIDEO_CONFIGS
from tools.study_runner import devices_arg, out_lock, resolve_devices, row_seconds, run_cells
from tools.study_tasks import (
    ABLATIONS,
    BIAS_ROWS,
    DETECT_ARCHS,
    EXTRAPOLATION_SCALES,
    PLANS,
    PRETRAINED_GROUP,
    ROTARY_ROWS,
    RTDETR_FAMILY,
    TASKS,
    VIDEO_BIAS_ROWS,
    VIDEO_ROTARY_ROWS,
    Plan,
    Row,
    TaskResult,
    assemble,
    cells_of,
    classify_specs,
    mean_std,
    plan_detect_rfdetr,
    plan_detect_rtdetr,
)

__all__ = [
    "StudyFailed",
    "cli",
    "compare",
    "error_bars",
    "fmt_ms",
    "interpret",
    "judge",
    "main",
    "markdown_table",
    "plot_task",
    "row_styles",
    "task_figure",
    "write_report",
]

DATA_HELP = {
    "classify": "ImageNet-style folder with train/<class>/ and val/<class>/",
    "detect": "COCO layout: train2017/, val2017/, annotations/instances_{train,val}2017.json",
    "video": "folder with train.csv + val.csv (Kinetics) or train.txt + val.txt ('path label')",
}
#: a value is "near chance" below ``chance + CHANCE_MARGIN * (1 - chance)`` (a tenth of the way to perfect)
CHANCE_MARGIN = 0.1
PROTOCOL_TEXT = {
    "quadrant": (
        "Protocol *quadrant*: the class is the shape and the quadrant it sits in, so the model must "
        "know where each patch is. At a larger test size the same scene has more tokens and the "
        "quadrant must still be read from absolute position."
    ),
    "scale": (
        "Protocol *scale*: the class is the shape alone (anywhere, any size, any hue), and each test "
        "size shows the same scenes rendered at that size, objects scaled with the image. This is "
        "CPVT's protocol (train at 224 px, test the same weights at 384 px)."
    ),
}


def _si(n: int) -> str:
    """Compact count: 1234 -> 1.23k, 5_600_000 -> 5.6M."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return str(n)


def fmt_ms(mean: float, std: float | None) -> str:
    """``0.990 ± 0.004`` (mean ± sample std), or ``0.990`` when there is no std (one seed)."""
    return f"{mean:.3f}" if std is None else f"{mean:.3f} ± {std:.3f}"


def _cell(row: Row, col: str) -> str:
    return fmt_ms(row.scores[col], row.std.get(col))


def markdown_table(result: TaskResult, rows: list[Row] | None = None) -> str:
    """One Markdown table: a row per encoding (and resize mode), a column per test size.

    ``rows``: the rows to show (default: the encoding rows, without the ablations).
    """
    rows = [r for r in result.rows if r.group == "encoding"] if rows is None else rows
    head = ["encoding", *[f"{s}{' (train)' if s == result.train_size else ''}" for s in result.sizes]]
    head += ["params", "FLOPs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        label = row.label + (f" (= {row.repeats})" if row.repeats else "")
        cells = [label, *[_cell(row, s) for s in result.sizes], _si(row.params), _si(row.flops)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ablation_tables(result: TaskResult) -> list[tuple[str, str]]:
    """``(axis, Markdown table)`` per ablation axis present, the rows of that axis only."""
    groups = list(dict.fromkeys(r.group for r in result.rows if r.group != "encoding"))
    return [(g, markdown_table(result, [r for r in result.rows if r.group == g])) for g in groups]


def int8_table(result: TaskResult) -> str | None:
    """Float32 and int8 accuracy and the drop (mean ± std over seeds) per encoding row, at each size."""
    rows = [r for r in result.rows if r.int8 and r.group == "encoding"]
    if not rows:
        return None
    head = ["encoding", *[f"{s} fp32 / int8 (drop)" for s in result.sizes]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.label]
        for s in result.sizes:
            q, qs = mean_std(row.int8[s])
            drop, ds = mean_std([a - b for a, b in zip(row.per_seed[s], row.int8[s], strict=True)])
            cells.append(f"{row.scores[s]:.3f} / {fmt_ms(q, qs)} ({fmt_ms(drop, ds)})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def error_bars(result: TaskResult) -> dict[str, tuple[list[float], list[float]]]:
    """Plot data of the encoding rows: ``label -> (means, stds)`` in test-size order (std 0 for one seed)."""
    return {
        r.label: ([r.scores[s] for s in result.sizes], [r.std.get(s, 0.0) for s in result.sizes])
        for r in result.rows
        if r.group == "encoding"
    }


#: 20 qualitative colours of high mutual contrast (Kelly's list without white and the near-black olive,
#: its violet, too close to its purple, replaced by a cyan): ten more than matplotlib's default cycle,
#: which gave a 12-row table two rows of the same blue
PALETTE = (
    "#0067A5", "#BE0032", "#008856", "#F38400", "#875692", "#222222", "#A1CAF1", "#8DB600", "#E68FAC",
    "#848482", "#F3C300", "#17BECF", "#882D17", "#F99379", "#C2B280", "#B3446C", "#DCD300", "#654522",
    "#E25822", "#F6A600",
)  # fmt: skip
#: 7 markers: with 20 colours, the pair (colour, marker) repeats only after 140 rows (lcm(20, 7))
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
#: the rows the study trains, in the order that fixes their style: the same row has the same colour and
#: marker in every figure, and the rows the README compares (peg, a resized table, the rotary rows)
#: get the most distinct colours
STYLE_ORDER = (
    "peg", "learned (bicubic)", "rope-mixed", "peg+rope-mixed", "none", "sincos", "peg-dynamic",
    "learned (bilinear)", "learned (nearest)", "learned + multi-scale", "learned + progressive", "rope-axial",
    "sine", "rope-dinov3", "peg+rope-axial", "learned",
)  # fmt: skip
#: video rows drawn as their image counterpart (a video figure never holds an image row): a PEG is the
#: blue circle and the rotary rows keep their colours in every figure
STYLE_LIKE = {"peg3d": "peg", "peg3d-factorized": "peg-dynamic", "rope-3d": "rope-mixed",
              "peg3d+rope-3d": "peg+rope-mixed"}  # fmt: skip


def row_styles(labels: list[str]) -> dict[str, tuple[str, str]]:
    """``label -> (colour, marker)``, a distinct pair per label, the same pair for a label in every figure.

    A label of :data:`STYLE_ORDER` takes its place there, a label of :data:`STYLE_LIKE` its
    counterpart's place (when the counterpart is not in ``labels``); any other label (a row this module
    does not know) takes the next free place after them, in sorted order, so a figure never repeats a pair.
    """
    index = {name: i for i, name in enumerate(STYLE_ORDER)}
    for name, like in STYLE_LIKE.items():
        if like not in labels:
            index[name] = index[like]
    unknown = sorted(set(labels) - set(index))
    index.update({name: len(STYLE_ORDER) + k for k, name in enumerate(unknown)})
    return {
        label: (PALETTE[index[label] % len(PALETTE)], MARKERS[index[label] % len(MARKERS)])
        for label in labels
    }


def task_figure(result: TaskResult) -> Figure:
    """Metric against test size, one line per encoding row, error bars = sample std (a pyplot-free Figure).

    Every row has its own colour and marker (:func:`row_styles`); a resized table in another mode than
    bicubic is dashed.  The metrics are fractions: error bars are cut at 0 and 1, and a top-k axis ends
    at 1.0 (an AP axis at its largest value, never above 1.0).
    """
    fig = Figure(figsize=(7.2, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = list(range(len(result.sizes)))
    modes = {r.label: r.mode for r in result.rows}
    bars = error_bars(result)
    styles = row_styles(list(bars))
    lows, highs = [], []
    for i, (label, (means, stds)) in enumerate(bars.items()):
        below = [min(s, m) for m, s in zip(means, stds, strict=True)]  # a fraction is never below 0
        above = [max(0.0, min(s, 1.0 - m)) for m, s in zip(means, stds, strict=True)]  # ... nor above 1
        lows += [m - b for m, b in zip(means, below, strict=True)]
        highs += [m + a for m, a in zip(means, above, strict=True)]
        colour, marker = styles[label]
        line = "--" if modes[label] not in (None, "bicubic") else "-"
        # side by side, so that the error bars do not hide each other
        shift = 0.03 * (i - (len(bars) - 1) / 2)
        ax.errorbar([v + shift for v in x], means, yerr=[below, above], fmt=line, color=colour, marker=marker,
                    capsize=2, label=label, markersize=4, clip_on=False)  # fmt: skip
    if lows:
        lo, hi = min(lows), max(highs)
        pad = 0.05 * max(hi - lo, 0.1)
        top = 1.0 if result.metric.lower().startswith("top") else min(1.0, hi + pad)
        ax.set_ylim(max(0.0, lo - pad), top)
    ax.set_xticks(x, result.sizes)
    ax.set_xlabel(f"test size (trained at {result.train_size})")
    ax.set_ylabel(result.metric)
    seeds = f", mean ± std of {len(result.seeds)} seeds" if len(result.seeds) > 1 else ""
    ax.set_title(f"{result.task}: {result.metric} vs test size{seeds}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _diagnosed(result: TaskResult) -> list[Row]:
    return [r for r in result.rows if r.group == "encoding" and r.diagnostics]


def attention_figure(result: TaskResult) -> Figure | None:
    """Per layer (a row of panels): mean attention entropy and mean attention distance against the test
    size, one line per encoding row (the same styles as :func:`task_figure`); None without diagnostics."""
    rows = _diagnosed(result)
    if not rows:
        return None
    cols = [c for c in square_columns(result) if all(c in r.diagnostics for r in rows)]
    depth = max(len(r.diagnostics[cols[0]]["entropy"]) for r in rows)
    fig = Figure(figsize=(8.4, 2.1 * depth + 0.6), dpi=100)
    FigureCanvasAgg(fig)
    styles = row_styles([r.label for r in rows])
    axes = fig.subplots(depth, 2, squeeze=False, sharex=True)
    for layer in range(depth):
        for j, (q, unit) in enumerate((("entropy", "nats"), ("distance", "grid cells"))):
            ax = axes[layer][j]
            for r in rows:
                values = [r.diagnostics[c][q] for c in cols]
                if layer < len(values[0]):
                    colour, marker = styles[r.label]
                    ax.plot(range(len(cols)), [v[layer] for v in values], color=colour, marker=marker,
                            markersize=3, label=r.label)  # fmt: skip
            ax.set_ylabel(f"layer {layer + 1}\n{q} ({unit})", fontsize=7)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if layer == depth - 1:
                ax.set_xticks(range(len(cols)), cols, fontsize=7)
                ax.set_xlabel(f"test size (trained at {result.train_size})", fontsize=7)
    axes[0][0].set_title("mean attention entropy (grid queries)", fontsize=8)
    axes[0][1].set_title("mean attention distance to the grid keys", fontsize=8)
    axes[0][1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{result.task}: attention diagnostics, mean over {len(result.seeds)} seed(s)", fontsize=9)
    fig.tight_layout()
    return fig


def diagnostics_table(result: TaskResult) -> str | None:
    """Entropy / distance of the first and last layer at the training and the largest test size, per row."""
    rows = _diagnosed(result)
    if not rows:
        return None
    train, big = result.train_size, largest_column(result)
    head = ["encoding", f"entropy {train}", f"entropy {big}", f"distance {train}", f"distance {big}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pair(r: Row, col: str, q: str) -> str:
        v = r.diagnostics[col][q]
        return f"{v[0]:.2f} / {v[-1]:.2f}"

    for r in rows:
        cells = [r.label] + [pair(r, c, q) for q in ("entropy", "distance") for c in (train, big)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the attention-diagnostic sentence needs this many rows and a rank correlation this certain
MIN_ROWS_FOR_RANKS, RANK_P = 5, 0.05


def diagnostics_sentences(result: TaskResult) -> list[str]:
    """Do the rows that lose most at the largest size change their last layer's attention most?

    Spearman's rank correlation over the encoding rows between the metric's drop (training size ->
    largest size) and the change of the last layer's mean entropy / distance; a conclusion only with
    at least 2 seeds, :data:`MIN_ROWS_FOR_RANKS` rows and ``p <`` :data:`RANK_P`.
    """
    from scipy.stats import spearmanr

    rows = _diagnosed(result)
    train, big = result.train_size, largest_column(result)
    rows = [r for r in rows if train in r.diagnostics and big in r.diagnostics]
    if not rows or big == train:
        return []
    drop = [r.scores[train] - r.scores[big] for r in rows]
    out = []
    for q, grows in (("entropy", "rises"), ("distance", "grows")):
        change = [r.diagnostics[big][q][-1] - r.diagnostics[train][q][-1] for r in rows]
        moved = ", ".join(f"`{r.label}` {c:+.2f}" for r, c in sorted(zip(rows, change, strict=True),
                                                                    key=lambda rc: -abs(rc[1]))[:3])  # fmt: skip
        head = f"Last layer's attention {q} from {train} to {big}: largest changes {moved}"
        if len(result.seeds) < 2:
            out.append(f"{head}; {_no_conclusion('one seed: a rank correlation needs at least 2 seeds')}.")
            continue
        if len(rows) < MIN_ROWS_FOR_RANKS or len(set(drop)) < 2 or len(set(change)) < 2:
            out.append(f"{head}; {_no_conclusion(f'{len(rows)} rows: too few to rank')}.")
            continue
        rho, pval = spearmanr(drop, change)
        stat = f"Spearman rho = {rho:.2f}, p = {pval:.3f}, n = {len(rows)} rows"
        if pval < RANK_P:
            way = "more" if rho > 0 else "less"
            out.append(
                f"{head}. The rows that lose most {result.metric} are those whose {q} {grows} {way} ({stat})."
            )
        else:
            out.append(f"{head}; a row's {result.metric} drop and its {q} change: "
                       f"{_no_conclusion(stat + ', not below ' + str(RANK_P))}.")  # fmt: skip
    return out


def plot_task(result: TaskResult, path: Path) -> Path:
    """:func:`task_figure` written to ``path`` as a PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    task_figure(result).savefig(path)
    return path


# ----------------------------------------------------------------------------------- interpretation


def judge(
    a: Row, b: Row, col: str, col_b: str | None = None, chance: float | None = None
) -> tuple[int, str | None]:
    """``(sign, why)``: whether ``a`` at ``col`` beats (``1``) or trails (``-1``) ``b`` at ``col_b``.

    A difference counts only with at least 2 seeds (a sample std on both sides), when it exceeds
    the combined spread ``std_a + std_b``, and not when both values are near ``chance`` (see
    :data:`CHANCE_MARGIN`).  Otherwise the sign is ``0`` and ``why`` says which of these failed.
    """
    col_b = col_b or col
    va, vb = a.scores[col], b.scores[col_b]
    sa, sb = a.std.get(col), b.std.get(col_b)
    reasons = []
    if sa is None or sb is None:
        reasons.append("one seed: a difference needs at least 2 seeds")
    elif abs(va - vb) <= sa + sb:
        reasons.append(f"the difference {abs(va - vb):.3f} is within the spread ±{sa + sb:.3f}")
    if chance is not None:
        near = chance + CHANCE_MARGIN * (1 - chance)
        if va < near and vb < near:
            reasons.append(f"both are near chance ({chance:.3f})")
    if reasons:
        return 0, "; ".join(reasons)
    return (1 if va > vb else -1), None


def compare(a: Row, b: Row, col: str, col_b: str | None = None, chance: float | None = None) -> int:
    """``1`` when ``a`` beats ``b`` at ``col`` (``b`` at ``col_b``), ``-1`` when it trails, ``0``: no
    conclusion (see :func:`judge`)."""
    return judge(a, b, col, col_b, chance)[0]


def _no_conclusion(why: str | None) -> str:
    return f"no conclusion ({why})"


def _holds(row: Row, col: str, train: str, chance: float | None = None) -> str:
    """``keeps 0.98 ± 0.01`` / ``drops to 0.61 ± 0.05`` / ``rises to ...`` from ``train`` to ``col``;
    ``is at 0.61`` when the seeds or chance do not support a change or its absence."""
    sign, why = judge(row, row, col, train, chance)
    if why is not None and ("one seed" in why or "chance" in why):
        return f"is at {_cell(row, col)}"
    verb = {0: "keeps", 1: "rises to", -1: "drops to"}[sign]
    return f"{verb} {_cell(row, col)}"


def _best(rows: list[Row], col: str, chance: float | None) -> str:
    """The best row at ``col`` when it is ahead of the runner-up, else no conclusion."""
    ranked = sorted(rows, key=lambda r: r.scores[col], reverse=True)
    top = ranked[0]
    if len(ranked) > 1:
        sign, why = judge(top, ranked[1], col, chance=chance)
        if sign != 1:
            return (
                f"{_no_conclusion(why)}: highest `{top.label}` ({_cell(top, col)}), next `{ranked[1].label}`"
            )
    return f"best `{top.label}` ({_cell(top, col)})"


def _find(result: TaskResult, *labels: str) -> Row | None:
    rows = {r.label: r for r in result.rows if r.group == "encoding"}
    return next((rows[lab] for lab in labels if lab in rows), None)


def interpret(result: TaskResult) -> list[str]:
    """Sentences that read the task's tables, each built from the numbers it states.

    Compares the conditional encoding (``peg`` / ``peg3d``) with a learned table resized
    bicubically, at the training size and at the largest test size, the best rotary row with the
    PEG at the largest test size, and reads the padding ablation; says which claim of the CPVT paper the table supports or contradicts, or that it draws
    no conclusion and why (one seed, a difference within the spread, both near chance: :func:`judge`).
    """
    out: list[str] = []
    if result.protocol in PROTOCOL_TEXT:
        out.append(PROTOCOL_TEXT[result.protocol])
    train = result.train_size
    big = largest_column(result)
    peg = _find(result, "peg", "peg3d")
    learned = _find(result, "learned (bicubic)", "learned")
    none = _find(result, "none")
    chance = result.chance
    if peg is not None and learned is not None and big != train:
        verdict, why = _size_sentence(out, peg, learned, big, train, chance)
        claim = "a PEG generalises to a larger input without fine-tuning better than a resized learned table"
        if result.protocol == "scale":
            claim += " (CPVT-Ti 73.4 -> 74.2 against DeiT-Ti 72.2 -> 71.2 at 224 -> 384 px)"
        elif result.protocol == "quadrant":
            claim += " when the label needs absolute position (not the paper's protocol: see classify-scale)"
        keeps = ""
        if verdict == 1 and compare(peg, peg, big, train, chance) == -1:  # ahead, yet not holding its level
            keeps = (f", but not that a PEG keeps its accuracy: {peg.label} falls from {_cell(peg, train)} to "
                     f"{_cell(peg, big)}")  # fmt: skip
        if verdict == 0:
            out.append(f"This table draws no conclusion on the claim that {claim} ({why}).")
        else:
            out.append(
                f"This table {'supports' if verdict == 1 else 'contradicts'} the claim that {claim}{keeps}."
            )
    sincos = _find(result, "sincos") if result.task in ("detect-rtdetr", "detect-dfine") else None
    if peg is not None and sincos is not None and big != train:  # RT-DETR's own encoding is the reference
        verdict, why = _size_sentence(out, peg, sincos, big, train, chance)
        claim = (
            f"a PEG in AIFI holds up at a larger input without fine-tuning better than "
            f"{RTDETR_FAMILY[result.task.removeprefix('detect-')][1]}'s sin-cos codes computed for that input's grid"
        )
        out.append(
            f"This table draws no conclusion on the claim that {claim} ({why})."
            if verdict == 0
            else f"This table {'supports' if verdict == 1 else 'contradicts'} the claim that {claim}."
        )
    if peg is not None and none is not None and result.protocol != "scale":
        v, why = judge(peg, none, train, chance=chance)
        reading = {1: "the task needs position, and the PEG supplies it", -1: "the PEG hurts here"}
        out.append(
            f"At the training size {peg.label} reaches {_cell(peg, train)} and `none` {_cell(none, train)}: "
            f"{reading.get(v) or _no_conclusion(why)}."
        )
    rotary = [
        r for r in result.rows if r.group == "encoding" and r.encoding in (*ROTARY_ROWS, *VIDEO_ROTARY_ROWS)
    ]
    if peg is not None and rotary and big != train:
        out.append(_rotary_sentence(peg, rotary, big, train, chance))
    biases = [
        r for r in result.rows if r.group == "encoding" and r.encoding in (*BIAS_ROWS, *VIDEO_BIAS_ROWS)
    ]
    if peg is not None and biases and big != train:
        out.append(_rotary_sentence(peg, biases, big, train, chance, "attention-bias"))
    pad = {r.label: r for r in result.rows if r.group == "padding"}
    if "zero padding" in pad and "circular padding" in pad:
        z, c = pad["zero padding"], pad["circular padding"]
        v, why = judge(z, c, train, chance=chance)
        claim = "the paper's claim that zero padding is what lets a PEG encode absolute position"
        out.append(
            f"Without zero padding (circular) the PEG reaches {_cell(c, train)} at the training size "
            f"against {_cell(z, train)} with zeros: "
            + (
                f"{_no_conclusion(why)} on {claim}"
                if v == 0
                else f"{'supports' if v == 1 else 'contradicts'} {claim}"
            )
            + "."
        )
    for group in dict.fromkeys(r.group for r in result.rows if r.group not in ("encoding", "padding")):
        rows = [r for r in result.rows if r.group == group]
        what = f"Rows {group}" if group == PRETRAINED_GROUP else f"Ablation {group}"
        out.append(
            f"{what}: at the training size {_best(rows, train, chance)}; at {big} {_best(rows, big, chance)}."
        )
    return out


def _size_sentence(
    out: list[str], peg: Row, ref: Row, big: str, train: str, chance: float | None
) -> tuple[int, str | None]:
    """Append how ``peg`` and ``ref`` go from ``train`` to ``big`` and who is ahead there; the verdict."""
    verdict, why = judge(peg, ref, big, chance=chance)
    out.append(
        f"At {big} (trained at {train}) {peg.label} {_holds(peg, big, train, chance)} while "
        f"{ref.label} {_holds(ref, big, train, chance)}: "
        + {1: f"{peg.label} is ahead", -1: f"{ref.label} is ahead", 0: _no_conclusion(why)}[verdict]
        + "."
    )
    return verdict, why


def _rotary_sentence(
    peg: Row, rotary: list[Row], big: str, train: str, chance: float | None, family: str = "rotary"
) -> str:
    """The best row of ``family`` against the PEG at ``big``: who is ahead beyond the spread, or no conclusion."""
    best = max(rotary, key=lambda r: r.scores[big])
    verdict, why = judge(best, peg, big, chance=chance)
    reading = {1: f"{best.label} is ahead", -1: f"{peg.label} is ahead", 0: _no_conclusion(why)}[verdict]
    return (
        f"{family.capitalize()} against PEG at {big} (trained at {train}): the best {family} row {best.label} "
        f"{_holds(best, big, train, chance)} while {peg.label} {_holds(peg, big, train, chance)}: {reading}."
    )


def largest_column(result: TaskResult) -> str:
    """The column of the largest square test size (video: the longest clip at the training crop)."""
    if result.task == "video":
        return max((c for c in result.sizes if "," not in c), key=_size_key)
    return max(result.sizes, key=_size_key)


def square_columns(result: TaskResult) -> list[str]:
    """The columns of one scale axis: square sizes (video: clip lengths at the training crop), in order."""
    cols = [c for c in result.sizes if "x" not in c.split()[0] and "," not in c]
    return sorted(cols, key=_size_key)


#: the encoding families of the three-families paragraph, in its order: label -> rows' encodings
FAMILIES = {
    "conditional (PEG)": ("peg", "peg3d"),
    "table": ("learned", "sincos", "sine"),
    "rotary": (*ROTARY_ROWS, *VIDEO_ROTARY_ROWS),
    "attention bias": (*BIAS_ROWS, *VIDEO_BIAS_ROWS),
}


def _family_of(row: Row) -> str | None:
    enc = row.encoding
    for name, members in FAMILIES.items():
        if enc in members and "+" not in enc:
            return name
    return "PEG pair" if enc.startswith("peg") and "+" in enc else None


def families_sentences(result: TaskResult) -> list[str]:
    """The best row of each family (PEG, table, rotary, bias, PEG pair) at the training size and the
    largest one, and which families are ahead of which beyond the spread there (generated from the numbers)."""
    rows = [r for r in result.rows if r.group == "encoding" and r.mode in (None, "bicubic")]
    fams: dict[str, list[Row]] = {}
    for r in rows:
        f = _family_of(r)
        if f is not None:
            fams.setdefault(f, []).append(r)
    if len(fams) < 2:
        return []
    train, big = result.train_size, largest_column(result)
    # the training size, twice it (where the families still differ on toy data) and the largest size
    double = [c for c in square_columns(result) if _size_key(c) == 2 * _size_key(train)]
    out = []
    for col in dict.fromkeys([train, *double, big]):
        best = {f: max(rs, key=lambda r: r.scores[col]) for f, rs in fams.items()}
        ranked = sorted(best.items(), key=lambda kv: kv[1].scores[col], reverse=True)
        listing = "; ".join(f"{f} `{r.label}` {_cell(r, col)}" for f, r in ranked)
        (f1, top), (f2, second) = ranked[0], ranked[1]
        sign, why = judge(top, second, col, chance=result.chance)
        lead = (f"the {f1} family leads, ahead of the next ({f2}) beyond the spread" if sign == 1
                else f"no family leads: {_no_conclusion(why)} between {f1} and {f2}")  # fmt: skip
        behind = [f for f, r in ranked[1:] if judge(top, r, col, chance=result.chance)[0] == 1]
        tail = f"; {f1} is ahead of {', '.join(behind)}" if behind and sign != 1 else ""
        where = {train: "the training size", big: "the largest test size"}.get(col, "twice the training size")
        out.append(f"{result.task}, best row per family at {col} ({where}): {listing}. Here {lead}{tail}.")
    return out


def _size_key(label: str) -> float:
    """``"96 px"`` -> 96; the order of image test sizes."""
    try:
        return float(label.split()[0])
    except ValueError:
        return 0.0


# -------------------------------------------------------------------------------------------- report


def task_section(result: TaskResult) -> str:
    b = result.budget
    seeds = result.seeds
    seed_text = (
        f"{len(seeds)} seeds ({', '.join(map(str, seeds))}; same data), cells = mean ± sample standard "
        "deviation (n - 1)"
        if len(seeds) > 1
        else f"seed {seeds[0]}"
    )
    lines = [
        f"## {result.task}: {result.metric} by test size",
        "",
        f"Data: {result.data}. Model: {b['model']}. Budget per row: {b['epochs']} epochs, "
        f"batch {b['batch_size']}, {seed_text}. Trained at {result.train_size}; {result.seconds} s of "
        "cell time for the task.",
        "",
        markdown_table(result),
        "",
        "params / FLOPs: the position encoding alone, at the training size (convs: 2 x MACs; plus one add "
        "per code element where codes join the tokens).",
        "",
        *[f"* {s}" for s in interpret(result)],
    ]
    fam = families_sentences(result)
    if fam:
        lines += ["", "Three families (conditional, table, rotary, attention bias; and the PEG pairs):", "",
                  *[f"* {s}" for s in fam]]  # fmt: skip
    diag = diagnostics_table(result)
    if diag is not None:
        lines += ["", "Attention diagnostics (`--diagnose`, `peg_core.models.probe`; first / last layer, mean "
                  "over seeds; entropy in nats over all keys, distance in grid cells to the attended grid keys):",
                  "", diag, "", *[f"* {s}" for s in diagnostics_sentences(result)]]  # fmt: skip
    for group, table in ablation_tables(result):
        if group == PRETRAINED_GROUP:  # not an ablation: a table row and a PEG row from the same weights
            lines += ["", f"**{group}** (a Hugging Face folder through `train --init`; same data, budget and "
                      "seeds):", "", table]  # fmt: skip
            continue
        lines += ["", f"Ablation **{group}** (PEG rows, same data, budget and seeds; a row marked "
                  "(= X) shows the models of row X, trained once):", "", table]  # fmt: skip
    q = int8_table(result)
    if q is not None:
        lines += [
            "",
            "int8 (PT2E, `peg_core.export.quantize`; fp32 / int8 (drop), mean ± std over seeds):",
            "",
            q,
        ]
    if result.notes:
        lines += [""] + [f"{n}" for n in result.notes]
    return "\n".join(lines)


def _cost_section() -> str | None:
    """The CPVT-Ti/S/B parameter / FLOP share table of :mod:`tools.study_cost`, when it has one."""
    from tools import study_cost

    if not hasattr(study_cost, "cost_table"):
        return None
    table, figures = study_cost.cost_table()
    check = study_cost.verdict(figures) if hasattr(study_cost, "verdict") else ""
    return "\n\n".join(t for t in ("## What a position encoding costs in CPVT-Ti/S/B", table, check) if t)


def write_report(
    results: list[TaskResult], out: Path, command: str, wall: float | None = None, cost: str | None = None
) -> Path:
    """``report.md``, ``study.json`` and one PNG per task under ``out``; ``cost``: a closing section."""
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {multiprocessing.cpu_count()} CPU cores, torch {torch.__version__}"
    parts = [
        "# Position-encoding study",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine}" + (f"; wall time {wall / 60:.1f} min." if wall is not None else "."),
        "",
        "Embedded data is small and budgets are minutes on a CPU: the numbers show trends between "
        "encodings under a size change, not what these models reach on real data. A difference counts "
        "(in the sentences) only with at least 2 seeds, when it exceeds the sum of the two standard "
        "deviations, and not when both values are near chance; otherwise the sentence says no conclusion "
        "and why.",
    ]
    for r in results:
        png = plot_task(r, out / f"{r.task}.png")
        parts += ["", task_section(r), "", f"![{r.task}]({png.name})"]
        fig = attention_figure(r)
        if fig is not None:
            fig.savefig(out / f"{r.task}_attention.png")
            parts += ["", f"![{r.task}: attention entropy and distance per layer]({r.task}_attention.png)"]
    if cost:
        parts += ["", cost]
    (out / "report.md").write_text("\n".join(parts) + "\n")
    doc = {"command": command, "torch": torch.__version__, "machine": machine, "wall_seconds": wall,
           "tasks": {r.task: r.to_dict() for r in results}}  # fmt: skip
    (out / "study.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out / "report.md"


# ---------------------------------------------------------------------------------------------- main


def _ablate_list(text: str) -> list[str]:
    """``argparse`` type: comma-separated axes of :data:`ABLATIONS`."""
    axes = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in axes if a not in ABLATIONS]
    if bad or not axes:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(ABLATIONS)}; got {text!r}"
        )
    return axes


def _video_configs() -> list[str]:
    """The peg_video recipes the video plan can train: the transformers (an X3D has no token grid)."""
    return sorted(
        name for name, cfg in VIDEO_CONFIGS.items() if not str(cfg.get("arch", "")).startswith("x3d")
    )


def _scale_list(text: str) -> list[float]:
    """``argparse`` type: comma-separated positive scales (``0.5,1,2,4``)."""
    try:
        scales = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        scales = []
    if not scales or any(not (0 < v <= 16) for v in scales):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated scales in (0, 16], e.g. 0.5,1,2,4; got {text!r}"
        )
    return sorted(set(scales))


def _name_list(text: str) -> list[str]:
    """``argparse`` type: comma-separated row names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated row names; got {text!r}")
    return names


def _check_rows(names: list[str], parser: argparse.ArgumentParser) -> None:
    """``--rows`` names that no task has: a usage error before any data is written."""
    known = {s.name for s in classify_specs(48, 6)} | {
        "sine",
        "peg3d",
        "peg3d-factorized",
        *VIDEO_ROTARY_ROWS,
        *VIDEO_BIAS_ROWS,
    }
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; rows are {', '.join(sorted(known))}")


def _keep_rows(plans: list[Plan], names: list[str]) -> None:
    """Drop the encoding rows not in ``names`` (keeping any row an ablation row repeats)."""
    for plan in plans:
        needed = set(names) | {s.same_as for s in plan.specs if s.group != "encoding" and s.same_as}
        plan.specs = [s for s in plan.specs if s.group != "encoding" or s.name in needed]


#: the largest --seed: seeds are torch / numpy seeds, and numpy's are below 2**32
MAX_SEED = 2**31 - 1
#: bounds of the study's numeric flags (a typo such as --seeds 100000000000 is one line, not a MemoryError)
MAX_SEEDS = 1000
MAX_JOBS = 128
MAX_THREADS = 256
MAX_EPOCHS = 10_000


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(  # one-line usage errors: error: python -m tools.study: <message> (see --help)
        prog="python -m tools.study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", default="all", choices=[*TASKS, "all"])
    p.add_argument("--arch", choices=("detr", *DETECT_ARCHS, "both"), default="detr",
                   help="detect: the detector (rtdetr / dfine / rfdetr: its own section detect-rtdetr / "
                   "detect-dfine / detect-rfdetr; both: DETR and RT-DETR)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="seconds per task, numbers meaningless (tests)")
    p.add_argument("--out", type=Path, default=Path("runs/study"))
    p.add_argument(
        "--data",
        type=Path,
        help="real data for one task: " + "; ".join(f"{k}: {v}" for k, v in DATA_HELP.items()),
    )
    p.add_argument("--epochs", type=int_in(1, MAX_EPOCHS, "epochs"), help="override the task budget's epochs")
    p.add_argument("--seed", type=int_in(0, MAX_SEED, "a seed"), default=0,
                   help="first seed (seeds SEED .. SEED + N - 1)")  # fmt: skip
    p.add_argument("--seeds", type=int_in(1, MAX_SEEDS, "a seed count"), default=1,
                   help="seeds per cell (mean ± sample std)")  # fmt: skip
    p.add_argument("--ablate", type=_ablate_list, default=[],
                   help=f"ablation axes, comma-separated: {','.join(ABLATIONS)} (video: the 3D PEG)")  # fmt: skip
    p.add_argument("--protocol", choices=("quadrant", "scale", "both"), default="quadrant",
                   help="classification labels: quadrant (needs absolute position), scale (shape only, "
                   "test scenes rendered larger), or both")  # fmt: skip
    p.add_argument("--quantize", choices=("int8",), help="also evaluate each classifier quantized (PT2E)")
    p.add_argument(
        "--train-size",
        type=image_side,
        help="image tasks: training size; --task video: the crop (default: the budget's, or the recipe's on --data)",
    )
    p.add_argument("--test-sizes", type=image_side_list, help="image tasks: test sizes, e.g. 36,48,72,96")
    p.add_argument(
        "--test-scales",
        type=_scale_list,
        help="test sizes (video: clip lengths) as fractions of the training one, e.g. 0.5,1,2,4",
    )
    p.add_argument(
        "--aspect",
        action="store_true",
        help="classify: also test at height:width 1:2 and 2:1 (trained square)",
    )
    p.add_argument(
        "--diagnose",
        action="store_true",
        help="per-layer mean attention entropy and distance at every test size (classify, video)",
    )
    p.add_argument("--train-args", default="",
                   help="flags appended to every cell's train command, which win over the study's, e.g. "
                   "\"--arch cpvt_tiny --batch-size 256 --workers 8\" for real data; the flags that place, "
                   "seed, encode, size and feed each cell are the study's own (--out, --seed, --rows, "
                   "--train-size, --test-sizes, --data, --devices, --video-config) and refused here")  # fmt: skip
    p.add_argument("--video-config", default="synthetic_tiny", choices=_video_configs(),
                   help="video: the peg_video recipe every cell trains (its clip length, stride and tubelet)")  # fmt: skip
    p.add_argument("--extrapolate", action="store_true",
                   help=f"the extrapolation protocol: --test-scales {','.join(map(str, EXTRAPOLATION_SCALES))} "
                   "--aspect --diagnose")  # fmt: skip
    p.add_argument("--rows", type=_name_list,
                   help="only these encoding rows, e.g. peg,learned (default: all; ablation rows stay)")  # fmt: skip
    p.add_argument("--jobs", type=int_in(1, MAX_JOBS, "a worker count"), default=1,
                   help="CPU: cells trained at once (worker processes); with GPUs, one worker per GPU")  # fmt: skip
    p.add_argument("--devices", type=devices_arg, default="auto",
                   help="auto (every visible GPU when CUDA is available, else the CPU), cpu, cuda (every GPU) "
                   "or cuda:0,cuda:2: one worker per GPU listed, each pinned to its GPU")  # fmt: skip
    p.add_argument("--retrain", action="store_true",
                   help="train every cell again (default: a cell whose cell.json in --out matches is reused)")  # fmt: skip
    p.add_argument(
        "--threads",
        type=int_in(1, MAX_THREADS, "a thread count"),
        help="torch intra-op threads per cell (default 1: these models are tiny, and one thread is faster "
        "on a busy CPU)",
    )
    return p


def _plans(args: argparse.Namespace, tasks: list[str], seeds: list[int]) -> list[Plan]:
    plans = []
    for task in tasks:
        kw = {"ablate": args.ablate, "train_size": args.train_size, "test_sizes": args.test_sizes,
              "test_scales": args.test_scales, "diagnose": args.diagnose}  # fmt: skip
        if task == "classify":
            protocols = ["quadrant", "scale"] if args.protocol == "both" else [args.protocol]
            if args.data is not None:
                protocols = protocols[:1]  # a user's data has its own labels
            for protocol in protocols:
                sub = args.out / ("classify" if protocol == "quadrant" else f"classify-{protocol}")
                plans.append(PLANS[task](sub, args.quick, seeds, args.data, args.epochs, protocol=protocol,
                                         quantize=args.quantize == "int8", aspect=args.aspect, **kw))  # fmt: skip
        elif task == "detect":
            if args.arch in ("detr", "both"):
                plans.append(PLANS[task](args.out / task, args.quick, seeds, args.data, args.epochs, **kw))
            for arch in (
                ("rtdetr",) if args.arch == "both" else (args.arch,) if args.arch in DETECT_ARCHS else ()
            ):
                section = args.out / f"detect-{arch}"
                if arch == "rfdetr":  # no hybrid encoder: the rows are the ViT's encodings
                    plans.append(plan_detect_rfdetr(section, args.quick, seeds, args.data, args.epochs,
                                                    rows=args.rows or (), **kw))  # fmt: skip
                    continue
                plans.append(plan_detect_rtdetr(section, args.quick, seeds, args.data,
                                                args.epochs, rows=args.rows or (), arch=arch, **kw))  # fmt: skip
        else:  # video
            # --train-size is the video crop with --task video only (with all, the image tasks' size)
            video_kw = {**kw, "train_size": args.train_size if args.task == "video" else None}
            plans.append(PLANS[task](args.out / task, args.quick, seeds, args.data, args.epochs,
                                     config=args.video_config, **video_kw))  # fmt: skip
    return plans


#: the train flags each cell's command sets for the study (argparse destinations; ``*``: every task),
#: refused in ``--train-args`` with the reason: they place, seed, encode, size or feed the cell
STUDY_TRAIN_FLAGS: dict[str, dict[str, str]] = {
    "*": {
        "output_dir": "is the study's: each cell's run folder is under --out",
        "resume": "is the study's: a rerun with the same --out reuses the finished cells",
        "seed": "is the study's: --seed and --seeds seed the cells",
        "pos_enc": "is the study's: each row trains its own encoding (--rows picks the rows)",
        "device": "is the study's: --devices places the cells",
        "help": "would print the train help and train nothing",
        "print_config": "would print the recipe and train nothing",
    },
    "classify": {
        "data_root": "is the study's: give the data as --data",
        "img_size": "is the study's: the training size is --train-size",
    },
    "detect": {
        "data_root": "is the study's: give the data as --data",
        "train_json": "is the study's: give the data as --data",
        "val_json": "is the study's: give the data as --data",
        "train_ann": "is the study's: give the data as --data",
        "train_images": "is the study's: give the data as --data",
        "val_ann": "is the study's: give the data as --data",
        "val_images": "is the study's: give the data as --data",
        "train_scales": "is the study's: the training size is --train-size",
        "val_size": "is the study's: the training size is --train-size",
        "eval_sizes": "is the study's: the test sizes are --test-sizes or --test-scales",
    },
    "video": {
        "train_ann": "is the study's: give the data as --data",
        "val_ann": "is the study's: give the data as --data",
        "crop": "is the study's: the crop is --train-size",
        "num_frames": "is the study's: the clip length is the --video-config recipe's (the test views follow it)",
        "config": "is the study's: the recipe is --video-config",
    },
}
#: what ``python -m PACKAGE train`` trains each task's cells
TRAIN_COMMANDS = {"classify": "peg_core", "detect": "peg_detr", "video": "peg_video"}
#: a token argparse reads as a (negative) number, not as a flag
_NEGATIVE_NUMBER = re.compile(r"-\.?\d")


def _train_parser(task: str) -> argparse.ArgumentParser:
    """The ``train`` parser of the package that trains ``task``'s cells."""
    if task == "classify":
        from peg_core.classify.cli import build_train_parser
    elif task == "detect":
        from peg_detr.cli import build_train_parser
    else:
        from peg_video.cli import build_train_parser
    return build_train_parser()


def _train_action(parser: argparse.ArgumentParser, token: str) -> tuple[argparse.Action | None, str]:
    """``(action, option)`` that ``token`` (``--flag``, ``--flag=value``, ``-h``) names in ``parser``,
    by argparse's own rule (the exact option, else the one long option it is a prefix of);
    ``(None, why)`` when it names none or several."""
    name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
    options = parser._option_string_actions
    if name in options:
        return options[name], name
    hits = (
        sorted(o for o in options if o.startswith(name))
        if name.startswith("--") and parser.allow_abbrev
        else []
    )
    if len(hits) == 1:
        return options[hits[0]], f"{name} ({hits[0]})"
    if hits:
        return None, f"{name} is ambiguous ({', '.join(hits[:6])}{', ...' if len(hits) > 6 else ''})"
    return None, f"{name} is not a flag"


class _Refused(Exception):
    """A train parser's usage error, raised instead of printed (:func:`_parse_values`)."""


def _raise(message: str) -> NoReturn:
    raise _Refused(message)


def _parse_values(train: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """Why ``train`` refuses ``argv`` on its own (a value of the wrong type or choice, a missing value),
    ``None`` when it takes it.  No flag is required here and no default is set: only ``argv`` is read."""
    train.error = _raise  # type: ignore[method-assign]
    train._defaults.clear()
    for action in train._actions:
        action.required = False
        action.default = argparse.SUPPRESS
    try:
        train.parse_args(list(argv))
    except _Refused as e:
        return str(e)
    return None


def train_args(text: str, tasks: list[str], parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """``--train-args`` as the argv it appends to every cell's train command of ``tasks``.

    Split as a shell would (an unclosed quote is a usage error); each flag must be one that
    ``python -m PACKAGE train`` of every task knows, none of :data:`STUDY_TRAIN_FLAGS` (what the
    study sets per cell), and each value one that train parser takes.  Errors go through
    ``parser.error`` (one line, exit 2), before any work.
    """
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        parser.error(f"--train-args {text!r}: {e} (quoted as in a shell)")
    for task in tasks if argv else ():
        train, owned = _train_parser(task), {**STUDY_TRAIN_FLAGS["*"], **STUDY_TRAIN_FLAGS[task]}
        command = f"python -m {TRAIN_COMMANDS[task]} train"
        for token in argv:
            if token == "--":
                parser.error(
                    "--train-args: '--' ends the flags of a train command; give flags and their values"
                )
            if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token):
                continue  # a value
            action, named = _train_action(train, token)
            if action is None:
                parser.error(f"--train-args: {named} in {command} (--task {task})")
            if action.dest in owned:
                parser.error(f"--train-args: {named} {owned[action.dest]}")
        why = _parse_values(train, argv)
        if why is not None:
            parser.error(f"--train-args: {why} in {command} (--task {task})")
    return argv


class StudyFailed(UserError):
    """Some cells failed: the report was written without their rows; ``results`` is what :func:`main` returns."""

    def __init__(
        self, failed: list[tuple[str, str, int]], total: int, results: dict[str, TaskResult]
    ) -> None:
        by_plan: dict[str, list[str]] = {}
        for key, row, seed in failed:
            by_plan.setdefault(key, []).append(f"{row} seed {seed}")
        super().__init__(
            f"{len(failed)} of {total} cells failed (their rows are left out of the report; the log says why, "
            "and the same command trains them again)",
            "; ".join(f"{key}: {', '.join(cells)}" for key, cells in by_plan.items()),
        )
        self.failed = failed
        self.results = results


def _make_out(out: Path, parser: argparse.ArgumentParser) -> None:
    """``--out`` as a folder (made when missing); a file, or a path that cannot be a folder, is a usage error."""
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--out {out}: cannot make the folder ({e.strerror or e})")


def main(argv: list[str] | None = None) -> dict[str, TaskResult]:
    """The study (module docstring): the results per task, as in ``study.json``.

    A usage error exits (``SystemExit`` 2, one line); another study running on ``--out`` is an
    :class:`~peg_core.errors.InputError`; failed cells raise :class:`StudyFailed` after the report
    is written.  :func:`cli` turns these into one line and an exit code.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data is not None and args.task == "all":
        parser.error(
            "--data is for one task (--task classify|detect|video): each task reads a different format"
        )
    if args.data is not None and not args.data.exists():
        parser.error(f"--data {args.data} does not exist ({DATA_HELP[args.task]})")
    if args.task == "video" and args.test_sizes:
        parser.error(
            "--test-sizes is for the image tasks (classify, detect); video: --test-scales (clip lengths)"
        )
    if args.video_config != "synthetic_tiny" and args.task not in ("video", "all"):
        parser.error("--video-config is for the video task (--task video or all)")
    tubelet = VIDEO_CONFIGS[args.video_config]["tubelet"]
    if args.task == "video" and args.train_size and args.train_size % tubelet[-1]:
        parser.error(f"--train-size {args.train_size}: the video crop must be a multiple of {args.video_config}'s "
                     f"tubelet side {tubelet[-1]}")  # fmt: skip
    if args.extrapolate:
        args.test_scales = args.test_scales or list(EXTRAPOLATION_SCALES)
        args.aspect = args.diagnose = True
    if args.test_sizes and args.test_scales:
        parser.error("--test-sizes and --test-scales (or --extrapolate) both set the test sizes; give one")
    if args.arch != "detr" and args.task not in ("detect", "all"):
        parser.error("--arch is for the detect task (--task detect or all)")
    if args.seed + args.seeds - 1 > MAX_SEED:
        parser.error(f"--seed {args.seed} --seeds {args.seeds}: the last seed is above {MAX_SEED}")
    try:
        devices = resolve_devices(args.devices)
    except ValueError as e:  # InputError: a GPU this machine does not have
        parser.error(str(e))
    tasks = list(TASKS) if args.task == "all" else [args.task]
    if args.rows:
        _check_rows(args.rows, parser)
    extra = train_args(args.train_args, tasks, parser)
    _make_out(args.out, parser)
    with out_lock(args.out):  # one study per --out: two would train the same cells in the same folders
        return _run(args, tasks, devices, extra, argv)


def _run(
    args: argparse.Namespace,
    tasks: list[str],
    devices: list[str],
    extra: tuple[str, ...],
    argv: list[str] | None,
) -> dict[str, TaskResult]:
    """Plan, train (or reuse) every cell and write the report; :class:`StudyFailed` when cells failed."""
    threads = args.threads or 1
    torch.set_num_threads(threads)
    seeds = list(range(args.seed, args.seed + args.seeds))
    command = ("python -m tools.study " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    t0 = time.time()
    plans = _plans(args, tasks, seeds)
    for plan in plans:
        plan.train_args = extra
        if extra:
            plan.notes.append(f"Every cell's train command ends with `{shlex.join(extra)}` (`--train-args`).")
    if args.rows:
        _keep_rows(plans, args.rows)
    order = [p.key for p in plans]
    results: dict[str, TaskResult] = {}

    def done(plan: Plan, cells: dict, secs: float) -> None:
        results[plan.key] = assemble(plan, cells, secs)
        results[plan.key].cell_seconds = row_seconds(plan, cells)
        ordered = [results[k] for k in order if k in results]
        write_report(ordered, args.out, command)  # finished tasks survive a crash

    failed = run_cells(plans, args.jobs, threads, done, devices, retrain=args.retrain)
    results = {k: results[k] for k in order}
    wall = time.time() - t0
    cost = None if args.quick else _cost_section()  # CPVT-Ti/S/B on the meta device: a minute on a busy CPU
    report = write_report(list(results.values()), args.out, command, wall, cost)
    print()
    for r in results.values():
        print(task_section(r) + "\n")
    print(f"report: {report} (wall {time.time() - t0:.0f} s)")
    if failed:
        total = sum(len(cells_of(p)) * len(p.seeds) for p in plans)
        raise StudyFailed(failed, total, results)
    return results


def cli(argv: list[str] | None = None) -> int:
    """``python -m tools.study``: :func:`main` under the suite's exit codes, every failure one line on stderr.

    0: every cell is in; 2: a usage error (argparse); 1: failed cells (named), another study on
    ``--out`` (its pid) or another input error; 130: Ctrl-C (the finished cells stay in ``--out``).
    """
    try:
        main(argv)
    except KeyboardInterrupt:
        print("error: interrupted: the finished cells are kept in --out; the same command resumes from them",
              file=sys.stderr, flush=True)  # fmt: skip
        return EXIT_INTERRUPTED
    except (UserError, InputError) as e:
        line = e.line() if isinstance(e, UserError) else UserError(e.what, e.where).line()
        print(line, file=sys.stderr, flush=True)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(cli())
