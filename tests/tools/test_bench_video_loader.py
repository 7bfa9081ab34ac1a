"""``tools/bench_video_loader.py --quick``: the comparison runs end to end and prints its table.

Speed is not asserted (the machine may be loaded); the rows, their columns and that every
loader produced clips are.
"""

from __future__ import annotations

import pytest

from tools.bench_video_loader import table


def test_table_format() -> None:
    row = {
        "set": "640x360",
        "loader": "pytorchvideo Kinetics (pyav)",
        "files": "original",
        "clips_per_s": 1.234,
        "clips_per_s_per_core": 0.617,
        "vs_pytorchvideo": 1.0,
        "clips_per_cpu_s": 0.5,
        "cpu_vs_pytorchvideo": 1.0,
        "clips": 2,
    }
    lines = table([row]).splitlines()
    assert lines[0].startswith("| videos | loader | files | clips/s | clips/s per core | vs pytorchvideo |")
    assert lines[0].endswith("| clips per CPU-s | vs pytorchvideo |")
    assert (
        lines[2]
        == "| 640x360 | pytorchvideo Kinetics (pyav) | original | 1.23 | 0.62 | 1.00x | 0.50 | 1.00x |"
    )


@pytest.mark.slow
def test_quick_mode_prints_the_table(tmp_path, capsys) -> None:
    from tools.bench_video_loader import main

    result = main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    expected = [
        ("pytorchvideo Kinetics (pyav)", "original"),
        ("peg_video, full-size decode", "original"),
        ("peg_video (decord, reduced decode)", "original"),
        ("peg_video (decord, reduced decode)", "prepared 320"),
    ]
    assert [(r["loader"], r["files"]) for r in result["rows"]] == expected
    rows = [line for line in out.splitlines() if line.startswith("| 640x360 |")]
    assert len(rows) == 4
    for line, (loader, files) in zip(rows, expected):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:3] == [loader, files]
        assert float(cells[3]) > 0 and float(cells[6]) > 0  # clips/s and clips per CPU-second
        assert cells[5].endswith("x") and cells[7].endswith("x")
    assert rows[0].split("|")[6].strip() == rows[0].split("|")[8].strip() == "1.00x"  # the baseline
    assert all(r["clips"] == 2 for r in result["rows"])  # one clip per video and loader
