"""``tools.study``: the encoding cost counter, the report (mean ± std, error bars, sentences), the
ablation rows, the scale-protocol scenes, and ``--quick`` runs of every task and of ``--data``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from peg_core import PEG2d, build_position_encoding
from peg_core.classify import DEMO_CONFIG
from peg_core.classify.shapes import SHAPES, sample_scenes
from peg_video import PEG3d
from tools.study import (
    attention_figure,
    compare,
    diagnostics_sentences,
    error_bars,
    families_sentences,
    fmt_ms,
    int8_table,
    interpret,
    judge,
    main,
    markdown_table,
    row_styles,
    task_figure,
    write_report,
)
from tools.study_cost import encoding_cost
from tools.study_tasks import (
    BIAS_ROWS,
    VIDEO_BIAS_ROWS,
    Budget,
    CellResult,
    Plan,
    Row,
    RowSpec,
    TaskResult,
    ablation_specs,
    assemble,
    cells_of,
    mean_std,
)


def _flop_counter(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    ("peg", "x", "size"),
    [
        (PEG2d(8, kernel_size=3), torch.randn(2, 5 * 7, 8), (5, 7)),
        (PEG2d(8, kernel_size=5, separable=True, num_prefix_tokens=1), torch.randn(1, 1 + 4 * 6, 8), (4, 6)),
        (PEG3d(8), torch.randn(1, 3 * 4 * 5, 8), (3, 4, 5)),
        (PEG3d(8, factorized=True), torch.randn(2, 2 * 3 * 3, 8), (2, 3, 3)),
    ],
)
def test_peg_conv_flops_equal_flop_counter(peg, x, size) -> None:
    cost = encoding_cost({"peg": peg}, lambda: peg(x, size))
    assert cost.conv_flops == _flop_counter(lambda: peg(x, size))
    # the analytic value: 2 x (grid tokens x channels x taps per channel), summed over the convs
    grid = x.shape[0] * (x.shape[1] - peg.num_prefix_tokens) * x.shape[2]
    k = peg.kernel_size if isinstance(peg.kernel_size, int) else None
    if isinstance(peg, PEG2d):
        taps = 2 * k if peg.separable else k * k
    else:
        kt, kh, kw = peg.kernel_size
        taps = kh * kw + kt if peg.factorized else kt * kh * kw
    assert cost.conv_flops == 2 * grid * taps
    assert cost.add_flops == grid  # one residual add per grid token and channel (prefix passes through)
    assert cost.params == sum(p.numel() for p in peg.parameters())


def test_table_and_fixed_encodings_cost_one_add_per_use() -> None:
    x = torch.randn(1, 6 * 4, 16)
    learned = build_position_encoding("learned", 16, grid_size=(3, 2))
    cost = encoding_cost({"pos": learned}, lambda: learned(x, (6, 4)))
    assert (cost.params, cost.conv_flops, cost.add_flops) == (3 * 2 * 16, 0, 6 * 4 * 16)
    sine = build_position_encoding("sine", 16, apply_to="qk")
    cost = encoding_cost({"pos": sine}, lambda: sine.position(x, (6, 4)), qk_uses=6)
    assert (cost.params, cost.flops) == (0, 6 * 6 * 4 * 16)  # q = k = src + pos in each of 6 layers
    none = build_position_encoding("none", 16)
    assert encoding_cost({"pos": none, "missing": None}, lambda: none(x, (6, 4))).flops == 0
    # the wrappers are removed afterwards
    assert "position" not in learned.__dict__ and "forward" not in learned.__dict__


def _result() -> TaskResult:
    rows = [
        Row("peg", "peg", None, {"36 px": 0.5, "48 px": 0.75}, 640, 19456),
        Row("learned (nearest)", "learned", "nearest", {"36 px": 0.25, "48 px": 1.0}, 2_304_000, 1024),
    ]
    return TaskResult("classify", "top-1", "48 px", ["36 px", "48 px"], rows, {"epochs": 1}, "toy")


def test_markdown_table_exact() -> None:
    assert markdown_table(_result()) == (
        "| encoding | 36 px | 48 px (train) | params | FLOPs |\n"
        "|---|---|---|---|---|\n"
        "| peg | 0.500 | 0.750 | 640 | 19.5k |\n"
        "| learned (nearest) | 0.250 | 1.000 | 2.3M | 1.02k |"
    )


def test_write_report_files(tmp_path: Path) -> None:
    r = _result()
    r.budget.update(batch_size=8, model="toy model")
    report = write_report([r], tmp_path, "python -m tools.study --task classify")
    text = report.read_text()
    assert "Command: `python -m tools.study --task classify`" in text
    assert markdown_table(r) in text and "![classify](classify.png)" in text
    png = tmp_path / "classify.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 200_000
    doc = json.loads((tmp_path / "study.json").read_text())
    assert doc["tasks"]["classify"]["rows"][1]["scores"] == {"36 px": 0.25, "48 px": 1.0}


#: the encoding rows of the documented classify table (12 rows: two more than matplotlib's colour cycle)
CLASSIFY_ROWS = [
    ("peg", None), ("peg-dynamic", None), ("sincos", None), ("learned (bicubic)", "bicubic"),
    ("learned (bilinear)", "bilinear"), ("learned (nearest)", "nearest"), ("none", None),
    ("learned + multi-scale", None), ("learned + progressive", None), ("rope-axial", None), ("rope-mixed", None),
    ("peg+rope-mixed", None),
]  # fmt: skip


def _figure_result(task: str, metric: str, rows: list[tuple[str, str | None]]) -> TaskResult:
    """A three-seed result whose learned rows have the README's spread (0.749 ± 0.415: past 1.0)."""
    sizes = ["36 px", "48 px", "72 px"]
    out = []
    for k, (label, mode) in enumerate(rows):
        mean = 1.0 if label == "sincos" else 0.25 + 0.05 * k
        std = 0.415 if label.startswith("learned") else 0.02
        out.append(Row(label, label.split(" ")[0], mode, dict.fromkeys(sizes, mean), 0, 0,
                       std=dict.fromkeys(sizes, std)))  # fmt: skip
    return TaskResult(task, metric, "48 px", sizes, out, {"epochs": 1}, "toy", seeds=[0, 1, 2])


def _styles(fig) -> dict[str, tuple[str, str]]:
    """``label -> (colour, marker)`` of each error-bar line of the figure's axes."""
    ax = fig.axes[0]
    out = {}
    for container in ax.containers:
        line = container.lines[0]
        out[container.get_label()] = (line.get_color().lower(), line.get_marker())
    return out


def test_study_figure_rows_have_distinct_styles_and_top1_ends_at_one() -> None:
    classify = task_figure(_figure_result("classify", "top-1", CLASSIFY_ROWS))
    styles = _styles(classify)
    assert list(styles) == [label for label, _ in CLASSIFY_ROWS]
    assert len(set(styles.values())) == len(CLASSIFY_ROWS)  # no two rows look alike (was: peg = rope-mixed)
    assert len({colour for colour, _ in styles.values()}) == len(CLASSIFY_ROWS)  # colours alone differ too
    bottom, top = classify.axes[0].get_ylim()
    assert top == 1.0 and bottom >= 0.0  # 0.749 ± 0.415 does not stretch the axis past 1.0
    # the same row has the same style in every figure
    detect_rows = [
        ("peg", None),
        ("sine", None),
        ("learned (bicubic)", "bicubic"),
        ("none", None),
        ("rope-mixed", None),
    ]
    detect = task_figure(_figure_result("detect", "AP50", detect_rows))
    assert detect.axes[0].get_ylim()[1] <= 1.0
    for label, style in _styles(detect).items():
        assert style == styles.get(label, style)
    assert _styles(detect)["peg"] == styles["peg"] != styles["rope-mixed"]
    # a video figure draws its PEG as the image figures draw theirs, and its rows stay distinct
    video_rows = [("peg3d", None), ("peg3d-factorized", None), ("learned (bicubic)", "bicubic"),
                  ("learned (nearest)", "nearest"), ("none", None), ("rope-3d", None), ("peg3d+rope-3d", None)]  # fmt: skip
    video = _styles(task_figure(_figure_result("video", "top-1", video_rows)))
    assert len(set(video.values())) == len(video_rows) and video["peg3d"] == styles["peg"]
    assert len(set(row_styles(["peg", "peg3d", "rope-3d", "rope-mixed"]).values())) == 4
    # rows the module does not know still get pairs of their own
    many = [f"row {i}" for i in range(30)] + ["peg"]
    assert len(set(row_styles(many).values())) == len(many)


def test_data_needs_a_single_task(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--task", "all", "--data", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["--task", "detect", "--data", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):  # before any data is written: a crop the tubelet (8) does not divide
        main(["--task", "video", "--quick", "--out", str(tmp_path), "--train-size", "36"])
    with pytest.raises(SystemExit):  # video tests clip lengths (--test-scales), not sizes
        main(["--task", "video", "--quick", "--out", str(tmp_path), "--test-sizes", "32,48"])
    with pytest.raises(SystemExit):
        main(["--task", "classify", "--ablate", "kernel,colour"])
    with pytest.raises(SystemExit):
        main(["--task", "classify", "--quick", "--out", str(tmp_path), "--rows", "peg,lerned"])
    assert not any(tmp_path.iterdir())


EXPECTED_ROWS = {
    "classify": [
        "peg",
        "peg-dynamic",
        "sincos",
        "learned (bicubic)",
        "learned (bilinear)",
        "learned (nearest)",
        "none",
        "learned + multi-scale",
        "learned + progressive",
        "rope-axial",
        "rope-mixed",
        "peg+rope-mixed",
        *BIAS_ROWS,
    ],
    "detect": [
        "peg",
        "sine",
        "learned (bicubic)",
        "learned (bilinear)",
        "learned (nearest)",
        "none",
        "rope-axial",
        "rope-mixed",
        "peg+rope-mixed",
        *BIAS_ROWS,
    ],
    "video": [
        "peg3d",
        "peg3d-factorized",
        "learned (bicubic)",
        "learned (bilinear)",
        "learned (nearest)",
        "none",
        "rope-3d",
        "peg3d+rope-3d",
        *VIDEO_BIAS_ROWS,
        "VideoMAE init, its table",
        "VideoMAE init, peg3d",
    ],
}


@pytest.mark.slow
def test_study_quick_all_tasks(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        results = main(
            ["--task", "all", "--quick", "--out", str(tmp_path), "--threads", "1", "--protocol", "both"]
        )
    finally:
        torch.set_num_threads(threads)
    doc = json.loads((tmp_path / "study.json").read_text())
    report = (tmp_path / "report.md").read_text()
    # the scale protocol: the same encoding rows, shape-only labels (3 classes), its own data and plot
    scale = doc["tasks"].pop("classify-scale")
    assert scale["protocol"] == "scale" and [r["label"] for r in scale["rows"]] == EXPECTED_ROWS["classify"]
    assert sorted(p.name for p in (tmp_path / "classify-scale" / "data" / "train").iterdir()) == sorted(
        SHAPES
    )
    assert (tmp_path / "classify-scale.png").is_file() and "Protocol *scale*" in report
    assert doc["tasks"]["classify"]["protocol"] == "quadrant"
    assert set(doc["tasks"]) == set(EXPECTED_ROWS) == set(results) - {"classify-scale"}
    # one seed: the sentences draw no conclusion, and say why
    sentences = [line for line in report.splitlines() if line.startswith("* ")]
    assert sentences and "no conclusion (one seed: a difference needs at least 2 seeds" in report
    assert not any(w in s for s in sentences for w in ("is ahead", "supports the", "contradicts", "supplies"))
    assert scale["chance"] == pytest.approx(1 / 3)  # shape-only labels: 3 classes
    assert doc["tasks"]["detect"]["chance"] == 0.0 and doc["tasks"]["video"]["chance"] > 0

    for task, labels in EXPECTED_ROWS.items():
        t = doc["tasks"][task]
        assert [r["label"] for r in t["rows"]] == labels
        assert len(t["sizes"]) == 4 and t["train_size"] in t["sizes"]
        for row in t["rows"]:
            assert list(row["scores"]) == t["sizes"]
            assert all(0.0 <= v <= 1.0 for v in row["scores"].values())
        rows = {r["label"]: r for r in t["rows"]}
        assert all(len(v) == 1 for r in t["rows"] for v in r["per_seed"].values())  # one seed, kept per seed
        assert rows["none"]["params"] == 0 and rows["none"]["flops"] == 0
        assert markdown_table(results[task]) in report
        png = tmp_path / f"{task}.png"
        assert png.is_file() and png.stat().st_size < 200_000
        # the three learned rows are one trained model: same cost, scores equal at the training size
        learned = [rows[f"learned ({m})"] for m in ("bicubic", "bilinear", "nearest")]
        assert len({(r["params"], r["flops"]) for r in learned}) == 1

    # classify (quick): DEMO_CONFIG (dim 64) at 32 px / patch 8 -> 4x4 grid, plus a class token
    # when the head pools it; a PEG adds to the grid tokens only, a table / sin-cos code to all
    c = {r["label"]: r for r in doc["tasks"]["classify"]["rows"]}
    n, dim = 16, 64
    prefix = 1 if DEMO_CONFIG.get("global_pool") == "token" else 0
    n_pegs = len(DEMO_CONFIG.get("peg_at", (0,)))
    assert c["peg"]["params"] == n_pegs * (dim * 9 + dim)
    assert c["peg"]["flops"] == n_pegs * (2 * n * dim * 9 + n * dim)
    assert c["sincos"]["params"] == 0 and c["sincos"]["flops"] == (prefix + n) * dim
    assert c["learned (nearest)"]["params"] == (prefix + n) * dim
    for mode in ("bicubic", "bilinear", "nearest"):  # no resize at the training size
        assert c[f"learned ({mode})"]["scores"]["32 px"] == c["learned (bicubic)"]["scores"]["32 px"]
    # rotary: 3 ops per q / k element (x cos + swap(x) sin) in each of the blocks, prefix rows included;
    # mixed: learned frequencies (2, depth, heads, head_dim / 2)
    depth, heads = DEMO_CONFIG["depth"], DEMO_CONFIG["num_heads"]
    rotation = 6 * (prefix + n) * dim * depth
    assert c["rope-axial"]["params"] == 0 and c["rope-axial"]["flops"] == rotation
    assert c["rope-mixed"]["params"] == 2 * depth * heads * (dim // heads // 2)
    assert c["rope-mixed"]["flops"] == rotation
    assert c["peg+rope-mixed"]["params"] == c["peg"]["params"] + c["rope-mixed"]["params"]
    assert c["peg+rope-mixed"]["flops"] == c["peg"]["flops"] + rotation
    assert "Rotary against PEG at 64 px (trained at 32 px): the best rotary row" in report

    # detect (quick): 64 px / stride 16 -> 4x4 grid, dim 64, sine added to q/k in each of 2 encoder layers
    d = {r["label"]: r for r in doc["tasks"]["detect"]["rows"]}
    assert d["sine"]["params"] == 0 and d["sine"]["flops"] == 2 * 16 * 64
    assert d["peg"]["params"] == 64 * 10 and d["peg"]["flops"] == 2 * 16 * 64 * 9 + 16 * 64
    assert d["rope-axial"]["params"] == 0 and d["rope-axial"]["flops"] == 2 * 6 * 16 * 64
    assert d["peg+rope-mixed"]["flops"] == d["peg"]["flops"] + d["rope-mixed"]["flops"]

    # video (quick): 8 frames / 2 x (32 / 8)^2 = 64 tubelets; learned = 4x4 spatial + 4 temporal codes
    v = {r["label"]: r for r in doc["tasks"]["video"]["rows"]}
    dim = v["learned (nearest)"]["params"] // (16 + 4)
    assert v["learned (nearest)"]["params"] == 20 * dim and v["learned (nearest)"]["flops"] == 64 * dim
    n_pegs = v["peg3d"]["params"] // (27 * dim + dim)
    assert n_pegs >= 1 and v["peg3d"]["params"] == n_pegs * 28 * dim
    assert v["peg3d"]["flops"] == n_pegs * (2 * 64 * dim * 27 + 64 * dim)
    assert v["peg3d-factorized"]["params"] < v["peg3d"]["params"]
    assert v["rope-3d"]["params"] == 0 and v["rope-3d"]["flops"] % (6 * 64 * dim) == 0
    assert v["peg3d+rope-3d"]["flops"] == v["peg3d"]["flops"] + v["rope-3d"]["flops"]
    assert doc["tasks"]["video"]["sizes"] == ["4 fr", "8 fr", "16 fr", "8 fr, 48 px"]


# ------------------------------------------------------------------------------ seeds: mean ± std


def test_mean_std_is_the_sample_std() -> None:
    values = [0.9, 0.95, 0.7]
    mean, std = mean_std(values)
    ref = sum(values) / 3
    assert mean == pytest.approx(ref, abs=1e-15)
    assert std == pytest.approx((sum((v - ref) ** 2 for v in values) / 2) ** 0.5, abs=1e-15)  # n - 1
    assert mean_std([0.5]) == (0.5, None)
    assert fmt_ms(0.98765, 0.01234) == "0.988 ± 0.012" and fmt_ms(0.5, None) == "0.500"


def _plan(specs: list[RowSpec], seeds: list[int]) -> Plan:
    return Plan(
        task="classify", key="classify", out=Path("unused"), specs=specs, seeds=seeds,
        budget=Budget(epochs=1, n_train=8, n_val=4, train_size=32), epochs=1, metric="top-1",
        sizes=[32, 64], labels=["32 px", "64 px"], train_label="32 px", data={}, data_name="toy",
        model="toy", protocol="quadrant",
    )  # fmt: skip


def _cell(a: float, b: float, int8: tuple[float, float] | None = None, modes=("None",)) -> CellResult:
    scores = {m: {"32 px": a, "64 px": b} for m in modes}
    q = {"32 px": int8[0], "64 px": int8[1]} if int8 else {}
    return CellResult(scores, {}, params=10, flops=20, int8=q)


def test_assemble_seeds_baseline_repeats_and_table() -> None:
    specs = [RowSpec("peg", "peg"), RowSpec("none", "none"),
             *ablation_specs(["padding"], depth=4, base_at=(0, 1, 2, 3))]  # fmt: skip
    plan = _plan(specs, [0, 1, 2])
    # the zero-padding row is the baseline: only peg, none and circular padding train
    assert [s.name for s in cells_of(plan)] == ["peg", "none", "circular padding"]
    cells = {}
    for seed, (p, c) in enumerate([(0.9, 0.8), (1.0, 0.6), (0.95, 0.7)]):
        cells["peg", seed] = _cell(p, c, int8=(p - 0.1, c))
        cells["none", seed] = _cell(0.25, 0.25)
        cells["circular padding", seed] = _cell(0.3 + 0.01 * seed, 0.3)
    result = assemble(plan, cells)
    rows = {r.label: r for r in result.rows}
    assert rows["peg"].per_seed == {"32 px": [0.9, 1.0, 0.95], "64 px": [0.8, 0.6, 0.7]}
    assert rows["peg"].scores["32 px"] == pytest.approx(0.95) and rows["peg"].std["64 px"] == pytest.approx(
        0.1
    )
    assert rows["zero padding"].per_seed == rows["peg"].per_seed and rows["zero padding"].repeats == "peg"
    assert rows["none"].std == {"32 px": 0.0, "64 px": 0.0}
    assert markdown_table(result).splitlines()[2] == "| peg | 0.950 ± 0.050 | 0.700 ± 0.100 | 10 | 20 |"
    # the error bars are the sample stds, in test-size order, encoding rows only
    assert error_bars(result) == {
        "peg": ([pytest.approx(0.95), pytest.approx(0.7)], [pytest.approx(0.05), pytest.approx(0.1)]),
        "none": ([0.25, 0.25], [0.0, 0.0]),
    }
    # int8: fp32 / int8 (drop), drop per seed then mean ± std
    assert int8_table(result).splitlines()[2] == (
        "| peg | 0.950 / 0.850 ± 0.050 (0.100 ± 0.000) | 0.700 / 0.700 ± 0.100 (0.000 ± 0.000) |"
    )
    text = "\n".join(interpret(result))
    assert (
        "circular) the PEG reaches 0.310 ± 0.010 at the training size against 0.950 ± 0.050 with zeros: supports"
        in text
    )


def test_ablation_rows() -> None:
    specs = ablation_specs(["kernel", "placement", "separable", "padding"], depth=4, base_at=(0, 1, 2, 3))
    got = [(s.group, s.name, s.argv, s.same_as) for s in specs]
    assert got == [
        ("kernel", "kernel 1x1", ("--peg-kernel-size", "1"), None),
        ("kernel", "kernel 3x3", ("--peg-kernel-size", "3"), "peg"),
        ("kernel", "kernel 5x5", ("--peg-kernel-size", "5"), None),
        ("kernel", "kernel 7x7", ("--peg-kernel-size", "7"), None),
        ("placement", "after block 0", ("--peg-at", "0"), None),
        ("placement", "after blocks 0-3", ("--peg-at", "all"), "peg"),
        ("placement", "before block 0", ("--peg-at", "-1"), None),
        ("separable", "full 3x3", (), "peg"),
        ("separable", "separable 1x3+3x1", ("--peg-separable",), None),
        ("padding", "zero padding", (), "peg"),
        ("padding", "circular padding", ("--peg-padding", "circular"), None),
    ]
    # CPVT's own baseline (one PEG after block 0): that placement row is the baseline instead
    at = {s.name: s.same_as for s in ablation_specs(["placement"], depth=6, base_at=(0,))}
    assert at == {"after block 0": "peg", "after blocks 0-5": None, "before block 0": None}
    assert ablation_specs([], 4, (0,)) == []


def _row(label: str, means: tuple[float, float], stds: tuple[float, float] | None) -> Row:
    std = {} if stds is None else {"48 px": stds[0], "96 px": stds[1]}
    return Row(label, label.split()[0], None, {"48 px": means[0], "96 px": means[1]}, 0, 0, std=std)


def _toy(rows: list[Row], protocol: str) -> TaskResult:
    return TaskResult("classify", "top-1", "48 px", ["48 px", "96 px"], rows, {}, "toy", protocol=protocol)


def test_sentences_follow_the_numbers() -> None:
    peg, learned = (
        _row("peg", (0.99, 0.61), (0.01, 0.05)),
        _row("learned (bicubic)", (0.99, 0.98), (0.01, 0.01)),
    )
    none = _row("none", (0.25, 0.24), (0.02, 0.02))
    quad = interpret(_toy([peg, learned, none], "quadrant"))
    assert quad[0].startswith("Protocol *quadrant*")
    assert quad[1] == (
        "At 96 px (trained at 48 px) peg drops to 0.610 ± 0.050 while learned (bicubic) keeps 0.980 ± 0.010: "
        "learned (bicubic) is ahead."
    )
    assert quad[2].startswith("This table contradicts the claim that a PEG generalises")
    assert quad[3] == (
        "At the training size peg reaches 0.990 ± 0.010 and `none` 0.250 ± 0.020: "
        "the task needs position, and the PEG supplies it."
    )
    # the scale protocol, PEG ahead (two seeds or more: stds on both sides)
    scale = interpret(
        _toy([_row("peg", (0.9, 0.91), (0.01, 0.01)), _row("learned (bicubic)", (0.9, 0.8), (0.01, 0.02))],
             "scale")
    )  # fmt: skip
    assert scale[1] == (
        "At 96 px (trained at 48 px) peg keeps 0.910 ± 0.010 while learned (bicubic) drops to 0.800 ± 0.020: "
        "peg is ahead."
    )
    assert scale[2].startswith("This table supports the claim") and "73.4 -> 74.2" in scale[2]
    # ahead of the table, yet falling: the sentence says both
    falls = interpret(
        _toy(
            [_row("peg", (0.9, 0.5), (0.0, 0.0)), _row("learned (bicubic)", (0.5, 0.35), (0.0, 0.0))], "scale"
        )
    )
    assert falls[2].endswith(
        ", but not that a PEG keeps its accuracy: peg falls from 0.900 ± 0.000 to 0.500 ± 0.000."
    )
    # overlapping error bars: no conclusion, and why
    a, b = _row("peg", (0.9, 0.78), (0.05, 0.05)), _row("learned (bicubic)", (0.9, 0.75), (0.05, 0.05))
    assert compare(a, b, "96 px") == 0 and compare(a, b, "96 px", "48 px") == -1
    assert interpret(_toy([a, b], "scale"))[2].endswith(
        "draws no conclusion on the claim that a PEG generalises to a larger input without fine-tuning better "
        "than a resized learned table (CPVT-Ti 73.4 -> 74.2 against DeiT-Ti 72.2 -> 71.2 at 224 -> 384 px) "
        "(the difference 0.030 is within the spread ±0.100)."
    )


def test_rotary_sentence_compares_the_best_rotary_row_with_peg() -> None:
    peg = _row("peg", (0.9, 0.6), (0.01, 0.02))
    rows = [peg, _row("rope-axial", (0.9, 0.7), (0.01, 0.02)), _row("rope-mixed", (0.9, 0.85), (0.01, 0.02)),
            _row("peg+rope-mixed", (0.9, 0.8), (0.01, 0.02))]  # fmt: skip
    rows[3].encoding = "peg+rope-mixed"
    text = interpret(_toy(rows, "scale"))
    assert text[-1] == (
        "Rotary against PEG at 96 px (trained at 48 px): the best rotary row rope-mixed drops to 0.850 ± 0.020 "
        "while peg drops to 0.600 ± 0.020: rope-mixed is ahead."
    )
    rows[2].scores["96 px"] = 0.62  # now the best rotary row is peg+rope-mixed (0.8), ahead of peg
    assert interpret(_toy(rows, "scale"))[-1].endswith("peg+rope-mixed is ahead.")
    close = [peg, _row("rope-axial", (0.9, 0.61), (0.01, 0.02))]
    assert interpret(_toy(close, "scale"))[-1].endswith(
        ": no conclusion (the difference 0.010 is within the spread ±0.040)."
    )
    assert not any("Rotary" in t for t in interpret(_toy([peg], "scale")))  # no rotary row: no sentence


def test_sentences_draw_no_conclusion_without_seeds_spread_or_distance_from_chance() -> None:
    # one seed (what --quick runs): a big difference, yet no spread to compare it with
    one = _toy([_row("peg", (0.9, 0.91), None), _row("learned (bicubic)", (0.9, 0.5), None),
                _row("none", (0.4, 0.4), None)], "quadrant")  # fmt: skip
    text = interpret(one)
    assert text[1] == (
        "At 96 px (trained at 48 px) peg is at 0.910 while learned (bicubic) is at 0.500: "
        "no conclusion (one seed: a difference needs at least 2 seeds)."
    )
    assert text[2].startswith("This table draws no conclusion on the claim that a PEG generalises")
    assert text[2].endswith("(one seed: a difference needs at least 2 seeds).")
    assert text[3] == (
        "At the training size peg reaches 0.900 and `none` 0.400: "
        "no conclusion (one seed: a difference needs at least 2 seeds)."
    )
    assert not any(w in " ".join(text) for w in ("is ahead", "supports", "contradicts", "supplies"))
    # two seeds whose spreads overlap: |0.80 - 0.74| = 0.06 <= 0.04 + 0.03
    overlap = _toy([_row("peg", (0.9, 0.80), (0.02, 0.04)), _row("learned (bicubic)", (0.9, 0.74), (0.02, 0.03)),
                    _row("none", (0.3, 0.3), (0.01, 0.01))], "quadrant")  # fmt: skip
    text = interpret(overlap)
    assert text[1].endswith(": no conclusion (the difference 0.060 is within the spread ±0.070).")
    assert text[3].endswith(": the task needs position, and the PEG supplies it.")  # 0.9 vs 0.3: clear
    # a clear difference (0.80 - 0.60 = 0.20 > 0.02 + 0.03) counts
    clear = _toy([_row("peg", (0.9, 0.80), (0.01, 0.02)), _row("learned (bicubic)", (0.9, 0.60), (0.01, 0.03))],
                 "quadrant")  # fmt: skip
    assert interpret(clear)[1] == (
        "At 96 px (trained at 48 px) peg drops to 0.800 ± 0.020 while learned (bicubic) drops to 0.600 ± 0.030: "
        "peg is ahead."
    )
    assert interpret(clear)[2].startswith("This table supports the claim")
    # the same clear-looking gap near chance (3 classes: below 0.333 + 0.1 * 0.667 = 0.4) is no conclusion
    near = _toy([_row("peg", (0.39, 0.38), (0.001, 0.001)), _row("none", (0.34, 0.34), (0.001, 0.001))],
                "quadrant")  # fmt: skip
    near.chance = 1 / 3
    assert judge(near.rows[0], near.rows[1], "48 px", chance=None) == (1, None)
    assert interpret(near)[1] == (
        "At the training size peg reaches 0.390 ± 0.001 and `none` 0.340 ± 0.001: "
        "no conclusion (both are near chance (0.333))."
    )
    # ablations: a best row only when it is ahead of the next
    rows = [_row("kernel 1x1", (0.5, 0.4), None), _row("kernel 3x3", (0.6, 0.5), None)]
    for r in rows:
        r.group = "kernel"
    assert interpret(_toy(rows, "scale"))[1] == (
        "Ablation kernel: at the training size no conclusion (one seed: a difference needs at least 2 seeds): "
        "highest `kernel 3x3` (0.600), next `kernel 1x1`; at 96 px no conclusion (one seed: a difference needs "
        "at least 2 seeds): highest `kernel 3x3` (0.500), next `kernel 1x1`."
    )
    rows[0].std, rows[1].std = {"48 px": 0.01, "96 px": 0.1}, {"48 px": 0.01, "96 px": 0.1}
    assert interpret(_toy(rows, "scale"))[1].startswith(
        "Ablation kernel: at the training size best `kernel 3x3` ("
    )


# ------------------------------------------------------------------------------- scale-protocol data


def test_shape_protocol_scenes() -> None:
    scenes = sample_scenes(60, seed=3, noise=0.0, labeling="shape")
    assert scenes.class_names == SHAPES and torch.equal(scenes.labels, scenes.shape)
    assert torch.bincount(scenes.labels).tolist() == [20, 20, 20]  # balanced
    # the label is not the position: every shape occurs in more than one quadrant, and colour is not the shape
    for k in range(3):
        assert len(set(scenes.quadrant[scenes.shape == k].tolist())) > 1
    hue = scenes.color - torch.tensor([[0.9, 0.15, 0.15], [0.15, 0.85, 0.2], [0.2, 0.3, 0.95]]).unsqueeze(1)
    assert (hue.abs().amax(-1).argmin(0) != scenes.shape).any()
    # whole shapes inside the image
    assert ((scenes.center - scenes.radius[:, None]) >= 0).all() and (
        (scenes.center + scenes.radius[:, None]) <= 1
    ).all()
    assert sample_scenes(12, 0).labels.max() > 3  # the quadrant labelling is unchanged
    with pytest.raises(ValueError, match="labeling"):
        sample_scenes(4, 0, labeling="where")


@pytest.mark.parametrize("size", [48, 30])
def test_scene_rendered_larger_is_the_same_picture(size: int) -> None:
    """The 2x render box-filtered down equals the 1x render, except where a shape's edge crosses a pixel."""
    scenes = sample_scenes(24, seed=1, noise=0.0, labeling="shape")
    small = scenes.images(size).double()
    big = torch.nn.functional.avg_pool2d(scenes.images(2 * size).double(), 2)
    diff = (big - small).abs().amax(1)  # (N, H, W)
    assert (diff < 1e-6).double().mean() > 0.9  # the interior of shape and background: identical
    # an edge pixel is a mix of the two colours: between them, never outside
    lo = torch.minimum(scenes.color, scenes.background).double()[:, :, None, None] * 2 - 1
    hi = torch.maximum(scenes.color, scenes.background).double()[:, :, None, None] * 2 - 1
    assert ((big >= lo - 1e-6) & (big <= hi + 1e-6)).all()
    # and the odd/non-square size renders too
    assert scenes.images((size, size + 6)).shape == (24, 3, size, size + 6)


@pytest.mark.slow
def test_study_on_an_image_folder(tmp_path: Path) -> None:
    """``--data DIR`` (a ``make-data`` tree) with ``--train-size`` / ``--test-sizes``: the folder is resized."""
    from peg_core.classify.cli import make_data

    make_data([str(tmp_path / "shapes"), "--n-train", "24", "--n-val", "12", "--img-size", "40"])
    threads = torch.get_num_threads()
    try:
        results = main(["--task", "classify", "--quick", "--data", str(tmp_path / "shapes"), "--out",
                        str(tmp_path / "out"), "--train-size", "32", "--test-sizes", "24,40", "--quantize", "int8", "--rows", "peg,learned"])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    r = results["classify"]
    assert r.sizes == ["24 px", "32 px", "40 px"] and r.train_size == "32 px" and r.protocol is None
    assert str(tmp_path / "shapes") in r.data
    assert all(0.0 <= v <= 1.0 for row in r.rows for v in row.scores.values())
    # int8 of each base encoding (the learned table with its default bicubic mode), at every size
    int8 = {row.label: row.int8 for row in r.rows if row.int8}
    assert [row.label for row in r.rows] == [
        "peg",
        "learned (bicubic)",
        "learned (bilinear)",
        "learned (nearest)",
    ]
    assert list(int8) == ["peg", "learned (bicubic)"]
    assert all(list(v) == r.sizes and all(0 <= x[0] <= 1 for x in v.values()) for v in int8.values())
    assert "int8 (PT2E" in (tmp_path / "out" / "report.md").read_text()


def test_a_failed_cell_drops_its_row_with_a_note() -> None:
    plan = _plan([RowSpec("peg", "peg"), RowSpec("none", "none")], [0, 1])
    cells = {
        ("peg", 0): _cell(0.9, 0.8),
        ("peg", 1): _cell(0.9, 0.8),
        ("none", 0): _cell(0.3, 0.3),
        ("none", 1): None,
    }
    result = assemble(plan, cells)
    assert [r.label for r in result.rows] == ["peg"]
    assert result.notes == ["Row `none` left out: its training failed for seed(s) [1] (see the log)."]


# ------------------------------------------------------------------------------- RT-DETR (detect)


def test_study_quick_rtdetr_has_its_own_section_and_multi_scale_training(tmp_path: Path) -> None:
    from peg_core.engine import read_checkpoint

    threads = torch.get_num_threads()
    try:
        results = main(["--task", "detect", "--arch", "rtdetr", "--quick", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert list(results) == ["detect-rtdetr"]  # DETR's "detect" rows are neither run nor overwritten
    doc = json.loads((tmp_path / "study.json").read_text())["tasks"]["detect-rtdetr"]
    assert [r["label"] for r in doc["rows"]] == ["peg", "sincos", "none"]
    assert doc["sizes"] == ["48 px", "64 px", "96 px", "128 px"] and doc["train_size"] == "64 px"
    report = (tmp_path / "report.md").read_text()
    assert "## detect-rtdetr: AP50 by test size" in report and (tmp_path / "detect-rtdetr.png").is_file()
    assert "no conclusion (one seed" in report and "sin-cos codes computed for that input's grid" in report
    # rtdetr_demo_tiny: dim 32, AIFI on the stride-32 map, 2 x 2 tokens at 64 px, one AIFI layer
    rows = {r["label"]: r for r in doc["rows"]}
    assert (rows["peg"]["params"], rows["peg"]["flops"]) == (32 * 9 + 32, 2 * 4 * 32 * 9 + 4 * 32)
    assert (rows["sincos"]["params"], rows["sincos"]["flops"]) == (0, 4 * 32)  # q = k = x + pos, once
    assert (rows["none"]["params"], rows["none"]["flops"]) == (0, 0)
    # trained as RT-DETR is: one square side per batch from 0.75x..1.25x of the training size
    ckpt = read_checkpoint(tmp_path / "detect-rtdetr" / "sincos" / "seed0" / "checkpoint.pth", "detect")
    assert ckpt["args"]["train_scales"] == [48, 56, 64, 72, 80] and ckpt["args"]["val_size"] == 64
    assert (ckpt["model_config"]["arch"], ckpt["model_config"]["pos_enc"]) == ("rtdetr", "sincos")


def test_study_rtdetr_rows_and_arch_flag(tmp_path: Path) -> None:
    from tools.study import _keep_rows
    from tools.study_tasks import plan_detect_rtdetr

    plan = plan_detect_rtdetr(tmp_path, True, [0], rows=["peg", "rope-axial"])
    _keep_rows([plan], ["peg", "rope-axial"])
    assert [s.name for s in plan.specs] == ["peg", "rope-axial"] and plan.key == "detect-rtdetr"
    assert plan.data["train_sides"] == [48, 56, 64, 72, 80]
    from tools.study import _plans, build_parser

    args = build_parser().parse_args(
        ["--task", "detect", "--arch", "both", "--quick", "--out", str(tmp_path)]
    )
    assert [p.key for p in _plans(args, ["detect"], [0])] == [
        "detect",
        "detect-rtdetr",
    ]  # DETR's first, own folders
    assert (tmp_path / "detect" / "data").is_dir() and (tmp_path / "detect-rtdetr" / "data").is_dir()
    with pytest.raises(SystemExit):  # --arch is the detect task's
        main(["--task", "classify", "--arch", "rtdetr", "--quick", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_study_quick_rfdetr_has_its_own_section_and_trains_at_multiples_of_its_windows(
    tmp_path: Path,
) -> None:
    """``--arch rfdetr``: its table / PEG / none rows in the ViT; one row trained (``--rows peg``) to stay cheap."""
    from peg_core.engine import read_checkpoint
    from tools.study_tasks import plan_detect_rfdetr

    plan = plan_detect_rfdetr(tmp_path / "plan", True, [0], train_size=96, rows=["rope-axial"])
    assert [s.name for s in plan.specs] == ["learned", "peg", "none", "rope-axial"]
    assert all(s.modes == (None,) for s in plan.specs)  # RF-DETR's table has one resize: transformers'
    assert plan.data["train_sides"] == [64, 80, 96, 112, 128] and plan.sizes == [72, 96, 144, 192]
    assert any(n.startswith("72 px: no multiple of 16 px, padded") for n in plan.notes)
    threads = torch.get_num_threads()
    try:
        results = main(
            ["--task", "detect", "--arch", "rfdetr", "--quick", "--rows", "peg", "--out", str(tmp_path)]
        )
    finally:
        torch.set_num_threads(threads)
    assert list(results) == ["detect-rfdetr"]
    doc = json.loads((tmp_path / "study.json").read_text())["tasks"]["detect-rfdetr"]
    assert [r["label"] for r in doc["rows"]] == ["peg"] and doc["train_size"] == "64 px"
    assert "## detect-rfdetr: AP50 by test size" in (tmp_path / "report.md").read_text()
    # rfdetr_demo_tiny: width 48, patch 8: an 8 x 8 grid at 64 px; the PEG's depthwise 3 x 3 conv and its add
    peg = doc["rows"][0]
    assert (peg["params"], peg["flops"]) == (48 * 9 + 48, 2 * 64 * 48 * 9 + 64 * 48)
    ckpt = read_checkpoint(tmp_path / "detect-rfdetr" / "peg" / "seed0" / "checkpoint.pth", "detect")
    assert ckpt["args"]["train_scales"] == [48, 64, 80]  # multiples of patch x windows = 16 px
    assert (ckpt["model_config"]["arch"], ckpt["model_config"]["pos_enc"]) == ("rfdetr", "peg")


# ----------------------------------------------------------------------- the extrapolation protocol


def test_extrapolation_protocol_quick(tmp_path: Path) -> None:
    """``--extrapolate``: 0.5x-4x, the two aspects, per-layer diagnostics in the JSON, report and figure."""
    threads = torch.get_num_threads()
    try:
        results = main(["--task", "classify", "--quick", "--extrapolate", "--rows", "peg,lookhere,fire",
                        "--out", str(tmp_path / "c"), "--threads", "1"])  # fmt: skip
        video = main(["--task", "video", "--quick", "--test-scales", "0.5,1,4", "--diagnose", "--rows",
                      "peg3d,alibi-2d", "--out", str(tmp_path / "v"), "--threads", "1"])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    c = results["classify"]
    # 32 px x (0.5, 0.75, 1, 1.5, 2, 3, 4), then 1:2 and 2:1 at twice the training size on the long side
    assert c.sizes == ["16 px", "24 px", "32 px", "48 px", "64 px", "96 px", "128 px", "32x64 px", "64x32 px"]
    depth = DEMO_CONFIG["depth"]
    for row in c.rows:
        assert list(row.scores) == c.sizes
        assert set(row.diagnostics) == set(c.sizes)
        for d in row.diagnostics.values():
            assert len(d["entropy"]) == len(d["distance"]) == depth
            assert all(e > 0 for e in d["entropy"]) and all(v >= 0 for v in d["distance"])
    rows = {r.label: r for r in c.rows}
    # an untrained-ish model's attention spreads over more keys at a larger grid: entropy grows with it
    peg = rows["peg"].diagnostics
    assert peg["128 px"]["entropy"][0] > peg["32 px"]["entropy"][0] > peg["16 px"]["entropy"][0]
    # LookHere masks half of the keys of every head: lower entropy than a model that sees all of them
    assert rows["lookhere"].diagnostics["128 px"]["entropy"][0] < peg["128 px"]["entropy"][0]
    report = (tmp_path / "c" / "report.md").read_text()
    assert "Attention diagnostics" in report and "Three families" in report
    assert (tmp_path / "c" / "classify_attention.png").is_file()
    doc = json.loads((tmp_path / "c" / "study.json").read_text())
    assert doc["tasks"]["classify"]["rows"][0]["diagnostics"]["32 px"]["entropy"]
    # video: clip lengths 0.5x / 1x / 4x (tubelet 2), the data long enough for 32 frames at stride 2
    v = video["video"]
    assert v.sizes == ["4 fr", "8 fr", "32 fr", "8 fr, 48 px"]
    assert (tmp_path / "v" / "video" / "data_63f_wrap" / "val.csv").is_file()
    enc = [r for r in v.rows if r.group == "encoding"]
    assert all(set(r.diagnostics) == set(v.sizes) for r in enc)
    assert enc[0].diagnostics["32 fr"]["distance"][-1] > enc[0].diagnostics["4 fr"]["distance"][-1]


def test_in_process_top1_equals_the_eval_command(tmp_path: Path) -> None:
    """The aspect columns' in-process top-1 at a square size equals ``evaluate``'s on the rendered PNGs."""
    from tools.study_tasks import _scenes_top1, _val_scenes, plan_classify, run_cell

    plan = plan_classify(tmp_path, True, [0], test_scales=(1.0,), aspect=True)
    spec = next(s for s in plan.specs if s.name == "peg")
    cell = run_cell(plan, spec, 0)
    from peg_core.classify.model import load_model

    model = load_model(tmp_path / "peg" / "seed0" / "checkpoint.pth").model
    assert _scenes_top1(model, _val_scenes(plan), (32, 32)) == cell.scores["None"]["32 px"]
    assert set(cell.scores["None"]) == {"32 px", "32x64 px", "64x32 px"}


def _diag_row(label: str, means, stds, ent, dist) -> Row:
    row = _row(label, means, stds)
    row.diagnostics = {"48 px": {"entropy": [1.0, ent[0]], "distance": [1.0, dist[0]]},
                       "96 px": {"entropy": [1.0, ent[1]], "distance": [1.0, dist[1]]}}  # fmt: skip
    return row


def test_family_and_diagnostic_sentences_follow_the_numbers() -> None:
    rows = [
        _diag_row("peg", (0.9, 0.8), (0.01, 0.01), (2.0, 2.5), (1.0, 1.5)),
        _diag_row("learned (bicubic)", (0.9, 0.5), (0.01, 0.01), (2.0, 3.5), (1.0, 1.2)),
        _diag_row("rope-axial", (0.9, 0.3), (0.01, 0.01), (2.0, 3.9), (1.0, 1.1)),
        _diag_row("alibi-2d", (0.9, 0.7), (0.01, 0.01), (2.0, 2.9), (1.0, 1.6)),
        _diag_row("fire", (0.9, 0.6), (0.01, 0.01), (2.0, 3.2), (1.0, 1.4)),
        _diag_row("peg+fire", (0.9, 0.85), (0.01, 0.01), (2.0, 2.2), (1.0, 1.3)),
    ]
    rows[-1].encoding = "peg+fire"
    toy = _toy(rows, "scale")
    toy.seeds = [0, 1]
    fam = families_sentences(toy)
    assert fam[0].startswith("classify, best row per family at 48 px (the training size):")
    assert "no family leads: no conclusion (the difference 0.000 is within the spread" in fam[0]
    assert fam[1] == (
        "classify, best row per family at 96 px (the largest test size): PEG pair `peg+fire` 0.850 ± 0.010; "
        "conditional (PEG) `peg` 0.800 ± 0.010; attention bias `alibi-2d` 0.700 ± 0.010; table "
        "`learned (bicubic)` 0.500 ± 0.010; rotary `rope-axial` 0.300 ± 0.010. Here the PEG pair family leads, "
        "ahead of the next (conditional (PEG)) beyond the spread."
    )
    diag = diagnostics_sentences(toy)
    # the drop ranks the rows exactly as the entropy rise does: rho = 1; distance: no clear rank order
    assert diag[0].endswith("The rows that lose most top-1 are those whose entropy rises more "
                            "(Spearman rho = 1.00, p = 0.000, n = 6 rows).")  # fmt: skip
    assert "no conclusion (Spearman rho = " in diag[1]
    toy.seeds = [0]
    assert "one seed: a rank correlation needs at least 2 seeds" in diagnostics_sentences(toy)[0]
    assert attention_figure(toy) is not None
    assert attention_figure(_toy([_row("peg", (0.9, 0.8), None)], "scale")) is None


def test_extrapolation_flags_are_checked(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--task", "classify", "--quick", "--test-scales", "0,1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["--task", "classify", "--quick", "--test-scales", "1,2", "--test-sizes", "32,64",
              "--out", str(tmp_path)])  # fmt: skip


def test_train_args_reach_every_cell_and_the_report(tmp_path: Path) -> None:
    results = main(["--task", "classify", "--quick", "--rows", "peg", "--train-args", "--epochs 2 --lr 0.001",
                    "--out", str(tmp_path), "--threads", "1"])  # fmt: skip
    from peg_core.engine import read_checkpoint

    ckpt = read_checkpoint(tmp_path / "classify" / "peg" / "seed0" / "checkpoint.pth", "classify")
    assert ckpt["args"]["epochs"] == 2 and ckpt["args"]["lr"] == 0.001
    assert (
        "Every cell's train command ends with `--epochs 2 --lr 0.001` (`--train-args`)."
        in results["classify"].notes
    )


def test_video_plan_takes_a_real_recipe_and_crop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--video-config`` / ``--train-size`` for real clips: the recipe's length, tubelet and crop set the views."""
    import tools.study_tasks as tasks

    monkeypatch.setattr(
        tasks, "write_videomae_stand_in", lambda folder, *a: folder
    )  # no ViT-S folder written
    (tmp_path / "k400").mkdir()
    plan = tasks.plan_video(tmp_path / "out", False, [0], tmp_path / "k400", config="k400_vit_s_16x4_peg3d",
                            test_scales=(0.5, 1, 4))  # fmt: skip
    assert plan.views == [
        ("8 fr", 8, 224),
        ("16 fr", 16, 224),
        ("64 fr", 64, 224),
        ("16 fr, 256 px", 16, 256),
    ]
    assert plan.train_label == "16 fr" and plan.data["config"] == "k400_vit_s_16x4_peg3d"
    smaller = tasks.plan_video(tmp_path / "out", False, [0], tmp_path / "k400", config="k400_vit_s_16x4_peg3d",
                               train_size=160)  # fmt: skip
    assert [v[2] for v in smaller.views] == [160, 160, 160, 192]
    with pytest.raises(SystemExit):
        main(
            [
                "--task",
                "classify",
                "--quick",
                "--video-config",
                "k400_vit_s_16x4_peg3d",
                "--out",
                str(tmp_path),
            ]
        )
    with pytest.raises(SystemExit):
        main(["--task", "video", "--quick", "--video-config", "k400_x3d_xs", "--out", str(tmp_path)])
