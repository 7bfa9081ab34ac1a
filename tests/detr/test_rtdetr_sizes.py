"""RT-DETR chooses its queries among the encoder's cells: an input with fewer cells than queries is
refused with one line naming the size and the smallest side, in the model, ``eval``, ``predict``,
``train`` and the ``Predictor`` (it used to end in ``topk``'s "selected index k out of range")."""

from __future__ import annotations

import pytest
import torch

from peg_core.errors import InputError
from peg_detr.__main__ import main as cli
from peg_detr.data import SyntheticSpec, make_synthetic_coco
from peg_detr.models.rtdetr.build import build_rtdetr
from peg_detr.predict import Predictor

TINY = {"hidden_dim": 32, "num_heads": 2, "dim_feedforward": 64, "dec_layers": 2, "encoder_expansion": 0.5}


def _too_small(side: int, cells: int, where: str) -> str:
    return (
        "input too small for RT-DETR's 20 queries, chosen among the encoder's cells "
        f"({side} x {side} px gives {cells} cells; at least 25 x 25 px needed): {where}"
    )


@torch.no_grad()
def test_the_model_counts_its_cells_and_refuses_too_small_inputs():
    model = build_rtdetr("tiny", num_classes=3, num_queries=20, **TINY)[0].eval()
    for h, w in ((24, 24), (25, 25), (50, 77), (33, 129)):  # cells = the backbone maps' actual size
        maps = model.backbone(torch.zeros(1, 3, h, w))
        assert model.encoder_cells(h, w) == sum(m.shape[-2] * m.shape[-1] for m in maps), (h, w)
    assert model.min_input_side() == 25  # 4x4 + 2x2 + 1 = 21 cells >= 20; 24 px: 3x3 + 2x2 + 1 = 14
    assert model(torch.zeros(1, 3, 25, 25))["pred_logits"].shape == (1, 20, 3)
    with pytest.raises(InputError) as e:
        model(torch.zeros(2, 3, 24, 24))
    assert str(e.value) == _too_small(24, 14, "24 x 24 px")
    # RT-DETR's own 300 queries: 113 px (15x15 + 8x8 + 4x4 = 305 cells; 112 px: 14x14 + 7x7 + 4x4 = 261)
    assert build_rtdetr("r18vd", num_classes=3)[0].min_input_side() == 113


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3, max_frac=0.5)
    data = make_synthetic_coco(tmp_path_factory.mktemp("data"), num_train=4, num_val=2, seed=1, spec=spec)
    out = tmp_path_factory.mktemp("run")
    argv = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(out),
            "--epochs", "1", "--total-batch-size", "4", "--workers", "0", "--no-progress"]  # fmt: skip
    assert cli(argv) == 0
    return data, out / "checkpoint.pth"


def _one_line(capsys: pytest.CaptureFixture, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.slow
def test_eval_predict_and_train_refuse_a_size_below_the_minimum(checkpoint, tmp_path, capsys):
    data, ckpt = checkpoint
    common = ["--data-root", str(data), "--workers", "0", "--no-progress"]
    capsys.readouterr()
    # checked before the first size is evaluated: nothing is written
    code = cli(
        [
            "eval",
            "--checkpoint",
            str(ckpt),
            "--eval-sizes",
            "96,24",
            "--output-dir",
            str(tmp_path / "ev"),
            *common,
        ]
    )
    assert _one_line(capsys, code) == "error: " + _too_small(24, 14, "--eval-sizes 24")
    assert not (tmp_path / "ev" / "report.json").exists()
    code = cli(
        ["eval", "--checkpoint", str(ckpt), "--val-size", "16", "--output-dir", str(tmp_path / "ev"), *common]
    )
    assert _one_line(capsys, code) == "error: " + _too_small(16, 6, "--val-size 16")
    assert (
        cli(
            [
                "eval",
                "--checkpoint",
                str(ckpt),
                "--eval-sizes",
                "25",
                "--output-dir",
                str(tmp_path / "ev"),
                *common,
            ]
        )
        == 0
    )

    image = sorted((data / "val2017").glob("*.jpg"))[0]
    code = cli(
        [
            "predict",
            str(image),
            "--checkpoint",
            str(ckpt),
            "--size",
            "16",
            "--output-dir",
            str(tmp_path / "p"),
        ]
    )
    assert _one_line(capsys, code) == "error: " + _too_small(16, 6, "size 16")
    with pytest.raises(InputError, match=r"^input too small for RT-DETR's 20 queries"):
        Predictor(ckpt, size=24)

    argv = [
        "train",
        "--config",
        "rtdetr_demo_tiny",
        "--output-dir",
        str(tmp_path / "t"),
        "--epochs",
        "1",
        *common,
    ]
    code = cli([*argv, "--train-sizes", "32,16"])
    assert _one_line(capsys, code) == "error: " + _too_small(16, 6, "--train-sizes 16")
    code = cli([*argv, "--eval-sizes", "96,20"])
    assert _one_line(capsys, code) == "error: " + _too_small(20, 14, "--eval-sizes 20")
