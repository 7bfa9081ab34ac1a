"""``tools.study``: the encoding cost counter, the report, and a ``--quick`` run of every task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from peg_core import PEG2d, build_position_encoding
from peg_core.classify import DEMO_CONFIG
from peg_video import PEG3d
from tools.study import main, markdown_table, write_report
from tools.study_cost import encoding_cost
from tools.study_tasks import Row, TaskResult


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


def test_data_needs_a_single_task(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--task", "all", "--data", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["--task", "detect", "--data", str(tmp_path / "missing")])


EXPECTED_ROWS = {
    "classify": ["peg", "sincos", "learned (bicubic)", "learned (bilinear)", "learned (nearest)", "none"],
    "detect": ["peg", "sine", "learned (bicubic)", "learned (bilinear)", "learned (nearest)", "none"],
    "video": [
        "peg3d",
        "peg3d-factorized",
        "learned (bicubic)",
        "learned (bilinear)",
        "learned (nearest)",
        "none",
    ],
}


@pytest.mark.slow
def test_study_quick_all_tasks(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        results = main(["--task", "all", "--quick", "--out", str(tmp_path), "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    doc = json.loads((tmp_path / "study.json").read_text())
    report = (tmp_path / "report.md").read_text()
    assert set(doc["tasks"]) == set(EXPECTED_ROWS) == set(results)

    for task, labels in EXPECTED_ROWS.items():
        t = doc["tasks"][task]
        assert [r["label"] for r in t["rows"]] == labels
        assert len(t["sizes"]) == 4 and t["train_size"] in t["sizes"]
        for row in t["rows"]:
            assert list(row["scores"]) == t["sizes"]
            assert all(0.0 <= v <= 1.0 for v in row["scores"].values())
        rows = {r["label"]: r for r in t["rows"]}
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

    # detect (quick): 64 px / stride 16 -> 4x4 grid, dim 64, sine added to q/k in each of 2 encoder layers
    d = {r["label"]: r for r in doc["tasks"]["detect"]["rows"]}
    assert d["sine"]["params"] == 0 and d["sine"]["flops"] == 2 * 16 * 64
    assert d["peg"]["params"] == 64 * 10 and d["peg"]["flops"] == 2 * 16 * 64 * 9 + 16 * 64

    # video (quick): 8 frames / 2 x (32 / 8)^2 = 64 tubelets; learned = 4x4 spatial + 4 temporal codes
    v = {r["label"]: r for r in doc["tasks"]["video"]["rows"]}
    dim = v["learned (nearest)"]["params"] // (16 + 4)
    assert v["learned (nearest)"]["params"] == 20 * dim and v["learned (nearest)"]["flops"] == 64 * dim
    n_pegs = v["peg3d"]["params"] // (27 * dim + dim)
    assert n_pegs >= 1 and v["peg3d"]["params"] == n_pegs * 28 * dim
    assert v["peg3d"]["flops"] == n_pegs * (2 * 64 * dim * 27 + 64 * dim)
    assert v["peg3d-factorized"]["params"] < v["peg3d"]["params"]
    assert doc["tasks"]["video"]["sizes"] == ["4 fr", "8 fr", "16 fr", "8 fr, 48 px"]
