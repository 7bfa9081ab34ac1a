"""Export of the attention-bias models (``alibi-2d``, ``fire``, ``lookhere``) with dynamic sizes, in every family.

* ``torch.export`` with a free height and width (video: also the clip length) at one size, the
  program run at a second size against eager (<= 1e-5): the whole DETR and RT-DETR's AIFI (the
  module D-FINE and DEIMv2 use as well) with each bias, a whole ``peg+fire`` RT-DETR (the bias's
  grid is the symbolic size of its stride-32 map), the video ViT (``peg3d+alibi-2d`` in joint
  attention, ``alibi-2d`` in divided).  CPVT's is in ``tests/test_bias_families.py``.
* ONNX through each task's own ``export`` command (``python -m peg_detr export`` of a ``peg+fire``
  DETR, ``python -m peg_video export`` of a ``fire`` ViT, ``--check`` included), run by
  onnxruntime at another batch and size than the example's, against PyTorch (<= 1e-4).  The
  classifier has no ``export`` command: CPVT's ONNX goes through
  :func:`peg_core.export.onnx.export_onnx`, the function those commands call, in
  ``tests/test_bias_families.py``.  ``export_onnx`` traces under ``torch.no_grad()``: FIRE's float
  mask would otherwise require grad, and torch's ONNX decomposition of that attention fails.

Every comparison also checks that zeroing the bias moves the outputs by 10 times its tolerance
or more, so that a bias the export got wrong (fixed at the traced size, say) would be seen.

Padding: DETR is the one family whose batches are padded, with a mask (its padding invariance is
in ``tests/test_bias_families.py``).  The others give a bias no padding to see: RT-DETR's
pipelines resize every batch to one square size (the model pads a list of images of different
sizes but ignores the mask, as RT-DETR does: the padded pixels are image content to its backbone
and encoder, whatever the encoding); CPVT's batches are stacked at one size, and its zero-padding
of an image to a multiple of the patch fills the last patch of a row / column, a real token, not
an extra one; video clips are stacked at one length and crop.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn
from torch.export import Dim

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT
from peg_detr.export import DetrForExport
from peg_detr.models.rtdetr.build import build_rtdetr
from peg_detr.models.rtdetr.encoder import AIFI
from peg_video.models import build_video_model
from tests.test_bias_families import BIASES, detr, video

#: torch.export of the same model: the same kernels, so the program equals eager to rounding
EXPORT_ATOL = 1e-5
#: onnxruntime against PyTorch (the export commands' ``--check`` tolerance)
ONNX_ATOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_thread")


def nontrivial(model: nn.Module) -> nn.Module:
    """Weights that make the attention, and so the bias, count; eval mode.

    The models' own inits (ViT's 0.02, zero PEG projections and box heads) leave the attention a
    small part of the output, so a comparison could miss a wrong bias: every matrix / kernel is
    drawn with standard deviation ``fan_in ** -0.5``, zero vectors with 0.1 and FIRE's MLP with
    0.5.  :func:`bias_effect` measures what the bias then does to the outputs.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "attn_bias.mlp" in name:
                p.normal_(0, 0.5)
            elif p.dim() >= 2:
                p.normal_(0, (p.numel() // p.shape[0]) ** -0.5)
            elif p.abs().sum() == 0:
                p.normal_(0, 0.1)
    return model.eval()


def outputs(out: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A model's output or outputs as a tuple."""
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def max_diff(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> float:
    """Largest absolute difference over matching outputs (shapes checked)."""
    assert [g.shape for g in got] == [w.shape for w in want]
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


def bias_effect(model: nn.Module, x: torch.Tensor, want: tuple[torch.Tensor, ...]) -> float:
    """How far the outputs ``want`` of ``model(x)`` move when the model's one attention bias is zero."""
    (bias,) = [m for name, m in model.named_modules() if name.split(".")[-1] == "attn_bias"]
    handle = bias.register_forward_hook(lambda _m, _args, out: torch.zeros_like(out))
    try:
        with torch.no_grad():
            return max_diff(outputs(model(x)), want)
    finally:
        handle.remove()


def check_export(model: nn.Module, example: torch.Tensor, dynamic: dict, x: torch.Tensor) -> None:
    """``torch.export`` of ``model`` on ``example`` with the ``dynamic`` dims, run at ``x``: equal to eager.

    The bias must move the outputs at ``x`` by 10 times the tolerance or more, so that the
    comparison would see a bias the program got wrong (one fixed at the traced size, say).
    """
    program = torch.export.export(model, (example,), dynamic_shapes=(dynamic,))
    with torch.no_grad():
        got, want = outputs(program.module()(x)), outputs(model(x))
    diff = max_diff(got, want)
    assert diff <= EXPORT_ATOL, diff
    effect = bias_effect(model, x, want)
    assert effect > 10 * EXPORT_ATOL, effect


def save_checkpoint(model: nn.Module, task: str, config: dict, meta: dict, path: Path) -> None:
    """``model`` as the engine's training checkpoint (what the ``export`` commands read)."""
    torch.save(
        {"format": CHECKPOINT_FORMAT, "task": task, "model": model.state_dict(), "model_config": config,
         "meta": meta, "args": {}},
        path,
    )  # fmt: skip


# ------------------------------------------------------------------------------ torch.export


@pytest.mark.parametrize("pos_enc", BIASES)  # peg+fire: the ONNX test below
def test_detr_exports_at_a_second_size(pos_enc):
    """The whole DETR (tiny backbone, stride 16, 2 encoder layers): 64 x 80 traced, 96 x 48 run."""
    model = DetrForExport(nontrivial(detr(pos_enc, dec_layers=1))).eval()
    h, w = Dim("h", min=2, max=64), Dim("w", min=2, max=64)
    check_export(model, torch.randn(1, 3, 64, 80), {2: 16 * h, 3: 16 * w}, torch.randn(1, 3, 96, 48))


@pytest.mark.parametrize("pos_enc", BIASES)  # peg+fire: the whole RT-DETR below
def test_aifi_exports_at_a_second_size(pos_enc):
    """RT-DETR's AIFI (D-FINE's and DEIMv2's too), 2 layers: a 5 x 7 map traced, 3 x 9 run."""
    torch.manual_seed(0)
    aifi = nontrivial(AIFI(32, 4, num_layers=2, pos_enc=pos_enc))
    h, w = Dim("h", min=2, max=64), Dim("w", min=2, max=64)
    check_export(aifi, torch.randn(2, 32, 5, 7), {2: h, 3: w}, torch.randn(2, 32, 3, 9))


def test_whole_rtdetr_exports_at_a_second_size():
    """A ``peg+fire`` RT-DETR (tiny ResNet-vd, stride 32): 96 x 128 traced, 64 x 160 run.

    The bias's grid is the stride-32 map's, a symbolic size in the program.
    """
    torch.manual_seed(0)
    model, _, _ = build_rtdetr(
        "tiny", "peg+fire", num_classes=3, hidden_dim=32, num_heads=4, dec_layers=1, dim_feedforward=64,
        num_queries=10, num_denoising=0, encoder_expansion=0.5, depth_mult=0.34,
    )  # fmt: skip
    model = DetrForExport(nontrivial(model)).eval()
    h, w = Dim("h", min=2, max=64), Dim("w", min=2, max=64)
    check_export(model, torch.randn(1, 3, 96, 128), {2: 32 * h, 3: 32 * w}, torch.randn(1, 3, 64, 160))


@pytest.mark.parametrize(("pos_enc", "attention"), [("peg3d+alibi-2d", "joint"), ("alibi-2d", "divided")])
def test_video_exports_at_a_second_clip(pos_enc, attention):
    """Free clip length, height and width (tubelet ``(2, 8, 8)``): 4 x 32 x 32 traced, 6 x 24 x 40 run.

    ``fire``: the ONNX test below (joint attention; the divided attention's two biases are alibi's here).
    """
    model = nontrivial(video(pos_enc, attention))
    t, h, w = Dim("t", min=2, max=32), Dim("h", min=2, max=32), Dim("w", min=2, max=32)
    check_export(
        model, torch.randn(2, 3, 4, 32, 32), {2: 2 * t, 3: 8 * h, 4: 8 * w}, torch.randn(2, 3, 6, 24, 40)
    )


# -------------------------------------------------------------------------------------- ONNX


@pytest.fixture
def onnxruntime():
    pytest.importorskip("onnxscript")
    return pytest.importorskip("onnxruntime")


def last_json(capsys: pytest.CaptureFixture) -> dict:
    """The export command's report (its last stdout line)."""
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def run_onnx(onnxruntime: ModuleType, path: Path, name: str, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The graph at ``path`` run by onnxruntime on ``{name: x}``."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return tuple(torch.from_numpy(a) for a in session.run(None, {name: x.numpy()}))


def detector_onnx_matches(
    model: nn.Module,
    config: dict,
    classes: int,
    size: tuple[int, int],
    x: torch.Tensor,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    onnxruntime: ModuleType,
) -> tuple[nn.Module, torch.Tensor, tuple[torch.Tensor, ...]]:
    """``python -m peg_detr export --check`` of ``model`` at ``size``, then onnxruntime at ``x``'s size equals
    PyTorch (≤ :data:`ONNX_ATOL`); returns the export wrapper, ``x`` and PyTorch's outputs."""
    from peg_detr.__main__ import main

    ckpt, out = tmp_path / "detector.pth", tmp_path / "detector.onnx"
    categories = [{"id": i, "name": f"c{i}"} for i in range(classes)]
    save_checkpoint(model, "detect", config, {"categories": categories}, ckpt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        argv = ["export", str(ckpt), str(out), "--height", str(size[0]), "--width", str(size[1]), "--check"]
        assert main(argv) == 0
    assert last_json(capsys)["max_abs_diff"] <= ONNX_ATOL
    wrapper = DetrForExport(model)
    with torch.no_grad():
        want = wrapper(x)
    diff = max_diff(run_onnx(onnxruntime, out, "images", x), want)
    assert diff <= ONNX_ATOL, diff
    return wrapper, x, want


def test_detr_onnx_through_the_export_command(tmp_path, capsys, onnxruntime):
    """``python -m peg_detr export --check`` of a ``peg+fire`` DETR at 2 x 64 x 80, run at 3 x 96 x 48."""
    model = nontrivial(detr("peg+fire", enc_layers=1, dec_layers=1))
    wrapper, x, want = detector_onnx_matches(model, model.build_config, 5, (64, 80), torch.randn(3, 3, 96, 48),
                                             tmp_path, capsys, onnxruntime)  # fmt: skip
    effect = bias_effect(wrapper, x, want)
    assert effect > 10 * ONNX_ATOL, effect


def test_video_onnx_through_the_export_command(tmp_path, capsys, onnxruntime):
    """``python -m peg_video export --check`` of a ``fire`` video ViT at 2 x 4 x 32 x 32, run at 3 x 6 x 24 x 40."""
    from peg_video.__main__ import main

    torch.manual_seed(0)
    config = {"name": "vit_tiny", "pos_enc": "fire", "num_classes": 3, "num_frames": 4, "img_size": 32,
              "tubelet": [2, 8, 8], "embed_dim": 32, "depth": 1, "num_heads": 4, "mlp_ratio": 1.0}  # fmt: skip
    model = nontrivial(build_video_model(**config))
    ckpt, out = tmp_path / "video.pth", tmp_path / "video.onnx"
    save_checkpoint(model, "video", config, {"classes": ["a", "b", "c"]}, ckpt)
    assert main(["export", str(ckpt), str(out), "--check"]) == 0
    report = last_json(capsys)
    assert report["example"] == [2, 3, 4, 32, 32] and report["max_abs_diff"] <= ONNX_ATOL
    x = torch.randn(3, 3, 6, 24, 40)
    with torch.no_grad():
        want = (model(x),)
    diff = max_diff(run_onnx(onnxruntime, out, "clips", x), want)
    assert diff <= ONNX_ATOL, diff
    effect = bias_effect(model, x, want)
    assert effect > 10 * ONNX_ATOL, effect


@pytest.mark.slow
def test_rtdetr_onnx_through_the_export_command(tmp_path, capsys, onnxruntime):
    """``python -m peg_detr export --check`` of a ``lookhere`` RT-DETR (fused, the default) at 96 x 128, run at 64 x 160.

    LookHere's masked keys (``-max bfloat16``) and distances must follow the stride-32 grid of the new size.
    """
    torch.manual_seed(0)
    model, _, _ = build_rtdetr(
        "tiny", "lookhere", num_classes=3, hidden_dim=32, num_heads=4, dec_layers=1, dim_feedforward=64,
        num_queries=10, num_denoising=0, encoder_expansion=0.5, depth_mult=0.34,
    )  # fmt: skip
    model = nontrivial(model).eval()
    config = {"arch": "rtdetr", **model.build_config}
    detector_onnx_matches(
        model, config, 3, (96, 128), torch.randn(1, 3, 64, 160), tmp_path, capsys, onnxruntime
    )
