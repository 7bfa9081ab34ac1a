"""DETR with rotary encodings in the encoder: the attention, padding invariance, keys, options."""

from __future__ import annotations

import json
import math

import pytest
import torch

from peg_core.registry import parse_pos_enc
from peg_detr import build_detr
from peg_detr.models import DETR_ENCODINGS, Transformer
from peg_detr.models.detr.transformer import rotary_self_attention

ROTARY = ["rope-axial", "rope-mixed", "rope-dinov3", "peg+rope-axial", "peg+rope-mixed"]
SMALL = dict(
    hidden_dim=32, num_heads=4, enc_layers=2, dec_layers=2, dim_feedforward=64, num_queries=10, dropout=0.0
)


def small(pos_enc: str, **kw):
    torch.manual_seed(0)
    model, criterion, post = build_detr("tiny", pos_enc=pos_enc, num_classes=5, **{**SMALL, **kw})
    with torch.no_grad():  # non-zero PEGs, so the tests see them
        for peg in model.transformer.encoder.pegs.values():
            torch.nn.init.normal_(peg.proj.weight, std=0.3)
    return model.eval(), criterion, post


def test_choices_reach_the_builder():
    for value in ROTARY:
        assert parse_pos_enc(value, DETR_ENCODINGS).rotary is not None
    with pytest.raises(
        ValueError, match="2-D token grid; encoding 'rope-3d' runs on 3-D grids: pos_enc='rope-3d'"
    ):
        build_detr("tiny", "rope-3d", **SMALL)
    with pytest.raises(ValueError, match="divisible by 4"):  # mixed: head_dim 6
        build_detr("tiny", "rope-mixed", **{**SMALL, "hidden_dim": 24})


def _reference_rotary_attention(mha, x, sin, cos, kpm):
    """Float64 from the definition: pair (2j, 2j+1) of each head's q and k rotated, explicit softmax."""
    c, h = x.shape[-1], mha.num_heads
    wq, wk, wv = mha.in_proj_weight.split(c)
    bq, bk, bv = mha.in_proj_bias.split(c)

    def heads(t):
        return t.reshape(t.shape[0], t.shape[1], h, c // h).transpose(1, 2)

    def rotate(t):  # (B, h, N, D); theta from the apply-form table: cos = cos(theta), sin[b] = sin(theta)
        ang = torch.atan2(sin[..., 1::2], cos[..., 0::2])
        z = torch.complex(t[..., 0::2], t[..., 1::2]) * torch.polar(torch.ones_like(ang), ang)
        return torch.stack([z.real, z.imag], -1).flatten(-2)

    q, k, v = rotate(heads(x @ wq.T + bq)), rotate(heads(x @ wk.T + bk)), heads(x @ wv.T + bv)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(c // h)).masked_fill(kpm[:, None, None, :], float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
    return out @ mha.out_proj.weight.T + mha.out_proj.bias


@pytest.mark.parametrize("kind", ["rope-axial", "rope-mixed"])
def test_rotary_attention_matches_the_definition(kind):
    model, _, _ = small(kind)
    model.double()
    enc = model.transformer.encoder
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[1, 3:], mask[1, :, 4:] = True, True
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    sin, cos = enc.rope((4, 5), mask)
    if enc.rope.learned:
        sin, cos = sin[0], cos[0]
    mha = enc.layers[0].self_attn
    got = rotary_self_attention(mha, x, x, (sin, cos), mask.flatten(1))
    want = _reference_rotary_attention(mha, x, sin, cos, mask.flatten(1))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # identity table: exactly nn.MultiheadAttention
    ident = (torch.zeros(20, 8, dtype=torch.float64), torch.ones(20, 8, dtype=torch.float64))
    plain = mha(x, x, x, key_padding_mask=mask.flatten(1), need_weights=False)[0]
    torch.testing.assert_close(
        rotary_self_attention(mha, x, x, ident, mask.flatten(1)), plain, atol=1e-12, rtol=0
    )


def _padded_vs_alone(model):
    small_img, big_img = torch.randn(3, 64, 96), torch.randn(3, 128, 144)
    with torch.no_grad():
        alone = model([small_img])
        batched = model([big_img, small_img])
    diff = max((batched[k][1] - alone[k][0]).abs().max().item() for k in ("pred_logits", "pred_boxes"))
    content = (batched["pred_logits"][0] - alone["pred_logits"][0]).abs().max().item()
    return diff, content


@pytest.mark.parametrize("key_pos", ["sine", "none"])
@pytest.mark.parametrize("pos_enc", ROTARY)
def test_padding_invariance(pos_enc, key_pos):
    """An image alone and padded into a batch with a larger one: the same outputs (<= 1e-5).

    The tiny backbone reads no bottom/right padding for sides that are multiples of 16, so the
    difference is the encoder's: the rotation of a real token must not depend on the padding.
    """
    model, _, _ = small(pos_enc, decoder_key_pos=key_pos)
    diff, content = _padded_vs_alone(model)
    assert diff <= 1e-5, diff
    assert content > 1e-3  # not vacuous


def test_transformer_padding_invariance_any_region():
    """At the transformer: a real 5x7 region padded to 8x10, for every rotary kind (DINOv3: normalised extents)."""
    torch.manual_seed(0)
    for kind in ("rope-axial", "rope-mixed", "rope-dinov3"):
        model, _, _ = small(kind, decoder_key_pos="none")
        t: Transformer = model.transformer
        src = torch.randn(1, 32, 5, 7)
        query = torch.randn(10, 32)
        padded = torch.zeros(2, 32, 8, 10)
        padded[0], padded[1, :, :5, :7] = torch.randn(32, 8, 10), src[0]
        mask = torch.ones(2, 8, 10, dtype=torch.bool)
        mask[0], mask[1, :5, :7] = False, False
        with torch.no_grad():
            alone = t(src, torch.zeros(1, 5, 7, dtype=torch.bool), query)
            batched = t(padded, mask, query)
        assert (batched[:, 1] - alone[:, 0]).abs().max() <= 1e-5, kind


def test_rope_changes_the_output_and_keeps_the_keys():
    """Rotary tokens: same weights as `none` (no new keys but mixed's freqs), different outputs."""
    none, _, _ = small("none")
    for kind in ROTARY:
        model, _, _ = small(kind)
        extra = set(model.state_dict()) - set(none.state_dict())
        want = {"transformer.encoder.rope.freqs"} if "mixed" in kind else set()
        if kind.startswith("peg+"):
            want |= {"transformer.encoder.pegs.0.proj.weight", "transformer.encoder.pegs.0.proj.bias"}
        assert extra == want, kind
        if "mixed" in kind:
            assert model.state_dict()["transformer.encoder.rope.freqs"].shape == (2, 2, 4, 4)
        none.load_state_dict(model.state_dict(), strict=False)
        x = torch.randn(1, 3, 64, 80)
        with torch.no_grad():
            assert (model(x)["pred_logits"] - none(x)["pred_logits"]).abs().max() > 1e-4, kind


def test_build_config_rebuilds_and_trains():
    model, criterion, _ = small("peg+rope-mixed")
    config = json.loads(json.dumps(model.build_config))
    clone, _, _ = build_detr(**config)
    clone.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        torch.testing.assert_close(clone.eval()(x)["pred_boxes"], model(x)["pred_boxes"], rtol=0, atol=0)
    model.train()
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.3]])}]
    losses = criterion(model(x), targets)
    sum(losses[k] * criterion.weight_dict[k] for k in criterion.weight_dict).backward()
    freqs = model.transformer.encoder.rope.freqs
    assert freqs.grad is not None and freqs.grad.abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "pos_enc", ["rope-axial", "rope-mixed", "rope-dinov3", "peg+rope-axial", "peg+rope-mixed"]
)
def test_train_and_eval_at_several_sizes_from_the_cli(tmp_path, pos_enc):
    """``python -m peg_detr train --pos-enc <rotary>`` 1 epoch, then ``eval --eval-sizes`` at three sizes."""
    from peg_core.engine import read_checkpoint
    from peg_detr.__main__ import main as cli
    from peg_detr.data import SyntheticSpec, make_synthetic_coco

    spec = SyntheticSpec(size=64, num_classes=3, min_objects=0, max_objects=2, min_frac=0.3, max_frac=0.5)
    data = make_synthetic_coco(tmp_path / "data", num_train=8, num_val=4, seed=1, spec=spec)
    out = tmp_path / "run"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli([
            "train", "--data-root", str(data), "--output-dir", str(out), "--epochs", "1", "--backbone", "tiny",
            "--pos-enc", pos_enc, "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1",
            "--dec-layers", "1", "--dim-feedforward", "32", "--num-queries", "6", "--train-sizes", "56,64",
            "--max-size", "96", "--crop-resize", "", "--val-size", "64", "--total-batch-size", "4",
            "--workers", "0", "--no-progress", "--seed", "7",
        ]) == 0  # fmt: skip
        ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
        assert ckpt["model_config"]["pos_enc"] == pos_enc
        if pos_enc.endswith("rope-mixed"):
            assert ckpt["model"]["transformer.encoder.rope.freqs"].shape == (2, 1, 2, 8)
        assert cli(["eval", "--checkpoint", str(out / "checkpoint.pth"), "--output-dir", str(out / "ev"),
                    "--eval-sizes", "48,64,96", "--workers", "0", "--no-progress"]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(before)
    report = json.loads((out / "ev" / "report.json").read_text())
    assert set(report["eval"]["sizes"]) == {"48", "64", "96"}
