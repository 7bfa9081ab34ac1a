"""Official DETR key layout and official-format checkpoint loading."""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path

import pytest
import torch

from peg_core.interop import WeightsError
from peg_detr import build_detr, load_official_checkpoint

REFERENCE = (
    Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "detr_r50_state_dict_keys.txt"
)
SMALL = dict(
    hidden_dim=32, num_heads=4, enc_layers=2, dec_layers=2, dim_feedforward=64, num_queries=10, dropout=0.0
)


def read_reference() -> dict[str, tuple[int, ...]]:
    keys = {}
    for line in REFERENCE.read_text().splitlines():
        m = re.fullmatch(r"(\S+) \(([\d, ]*)\)", line.strip())
        assert m, f"unparsable line in {REFERENCE}: {line!r}"
        keys[m.group(1)] = tuple(int(s) for s in m.group(2).split(",") if s.strip())
    return keys


def r50_state_shapes(**kw) -> dict[str, tuple[int, ...]]:
    # Built on the meta device: real shapes, no memory and no initialisation cost.
    with torch.device("meta"), pytest.warns(UserWarning, match="random weights"):
        model, _, _ = build_detr("resnet50", num_classes=91, num_queries=100, **kw)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.skipif(
    not REFERENCE.is_file(), reason=f"reference key list {REFERENCE} not present (it is in CI)"
)
def test_r50_sine_keys_equal_official():
    ref = read_reference()
    assert len(ref) > 400
    ours = r50_state_shapes(pos_enc="sine")
    assert sorted(ours.keys() - ref.keys()) == []
    assert sorted(ref.keys() - ours.keys()) == []
    assert {k: v for k, v in ours.items() if ref[k] != v} == {}
    # DC5 has the same parameters; PEG adds only its own keys.
    assert r50_state_shapes(pos_enc="sine", dilation=True) == ours
    assert r50_state_shapes(pos_enc="none") == ours
    peg = r50_state_shapes(pos_enc="peg")
    assert {k: peg[k] for k in peg.keys() - ref.keys()} == {
        "transformer.encoder.pegs.0.proj.weight": (256, 1, 3, 3),
        "transformer.encoder.pegs.0.proj.bias": (256,),
    }


def small(pos_enc, **kw):
    opts = {**SMALL, **kw}
    return build_detr("tiny", pos_enc=pos_enc, num_classes=opts.pop("num_classes", 5), **opts)[0].eval()


def official_file(tmp_path, model, name="detr.pth", prefix=""):
    """Write ``model`` the way the official training script does: weights plus the pickled args."""
    args = argparse.Namespace(
        lr=1e-4, backbone="resnet50", position_embedding="sine", num_queries=10, dilation=False
    )
    path = tmp_path / name
    torch.save(
        {"model": {prefix + k: v for k, v in model.state_dict().items()}, "args": args, "epoch": 499}, path
    )
    return path


class Untrusted:
    """A class outside the allow-list."""


def test_official_file_needs_allow_list_and_loads_strict(tmp_path):
    src = small("sine")
    path = official_file(tmp_path, src, prefix="module.")
    # Plain weights_only=True refuses the pickled Namespace: the allow-list is what makes it load.
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    dst = small("sine")
    report = load_official_checkpoint(dst, path)
    assert report.copied == sorted(src.state_dict())
    assert report.converted == {} and report.skipped == {}
    assert report.args["position_embedding"] == "sine"
    x = [torch.randn(3, 64, 96), torch.randn(3, 80, 48)]
    with torch.no_grad():
        torch.testing.assert_close(dst(x)["pred_logits"], src(x)["pred_logits"], rtol=0, atol=0)
    # A bare state dict (no "model" wrapper, no args) loads the same way.
    bare = tmp_path / "bare.pth"
    torch.save(src.state_dict(), bare)
    report = load_official_checkpoint(small("sine"), bare)
    assert report.args is None and report.copied == sorted(src.state_dict())


def test_untrusted_pickle_is_always_refused(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model": small("sine").state_dict(), "extra": Untrusted()}, path)
    with pytest.raises(WeightsError, match="refused") as e:
        load_official_checkpoint(small("sine"), path)
    assert "weights_only=False" not in str(e.value) and str(e.value).endswith(f": {path}")
    with pytest.raises(TypeError):  # there is no way to ask for full unpickling
        load_official_checkpoint(small("sine"), path, trust_pickle=True)


@pytest.mark.parametrize("key_pos", ["sine", "none"])
def test_peg_from_official_equals_none(tmp_path, key_pos, capsys):
    """A PEG model loaded from a sine checkpoint starts with PEG = 0 and computes what 'none' computes."""
    path = official_file(tmp_path, small("sine"))
    peg = small("peg", decoder_key_pos=key_pos, peg_at=(0, 1))
    none = small("none", decoder_key_pos=key_pos)
    with pytest.warns(
        UserWarning, match="no PEG weights in the file"
    ):  # a warning: library code prints nothing
        report = load_official_checkpoint(peg, path)
    load_official_checkpoint(none, path)
    assert list(report.converted) == [
        f"transformer.encoder.pegs.{i}.proj.{p}" for i in (0, 1) for p in ("bias", "weight")
    ]
    assert capsys.readouterr().out == ""
    assert all(p.abs().sum() == 0 for p in peg.transformer.encoder.pegs.parameters())
    x = [torch.randn(3, 64, 96), torch.randn(3, 96, 64)]
    with torch.no_grad():
        a, b = peg(x), none(x)
    torch.testing.assert_close(a["pred_logits"], b["pred_logits"], rtol=0, atol=0)
    torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], rtol=0, atol=0)
    if key_pos == "none":
        # peg-output keys are the (zero) PEG output, i.e. no key codes either.
        peg_out = small("peg", decoder_key_pos="peg-output")
        load_official_checkpoint(peg_out, path)
        with torch.no_grad():
            torch.testing.assert_close(peg_out(x)["pred_logits"], b["pred_logits"], rtol=0, atol=0)


def test_num_classes_change_drops_class_embed(tmp_path, capsys):
    src = small("sine", num_classes=5)
    path = official_file(tmp_path, src)
    dst = small("peg", num_classes=3)
    fresh = dst.class_embed.weight.detach().clone()
    with pytest.warns(UserWarning, match="5 classes"):
        report = load_official_checkpoint(dst, path, num_classes=3)
    assert sorted(report.skipped) == report.missing == ["class_embed.bias", "class_embed.weight"]
    assert capsys.readouterr().out == ""
    torch.testing.assert_close(dst.class_embed.weight, fresh, rtol=0, atol=0)
    torch.testing.assert_close(dst.query_embed.weight, src.query_embed.weight, rtol=0, atol=0)
    with pytest.raises(WeightsError, match="num_classes=4"):
        load_official_checkpoint(dst, path, num_classes=4)


def test_mismatches_are_listed(tmp_path):
    path = official_file(tmp_path, small("sine"))
    with pytest.raises(WeightsError, match=r"missing keys: \['transformer.encoder.pos.pos_embed'\]"):
        load_official_checkpoint(small("learned", learned_grid=(4, 6)), path)
    with pytest.raises(
        WeightsError,
        match=re.escape("shape mismatches: ['query_embed.weight: file (10, 32) vs model (7, 32)"),
    ):
        load_official_checkpoint(small("sine", num_queries=7), path)
    peg_path = official_file(tmp_path, small("peg"), name="peg.pth")
    with pytest.raises(WeightsError, match=r"unexpected keys: \['transformer.encoder.pegs.0.proj.bias'") as e:
        load_official_checkpoint(small("sine"), peg_path)
    assert "\n" not in str(e.value) and str(e.value).endswith(f": {peg_path}")


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "pretrained checkpoint not found"), (b"", r"pretrained checkpoint is empty \(0 bytes\)"),
     (b"\x80\x02garbage", "pretrained checkpoint is truncated or not a torch file"),
     (b"PK\x03\x04cut", "pretrained checkpoint is truncated")],
)  # fmt: skip
def test_missing_and_garbage_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "detr.pth"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(WeightsError, match=message) as e:
        load_official_checkpoint(small("sine"), path)
    assert "\n" not in str(e.value) and str(e.value).endswith(f": {path}")
    torch.save([1, 2], path)
    with pytest.raises(WeightsError, match="is not a dict"):
        load_official_checkpoint(small("sine"), path)
