"""Int8 post-training quantization (PT2E): the library call, the ``quantize`` command, eval of ``.pt2`` files."""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.__main__ import main
from peg_core.classify.data import ShapeImages
from peg_core.classify.model import build_model
from peg_core.classify.shapes import sample_scenes
from peg_core.export.quantize import (
    QuantizedClassifier,
    calibration_batches,
    has_quantized_ops,
    load_quantized,
    quantize_int8,
)

#: a tiny CPVT on 16 px shapes, patch 4 (a 4x4 grid)
TINY = [
    "--img-size", "16", "--embed-dim", "32", "--depth", "1", "--num-heads", "2", "--peg-at", "0",
    "--patch-size", "4", "--batch-size", "16", "--n-train", "128", "--n-val", "64", "--workers", "0",
    "--threads", "2", "--no-progress", "--device", "cpu", "--lr", "3e-3",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny classifier trained for 2 epochs, and its int8 model written by the command."""
    out = tmp_path_factory.mktemp("quant")
    assert main(["train", *TINY, "--epochs", "2", "--output-dir", str(out)]) == 0
    assert main(["quantize", str(out / "checkpoint.pth"), str(out / "int8.pt2"), "--calib", "64"]) == 0
    return out


def _one_line_error(capsys, code: int, expected_code: int = 1) -> str:
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


def _float_model(run):
    from peg_core.classify.model import load_model
    from peg_core.engine import read_checkpoint

    path = run / "checkpoint.pth"
    return load_model(read_checkpoint(path, "classify"), path).model


def test_the_int8_file_has_quantized_ops_and_agrees_with_float_at_several_sizes(run):
    model, meta = load_quantized(run / "int8.pt2")
    assert meta["calibration"] == {"images": 64, "img_size": 16, "data": None}
    assert meta["classes"] and meta["img_size"] == 16 and meta["epoch"] == 1
    ops = has_quantized_ops(model)
    # every linear / conv input is quantized per tensor, every weight dequantized per channel
    assert ops["quantize_per_tensor"] >= 6 and ops["dequantize_per_channel"] >= 6
    ref = _float_model(run)
    images = ShapeImages(sample_scenes(64, 1), 16).images  # the validation scenes (seed + 1)
    for size in (16, 24, 20):  # 20: not a multiple of the patch, padded as the float model pads
        x = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
        with torch.no_grad():
            q, f = model(x), ref(x)
        assert q.shape == f.shape == (64, len(meta["classes"]))
        agree = (q.argmax(1) == f.argmax(1)).float().mean().item()
        # int8 rounding flips a few near-ties at most; the logits stay within 5 % of their spread
        assert agree >= 0.9, (size, agree)
        assert (q - f).abs().max().item() < 0.05 * (f.max() - f.min()).item(), size


def test_eval_of_the_int8_file_matches_the_float_checkpoint(run, tmp_path):
    sizes = ["--eval-sizes", "16,24", "--no-progress", "--threads", "2"]
    for name, ckpt in (("f", "checkpoint.pth"), ("q", "int8.pt2")):
        assert (
            main(["eval", "--checkpoint", str(run / ckpt), "--output-dir", str(tmp_path / name), *sizes]) == 0
        )
    f = json.loads((tmp_path / "f" / "report.json").read_text())["eval"]
    q = json.loads((tmp_path / "q" / "report.json").read_text())["eval"]
    assert q["sizes"] == f["sizes"] == [16, 24] and q["samples"] == f["samples"] == 64
    assert f["top1"] > 1 / 8  # past chance, so agreement means something
    for size in ("16", "24"):  # tolerance: 4 of 64 images, loss within 5 %
        assert abs(q["top1_by_size"][size] - f["top1_by_size"][size]) <= 4 / 64, size
        assert q["loss_by_size"][size] == pytest.approx(f["loss_by_size"][size], rel=0.05), size


def test_errors_are_one_line(run, tmp_path, capsys):
    err = _one_line_error(capsys, main(["quantize", str(tmp_path / "nope.pth"), str(tmp_path / "o.pt2")]))
    assert err.startswith("error: ") and err.endswith(str(tmp_path / "nope.pth"))
    detr = tmp_path / "detr.pth"
    torch.save({"format": "peg-checkpoint/1", "task": "detect", "model": {"w": torch.zeros(1)}}, detr)
    err = _one_line_error(capsys, main(["quantize", str(detr), str(tmp_path / "o.pt2")]))
    assert (
        err == f"error: wrong model: checkpoint is for task 'detect', this command needs 'classify': {detr}"
    )
    err = _one_line_error(capsys, main(["quantize", str(run / "checkpoint.pth"), str(tmp_path / "o.pth")]))
    assert err == f"error: the quantized model is a .pt2 file: {tmp_path / 'o.pth'}"
    err = _one_line_error(capsys, main(["quantize", str(run / "checkpoint.pth"), "o.pt2", "--calib", "0"]), 2)
    assert "argument --calib: expected a positive integer" in err
    err = _one_line_error(capsys, main(["eval", "--checkpoint", str(run / "int8.pt2"), "--device", "cuda"]))
    assert err == "error: quantized models run on the CPU only: --device cuda"
    argv = ["eval", "--checkpoint", str(run / "int8.pt2"), "--device", "cpu", "--compile"]
    err = _one_line_error(capsys, main(argv))
    assert err == "error: a quantized model runs as exported, not compiled: --compile"
    fake = tmp_path / "fake.pt2"
    fake.write_bytes(b"not a zip")
    err = _one_line_error(capsys, main(["eval", "--checkpoint", str(fake), "--no-progress"]))
    assert err == f"error: not a .pt2 archive (not a readable zip file: File is not a zip file): {fake}"
    err = _one_line_error(capsys, main(["eval", "--checkpoint", str(tmp_path / "gone.pt2"), "--no-progress"]))
    assert err == f"error: quantized model not found: {tmp_path / 'gone.pt2'}"


def test_calibration_batches_take_the_first_images():
    data = ShapeImages(sample_scenes(10, 0), 16)
    batches = calibration_batches(data, 7, 3)
    assert [tuple(b.shape) for b in batches] == [(3, 3, 16, 16), (3, 3, 16, 16), (1, 3, 16, 16)]
    assert torch.equal(torch.cat(batches), data.images[:7])
    assert sum(len(b) for b in calibration_batches(data, 50, 4)) == 10


def _tiny(pos_enc: str, **kw):
    return build_model({"arch": "demo", "pos_enc": pos_enc, "img_size": 16, "num_classes": 8, "embed_dim": 32,
                        "depth": 1, "num_heads": 2, "patch_size": 4, "peg_at": [0], **kw})  # fmt: skip


def _check_close(model, ref, sizes, n=16):
    g = torch.Generator().manual_seed(1)
    for size in sizes:
        x = torch.randn(n, 3, *size, generator=g)
        with torch.no_grad():
            q, f = model(x), ref(x)
        # int8 error relative to the logits' own variation: RMS under 10 %, worst entry under 10 % of the range
        rel_rms = ((q - f).norm() / (f - f.mean()).norm()).item()
        worst = ((q - f).abs().max() / (f.max() - f.min())).item()
        assert rel_rms < 0.1 and worst < 0.1, (size, rel_rms, worst)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pos_enc", "extra"),
    [("peg", {}), ("learned", {}), ("sincos", {}), ("none", {}), ("peg", {"peg_dynamic": True})],
)
def test_every_encoding_quantizes_with_dynamic_sizes(pos_enc, extra):
    torch.manual_seed(0)
    ref = _tiny(pos_enc, **extra).eval()
    for p in ref.parameters():  # PEG weights start at zero: give them something to quantize
        torch.nn.init.normal_(p, std=0.05) if p.ndim > 1 else None
    calib = [torch.randn(8, 3, 16, 16) for _ in range(2)]
    model = quantize_int8(ref, calib, torch.zeros(2, 3, 8, 8))
    assert isinstance(model, QuantizedClassifier) and has_quantized_ops(model)["quantize_per_tensor"] >= 6
    _check_close(
        model, ref, [(16, 16), (12, 28), (8, 8)]
    )  # the training grid, a non-square one, the smallest


@pytest.mark.slow
def test_cpvt_tiny_quantizes():
    from peg_core.models import cpvt_tiny

    torch.manual_seed(0)
    ref = cpvt_tiny(num_classes=10, img_size=64).eval()
    model = quantize_int8(ref, [torch.randn(4, 3, 64, 64)], torch.zeros(1, 3, 32, 32))
    assert has_quantized_ops(model)["dequantize_per_channel"] >= 12 * 4
    _check_close(model, ref, [(64, 64), (48, 80)], n=4)


def _with_meta(src, dst, text: str):
    """A copy of the ``.pt2`` ``src`` whose metadata member holds ``text``."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, text if name.endswith("extra/peg_quantized.json") else zin.read(name))
    return dst


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the metadata is empty"),
        ("{", "the metadata is not valid JSON"),
        ("[1, 2]", "the metadata is not a JSON object (got list)"),
        ("{}", "the metadata has no key 'num_classes' (a positive int)"),
        ('{"num_classes": 8, "patch_size": 0}', "metadata key 'patch_size' must be a positive int; got 0"),
        ('{"num_classes": "8"}', "metadata key 'num_classes' must be a positive int; got 8"),
        ('{"num_classes": 2, "patch_size": 4, "img_size": 16, "classes": "ab"}',
         "metadata key 'classes' must be a list of class names (str); got ab"),
        ('{"num_classes": 2, "patch_size": 4, "img_size": 16, "classes": ["a", "b"], "grid_range": [2, 1]}',
         "metadata key 'grid_range' must be [min, max] grid sides in patches, 2 <= min <= max; got [2, 1]"),
        ('{"num_classes": 3, "patch_size": 4, "img_size": 16, "classes": ["a", "b"]}',
         "metadata key 'classes' has 2 names but 'num_classes' is 3"),
        ('{"num_classes": 2, "patch_size": 4, "img_size": 16, "classes": ["a", "b"], "data": {"seed": "x"}}',
         "metadata key 'data.seed' must be an int; got x"),
    ],
)  # fmt: skip
def test_bad_metadata_is_one_line_naming_the_file_and_key(run, tmp_path, capsys, text, message):
    path = _with_meta(run / "int8.pt2", tmp_path / "bad.pt2", text)
    code = main(["eval", "--checkpoint", str(path), "--no-progress", "--output-dir", str(tmp_path / "e")])
    err = _one_line_error(capsys, code)
    assert err.startswith(f"error: {message}") and err.endswith(f": {path} (extra/peg_quantized.json)"), err


def test_sizes_outside_the_exported_range_are_refused_up_front(run, tmp_path, capsys):
    model, meta = load_quantized(run / "int8.pt2")
    assert meta["grid_range"] == [2, 256] and model.size_range() == (5, 1024)  # patch 4
    argv = ["eval", "--checkpoint", str(run / "int8.pt2"), "--no-progress", "--output-dir", str(tmp_path)]
    err = _one_line_error(capsys, main([*argv, "--eval-sizes", "4,16,2000"]))
    assert err == (
        "error: the quantized model was exported for image sides of 5 to 1024 px (2 to 256 patches of 4 px); "
        "got [4, 2000]: --eval-sizes 4,16,2000"
    )
    assert not (tmp_path / "report.json").exists()  # refused before any evaluation
    with pytest.raises(ValueError, match=r"5 to 1024 px .* got \[4\]: input of shape \(1, 3, 4, 16\)"):
        model(torch.zeros(1, 3, 4, 16))


def test_without_torchao_quantize_and_eval_name_the_extra(run, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; sys.modules['torchao'] = None\n"  # 'import torchao' fails as if it were not installed
        "from peg_core.__main__ import main\n"
        f"print(main(['quantize', {str(run / 'checkpoint.pth')!r}, {str(tmp_path / 'q.pt2')!r}]))\n"
        f"print(main(['eval', '--checkpoint', {str(run / 'int8.pt2')!r}, '--no-progress']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)  # fmt: skip
    assert proc.stdout.split() == ["1", "1"], proc.stderr
    line = "error: int8 quantization needs torchao: pip install 'peg-core[quantize]'"
    assert proc.stderr.splitlines() == [line, line] and "Traceback" not in proc.stderr
