"""``python -m peg_video prepare``: sizes, frame counts, annotations, broken files, resume, errors."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import av
import numpy as np
import pytest

from peg_video.__main__ import main
from peg_video.data import load_annotations
from peg_video.data.synthetic import SyntheticSpec, make_synthetic_kinetics, render_video, write_mp4
from peg_video.prepare import REPORT_NAME, scaled_size


def probe(path: Path) -> tuple[int, int, int, float]:
    """``(width, height, decoded frames, duration in s)`` of a video."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        frames = sum(1 for _ in c.decode(s))
        return s.width, s.height, frames, float(c.duration or 0) / 1e6


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file under ``root``."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """Nested class layout (train/val) + CSV and lists, a flat split, a small video, a broken one,
    and a list with absolute paths into the tree."""
    src = tmp_path_factory.mktemp("prep") / "src"
    make_synthetic_kinetics(
        src, SyntheticSpec(num_train=3, num_val=2, width=96, height=64, frames=10, fps=12)
    )
    rng = np.random.default_rng(0)
    # Flat layout: split/ID_start_end.mp4, a 64x96 portrait video and a 40x32 one already small enough.
    write_mp4(
        src / "flat" / "portraitAAAA_000001_000011.mp4",
        render_video(0, SyntheticSpec(width=64, height=96, frames=9), rng),
        12,
    )
    write_mp4(
        src / "flat" / "smallBBBBBB_000002_000012.mp4",
        render_video(1, SyntheticSpec(width=40, height=32, frames=9), rng),
        12,
    )
    (src / "flat.csv").write_text(
        "label,youtube_id,time_start,time_end,split\n"
        '"move right",portraitAAAA,1,11,flat\n'
        '"move left",smallBBBBBB,2,12,flat\n'
    )
    (src / "train" / "move_up").mkdir(parents=True, exist_ok=True)
    (src / "train" / "move_up" / "brokenCCCCC_000003_000013.mp4").write_bytes(
        b"\x00\x00\x00\x18ftypmp42" + b"x" * 200
    )
    first = sorted((src / "train").rglob("*.mp4"))[0]
    (src / "absolute.txt").write_text(f"{first.resolve()} 0\n")
    return src


@pytest.fixture(scope="module")
def prepared(tree, tmp_path_factory):
    dst = tmp_path_factory.mktemp("prep_out") / "dst"
    before = snapshot(tree)
    code = main(["prepare", str(tree), str(dst), "--short-side", "32", "--workers", "2", "--no-progress"])
    assert code == 0
    assert snapshot(tree) == before  # the source is only read
    return dst


def test_scaled_size():
    assert scaled_size(1280, 720, 320) == (568, 320)
    assert scaled_size(640, 272, 320) == (752, 320)  # 752.9 -> nearest even
    assert scaled_size(360, 640, 320) == (320, 568)
    assert scaled_size(96, 64, 31) == (48, 32)  # short side rounded up to even


def test_outputs_sizes_frames_and_report(tree, prepared):
    report = json.loads((prepared / REPORT_NAME).read_text())
    assert (report["videos"], report["encoded"], report["copied"], report["broken"]["count"]) == (8, 6, 1, 1)
    assert report["broken"]["samples"][0]["path"].endswith("brokenCCCCC_000003_000013.mp4")
    assert not (prepared / "train" / "move_up" / "brokenCCCCC_000003_000013.mp4").exists()
    for src in sorted(tree.rglob("*.mp4")):
        if "broken" in src.name:
            continue
        out = prepared / src.relative_to(tree)
        sw, sh, sf, sd = probe(src)
        w, h, f, d = probe(out)
        if min(sw, sh) <= 32:
            assert out.read_bytes() == src.read_bytes()  # copied, not re-encoded
            continue
        assert min(w, h) == 32 and w % 2 == 0 and h % 2 == 0, (src, w, h)
        assert abs(w / h - sw / sh) < 2 / 32  # aspect kept up to the even rounding
        assert abs(f - sf) <= 1 and abs(d - sd) < 0.1, (src, f, sf, d, sd)
    assert not list(prepared.rglob("*prepare-tmp"))


def test_annotations_stay_valid(tree, prepared):
    for name in ("train.csv", "val.csv", "train.txt", "val.txt", "flat.csv", "absolute.txt"):
        ann = load_annotations(prepared / name)
        assert ann.records, name
        for r in ann.records:
            assert r.path.is_file() and prepared.resolve() in r.path.resolve().parents, (name, r.path)
        assert ann.classes == load_annotations(tree / name).classes
    assert str(tree.resolve()) not in (prepared / "absolute.txt").read_text()
    assert (prepared / "classes.json").read_text() == (tree / "classes.json").read_text()


def test_resume_skips_and_completes(tree, prepared, capsys):
    outputs = {p: p.stat().st_mtime_ns for p in prepared.rglob("*.mp4")}
    assert (
        main(["prepare", str(tree), str(prepared), "--short-side", "32", "--workers", "1", "--no-progress"])
        == 0
    )
    report = json.loads((prepared / REPORT_NAME).read_text())
    assert (report["encoded"], report["copied"], report["done"]) == (0, 0, 7)
    assert {p: p.stat().st_mtime_ns for p in prepared.rglob("*.mp4")} == outputs
    # A killed run: one output missing, a temporary file left behind.
    victim = sorted(outputs)[0]
    victim.unlink()
    stale = victim.with_name(f".{victim.name}.999.prepare-tmp")
    stale.write_bytes(b"half a video")
    assert (
        main(["prepare", str(tree), str(prepared), "--short-side", "32", "--workers", "1", "--no-progress"])
        == 0
    )
    report = json.loads((prepared / REPORT_NAME).read_text())
    assert report["encoded"] + report["copied"] == 1 and report["done"] == 6
    assert victim.is_file() and not stale.exists()
    assert "1 broken" in capsys.readouterr().out


def test_user_errors(tree, tmp_path, capsys):
    (tmp_path / "a_file").write_text("a file, not a folder")  # (chmod cannot stop root)
    cases = [
        ([str(tmp_path / "nope"), str(tmp_path / "out")], "source folder not found"),
        ([str(tree), str(tree / "inside")], "output folder is inside the source folder"),
        ([str(tree), str(tmp_path / "a_file" / "out")], "output folder is not writable"),
    ]
    for args, message in cases:
        assert main(["prepare", *args, "--no-progress"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tree / "inside").exists()
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(tree), str(tmp_path / "o"), "--short-side", "0"])
    assert e.value.code == 2


def _small_tree(root: Path) -> Path:
    """Two 96x64 videos and a list of them."""
    rng = np.random.default_rng(1)
    for i, name in enumerate(("a/one.mp4", "b/two.mp4")):
        write_mp4(root / name, render_video(i, SyntheticSpec(width=96, height=64, frames=6), rng), 12)
    (root / "list.txt").write_text("a/one.mp4 0\nb/two.mp4 1\n")
    return root


def test_rerun_with_other_settings_is_refused_then_overwritten(tmp_path, capsys):
    src, dst = _small_tree(tmp_path / "src"), tmp_path / "dst"
    run = ["prepare", str(src), str(dst), "--workers", "1", "--no-progress"]
    assert main([*run, "--short-side", "32"]) == 0
    assert json.loads((dst / "prepare_settings.json").read_text()) == {
        "short_side": 32,
        "crf": 20,
        "preset": "veryfast",
    }
    before = snapshot(dst)
    capsys.readouterr()
    assert main([*run, "--short-side", "48"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert "--short-side 32 --crf 20 --preset veryfast, this run asks --short-side 48" in err
    assert "--overwrite" in err and err.rstrip().endswith(str(dst / "prepare_settings.json"))
    assert snapshot(dst) == before  # refused before any work
    # the same settings resume as before; other settings with --overwrite re-encode every video
    assert main([*run, "--short-side", "32"]) == 0
    assert json.loads((dst / REPORT_NAME).read_text())["done"] == 2
    assert main([*run, "--short-side", "48", "--overwrite"]) == 0
    report = json.loads((dst / REPORT_NAME).read_text())
    assert (report["short_side"], report["encoded"], report["done"]) == (48, 2, 0)
    for name in ("a/one.mp4", "b/two.mp4"):
        assert probe(dst / name)[:2] == (72, 48)  # decoded frames at the new size
    assert json.loads((dst / "prepare_settings.json").read_text())["short_side"] == 48
    # a DST from before the settings file: its report's settings count
    (dst / "prepare_settings.json").unlink()
    assert main([*run, "--short-side", "32", "--crf", "30"]) == 1
    assert "--short-side 48 --crf 20" in capsys.readouterr().err and probe(dst / "a/one.mp4")[:2] == (72, 48)


def test_relative_source_rewrites_absolute_paths_deterministically(tmp_path):
    """Absolute paths into a relative SRC point into DST, others stay; the same for any hash seed."""
    import os
    import subprocess
    import sys

    src = tmp_path / "k"
    (src / "train").mkdir(parents=True)
    outside = tmp_path / "other" / "k" / "b.mp4"  # holds "k/" too, but is not under SRC
    (src / "abs.txt").write_text(
        f"{src}/train/a.mp4 0\n# {src}/comment.mp4 1\n{outside} 1\ntrain/c.mp4 0\n{src}/sub dir/d e.mp4 1\n"
        f"{src}/test/only_a_path.mp4\r\n"
    )
    (src / "paths.csv").write_text(f"path,label\n{src}/train/a.mp4,0\n{outside},1\n")
    (src / "meta.json").write_text(json.dumps({"videos": [f"{src}/train/a.mp4", str(outside)], "n": 2}))
    out = (tmp_path / "out").resolve()
    texts = []
    for seed in ("0", "1"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(Path(__file__).parents[2])}
        proc = subprocess.run(
            [sys.executable, "-m", "peg_video", "prepare", "k", "out", "--no-progress"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        texts.append({n: (out / n).read_bytes().decode() for n in ("abs.txt", "paths.csv", "meta.json")})
        assert sorted(json.loads((out / REPORT_NAME).read_text())["rewritten_annotations"]) == sorted(
            str(Path("out") / n) for n in ("abs.txt", "meta.json", "paths.csv")
        )
        shutil.rmtree(out)
    assert texts[0] == texts[1]
    assert texts[0]["abs.txt"] == (
        f"{out}/train/a.mp4 0\n# {src}/comment.mp4 1\n{outside} 1\ntrain/c.mp4 0\n{out}/sub dir/d e.mp4 1\n"
        f"{out}/test/only_a_path.mp4\r\n"
    )
    assert texts[0]["paths.csv"] == f"path,label\n{out}/train/a.mp4,0\n{outside},1\n"
    assert json.loads(texts[0]["meta.json"]) == {"videos": [f"{out}/train/a.mp4", str(outside)], "n": 2}
