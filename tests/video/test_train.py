"""``python -m peg_video train|eval`` on the engine: the loss falls, resume is exact, NaN stops, eval at other views."""

import json

import pytest
import torch

from peg_core.engine import EXIT_DIVERGED, read_checkpoint
from peg_video.__main__ import main
from tests.video.runs import TINY

pytestmark = pytest.mark.slow


VIDEOS = dict(num_train=12, num_val=6, seed=2)  # the module's ``data`` (tests/video/conftest.py)


def _train(data, out, *extra) -> int:
    return main([
        "train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
        "--output-dir", str(out), *TINY, *extra,
    ])  # fmt: skip


def _log(out, tag):
    """Records of ``tag`` in ``log.jsonl``, without their wall-clock ``time``."""
    records = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if k != "time"} for r in records if r["tag"] == tag]


def _report(folder):
    return json.loads((folder / "report.json").read_text())


def test_loss_falls_and_outputs_are_written(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        _train(data, out, "--epochs", "8", "--lr", "1e-2", "--warmup-epochs", "0", "--eval-every", "4") == 0
    )
    losses = [r["loss"] for r in _log(out, "train")]
    assert len(losses) == 8 and all(0.0 <= r["acc"] <= 1.0 for r in _log(out, "train"))
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.1, losses  # 1.87 -> 1.72 here
    assert len(_log(out, "val")) == 2  # epochs 4 and 8
    report = _report(out)
    assert report["task"] == "video" and report["status"] == "finished" and report["steps"] == 8 * 3
    metrics = report["eval"]
    assert metrics["num_videos"] == 6 and metrics["num_views"] == 12
    assert 0.0 <= metrics["top1"] <= metrics["top5"] <= 1.0
    assert report["broken"]["train"] == {"count": 0, "total": 12, "samples": []}
    assert report["broken"]["val"] == {"count": 0, "total": 6, "samples": []}
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert closing == (
        f"train done: top1 {metrics['top1']:.3f} top5 {metrics['top5']:.3f}, 8 epochs, 0 skipped ({out})"
    )
    classes = json.loads((out / "classes.json").read_text())
    assert classes["classes"][0] == "circle_clockwise" and classes["index"]["move_up"] == 5
    ckpt = read_checkpoint(out / "checkpoint.pth", "video")
    assert ckpt["epoch"] == 7 and ckpt["meta"]["classes"] == classes["classes"]
    assert ckpt["model_config"] == {
        "name": "vit_tiny", "pos_enc": "peg3d", "num_classes": 6, "num_frames": 4, "img_size": 32,
        "tubelet": [2, 8, 8], "embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_ratio": 2.0, "peg_at": [-1, 0],
    }  # fmt: skip
    assert (out / "tb").is_dir() and (out / "checkpoint_prev.pth").is_file()
    assert json.loads((out / "args.json").read_text())["clip_max_norm"] == 1.0


def test_stop_then_resume_is_exact(data, tmp_path):
    """An uninterrupted run equals one stopped after each epoch and resumed (by path, then by auto)."""
    common = ("--epochs", "3", "--eval-every", "1")
    assert _train(data, tmp_path / "straight", *common) == 0
    cut = tmp_path / "cut"
    assert _train(data, cut, *common, "--stop-after-epoch", "1") == 0
    assert _report(cut)["status"] == "stopped" and read_checkpoint(cut / "checkpoint.pth")["epoch"] == 0
    # resume by path, in a loader worker: clips do not depend on which process decodes them
    resumed = ("--resume", str(cut / "checkpoint.pth"), "--workers", "1", "--stop-after-epoch", "2")
    assert _train(data, cut, *common, *resumed) == 0
    assert _train(data, cut, *common, "--resume", "auto") == 0
    a = read_checkpoint(tmp_path / "straight" / "checkpoint.pth", "video")
    b = read_checkpoint(cut / "checkpoint.pth", "video")
    assert a["epoch"] == b["epoch"] == 2 and a["step"] == b["step"] == 9
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k, v in a["optimizer"]["state"].items():
        assert torch.equal(v["exp_avg"], b["optimizer"]["state"][k]["exp_avg"]), k
    assert a["scheduler"] == b["scheduler"]
    assert _log(tmp_path / "straight", "train") == _log(cut, "train")
    assert _report(tmp_path / "straight")["eval"] == _report(cut)["eval"]


def test_resume_auto_falls_back_when_the_newest_checkpoint_is_corrupt(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(data, out, "--epochs", "3", "--eval-every", "0", "--stop-after-epoch", "2") == 0
    (out / "checkpoint.pth").write_bytes(b"\x00 half-written")
    capsys.readouterr()
    assert _train(data, out, "--epochs", "3", "--eval-every", "0", "--resume", "auto") == 0
    said = capsys.readouterr().out
    assert "checkpoint_prev.pth" in said and "resumed from" in said and "(epoch 1," in said
    assert read_checkpoint(out / "checkpoint.pth", "video")["epoch"] == 2


def test_nan_loss_stops_with_exit_3_and_keeps_the_last_checkpoint(data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert _train(data, out, "--epochs", "2", "--stop-after-epoch", "1", "--eval-every", "0") == 0
    before = (out / "checkpoint.pth").read_bytes()
    monkeypatch.setattr(torch.nn.CrossEntropyLoss, "forward", lambda self, x, y: (x * float("nan")).sum())
    capsys.readouterr()
    assert _train(data, out, "--epochs", "2", "--resume", "auto") == EXIT_DIVERGED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: loss is nan at step 4 (epoch 2); training stopped")
    assert f"the last good checkpoint is {out / 'checkpoint.pth'}" in err[0]
    assert (out / "checkpoint.pth").read_bytes() == before
    assert "training stopped" in _log(out, "error")[0]["message"]


def test_eval_command_at_a_longer_clip(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(data, out, "--epochs", "1") == 0
    capsys.readouterr()
    argv = ["eval", "--checkpoint", str(out / "checkpoint.pth"), "--num-frames", "8", "--num-crops", "3",
            "--output-dir", str(tmp_path / "ev"), "--no-progress", "--workers", "0"]  # fmt: skip
    assert main(argv) == 0
    report = _report(tmp_path / "ev")
    assert report["command"] == "eval" and report["epoch"] == 0 and report["broken"]["val"]["count"] == 0
    metrics = report["eval"]
    assert metrics["num_frames"] == 8 and metrics["num_videos"] == 6 and metrics["num_views"] == 6 * 2 * 3
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert closing == (
        f"eval done: top1 {metrics['top1']:.3f} top5 {metrics['top5']:.3f} at 8 frames, 32 px "
        f"({tmp_path / 'ev' / 'report.json'})"
    )
    assert _report(out)["command"] == "train"  # the run's report stays
    assert main([*argv, "--json"]) == 0  # --json: the report is the only stdout line
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == _report(tmp_path / "ev")


def test_eval_at_a_larger_crop_resizes_a_learned_table(data, tmp_path, monkeypatch):
    """Same weights at a larger crop than training (32 -> 40 px): the learned table is resized with the
    mode asked for (recorded at peg_core's resize); training scales are not re-checked for eval."""
    import peg_core.encodings as pos_embed

    out = tmp_path / "run"
    assert _train(data, out, "--epochs", "1", "--pos-enc", "learned") == 0
    calls = []
    real = pos_embed.resize_pos_embed

    def spy(posemb, new_size, *a, **kw):
        calls.append((tuple(new_size), kw.get("mode")))
        return real(posemb, new_size, *a, **kw)

    monkeypatch.setattr(pos_embed, "resize_pos_embed", spy)
    for mode in ("nearest", "bicubic"):
        calls.clear()
        ev = tmp_path / f"ev_{mode}"
        argv = ["eval", "--checkpoint", str(out / "checkpoint.pth"), "--crop", "40", "--pos-interpolation", mode,
                "--output-dir", str(ev), "--no-progress", "--workers", "0"]  # fmt: skip
        assert main(argv) == 0
        metrics = _report(ev)["eval"]
        assert metrics["crop"] == 40 and metrics["num_videos"] == 6
        assert calls and set(calls) == {((5, 5), mode)}  # 40 px / 8 px tubelets


def test_common_flags_are_accepted(data, tmp_path):
    out = tmp_path / "run"
    flags = ["--epochs", "1", "--amp", "bf16", "--clip-max-norm", "0.5", "--device", "cpu", "--seed", "3",
             "--lr", "2e-3", "--threads", "1", "--eval-every", "1", "--save-every", "1", "--max-broken", "5%",
             "--find-unused-parameters", "--scale-jitter", "32,40", "--tubelet", "2,8,8", "--hflip"]  # fmt: skip
    assert _train(data, out, *flags) == 0
    args = json.loads((out / "args.json").read_text())
    assert (args["amp"], args["clip_max_norm"], args["seed"], args["max_broken"]) == ("bf16", 0.5, 3, 0.05)
    assert args["scale_jitter"] == [32, 40] and args["tubelet"] == [2, 8, 8] and args["hflip"] is True
    assert (out / "checkpoint0000.pth").is_file() and _report(out)["eval"]["num_videos"] == 6


def test_predict_lists_top_classes(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(data, out, "--epochs", "1") == 0
    videos = sorted((data / "val").rglob("*.mp4"))[:2]
    capsys.readouterr()
    assert (
        main(["predict", "--checkpoint", str(out / "checkpoint.pth"), *map(str, videos), "--top-k", "3"]) == 0
    )
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 3 and printed[-1] == "predict done: 2 videos, 0 skipped (stdout)"
    argv = [
        "predict",
        "--checkpoint",
        str(out / "checkpoint.pth"),
        *map(str, videos),
        "--top-k",
        "3",
        "--json",
    ]
    assert main(argv) == 0
    (line,) = capsys.readouterr().out.splitlines()
    rows = json.loads(line)["predictions"]
    assert [x["path"] for x in rows] == list(map(str, videos))
    for row, text in zip(rows, printed):
        scores = [t["p"] for t in row["top"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
        assert text == f"{row['path']}: " + ", ".join(f"{t['class']} {t['p']:.3f}" for t in row["top"])
    # the same through the Python API, and on a clip already at the model's input
    from peg_video.predict import Predictor

    predictor = Predictor.from_checkpoint(out / "checkpoint.pth", top_k=3)
    (pred,) = predictor.predict_files(videos[:1])
    assert [(c, round(p, 4)) for c, p in pred.top] == [(t["class"], t["p"]) for t in rows[0]["top"]]
    views = predictor.read(str(videos[0]))
    (again,) = predictor(views)
    assert again.path is None and again.top == pred.top
