"""pytorchvideo on current torchvision: the compat shim, its Kinetics data path with decord, X3D."""

import json
import subprocess
import sys

import pytest
import torch

from peg_video.data import ClipTransformConfig, SyntheticSpec, load_annotations, make_synthetic_kinetics
from peg_video.data.pytorchvideo_data import build_pytorchvideo_dataset, collate_pytorchvideo, probe_fps
from peg_video.train import parse_args, train

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


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    make_synthetic_kinetics(
        root, SyntheticSpec(num_train=6, num_val=3, width=64, height=48, frames=12, fps=12, seed=6)
    )
    return root


def test_labeled_video_dataset_with_decord_yields_clips(data, tmp_path):
    ann = load_annotations(data / "val.csv")
    assert probe_fps(ann) == pytest.approx(12.0)
    cfg = ClipTransformConfig(crop=32, train_scale=(32, 40), test_scale=32, num_crops=3)
    train_ds = build_pytorchvideo_dataset(ann, tmp_path / "l.txt", "train", 4, 2, cfg)
    sample = next(iter(train_ds))
    assert sample["video"].shape == (3, 4, 32, 32)
    assert sample["label"] == ann.records[sample["video_index"]].label
    assert (tmp_path / "l.txt").read_text().splitlines()[
        0
    ] == f"{ann.records[0].path.resolve()} {ann.records[0].label}"
    test_ds = build_pytorchvideo_dataset(ann, tmp_path / "l.txt", "test", 4, 2, cfg, num_clips=2)
    samples = list(test_ds)
    assert [(s["video_index"], s["clip_index"]) for s in samples] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    batch = collate_pytorchvideo(samples[:2], num_crops=3)
    assert batch["video"].shape == (2, 3, 3, 4, 32, 32)
    assert batch["view_offset"].tolist() == [0, 3] and batch["index"].tolist() == [0, 0]
    # normalised with the Kinetics mean/std: a decoded clip is not left in [0, 255]
    assert batch["video"].abs().max() < 1 / 0.225 + 1e-3


@pytest.mark.slow
def test_training_command_with_pytorchvideo_backend_and_x3d(data, tmp_path):
    out = tmp_path / "run"
    report = train(parse_args([
        "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"), "--out", str(out),
        "--config", "synthetic_tiny", "--data-backend", "pytorchvideo", "--model", "x3d_xs", "--pos-enc", "none",
        "--model-opt", "width_factor=0.5", "--model-opt", "depth_factor=1.0", "--num-frames", "4",
        "--epochs", "1", "--batch-size", "3", "--num-clips", "1", "--num-crops", "3", "--no-progress",
    ]))  # fmt: skip
    assert report["videos_evaluated"] == 3 and report["num_views"] == 3 * 3
    assert report["steps"] == 2
    assert json.loads((out / "config.json").read_text())["model"] == "x3d_xs"
    state = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert any(k.startswith("blocks.") for k in state)  # pytorchvideo's X3D
