"""A detector family from outside the package: its config, builder and arch entry, in this file alone.

``ToyDet`` is a three-stage conv backbone under RT-DETR's hybrid encoder and decoder.  Registered
with :func:`peg_detr.archs.register_arch`, it trains, evaluates and exports through the command
line (``python -m peg_detr``'s entry point, in this process) with no change to the package: its
``--toy-width`` flag, its ``--model-size`` preset and the refusal of another family's flag come
from its config's fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor, nn

from peg_core.engine import UserError, read_checkpoint
from peg_core.registry import EncodingSupport, parse_pos_enc
from peg_detr.__main__ import main as cli
from peg_detr.archs import ARCHS, Arch, register_arch
from peg_detr.cli import parse_train_args
from peg_detr.configs import CONFIGS
from peg_detr.model import load_model
from peg_detr.models.config import DetectorConfig, option
from peg_detr.models.rtdetr import AIFI_ENCODINGS, RTDETR, HybridEncoder, RTDETRDecoder, RTDETRDecoderSpec
from peg_detr.models.rtdetr.build import rtdetr_training_parts
from peg_detr.models.rtdetr.config import check_counts


@dataclass(kw_only=True)
class ToyConfig(DetectorConfig):
    """ToyDet's settings: the shared fields by their shared names (their flags come with them), one of its own."""

    TITLE = "ToyDet"
    ENCODINGS: ClassVar[EncodingSupport] = AIFI_ENCODINGS
    SIZES: ClassVar[dict[str, dict[str, Any]]] = {"small": dict(toy_width=8, hidden_dim=32, num_heads=2)}

    backbone: str = "toyconv"
    pos_enc: str = "sincos"
    num_classes: int = 80
    hidden_dim: int = 32
    num_heads: int = 2
    dec_layers: int = 2
    dim_feedforward: int = 64
    num_queries: int = 20
    num_denoising: int = 0
    aux_loss: bool = True
    toy_width: int = option(16, flag="--toy-width", type="positive_int", help="ToyDet's first conv width")

    def validate(self) -> None:
        parse_pos_enc(self.pos_enc, AIFI_ENCODINGS)
        check_counts(self.num_classes, self.num_queries, self.num_denoising)
        if self.backbone != "toyconv":
            raise ValueError(f"unknown ToyDet backbone {self.backbone!r}; choose from ('toyconv',)")


class ToyConv(nn.Module):
    """Three stride-2 stages after a stride-4 stem: maps at strides 8, 16, 32 (RT-DETR's encoder input)."""

    out_strides = (8, 16, 32)

    def __init__(self, width: int) -> None:
        super().__init__()
        self.out_channels = [width, 2 * width, 4 * width]
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 4, 1), nn.BatchNorm2d(width), nn.ReLU())
        chans = [width, *self.out_channels]
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv2d(a, b, 3, 2, 1), nn.BatchNorm2d(b), nn.ReLU()) for a, b in pairwise(chans)
        )

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.stem(x)
        maps = []
        for stage in self.stages:
            x = stage(x)
            maps.append(x)
        return maps


class ToyDet(RTDETR):
    """RT-DETR's detector around the toy backbone (its own class: ``arch_of_model`` tells it apart)."""

    family = "ToyDet"


def build_toydet(config: ToyConfig) -> tuple[ToyDet, nn.Module, nn.Module]:
    net = ToyConv(config.toy_width)
    encoder = HybridEncoder(
        net.out_channels, config.hidden_dim, num_heads=config.num_heads, dim_feedforward=config.dim_feedforward,
        expansion=0.5, pos_enc=config.pos_enc,
    )  # fmt: skip
    decoder_spec = RTDETRDecoderSpec(
        in_channels=[config.hidden_dim] * 3,
        hidden_dim=config.hidden_dim,
        num_queries=config.num_queries,
        num_layers=config.dec_layers,
        num_heads=config.num_heads,
        dim_feedforward=config.dim_feedforward,
    )
    decoder = RTDETRDecoder(config.num_classes, decoder_spec)
    model = ToyDet(
        net, encoder, decoder, num_classes=config.num_classes, num_queries=config.num_queries,
        num_denoising=config.num_denoising, aux_loss=config.aux_loss,
    )  # fmt: skip
    model.build_config = config.to_dict()
    return model, *rtdetr_training_parts(model)


@pytest.fixture(scope="module")
def toydet() -> Iterator[Arch]:
    recipe = {k: v for k, v in CONFIGS["rtdetr_demo_tiny"].items() if k != "arch"}  # seconds on a CPU
    arch = register_arch(
        Arch(
            name="toydet", family="rtdetr", build=build_toydet, config=ToyConfig,
            backbones=("toyconv",), model_cls=ToyDet, eval_size=96,
            recipe_defaults={**recipe, "backbone": "toyconv", "pos_enc": "sincos", "num_queries": 20},
        )
    )  # fmt: skip
    yield arch
    del ARCHS["toydet"]  # the other tests see the package's archs alone


def test_flags_presets_and_refusals_come_from_its_config(toydet):
    args = parse_train_args(
        ["--arch", "toydet", "--model-size", "small", "--toy-width", "4", "--data-root", "x"]
    )
    assert (args.toy_width, args.backbone, args.num_queries) == (4, "toyconv", 20)
    with pytest.raises(UserError) as e:
        parse_train_args(["--arch", "toydet", "--head-act", "silu", "--data-root", "x"])
    assert e.value.line() == "error: applies to --arch dfine only (not --arch toydet): --head-act silu"
    with pytest.raises(UserError) as e:
        parse_train_args(["--arch", "rtdetr", "--toy-width", "4", "--data-root", "x"])
    assert e.value.line() == "error: applies to --arch toydet only (not --arch rtdetr): --toy-width 4"


@pytest.mark.slow  # ~2 min on two shared CPUs: a training epoch, two evaluations, an ONNX export
def test_trains_evaluates_and_exports_through_the_command_line(toydet, tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "run"
    assert cli(["make-data", str(data), "--num-train", "8", "--num-val", "4", "--size", "96"]) == 0
    assert cli(["train", "--arch", "toydet", "--toy-width", "8", "--data-root", str(data), "--output-dir", str(out),
                "--epochs", "1", "--workers", "0", "--no-progress", "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["status"] == "finished" and report["steps"] == 2  # 8 images, batch 4
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    # the recipe (rtdetr_demo_tiny's) sets 10 denoising queries; --toy-width its own field
    assert ckpt["model_config"] == {
        "arch": "toydet",
        **ToyConfig(toy_width=8, num_classes=4, num_denoising=10).to_dict(),
    }
    loaded = load_model(out / "checkpoint.pth")
    assert isinstance(loaded.model, ToyDet) and loaded.model.backbone.out_channels == [8, 16, 32]

    assert cli(["eval", "--checkpoint", str(out / "checkpoint.pth"), "--eval-sizes", "64,96", "--workers", "0",
                "--no-progress", "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["eval"]["sizes"]) == {"64", "96"}

    pytest.importorskip("onnx")
    onnx_path = tmp_path / "toydet.onnx"
    argv = [
        "export",
        str(out / "checkpoint.pth"),
        str(onnx_path),
        "--height",
        "96",
        "--width",
        "96",
        "--check",
    ]
    assert cli(argv) == 0 and onnx_path.is_file()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["max_abs_diff"] <= 1e-4
    with torch.no_grad():
        assert loaded.model(torch.rand(1, 3, 96, 96))["pred_logits"].shape == (1, 20, 4)
