"""Memory budgets before work: a size whose largest tensor cannot fit is one line naming the flag, the
size and the bytes, before any data is read (classify, detect and video verbs), ``--max-memory``."""

from __future__ import annotations

import argparse

import pytest
import torch

from peg_core.engine import UserError
from peg_core.engine.memory import check_memory, largest_tensor, memory_bytes
from tests.core.classify_runs import no_peg, tiny


def _one_line(capsys, code):
    err = capsys.readouterr().err
    assert code not in (0, None) and err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    return err.strip()


def test_largest_tensor_on_fake_tensors_and_the_limit():
    lin = torch.nn.Linear(4, 1000)
    found = largest_tensor(lin, (50, 4))
    assert found.shape == (50, 1000) and found.nbytes == 50 * 1000 * 4
    with pytest.raises(UserError) as e:
        check_memory(lin, (10**6, 4), where="--batch 1000000", limit=10**9)
    assert (
        "a (1000000, 1000) float32 tensor of 4.0 GB would not fit the memory limit of 1.0 GB" in e.value.what
    )
    assert e.value.where == "--batch 1000000"
    assert largest_tensor(lambda x: x.nonzero().tolist(), (3,)) is None  # data-dependent: unknown
    assert (
        memory_bytes("16G") == 16 * 10**9 and memory_bytes("2GiB") == 2 * 2**30 and memory_bytes("512") == 512
    )
    with pytest.raises(argparse.ArgumentTypeError):
        memory_bytes("lots")


@pytest.fixture(scope="module")
def fire_classifier(tmp_path_factory):
    from peg_core.__main__ import main

    out = tmp_path_factory.mktemp("fire")
    assert (
        main(["train", *no_peg(tiny(8, 4, "--epochs", "1", "--pos-enc", "fire", "--output-dir", str(out)))])
        == 0
    )
    return out / "checkpoint.pth"


def test_classify_eval_predict_train_refuse_sizes_that_cannot_fit(fire_classifier, tmp_path, capsys):
    from peg_core.__main__ import main

    capsys.readouterr()
    # 4096 px at patch 8: 262145 tokens, a (2 heads, 262145, 262145) bias of 550 GB (the FIRE MLP in chunks)
    err = _one_line(capsys, main(["eval", "--checkpoint", str(fire_classifier), "--eval-sizes", "16,4096",
                                  "--device", "cpu", "--workers", "0", "--no-progress"]))  # fmt: skip
    assert (
        err.endswith(": --eval-sizes 4096")
        and "(2, 262145, 262145) float32 tensor of 549.8 GB" in err
        and "the machine's memory" in err
    ), err
    image = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (16, 16)).save(image)
    err = _one_line(capsys, main(["predict", str(image), "--checkpoint", str(fire_classifier), "--img-size", "16",
                                  "--device", "cpu", "--max-memory", "1K"]))  # fmt: skip
    assert err.endswith(": --img-size 16") and "memory limit of 1.0 kB (--max-memory 1.0 kB)" in err, err
    err = _one_line(capsys, main(["train", *no_peg(tiny(8, 4, "--pos-enc", "fire", "--output-dir", str(tmp_path / "r"),
                                                        "--max-memory", "1K"))]))  # fmt: skip
    assert err.endswith(": --img-size 16") and not (tmp_path / "r" / "checkpoint.pth").exists()
    # a size that fits runs
    assert main(["eval", "--checkpoint", str(fire_classifier), "--eval-sizes", "24", "--device", "cpu",
                 "--workers", "0", "--no-progress", "--output-dir", str(tmp_path / "e")]) == 0  # fmt: skip


@pytest.fixture(scope="module")
def fire_rtdetr(tmp_path_factory):
    from peg_detr.__main__ import main
    from peg_detr.data import SyntheticSpec, make_synthetic_coco

    root = tmp_path_factory.mktemp("rtdetr")
    spec = SyntheticSpec(size=96, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3, max_frac=0.5)
    data = make_synthetic_coco(root / "data", num_train=4, num_val=2, seed=1, spec=spec)
    argv = ["train", "--config", "rtdetr_demo_tiny", "--pos-enc", "peg+fire", "--data-root", str(data),
            "--output-dir", str(root / "run"), "--epochs", "1", "--batch-size", "2", "--train-sizes", "64",
            "--workers", "0", "--device", "cpu", "--no-progress", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    return data, root / "run" / "checkpoint.pth", argv


def test_detr_predict_eval_train_refuse_sides_that_cannot_fit(fire_rtdetr, tmp_path, capsys):
    from peg_detr.__main__ import main

    data, ckpt, train_argv = fire_rtdetr
    capsys.readouterr()
    image = next((data / "val2017").glob("*"))
    # AIFI at stride 32 of 4096 px: 16384 tokens, the (2 heads, N, N) FIRE bias is 2.1 GB (its MLP's
    # hidden layer, 34 GB at 32 wide, is computed in chunks)
    err = _one_line(capsys, main(["predict", str(image), "--checkpoint", str(ckpt), "--size", "4096",
                                  "--output-dir", str(tmp_path / "p"), "--device", "cpu", "--max-memory", "1G"]))  # fmt: skip
    assert (
        err.endswith(": --size 4096") and "(2, 16384, 16384) float32 tensor of 2.1 GB would not fit" in err
    ), err
    assert not (tmp_path / "p" / "detections.json").exists()
    err = _one_line(capsys, main(["eval", "--checkpoint", str(ckpt), "--data-root", str(data), "--eval-sizes", "4096",
                                  "--device", "cpu", "--workers", "0", "--no-progress", "--max-memory", "1G"]))  # fmt: skip
    assert err.endswith(": --eval-sizes 4096"), err
    argv = list(train_argv)
    argv[argv.index("--output-dir") + 1] = str(tmp_path / "t")
    argv[argv.index("--train-sizes") + 1] = "64,128"
    argv += ["--max-memory", "10K"]
    err = _one_line(capsys, main(argv))
    assert err.endswith(": --train-sizes 128"), err


def test_video_eval_predict_refuse_clips_that_cannot_fit(tmp_path, capsys):
    from peg_video.__main__ import main
    from tests.video.runs import TINY, synthetic_set

    data = synthetic_set(tmp_path / "data", 4, 2)
    out = tmp_path / "run"
    argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"), "--output-dir",
            str(out), *TINY, "--pos-enc", "fire", "--epochs", "1", "--device", "cpu", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    ckpt = str(out / "checkpoint.pth")
    err = _one_line(capsys, main(["eval", "--checkpoint", ckpt, "--val-ann", str(data / "val.csv"), "--num-frames",
                                  "256", "--crop", "256", "--workers", "0", "--no-progress", "--device", "cpu"]))  # fmt: skip
    assert err.endswith(": --num-frames 256 --crop 256") and "GB would not fit" in err, err
    video = next((data / "val").rglob("*.mp4"), None) or next(data.rglob("*.mp4"))
    err = _one_line(capsys, main(["predict", str(video), "--checkpoint", ckpt, "--num-frames", "256",
                                  "--device", "cpu", "--max-memory", "10M"]))  # fmt: skip
    # 256 frames at the run's 32 px: 2048 tubelets, a (2 heads, 2048, 2048) bias of 33.6 MB
    assert err.endswith(": --num-frames 256 --crop 32") and "memory limit of 10.0 MB" in err, err
    err = _one_line(capsys, main([*argv[:6], str(tmp_path / "t"), *argv[7:], "--max-memory", "10K"]))
    assert (
        "would not fit the memory limit of 10.0 kB" in err
        and not (tmp_path / "t" / "checkpoint.pth").exists()
    )
