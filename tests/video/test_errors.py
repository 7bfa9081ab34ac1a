"""User errors of ``python -m peg_video``: one line ``error: <what>: <where>``, exit 1 (2 for usage), no traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peg_core.engine import EXIT_ERROR, EXIT_USAGE
from peg_video.__main__ import main
from tests.video.runs import TINY, synthetic_set

REPO = Path(__file__).resolve().parents[2]
ONE_EPOCH = [*TINY, "--epochs", "1"]


VIDEOS = dict(num_train=4, num_val=3, frames=8, seed=5)  # the module's ``data`` (tests/video/conftest.py)


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """A one-epoch training run: its checkpoint for eval / resume."""
    out = tmp_path_factory.mktemp("run")
    assert main(["train", "--train-ann", str(data / "train.csv"), "--output-dir", str(out), *ONE_EPOCH]) == 0
    return out


def _fails(capsys, argv, code=EXIT_ERROR) -> str:
    """Run ``argv``; check the exit code and that stderr is one line without a traceback; return it."""
    capsys.readouterr()
    try:
        assert main(argv) == code
    except SystemExit as e:  # argparse's usage error, as the command line would exit
        assert e.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


def _train(data, out, *extra):
    return ["train", "--train-ann", str(data / "train.csv"), "--output-dir", str(out), *ONE_EPOCH, *extra]


def test_all_videos_broken_in_training_is_one_line(data, tmp_path, capsys):
    broken = synthetic_set(tmp_path / "broken", num_train=4, num_val=1, frames=4)
    for f in (broken / "train").rglob("*.mp4"):
        f.write_bytes(b"")
    err = _fails(capsys, _train(broken, tmp_path / "o"))
    assert err.startswith("error: nothing could be read in split 'train' (4 of 4 samples broken; first: ")
    assert "empty (zero-byte) file" in err and str(broken / "train") in err


def test_missing_video_folder_is_named_before_training(data, tmp_path, capsys):
    missing = tmp_path / "no" / "videos"
    err = _fails(capsys, _train(data, tmp_path / "o", "--train-root", str(missing)))
    assert err == f"error: video folder not found: {missing}"
    assert not (tmp_path / "o" / "checkpoint.pth").exists()
    # a folder that exists but holds none of the listed videos
    err = _fails(capsys, _train(data, tmp_path / "o", "--train-root", str(tmp_path)))
    assert err.startswith("error: none of the 4 videos of --train-ann exists (the first would be ")
    assert err.endswith(f"check --train-root: {data / 'train.csv'}")


def test_eval_where_every_video_is_broken_exits_1(data, run, tmp_path, capsys):
    val = synthetic_set(tmp_path / "val", num_train=1, num_val=3, frames=4, seed=9)
    for f in (val / "val").rglob("*.mp4"):
        f.write_text("not a video")
    argv = ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--val-ann", str(val / "val.csv"),
            "--output-dir", str(tmp_path / "ev"), "--no-progress", "--workers", "0"]  # fmt: skip
    err = _fails(capsys, argv)
    assert err.startswith("error: nothing could be read in split 'val' (3 of 3 samples broken; first: ")
    assert "undecodable" in err and not (tmp_path / "ev" / "report.json").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["make-data", "OUT", "--width", "81"], "argument --width: expected an even number of pixels >= 16"),
        (["eval", "--output-dir", "x"], "the following arguments are required: --checkpoint"),
        (["train", "--train-ann", "a.csv", "--epochs", "0"], "argument --epochs: expected a positive integer"),
        (["train", "--train-ann", "a.csv", "--scale-jitter", "256"], "argument --scale-jitter: expected 2"),
        (["train", "--train-ann", "a.csv", "--train-scale", "256"], "argument --train-scale: expected 2"),
        (["train", "--train-ann", "a.csv", "--tubelet", "2,16"], "argument --tubelet: expected 3"),
        (["train", "--train-ann", "a.csv", "--scale-jitter", "40,36"], "--scale-jitter: MIN must not exceed MAX"),
        (["train", "--train-ann", "a.csv", "--num-frames", "5"], "--num-frames 5 and --crop 32 must be multiples"),
        (["train", "--train-ann", "a.csv", "--amp", "none"], "argument --amp: invalid choice: 'none'"),
        (["train", "--train-ann", "a.csv", "--model-opt", "depth"], "--model-opt: expected KEY=VALUE"),
        (["train", "--train-ann", "a.csv", "--resume"], "argument --resume: expected one argument"),
    ],
)  # fmt: skip
def test_bad_options_are_usage_lines(argv, message, tmp_path, capsys):
    argv = [str(tmp_path / a) if a == "OUT" else a for a in argv]
    err = _fails(capsys, argv, EXIT_USAGE)
    assert err.startswith(f"error: python -m peg_video {argv[0]}: ") and message in err


def test_make_data_frame_size_decord_misreads_and_unwritable_folder(tmp_path, capsys):
    err = _fails(capsys, ["make-data", str(tmp_path / "d"), "--width", "16", "--height", "16", "--num-train", "1",
                          "--num-val", "1", "--frames", "2"])  # fmt: skip
    assert err.startswith("error: decord reads the videos as (16, 16, 6) instead of (16, 16, 3)")
    assert err.endswith("--width 16 --height 16")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    err = _fails(capsys, ["make-data", str(blocker / "d")])
    assert err.startswith("error: output folder is not writable") and err.endswith(str(blocker / "d"))


def test_eval_into_an_unwritable_folder_fails_before_evaluating(run, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    err = _fails(
        capsys, ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--output-dir", str(blocker / "ev")]
    )
    assert err == f"error: output folder is not writable (Not a directory): {blocker / 'ev'}"


def _bad_checkpoints(folder: Path, run: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, expected message start) for every kind of unusable checkpoint."""
    good = (run / "checkpoint.pth").read_bytes()
    files = {
        name: folder / f"{name}.pth" for name in ("zero", "cut", "timm", "detr", "classify", "evil", "other")
    }
    files["zero"].write_bytes(b"")
    files["cut"].write_bytes(good[: len(good) // 2])
    torch.save(
        {"pos_embed": torch.zeros(1, 5, 3), "blocks.0.attn.qkv.weight": torch.zeros(3, 3)}, files["timm"]
    )
    for task in ("detect", "classify"):
        torch.save(
            {"format": "peg-checkpoint/1", "task": task, "model": {}},
            files["detr" if task == "detect" else task],
        )

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {folder / 'pwned'}",))

    torch.save({"task": "video", "model": Evil()}, files["evil"])
    other = torch.load(run / "checkpoint.pth", weights_only=True)
    other["model"] = {k: v for k, v in other["model"].items() if not k.startswith("head.")}
    torch.save(other, files["other"])
    return {
        "zero": (files["zero"], "checkpoint is empty (0 bytes)"),
        "cut": (files["cut"], "checkpoint is truncated"),
        "timm": (files["timm"], "not a peg training checkpoint (no 'task'/'model' keys"),
        "detr": (files["detr"], "wrong model: checkpoint is for task 'detect', this command needs 'video'"),
        "classify": (files["classify"], "wrong model: checkpoint is for task 'classify'"),
        "evil": (files["evil"], "checkpoint refused: it holds pickled objects"),
        "other": (files["other"], "checkpoint does not fit the model: 2 missing (e.g. head.bias)"),
    }


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_unusable_checkpoints_are_one_line_errors(command, data, run, tmp_path, capsys):
    for name, (path, message) in _bad_checkpoints(tmp_path, run).items():
        if command == "eval":
            argv = ["eval", "--checkpoint", str(path), "--output-dir", str(tmp_path / "ev"), "--no-progress"]
        else:
            argv = _train(data, tmp_path / "resumed", "--resume", str(path))
        err = _fails(capsys, argv)
        assert err.startswith(f"error: {message}") and err.endswith(f": {path}"), (name, err)
        assert "weights_only=False" not in err
    assert not (tmp_path / "pwned").exists()


def test_annotation_errors_name_file_and_line(data, tmp_path, capsys):
    bad = tmp_path / "val.csv"
    lines = (data / "val.csv").read_text().splitlines()
    bad.write_text("\n".join([*lines[:2], lines[2].replace("move", "jump"), *lines[3:]]) + "\n")
    argv = _train(data, tmp_path / "o", "--val-ann", str(bad), "--val-root", str(data / "val"))
    assert _fails(capsys, argv) == f"error: label 'jump_left' is not one of the 4 known classes: {bad}:3"
    bad.write_text(lines[0] + "\n" + lines[1].rsplit(",", 2)[0] + ",x,val\n")
    assert _fails(capsys, argv).startswith("error: time_start/time_end must be integers, got ")
    bad.write_text(lines[0] + "\n" + lines[1] + ",extra\n")
    assert _fails(capsys, argv) == f"error: expected 5 comma-separated fields: {bad}:2"
    bad.write_bytes(b"\xff\xfe\x00binary")
    assert _fails(capsys, argv) == f"error: annotation file is not UTF-8 text: {bad}"
    argv = _train(data, tmp_path / "o", "--classes", str(tmp_path / "none.json"))
    assert _fails(capsys, argv) == f"error: class file not found: {tmp_path / 'none.json'}"


def test_init_files_are_one_line_errors(data, run, tmp_path, capsys):
    garbage, foreign = tmp_path / "garbage.pth", tmp_path / "foreign.pth"
    garbage.write_bytes(b"\x80\x02 not a torch file")
    torch.save({"encoder.weight": torch.zeros(2, 2)}, foreign)
    cases = [
        (tmp_path / "missing.pth", "--init checkpoint not found"),
        (garbage, "--init checkpoint is truncated or not a torch file"),
        (foreign, "the cpvt state dict has no 'patch_embed.proj.weight': not a DeiT-layout ViT checkpoint"),
    ]
    for flag in ("--init", "--init-2d"):  # --init-2d: the older spelling
        for path, message in cases:
            err = _fails(capsys, _train(data, tmp_path / "o", flag, str(path)))
            assert err.startswith(f"error: {message}") and err.endswith(f": {path}"), err
    # a video checkpoint of another model: a one-line mismatch; --init-source is for 2-D files only
    ckpt = run / "checkpoint.pth"
    err = _fails(capsys, _train(data, tmp_path / "o", "--init", str(ckpt), "--pos-enc", "none"))
    assert err.startswith("error: checkpoint does not fit the model: ") and err.endswith(f": {ckpt}"), err
    err = _fails(capsys, _train(data, tmp_path / "o", "--init", str(ckpt), "--init-source", "deit"))
    assert (
        err == f"error: --init-source is the layout of a 2-D checkpoint; this is a video checkpoint: {ckpt}"
    )


def test_init_from_a_video_checkpoint_trains(data, run, tmp_path, capsys):
    capsys.readouterr()
    assert main(_train(data, tmp_path / "o", "--init", str(run / "checkpoint.pth"))) == 0
    assert (
        f"--init {run / 'checkpoint.pth'}: {len(torch.load(run / 'checkpoint.pth')['model'])} copied, "
        in capsys.readouterr().out
    )


def test_a_subprocess_shows_no_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "peg_video", "eval", "--checkpoint", str(tmp_path / "none.pth")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    err = [line for line in proc.stderr.splitlines() if "Warning" not in line and "warnings.warn" not in line]
    assert proc.returncode == EXIT_ERROR and err == [f"error: checkpoint not found: {tmp_path / 'none.pth'}"]


def test_eval_and_predict_check_clip_and_video_before_work(run, tmp_path, capsys):
    ckpt = str(run / "checkpoint.pth")
    err = _fails(
        capsys, ["eval", "--checkpoint", ckpt, "--num-frames", "5", "--output-dir", str(tmp_path / "e")]
    )
    assert err == "error: must be a multiple of the model's tubelet (2, 8, 8): --num-frames 5"
    missing = tmp_path / "gone.mp4"
    err = _fails(capsys, ["predict", "--checkpoint", ckpt, str(missing)])
    assert err == f"error: cannot read the video (file not found): {missing}"
    err = _fails(capsys, ["predict", "--checkpoint", str(tmp_path / "none.pth"), str(missing)])
    assert err == f"error: checkpoint not found: {tmp_path / 'none.pth'}"
