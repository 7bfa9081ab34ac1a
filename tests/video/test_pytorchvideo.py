"""pytorchvideo on current torchvision: the compat shim, its Kinetics data path with decord, X3D."""

import json
import subprocess
import sys

import decord
import pytest

from peg_core.engine import read_checkpoint
from peg_video.__main__ import main
from peg_video.data import (
    ClipBatches,
    ClipTransformConfig,
    SyntheticSpec,
    load_annotations,
    make_synthetic_kinetics,
)
from peg_video.data.pytorchvideo_data import _RecordingPathHandler, build_pytorchvideo_dataset, probe_fps

SHIM_CHECK = """
import importlib.util, sys
name = "torchvision.transforms.functional_tensor"
had_real = importlib.util.find_spec(name) is not None
from peg_video.compat import ensure_pytorchvideo_compat
ensure_pytorchvideo_compat()
first = sys.modules[name]
ensure_pytorchvideo_compat()
assert sys.modules[name] is first  # idempotent
import pytorchvideo.transforms
from pytorchvideo.transforms import RandomShortSideScale, ShortSideScale, UniformTemporalSubsample
print(had_real, first.__name__)
"""


def test_shim_makes_pytorchvideo_transforms_import_in_a_fresh_process():
    proc = subprocess.run([sys.executable, "-c", SHIM_CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    had_real, module = proc.stdout.split()
    expected = (
        "torchvision.transforms.functional_tensor"
        if had_real == "True"
        else "torchvision.transforms._functional_tensor"
    )
    assert module == expected


VIDEOS = dict(num_train=6, num_val=3, seed=6)  # the module's ``data`` (tests/video/conftest.py)


def test_labeled_video_dataset_with_decord_yields_clips(data, tmp_path):
    ann = load_annotations(data / "val.csv")
    assert probe_fps(ann) == pytest.approx(12.0)
    cfg = ClipTransformConfig(crop=32, train_scale=(32, 40), test_scale=32, num_crops=3)
    train_ds = build_pytorchvideo_dataset(ann, tmp_path / "l.txt", "train", 4, 2, cfg)
    sample = next(iter(train_ds))
    assert sample["video"].shape == (3, 4, 32, 32) and sample["skipped"] == []
    assert sample["label"] == ann.records[sample["index"]].label
    first = (tmp_path / "l.txt").read_text().splitlines()[0]
    assert first == f"{ann.records[0].path.resolve()} {ann.records[0].label}"
    test_ds = build_pytorchvideo_dataset(ann, tmp_path / "l.txt", "test", 4, 2, cfg, num_clips=2)
    samples = list(test_ds)
    assert len(test_ds) == 3 * 2
    assert [(s["index"], s["view_offset"]) for s in samples] == [
        (0, 0),
        (0, 3),
        (1, 0),
        (1, 3),
        (2, 0),
        (2, 3),
    ]
    batch = ClipBatches()(samples[:2])
    assert batch.broken == [] and batch.data["video"].shape == (2, 3, 3, 4, 32, 32)
    assert batch.data["view_offset"].tolist() == [0, 3] and batch.data["index"].tolist() == [0, 0]
    # normalised with the Kinetics mean/std: a decoded clip is not left in [0, 255]
    assert batch.data["video"].abs().max() < 1 / 0.225 + 1e-3


class _FailingVideo:
    name, duration = "v.mp4", 2.0

    def get_clip(self, start, end):
        raise decord.DECORDError("[h264] Invalid NAL unit size\nmore")


class _Handler:
    def video_from_path(self, filepath, **kwargs):
        return _FailingVideo()


def test_a_clip_decord_cannot_decode_is_recorded_not_raised(tmp_path):
    """pytorchvideo lets a decoding error of get_clip out of its iterator: the wrapper records it."""
    video = tmp_path / "v.mp4"
    video.write_bytes(b"x")
    handler = _RecordingPathHandler(_Handler())
    clip = handler.video_from_path(str(video), decode_audio=False, decoder="decord").get_clip(0.0, 1.0)
    assert clip == {"video": None, "audio": None}
    assert handler.drain() == [(str(video), "undecodable: [h264] Invalid NAL unit size")]
    with pytest.raises(FileNotFoundError):
        handler.video_from_path(str(tmp_path / "gone.mp4"))
    assert handler.drain() == [(str(tmp_path / "gone.mp4"), "missing file")]


@pytest.mark.slow
def test_training_command_with_pytorchvideo_backend_and_x3d(data, tmp_path):
    out = tmp_path / "run"
    assert main([
        "train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
        "--output-dir", str(out), "--config", "synthetic_tiny", "--data-backend", "pytorchvideo",
        "--arch", "x3d_xs", "--pos-enc", "none", "--model-opt", "width_factor=0.5",
        "--model-opt", "depth_factor=1.0", "--num-frames", "4", "--epochs", "1", "--batch-size", "3",
        "--num-clips", "1", "--num-crops", "3", "--no-progress",
    ]) == 0  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["eval"]["num_videos"] == 3 and report["eval"]["num_views"] == 3 * 3
    assert report["steps"] == 2 and report["broken"]["train"]["count"] == 0
    assert json.loads((out / "args.json").read_text())["arch"] == "x3d_xs"
    ckpt = read_checkpoint(out / "checkpoint.pth", "video")
    assert ckpt["model_config"]["name"] == "x3d_xs" and "embed_dim" not in ckpt["model_config"]
    assert any(k.startswith("blocks.") for k in ckpt["model"])  # pytorchvideo's X3D


@pytest.mark.slow
def test_pytorchvideo_backend_skips_counts_and_lists_broken_videos(tmp_path):
    """Zero-byte, missing, truncated and text-file videos (4 of 6): listed with reasons for train and val."""
    make_synthetic_kinetics(tmp_path, SyntheticSpec(num_train=6, num_val=6, width=64, height=48, frames=12))
    broken = {}
    for split in ("train", "val"):
        paths = [r.path for r in load_annotations(tmp_path / f"{split}.csv").records]
        paths[0].write_bytes(b"")
        paths[1].unlink()
        data = paths[2].read_bytes()
        paths[2].write_bytes(data[: len(data) // 2])
        paths[3].write_text("not a video")
        broken[split] = {
            str(paths[0].resolve()): "empty (zero-byte) file",
            str(paths[1].resolve()): "missing file",
            str(paths[2].resolve()): "undecodable",
            str(paths[3].resolve()): "undecodable",
        }
    out = tmp_path / "run"
    argv = ["train", "--train-ann", str(tmp_path / "train.csv"), "--val-ann", str(tmp_path / "val.csv"),
            "--output-dir", str(out), "--config", "synthetic_tiny", "--data-backend", "pytorchvideo",
            "--model-opt", "embed_dim=32", "--model-opt", "depth=1", "--num-frames", "4", "--epochs", "1",
            "--batch-size", "2", "--no-progress", "--max-broken", "100%"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    for split, expected in broken.items():
        log = report["broken"][split]
        assert log["count"] == 4, (split, log)
        listed = {d["path"]: d["reason"] for d in log["samples"]}
        assert set(listed) == set(expected)
        for path, reason in expected.items():
            assert listed[path].startswith(reason), (split, path, listed[path])
    assert report["eval"]["num_videos"] == 2 and report["train"]["steps"] == 1  # 2 good videos each
