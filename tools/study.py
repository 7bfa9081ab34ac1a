"""Does each position encoding hold up when the input size changes?  One command per package.

For each task the same model is trained once per position encoding (same
data, budget and seed), then evaluated at the training size and at other sizes
without fine-tuning; a learned table is evaluated once per resize mode
(bicubic / bilinear / nearest).  Writes, under ``--out``:

* ``report.md``: one Markdown table per task (encoding x test size, plus the
  encoding's parameters and FLOPs at the training size),
* ``<task>.png``: the metric against test size, one line per encoding,
* ``study.json``: every number (also AP next to AP50, top-5 next to top-1),

and prints the tables.  Tasks and encodings:

* ``classify``: CPVT classifier on generated shapes; ``peg``, ``sincos``, ``learned``, ``none``;
  test sizes 0.75x, 1x, 1.5x, 2x;
* ``detect``: tiny DETR on synthetic COCO; ``peg``, ``sine``, ``learned``, ``none``; same scales;
* ``video``: tiny video ViT on synthetic Kinetics; ``peg3d``, ``peg3d-factorized``, ``learned``,
  ``none``; half, same and double clip length, and a larger crop.

    python -m tools.study --task all                 # ~15 min on 2 CPU cores
    python -m tools.study --task classify --quick    # seconds (what the tests run)
    python -m tools.study --task detect --data /data/coco --epochs 50
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.study_tasks import TASKS, TaskResult, timed

__all__ = ["main", "markdown_table", "plot_task", "write_report"]

DATA_HELP = {
    "classify": "ImageNet-style folder with train/<class>/ and val/<class>/",
    "detect": "COCO layout: train2017/, val2017/, annotations/instances_{train,val}2017.json",
    "video": "folder with train.csv + val.csv (Kinetics) or train.txt + val.txt ('path label')",
}


def _si(n: int) -> str:
    """Compact count: 1234 -> 1.23k, 5_600_000 -> 5.6M."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return str(n)


def markdown_table(result: TaskResult) -> str:
    """One Markdown table: a row per encoding (and resize mode), a column per test size."""
    head = ["encoding", *[f"{s}{' (train)' if s == result.train_size else ''}" for s in result.sizes]]
    head += ["params", "FLOPs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result.rows:
        cells = [row.label, *[f"{row.scores[s]:.3f}" for s in result.sizes], _si(row.params), _si(row.flops)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_task(result: TaskResult, path: Path) -> Path:
    """Metric against test size, one line per row; written as PNG with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.4), dpi=100)
    x = list(range(len(result.sizes)))
    for row in result.rows:
        style = "--" if row.mode not in (None, "bicubic") else "-"
        ax.plot(x, [row.scores[s] for s in result.sizes], style, marker="o", label=row.label)
    ax.set_xticks(x, result.sizes)
    ax.set_xlabel(f"test size (trained at {result.train_size})")
    ax.set_ylabel(result.metric)
    ax.set_title(f"{result.task}: {result.metric} vs test size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def task_section(result: TaskResult) -> str:
    b = result.budget
    lines = [
        f"## {result.task}: {result.metric} by test size",
        "",
        f"Data: {result.data}. Model: {b['model']}. Budget per encoding: {b['epochs']} epochs, "
        f"batch {b['batch_size']}, seed shared. Trained at {result.train_size}; {result.seconds} s for the task.",
        "",
        markdown_table(result),
        "",
        "params / FLOPs: the position encoding alone, at the training size (convs: 2 x MACs; plus one add "
        "per code element where codes join the tokens).",
    ]
    lines += [f"{n}" for n in result.notes]
    return "\n".join(lines)


def write_report(results: list[TaskResult], out: Path, command: str) -> Path:
    """``report.md``, ``study.json`` and one PNG per task under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        "# Position-encoding study",
        "",
        f"Command: `{command}`",
        "",
        "Embedded data is small and budgets are minutes on a CPU: the numbers show trends between "
        "encodings under a size change, not what these models reach on real data.",
    ]
    for r in results:
        png = plot_task(r, out / f"{r.task}.png")
        parts += ["", task_section(r), "", f"![{r.task}]({png.name})"]
    (out / "report.md").write_text("\n".join(parts) + "\n")
    doc = {"command": command, "torch": torch.__version__, "tasks": {r.task: r.to_dict() for r in results}}
    (out / "study.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out / "report.md"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", default="all", choices=[*TASKS, "all"])
    p.add_argument("--quick", action="store_true", help="seconds per task, numbers meaningless (tests)")
    p.add_argument("--out", type=Path, default=Path("runs/study"))
    p.add_argument(
        "--data",
        type=Path,
        help="real data for one task: " + "; ".join(f"{k}: {v}" for k, v in DATA_HELP.items()),
    )
    p.add_argument("--epochs", type=int, help="override the task budget's epochs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default 1: these models are tiny, and one thread is faster on a busy CPU)",
    )
    return p


def main(argv: list[str] | None = None) -> dict[str, TaskResult]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data is not None and args.task == "all":
        parser.error(
            "--data is for one task (--task classify|detect|video): each task reads a different format"
        )
    if args.data is not None and not args.data.exists():
        parser.error(f"--data {args.data} does not exist ({DATA_HELP[args.task]})")
    torch.set_num_threads(args.threads or 1)
    tasks = list(TASKS) if args.task == "all" else [args.task]
    command = ("python -m tools.study " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    results = {}
    for task in tasks:
        print(f"\n=== study: {task} ===", flush=True)
        results[task] = timed(TASKS[task], args.out / task, args.quick, args.seed, args.data, args.epochs)
        report = write_report(list(results.values()), args.out, command)  # finished tasks survive a crash
    print()
    for r in results.values():
        print(task_section(r) + "\n")
    print(f"report: {report}")
    return results


if __name__ == "__main__":
    main()
