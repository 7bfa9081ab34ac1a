"""``tools/bench_rtdetr.py --small``: same weights in both models, a table with every measurement and ratio.

One test per family (RT-DETR, D-FINE, DEIMv2, RF-DETR) runs its ``--small --rounds 1`` path at
96x96 (RF-DETR: no ``eval_fused`` row, it has no batch norm to fold; and by CPU time, ``--clock
cpu``); the ratios are reported, not asserted (timings vary with the machine's load).
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("transformers")
pytest.importorskip("timm")

import tools.bench_rtdetr as bench
from tools.bench_rtdetr import FAMILIES, main

MEASUREMENTS = ("eval", "eval_fused", "train")


def _rows(out: str, names: tuple[str, ...] = MEASUREMENTS) -> None:
    rows = re.findall(r"^\| (\w+) \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d\d)x \|$", out, re.M)
    assert tuple(r[0] for r in rows) == names and all(float(r[3]) > 0 for r in rows), rows


@pytest.mark.parametrize("model", ["rtdetr", "dfine", "deimv2", "rfdetr"])
def test_small_bench_prints_every_measurement(model: str, capsys) -> None:
    args = ["--small", "--size", "96", "--rounds", "1"]
    if model == "rfdetr":
        args += ["--clock", "cpu"]
    assert main(args if model == "rtdetr" else [*args, "--model", model]) == 0  # rtdetr: the default
    out = capsys.readouterr().out
    assert out.startswith(f"{FAMILIES[model].labels[0]}, 96x96, batch 2, 1 thread(s)")
    _rows(out, MEASUREMENTS if FAMILIES[model].fused else ("eval", "train"))
    assert ("CPU time" in out.splitlines()[0]) == (model == "rfdetr")


def test_small_bench_all_families_as_json(capsys, monkeypatch) -> None:
    """``--model all --json``: one table per family, in :data:`FAMILIES` order (timing stubbed: the runs above cover it)."""

    row = {"ours": 1.0, "transformers": 2.0, "ratio": 0.5}
    monkeypatch.setattr(bench, "run_bench", lambda *a, model, **k: {m: row for m in MEASUREMENTS})
    assert main(["--small", "--model", "all", "--json"]) == 0
    tables = json.loads(capsys.readouterr().out)
    assert list(tables) == list(FAMILIES) and all(list(t) == list(MEASUREMENTS) for t in tables.values())
