"""CPVT's PEG ablation options: kernel size, separable, padding, dynamic kernels, ``peg_at`` -1 / all.

Each option is checked on the model (shapes, state-dict keys, where the PEG
runs), through the classify CLI's flags into ``model_config``, and back from a
saved checkpoint with :func:`peg_core.classify.model.load_model`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg_core.__main__ import main
from peg_core.classify.cli import build_train_parser
from peg_core.classify.model import build_model, load_model, model_config_from_args
from peg_core.engine import read_checkpoint
from peg_core.models import CPVT
from peg_core.peg import PegOptions, fold_peg_keys
from tests.core.classify_runs import (
    keep_threads,  # noqa: F401 (autouse: restores torch's threads)
    tiny,
)

#: a tiny CPVT: 32 px images, patch 8 -> a 4x4 grid (5x3 for 40x24 inputs)
SMALL = {"embed_dim": 16, "depth": 3, "num_heads": 2, "patch_size": 8, "img_size": 32, "num_classes": 3}


def shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("pos_blocks.")}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, {"pos_blocks.0.proj.weight": (16, 1, 3, 3), "pos_blocks.0.proj.bias": (16,)}),
        (
            {"peg_kernel_size": 5},
            {"pos_blocks.0.proj.weight": (16, 1, 5, 5), "pos_blocks.0.proj.bias": (16,)},
        ),
        (
            {"peg_separable": True, "peg_at": (1,)},
            {
                "pos_blocks.1.proj_w.weight": (16, 1, 1, 3),
                "pos_blocks.1.proj.weight": (16, 1, 3, 1),
                "pos_blocks.1.proj.bias": (16,),
            },
        ),
        (
            {"peg_dynamic": True, "peg_num_kernels": 3},
            {
                "pos_blocks.0.weight": (3, 16, 1, 3, 3),
                "pos_blocks.0.bias": (3, 16),
                "pos_blocks.0.route.weight": (3, 16),
                "pos_blocks.0.route.bias": (3,),
            },
        ),
        ({"peg_at": (-1,)}, {"pos_blocks.-1.proj.weight": (16, 1, 3, 3), "pos_blocks.-1.proj.bias": (16,)}),
        (
            {"peg_at": "all"},
            {
                f"pos_blocks.{i}.proj.{p}": s
                for i in range(3)
                for p, s in (("weight", (16, 1, 3, 3)), ("bias", (16,)))
            },
        ),
    ],
)
def test_options_build_their_pegs(options: dict, expected: dict) -> None:
    torch.manual_seed(0)
    # the loose peg_* keywords of stored configs, folded into one PegOptions value
    model = CPVT(**fold_peg_keys({**SMALL, "class_token": True, **options})).eval()
    assert shapes(model) == expected
    with torch.no_grad():
        assert model(torch.randn(2, 3, 40, 24)).shape == (2, 3)  # 5x3 grid: non-square, odd


def test_circular_padding_reaches_the_conv() -> None:
    model = CPVT(**SMALL, peg=PegOptions(padding_mode="circular"), peg_at=(0, 2))
    assert {m.padding_mode for m in model.pos_blocks.values()} == {"circular"}
    assert {m.proj.padding_mode for m in model.pos_blocks.values()} == {"circular"}


def test_peg_at_minus_one_runs_before_block_zero() -> None:
    model = CPVT(**SMALL, peg_at=(-1, 1)).eval()
    order: list[str] = []
    for name, mod in [("peg-1", model.pos_blocks["-1"]), ("peg1", model.pos_blocks["1"]),
                      *((f"block{i}", b) for i, b in enumerate(model.blocks))]:  # fmt: skip
        mod.register_forward_hook(lambda *_, name=name: order.append(name))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert order == ["peg-1", "block0", "block1", "peg1", "block2"]
    assert model.peg_at == (-1, 1)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"indices \[-2\] outside -1 \(before block 0\) \.\. 2 \(3 blocks\)"):
        CPVT(**SMALL, peg_at=(-2,))
    with pytest.raises(ValueError, match="'all'"):
        CPVT(**SMALL, peg_at="every")
    with pytest.raises(ValueError, match=r"peg_at needs at least one block index \(or 'all'\)"):
        CPVT(**SMALL, peg_at=())
    # resolve_peg_at's one meaning: "all" is after every block; other encodings have no PEG at all
    assert CPVT(**SMALL, peg_at="all").peg_at == (0, 1, 2)
    assert (
        CPVT(**SMALL, pos_enc="learned", peg_at="all").peg_at == ()
        and not CPVT(**SMALL, pos_enc="none").pos_blocks
    )
    with pytest.raises(ValueError, match="factorized"):
        CPVT(**SMALL, peg=PegOptions(dynamic=True, separable=True))
    with pytest.raises(ValueError, match="padding_mode"):
        CPVT(**SMALL, peg={"padding_mode": "mirror"})


def _config(*flags: str) -> dict:
    args = build_train_parser().parse_args(list(flags))
    return model_config_from_args(args, 12)


def test_flags_into_model_config() -> None:
    cfg = _config("--peg-at", "-1", "--peg-kernel-size", "5", "--peg-separable", "--peg-padding", "circular")
    assert cfg["peg_at"] == [-1] and cfg["peg_kernel_size"] == 5
    assert cfg["peg_separable"] is True and cfg["peg_padding"] == "circular"
    assert "peg_dynamic" not in cfg  # unset flags stay out of the config (the arch's defaults hold)
    cfg = _config("--peg-at=0,-1,2", "--peg-dynamic", "--peg-num-kernels", "2", "--no-peg-separable")
    assert cfg["peg_at"] == [-1, 0, 2] and cfg["peg_dynamic"] is True and cfg["peg_num_kernels"] == 2
    assert cfg["peg_separable"] is False
    assert _config("--peg-at", "all")["peg_at"] == "all"


@pytest.mark.parametrize(
    "flags",
    [["--peg-kernel-size", "4"], ["--peg-padding", "reflect"], ["--peg-num-kernels", "0"], ["--peg-at", "x"]],
)
def test_bad_flags_exit_2(flags: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as e:
        build_train_parser().parse_args(flags)
    assert e.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "options",
    [
        {"peg_kernel_size": 5, "peg_separable": True, "peg_at": "all"},
        {"peg_dynamic": True, "peg_num_kernels": 2, "peg_padding": "circular", "peg_at": [-1, 0]},
    ],
)
def test_checkpoint_round_trip(tmp_path: Path, options: dict) -> None:
    """model_config -> saved checkpoint -> load_model rebuilds the same network with the same outputs."""
    torch.manual_seed(1)
    config = {"arch": "demo", "embed_dim": 16, "depth": 2, "num_heads": 2, "num_classes": 3, **options}
    built = build_model(config).eval()
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {"model_config": config, "meta": {"classes": ["a", "b", "c"]}, "model": built.state_dict()}, path
    )
    loaded = load_model(torch.load(path, weights_only=True), path).model
    assert shapes(loaded) == shapes(built) and loaded.peg_at == built.peg_at
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), built(x), rtol=0, atol=0)


def test_train_then_eval_with_dynamic_circular_peg(tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = ["--peg-at=-1,0", "--peg-dynamic", "--peg-num-kernels", "2", "--peg-padding", "circular"]
    assert main(["train", *tiny(16, 8, "--epochs", "1"), *flags, "--output-dir", str(run)]) == 0
    ckpt = read_checkpoint(run / "checkpoint.pth", "classify")
    cfg = ckpt["model_config"]
    assert (cfg["peg_at"], cfg["peg_dynamic"], cfg["peg_num_kernels"], cfg["peg_padding"]) == (
        [-1, 0], True, 2, "circular",
    )  # fmt: skip
    assert "pos_blocks.-1.route.weight" in ckpt["model"]
    code = main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--eval-sizes", "16,24",
                 "--output-dir", str(tmp_path / "ev"), "--no-progress", "--device", "cpu"])  # fmt: skip
    assert code == 0
    assert json.loads((tmp_path / "ev" / "report.json").read_text())["eval"]["sizes"] == [16, 24]


def test_torch_export_with_dynamic_peg() -> None:
    """The batched grouped conv (groups = B*C) traces with torch.export at a fixed input size."""
    torch.manual_seed(2)
    model = CPVT(**{**SMALL, "depth": 1}, peg=PegOptions(dynamic=True), peg_at=(-1, 0)).eval()
    x = torch.randn(2, 3, 32, 24)
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), model(x), rtol=1e-5, atol=1e-5)
