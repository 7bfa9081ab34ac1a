"""``python -m peg_video export-hf`` folders in transformers' ``pipeline("video-classification")`` give
``predict``'s top classes.

A tiny VideoMAE-layout run (one epoch on the moving shapes) is exported; the folder holds the
processors transformers pairs with VideoMAE (``VideoMAEImageProcessor`` /
``VideoMAEVideoProcessor``) at the run's test scale, crop and normalisation.  The pipeline's video
processor samples ``config.num_frames`` frames evenly over the video and takes the centre crop;
``predict`` with one clip and one crop takes ``num_frames`` frames ``stride`` apart from the video's
middle and the same crop: on a video of ``num_frames * stride`` frames whose short side is the test
scale, the two feed the model the same pixels, and give the same classes and probabilities (within
1e-5).  The frames are decoded once, by peg_video's own reader, and handed to both (transformers
decodes a file with torchcodec, which the test machines lack).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from peg_video.__main__ import main
from peg_video.data.decode import open_video
from peg_video.data.synthetic import write_mp4
from peg_video.predict import Predictor
from tests.video.runs import TINY, synthetic_set

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A one-epoch VideoMAE-layout run (4 frames, stride 2, crop and test scale 32) and its export-hf folder."""
    tmp = tmp_path_factory.mktemp("video_pipe")
    data = synthetic_set(tmp / "syn", num_train=4, num_val=2, frames=8, seed=2)
    run = tmp / "run"
    assert main([
        "train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
        "--output-dir", str(run), *TINY, "--epochs", "1", "--pos-enc", "sinusoid-1d",
        "--model-opt", "qkv_bias=qv", "--model-opt", "fc_norm_eps=1e-5", "--mean", "0.5,0.4,0.3",
        "--std", "0.2,0.25,0.3",
    ]) == 0  # fmt: skip
    out = tmp / "hf"
    assert main(["export-hf", str(run / "checkpoint.pth"), str(out)]) == 0
    return run / "checkpoint.pth", out


def _video(path, width, height, frames=8, seed=0):
    """Blocks of colour that move a little each frame (an mp4, as the data sets hold them)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (height // 4 + 2, width // 4 + 2, 3), dtype=np.uint8)
    big = np.kron(blocks, np.ones((4, 4, 1), dtype=np.uint8))
    clip = np.stack([big[t % 3 : t % 3 + height, t : t + width] for t in range(frames)])
    write_mp4(path, clip, fps=8)
    return path


def _frames(path):
    source = open_video(path)
    return source.get_batch(list(range(len(source))))  # (T, H, W, 3) uint8


def test_the_folder_holds_the_runs_processors(exported):
    _, out = exported
    image = json.loads((out / "preprocessor_config.json").read_text())
    video = json.loads((out / "video_preprocessor_config.json").read_text())
    assert image["image_processor_type"] == "VideoMAEImageProcessor"
    assert video["video_processor_type"] == "VideoMAEVideoProcessor"
    for pre in (image, video):
        assert pre["size"] == {"shortest_edge": 32} and pre["crop_size"] == {"height": 32, "width": 32}
        assert pre["image_mean"] == [0.5, 0.4, 0.3] and pre["image_std"] == [0.2, 0.25, 0.3]
    processor = transformers.AutoImageProcessor.from_pretrained(out)
    assert type(processor).__name__ == "VideoMAEImageProcessor" and processor.crop_size["height"] == 32


def test_pipeline_equals_predict(exported, tmp_path):
    checkpoint, out = exported
    video = _video(
        tmp_path / "clip.mp4", width=40, height=32
    )  # short side = the test scale; 4 frames x stride 2
    predictor = Predictor(checkpoint, top_k=4, num_clips=1, num_crops=1)
    (pred,) = predictor.predict_files([str(video)])
    with torch.no_grad():  # predict rounds its probabilities to 4 places: the unrounded ones
        probs = predictor.model(predictor.read(str(video))).softmax(-1).mean(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = transformers.pipeline("video-classification", model=str(out), device="cpu")
    assert type(pipe.video_processor).__name__ == "VideoMAEVideoProcessor"
    theirs = pipe(_frames(video), top_k=4)
    assert [t["label"] for t in theirs] == [name for name, _ in pred.top]
    for t in theirs:
        want = float(probs[predictor.classes.index(t["label"])])
        assert abs(t["score"] - want) <= 1e-5, (t, want)
    assert max(t["score"] for t in theirs) - min(t["score"] for t in theirs) > 1e-4  # not a flat answer
    # the control: transformers' default VideoMAE normalisation (0.5 / 0.5) scores the clip otherwise
    video_pre = out / "video_preprocessor_config.json"
    saved = json.loads(video_pre.read_text())
    video_pre.write_text(json.dumps({**saved, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other = transformers.pipeline("video-classification", model=str(out), device="cpu")
        assert (
            max(abs(a["score"] - b["score"]) for a, b in zip(other(_frames(video), top_k=4), theirs)) > 1e-4
        )
    finally:
        video_pre.write_text(json.dumps(saved))
