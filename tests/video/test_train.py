"""End-to-end training: the loss falls, --resume continues exactly, NaN stops cleanly."""

import json

import pytest
import torch

from peg_core.utils import load_checkpoint
from peg_video.data import SyntheticSpec, make_synthetic_kinetics
from peg_video.train import main_eval, main_train, parse_args, train

pytestmark = pytest.mark.slow

TINY = [
    "--config", "synthetic_tiny", "--num-frames", "4", "--stride", "2", "--batch-size", "4",
    "--model-opt", "embed_dim=32", "--model-opt", "depth=1", "--model-opt", "num_heads=2",
    "--num-clips", "2", "--no-progress", "--workers", "0",
]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    make_synthetic_kinetics(
        root, SyntheticSpec(num_train=12, num_val=6, width=64, height=48, frames=12, seed=2)
    )
    return root


def _args(data, out, *extra):
    return parse_args([
        "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"), "--out", str(out), *TINY, *extra,
    ])  # fmt: skip


def _log(out, tag):
    return [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["tag"] == tag]


def test_loss_falls_and_outputs_are_written(data, tmp_path):
    out = tmp_path / "run"
    report = train(
        _args(data, out, "--epochs", "8", "--lr", "1e-2", "--warmup-epochs", "0", "--eval-every", "4")
    )
    losses = [r["loss"] for r in _log(out, "train")]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.1, losses  # 1.87 -> 1.72 here
    assert len(_log(out, "val")) == 2  # epochs 4 and 8
    assert report["videos_evaluated"] == 6 and report["num_views"] == 12 and report["skipped"] == 0
    assert 0.0 <= report["top1"] <= report["top5"] <= 1.0
    saved = json.loads((out / "report.json").read_text())
    assert saved["top1"] == report["top1"]
    classes = json.loads((out / "classes.json").read_text())
    assert classes["classes"][0] == "circle_clockwise" and classes["index"]["move_up"] == 5
    assert (out / "tb").is_dir() and load_checkpoint(out / "checkpoint.pt")["epoch"] == 7


def test_resume_is_exact(data, tmp_path):
    common = ("--epochs", "3", "--eval-every", "0")
    train(_args(data, tmp_path / "straight", *common))
    train(_args(data, tmp_path / "cut", *common, "--stop-after-epoch", "1"))
    assert load_checkpoint(tmp_path / "cut" / "checkpoint.pt")["epoch"] == 0
    # resume in a loader worker: clips do not depend on which process decodes them
    train(
        _args(
            data,
            tmp_path / "cut",
            *common,
            "--resume",
            str(tmp_path / "cut" / "checkpoint.pt"),
            "--workers",
            "1",
        )
    )
    a = load_checkpoint(tmp_path / "straight" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    assert a["epoch"] == b["epoch"] == 2 and a["step"] == b["step"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert [r["loss"] for r in _log(tmp_path / "straight", "train")] == [
        r["loss"] for r in _log(tmp_path / "cut", "train")
    ]
    assert a["metrics"]["top1"] == b["metrics"]["top1"]


def test_nan_loss_stops_and_keeps_the_last_checkpoint(data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    train(_args(data, out, "--epochs", "2", "--stop-after-epoch", "1", "--eval-every", "0"))
    before = (out / "checkpoint.pt").read_bytes()
    monkeypatch.setattr(torch.nn.CrossEntropyLoss, "forward", lambda self, x, y: (x * float("nan")).sum())
    argv = ["--train-ann", str(data / "train.csv"), "--out", str(out), *TINY, "--epochs", "2"]
    assert main_train([*argv, "--resume", str(out / "checkpoint.pt")]) == 2
    assert "loss is nan at step 3; training stopped" in capsys.readouterr().out
    assert (out / "checkpoint.pt").read_bytes() == before
    assert "training stopped" in _log(out, "error")[0]["message"]


def test_eval_command_at_a_longer_clip(data, tmp_path, capsys):
    out = tmp_path / "run"
    train(_args(data, out, "--epochs", "1"))
    assert main_eval(["--checkpoint", str(out / "checkpoint.pt"), "--num-frames", "8", "--num-crops", "3",
                      "--out", str(tmp_path / "ev"), "--no-progress"]) == 0  # fmt: skip
    metrics = json.loads((tmp_path / "ev" / "eval_report.json").read_text())
    assert metrics["num_frames"] == 8 and metrics["num_videos"] == 6 and metrics["num_views"] == 6 * 2 * 3
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["top1"] == metrics["top1"]


def test_eval_at_a_larger_crop_resizes_a_learned_table(data, tmp_path, monkeypatch):
    """Same weights at a larger crop than training (32 -> 40 px): the learned table is resized with the
    mode asked for (recorded at peg_core's resize); training scales are not re-checked for eval."""
    import peg_video.models.pos_embed as pos_embed

    out = tmp_path / "run"
    train(_args(data, out, "--epochs", "1", "--pos-enc", "learned"))
    calls = []
    real = pos_embed.resize_pos_embed

    def spy(posemb, new_size, *a, **kw):
        calls.append((tuple(new_size), kw.get("mode")))
        return real(posemb, new_size, *a, **kw)

    monkeypatch.setattr(pos_embed, "resize_pos_embed", spy)
    for mode in ("nearest", "bicubic"):
        calls.clear()
        ev = tmp_path / f"ev_{mode}"
        argv = ["--checkpoint", str(out / "checkpoint.pt"), "--crop", "40", "--pos-interpolation", mode,
                "--out", str(ev), "--no-progress"]  # fmt: skip
        assert main_eval(argv) == 0
        metrics = json.loads((ev / "eval_report.json").read_text())
        assert metrics["crop"] == 40 and metrics["num_videos"] == 6
        assert calls and set(calls) == {((5, 5), mode)}  # 40 px / 8 px tubelets
