"""``tools/bench_core.py --only bias --quick``: finite ratios for every kind, bias bytes from the shapes.

The timing blocks are cut to a millisecond (``--min-run-time 0.001 --repeats 1``): the test checks
that the table and its JSON are complete, not what the ratios are (they vary with the machine's load).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from peg_core.bias import ALiBiBias, FIREBias, LookHereBias
from tools.bench_core import BIAS_DEPTH, bias_bytes, largest_intermediate, main, position_kinds

KINDS = ("alibi-2d", "fire", "lookhere", "rope-axial", "rope-mixed", "rope-dinov3")


def _peak_measurable() -> bool:
    """The memory peak needs Linux's ``/proc/self/clear_refs`` (high-water-mark reset)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def test_quick_bias_table_has_every_kind(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bench.json"
    main(["--only", "bias", "--quick", "--threads", "1", "--min-run-time", "0.001", "--repeats", "1",
          "--json", str(path)])  # fmt: skip
    out = capsys.readouterr().out
    payload = json.loads(path.read_text())
    assert (
        set(payload) >= {"bias_rows", "bias_memory"} and "rows" not in payload and "rope_rows" not in payload
    )
    assert set(KINDS) <= set(position_kinds())

    rows = payload["bias_rows"]
    # 2 grids x 2 passes x every registered 2-D bias / rotary kind
    assert len(rows) == 2 * 2 * len(position_kinds())
    for r in rows:
        assert r["depth"] == BIAS_DEPTH
        for key in (
            "pos_us",
            "call_us",
            "attn_us",
            "plain_us",
            "call_vs_plain",
            "attn_vs_plain",
            "model_vs_plain",
        ):
            assert math.isfinite(r[key]) and r[key] > 0, (r["kind"], key, r[key])
        assert r["model_vs_plain"] == (r["pos_us"] + BIAS_DEPTH * r["attn_us"]) / (BIAS_DEPTH * r["plain_us"])
    for case in ("4x4+cls", "6x6+cls"):
        for pass_ in ("fwd", "fwd+bwd"):
            for kind in KINDS:
                # | shape | B | pass | kind | 4 timings | 3 ratios |
                head = rf"^\| {re.escape(case)} \| 1 \| {re.escape(pass_)} \| {kind} "
                pattern = head + r"(\| \d+ ){4}(\| \d+\.\d\d ){3}\|$"
                assert re.search(pattern, out, re.M), (case, pass_, kind)
    assert f"{BIAS_DEPTH}-layer/plain at 6x6+cls (fwd / fwd+bwd): alibi-2d " in out

    mem = {r["kind"]: r for r in payload["bias_memory"]}
    assert set(mem) == {"alibi-2d", "fire", "lookhere"}
    measurable = _peak_measurable()
    for r in mem.values():
        # quick: 4x the 4x4 grid, 2 heads, a class token
        assert r["size"] == [16, 16] and r["heads"] == 2 and r["tokens"] == 257
        assert r["float32_bytes"] == 2 * 257 * 257 * 4 and r["bfloat16_bytes"] == 2 * 257 * 257 * 2
        if measurable:  # the RSS rise: rough below a MiB (Linux counts RSS in per-thread batches)
            assert math.isfinite(r["peak_float32_bytes"]) and math.isfinite(r["peak_bfloat16_bytes"]), r
    if measurable:  # FIRE's (N, N, 32) hidden layer is 8 MiB: its linear and ReLU outputs coexist
        assert mem["fire"]["peak_float32_bytes"] >= 1.5 * mem["fire"]["largest_bytes"], mem["fire"]
        assert mem["fire"]["peak_bfloat16_bytes"] >= 1.5 * mem["fire"]["largest_bytes"], mem["fire"]
    assert re.search(
        r"^\| fire \| 16x16\+cls \| 2 \| 257 \| 0\.5 \| 0\.3 \| \(N, N, 32\) MLP hidden \| 8\.0 \|", out, re.M
    )


def test_bias_bytes_at_896_px() -> None:
    """ViT-S/16 at 4x 224 px: 56x56 grid + class token = 3137 tokens, 6 heads."""
    assert bias_bytes(6, (56, 56), 1, 4) == 6 * 3137 * 3137 * 4  # 236 MB in float32
    assert bias_bytes(6, (56, 56), 1, 2) == 6 * 3137 * 3137 * 2
    assert bias_bytes(6, (14, 14), 0, 4) == 6 * 196 * 196 * 4
    n = 56 * 56
    # FIRE's 1.26 GB hidden layer is made in row chunks of at most 256 MiB: 668 rows of 3136 x 32 floats
    assert largest_intermediate(FIREBias(6, 2), (56, 56)) == (
        "(668, N, 32) MLP hidden chunk",
        668 * n * 32 * 4,
    )
    assert largest_intermediate(FIREBias(6, 2, hidden=8), (56, 56))[1] == 2674 * n * 8 * 4
    assert largest_intermediate(FIREBias(6, 2), (28, 28)) == ("(N, N, 32) MLP hidden", 784 * 784 * 32 * 4)
    # past 64 chunks the (heads, N, N) result is the largest tensor
    assert largest_intermediate(FIREBias(6, 2), (128, 128)) == ("(6, N, N) grid bias", 6 * 128**4 * 4)
    for bias in (ALiBiBias(6, 2), LookHereBias(6, 2)):
        assert largest_intermediate(bias, (56, 56)) == ("(6, N, N) grid bias", 6 * n * n * 4)
