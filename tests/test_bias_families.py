"""Attention biases (``alibi-2d``, ``fire``; ``lookhere`` in the 2-D ones) in the four model families: CPVT, DETR, RT-DETR's AIFI, the video ViT.

Each family trains one epoch and evaluates at two other sizes through its command line; in Python:
the registry's family rules, one bias per forward shared by the layers, the attention against a
float64 softmax reference, DETR's padding invariance, the divided video attention's split of the
3-D bias, and ``torch.export`` of CPVT at a second size.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from peg_core.bias import LookHereBias
from peg_core.engine import read_checkpoint
from peg_core.models import CPVT
from peg_core.models.cpvt import CPVT_ENCODINGS
from peg_core.registry import PosEncError, parse_pos_enc
from peg_detr import build_detr
from peg_detr.models import DETR_ENCODINGS
from peg_detr.models.detr.transformer import rotary_self_attention
from peg_detr.models.rtdetr import AIFI_ENCODINGS
from peg_detr.models.rtdetr.encoder import AIFI
from peg_video.models import VIDEO_ENCODINGS, VideoTransformer

BIASES = ["alibi-2d", "fire", "lookhere"]
FAMILIES = [CPVT_ENCODINGS, DETR_ENCODINGS, AIFI_ENCODINGS, VIDEO_ENCODINGS]


def without_bias(pos_enc: str) -> str:
    """``pos_enc`` less its bias part (``"none"`` when nothing is left): the same model without the bias."""
    return "+".join(p for p in pos_enc.split("+") if p not in BIASES) or "none"


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------ the family rules


def test_every_family_takes_the_biases_alone_and_with_its_peg():
    for family in FAMILIES:
        peg = "peg3d" if family.ndim == 3 else "peg"
        biases = BIASES if family.ndim == 2 else ["alibi-2d", "fire"]
        assert set(biases) <= set(family.names()), family.family
        for value in (*biases, f"{peg}+alibi-2d", f"{peg}+fire"):
            assert parse_pos_enc(value, family).bias is not None
    with pytest.raises(PosEncError, match="3-D token grid; encoding 'lookhere' runs on 2-D grids"):
        parse_pos_enc("lookhere", VIDEO_ENCODINGS)
    for family in (DETR_ENCODINGS, AIFI_ENCODINGS, VIDEO_ENCODINGS):  # the detectors / video: no table+bias
        with pytest.raises(PosEncError, match="takes no table\\+bias combination"):
            parse_pos_enc("learned+alibi-2d", family)
    with pytest.raises(PosEncError, match="both bias encodings"):
        parse_pos_enc("alibi-2d+fire")


# ----------------------------------------------------------------------------------------- CPVT

SMALL = {"embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 3, "img_size": 32, "patch_size": 8}


@pytest.mark.parametrize("pos_enc", ["alibi-2d", "fire", "lookhere", "peg+alibi-2d", "peg+fire+rope-axial"])
def test_cpvt_one_bias_for_every_block_and_any_size(pos_enc):
    torch.manual_seed(0)
    model = CPVT(**SMALL, pos_enc=pos_enc, global_pool="token", num_reg_tokens=1)
    seen = []
    for blk in model.blocks:
        blk.attn.register_forward_hook(lambda m, args, out: seen.append(args[2]))
    for size in ((32, 32), (24, 56), (40, 16)):
        seen.clear()
        model(torch.randn(2, 3, *size)).sum().backward()
        n = 2 + math.prod(-(-s // 8) for s in size)
        assert len(seen) == 2 and seen[0] is seen[1] and seen[0].shape == (1, 4, n, n)
    if "fire" in pos_enc:
        assert all(p.grad is not None for p in model.attn_bias.parameters())
        assert {"attn_bias.c", "attn_bias.threshold_scale"} <= model.no_weight_decay()
        assert model.lr_layer_id("attn_bias.mlp.0.weight") == 0
    else:
        assert not any("attn_bias" in k for k in model.state_dict())
    # the bias changes the output (ALiBi from the start; FIRE once its MLP is not ~0)
    plain = CPVT(**SMALL, pos_enc=without_bias(pos_enc), global_pool="token", num_reg_tokens=1)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "attn_bias" not in k})
    with torch.no_grad():
        for p in model.attn_bias.parameters():
            p.add_(0.5)
        x = torch.randn(1, 3, 32, 32)
        assert (model.forward_features(x)[0] - plain.forward_features(x)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("pos_enc", BIASES)
def test_cpvt_exports_at_a_second_size(pos_enc):
    torch.manual_seed(0)
    model = CPVT(**SMALL, pos_enc=pos_enc, global_pool="token").eval()
    h, w = torch.export.Dim("h", min=2, max=16), torch.export.Dim("w", min=2, max=16)
    ep = torch.export.export(model, (torch.randn(1, 3, 32, 32),), dynamic_shapes={"x": {2: 8 * h, 3: 8 * w}})
    x = torch.randn(1, 3, 48, 24)
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_cpvt_onnx_at_a_second_size(tmp_path):
    """ONNX through the library's exporter (dynamic H and W), run by onnxruntime at another size.

    ``export_onnx`` exports under ``torch.no_grad()``: with FIRE's parameters requiring grad, the
    float mask requires grad and torch 2.14's ONNX decomposition of that SDPA fails.
    """
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from peg_core.export.onnx import export_onnx

    torch.manual_seed(0)
    for pos_enc in BIASES:
        model = CPVT(**SMALL, pos_enc=pos_enc, global_pool="token").eval()
        h, w = torch.export.Dim("h", min=2, max=16), torch.export.Dim("w", min=2, max=16)
        path = tmp_path / f"{pos_enc}.onnx"
        export_onnx(model, torch.randn(1, 3, 32, 32), path, ({2: 8 * h, 3: 8 * w},), "x", ["logits"], 18, {})
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        x = torch.randn(1, 3, 48, 24)
        got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)


def test_cpvt_bf16_autocast_and_bf16_weights():
    torch.manual_seed(0)
    model = CPVT(**SMALL, pos_enc="peg+fire", global_pool="token").eval()
    x = torch.randn(2, 3, 24, 40)
    ref = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(model(x).float(), ref, atol=0.05, rtol=0.05)
    torch.testing.assert_close(model.to(torch.bfloat16)(x.bfloat16()).float(), ref, atol=0.1, rtol=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("pos_enc", ["alibi-2d", "fire", "lookhere", "peg+alibi-2d"])
def test_classifier_cli_trains_and_evaluates_at_two_other_sizes(tmp_path, pos_enc):
    from peg_core.__main__ import main
    from tests.core.classify_runs import no_peg, tiny

    run = tmp_path / "run"
    flags = tiny(16, 8) if pos_enc.startswith("peg") else no_peg(tiny(16, 8))
    assert main(["train", *flags, "--epochs", "1", "--output-dir", str(run), "--pos-enc", pos_enc]) == 0
    ckpt = read_checkpoint(run / "checkpoint.pth", "classify")
    assert ckpt["model_config"]["pos_enc"] == pos_enc
    assert ("attn_bias.mlp.0.weight" in ckpt["model"]) == (pos_enc == "fire")
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--eval-sizes", "24,40", "--output-dir",
                 str(tmp_path / "ev"), "--no-progress", "--device", "cpu"]) == 0  # fmt: skip
    ev = json.loads((tmp_path / "ev" / "report.json").read_text())["eval"]
    assert list(ev["top1_by_size"]) == ["24", "40"] and all(0 <= v <= 1 for v in ev["top1_by_size"].values())


# ----------------------------------------------------------------------------------------- DETR

DETR_SMALL = dict(
    hidden_dim=32, num_heads=4, enc_layers=2, dec_layers=2, dim_feedforward=64, num_queries=10, dropout=0.0
)


def detr(pos_enc: str, **kw):
    torch.manual_seed(0)
    model, _, _ = build_detr("tiny", pos_enc=pos_enc, num_classes=5, **{**DETR_SMALL, **kw})
    with torch.no_grad():  # non-zero PEGs and a non-trivial FIRE, so the tests see them
        for peg in model.transformer.encoder.pegs.values():
            torch.nn.init.normal_(peg.proj.weight, std=0.3)
        bias = model.transformer.encoder.attn_bias
        if bias is not None and any(True for _ in bias.parameters()):
            for p in bias.mlp.parameters():
                torch.nn.init.normal_(p, std=0.5)
    return model.eval()


def test_detr_biased_attention_matches_the_definition():
    """Float64 from the definition: softmax(q k^T / sqrt(d) + bias, padded keys -inf) v, nn.MultiheadAttention's weights."""
    model = detr("fire").double()
    enc = model.transformer.encoder
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[1, 3:], mask[1, :, 4:] = True, True
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    bias = enc.attn_bias((4, 5), mask, dtype=torch.float64)
    mha = enc.layers[0].self_attn
    got = rotary_self_attention(mha, x, x, None, mask.flatten(1), attn_bias=bias)
    c, h = 32, 4
    wq, wk, wv = mha.in_proj_weight.split(c)
    bq, bk, bv = mha.in_proj_bias.split(c)

    def heads(t):
        return t.reshape(2, 20, h, c // h).transpose(1, 2)

    q, k, v = heads(x @ wq.T + bq), heads(x @ wk.T + bk), heads(x @ wv.T + bv)
    scores = q @ k.transpose(-1, -2) / math.sqrt(c // h) + bias
    scores = scores.masked_fill(mask.flatten(1)[:, None, None, :], float("-inf"))
    want = (scores.softmax(-1) @ v).transpose(1, 2).reshape(
        2, 20, c
    ) @ mha.out_proj.weight.T + mha.out_proj.bias
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # a zero bias: exactly nn.MultiheadAttention
    plain = mha(x, x, x, key_padding_mask=mask.flatten(1), need_weights=False)[0]
    zero = torch.zeros_like(bias)
    torch.testing.assert_close(rotary_self_attention(mha, x, x, None, mask.flatten(1), attn_bias=zero), plain,
                               atol=1e-12, rtol=0)  # fmt: skip


@pytest.mark.parametrize("pos_enc", ["alibi-2d", "fire", "lookhere", "peg+alibi-2d", "peg+fire"])
def test_detr_padding_invariance(pos_enc):
    """An image alone and padded into a batch with a larger one: the same outputs (<= 1e-5).

    The tiny backbone reads no bottom/right padding for sides that are multiples of 16, so the
    difference is the encoder's: a real token's bias must not depend on the padding.
    """
    model = detr(pos_enc)
    small_img, big_img = torch.randn(3, 64, 96), torch.randn(3, 128, 144)
    with torch.no_grad():
        alone = model([small_img])
        batched = model([big_img, small_img])
    diff = max((batched[k][1] - alone[k][0]).abs().max().item() for k in ("pred_logits", "pred_boxes"))
    assert diff <= 1e-5, diff
    # at the transformer: a real 5x7 region padded to 8x10
    t = model.transformer
    src, query = torch.randn(1, 32, 5, 7), torch.randn(10, 32)
    padded = torch.zeros(2, 32, 8, 10)
    padded[0], padded[1, :, :5, :7] = torch.randn(32, 8, 10), src[0]
    mask = torch.ones(2, 8, 10, dtype=torch.bool)
    mask[0], mask[1, :5, :7] = False, False
    with torch.no_grad():
        one = t(src, torch.zeros(1, 5, 7, dtype=torch.bool), query)
        two = t(padded, mask, query)
    assert (two[:, 1] - one[:, 0]).abs().max() <= 1e-5
    # not vacuous: the bias changes the encoder's output
    none = detr(without_bias(pos_enc))
    none.load_state_dict({k: v for k, v in model.state_dict().items() if "attn_bias" not in k})
    with torch.no_grad():
        assert (none([small_img])["pred_logits"] - alone["pred_logits"]).abs().max() > 1e-4


def test_detr_keys_and_one_bias_per_forward():
    model = detr("peg+fire")
    keys = set(model.state_dict())
    assert {"transformer.encoder.attn_bias.mlp.0.weight", "transformer.encoder.attn_bias.c"} <= keys
    assert not any("attn_bias" in k for k in detr("alibi-2d").state_dict())
    calls = []
    model.transformer.encoder.attn_bias.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        model([torch.randn(3, 64, 64)])
    assert len(calls) == 1  # two encoder layers, one bias


DETR_CLI = [
    "--backbone", "tiny", "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1",
    "--dim-feedforward", "64", "--num-queries", "6", "--train-sizes", "64", "--max-size", "64",
    "--val-size", "64", "--total-batch-size", "4", "--workers", "0", "--no-progress", "--device", "cpu",
]  # fmt: skip
RTDETR_CLI = ["--config", "rtdetr_demo_tiny", "--workers", "0", "--no-progress", "--device", "cpu"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "pos_enc", "sizes"),
    [
        ("detr", "alibi-2d", "48,96"),
        ("detr", "fire", "48,96"),
        ("detr", "peg+fire", "48,96"),
        ("detr", "lookhere", "48,96"),
        ("rtdetr", "alibi-2d", "96,128"),
        ("rtdetr", "fire", "96,128"),
        ("rtdetr", "peg+alibi-2d", "96,128"),
        ("rtdetr", "lookhere", "96,128"),
    ],
)
def test_detectors_train_and_evaluate_at_two_other_sizes(coco, tmp_path, arch, pos_enc, sizes):
    from peg_detr.__main__ import main

    run = tmp_path / "run"
    flags = DETR_CLI if arch == "detr" else RTDETR_CLI
    argv = ["train", *flags, "--data-root", str(coco), "--output-dir", str(run), "--epochs", "1",
            "--pos-enc", pos_enc]  # fmt: skip
    assert main(argv) == 0
    ckpt = read_checkpoint(run / "checkpoint.pth", "detect")
    assert ckpt["model_config"]["pos_enc"] == pos_enc
    assert any(k.endswith("attn_bias.mlp.0.weight") for k in ckpt["model"]) == ("fire" in pos_enc)
    ev = tmp_path / "ev"
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--data-root", str(coco), "--output-dir",
                 str(ev), "--eval-sizes", sizes, "--no-progress", "--device", "cpu", "--workers", "0"]) == 0  # fmt: skip
    report = json.loads((ev / "report.json").read_text())["eval"]
    assert set(report["sizes"]) == set(sizes.split(","))


# ------------------------------------------------------------------------------------------ AIFI


@pytest.mark.parametrize("pos_enc", ["alibi-2d", "fire", "lookhere", "peg+fire"])
def test_aifi_adds_one_bias_to_every_layer(pos_enc):
    torch.manual_seed(0)
    aifi = AIFI(32, 4, num_layers=2, pos_enc=pos_enc)
    seen = []
    for layer in aifi.layers:
        layer.self_attn.register_forward_hook(lambda m, args, out: seen.append(args[3]))
    for size in ((5, 7), (4, 4)):
        seen.clear()
        aifi(torch.randn(2, 32, *size)).sum().backward()
        n = math.prod(size)
        assert len(seen) == 2 and seen[0] is seen[1] and seen[0].shape == (1, 4, n, n)
    # the attention: softmax(q k^T / sqrt(d) + bias) v, float64
    attn = aifi.layers[0].self_attn.double()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    bias = aifi.attn_bias((3, 4), dtype=torch.float64)

    def heads(t):
        return t.reshape(2, 12, 4, 8).transpose(1, 2)

    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    want = (
        ((q @ k.transpose(-1, -2) / math.sqrt(8) + bias).softmax(-1) @ v).transpose(1, 2).reshape(2, 12, 32)
    )
    torch.testing.assert_close(attn(x, None, None, bias), attn.o_proj(want), atol=1e-12, rtol=0)


# ------------------------------------------------------------------------ LookHere's layer schedule


def test_lookhere_layer_schedule_reaches_every_block_of_the_2d_families():
    """With ``layer_slopes`` each block of CPVT, DETR's encoder and AIFI gets its own scaled bias."""
    torch.manual_seed(0)
    cpvt = CPVT(**SMALL, pos_enc="lookhere", global_pool="token")
    detr_model = detr("lookhere")
    aifi = AIFI(32, 4, num_layers=2, pos_enc="lookhere")
    cases = [  # (the module that holds attn_bias, the blocks' attentions (DETR: layers), the bias argument)
        (cpvt, [b.attn for b in cpvt.blocks], 2, lambda: cpvt(torch.randn(1, 3, 24, 40))),
        (detr_model.transformer.encoder, list(detr_model.transformer.encoder.layers), 4,
         lambda: detr_model([torch.randn(3, 64, 96)])),
        (aifi, [lay.self_attn for lay in aifi.layers], 3, lambda: aifi(torch.randn(1, 32, 3, 5))),
    ]  # fmt: skip
    for holder, attns, index, run in cases:
        heads = holder.attn_bias.num_heads
        holder.attn_bias = LookHereBias(heads, layer_slopes=(2.0, 0.5), depth=len(attns))
        seen = []
        for attn in attns:
            attn.register_forward_hook(lambda m, a, out, i=index, s=seen: s.append(a[i]))
        with torch.no_grad():
            run()
        assert len(seen) == len(attns) == 2
        first, last = seen
        visible = first > -1e30
        assert torch.equal(visible, last > -1e30)  # the same directions masked
        torch.testing.assert_close(last[visible] * 4, first[visible])  # slopes 2.0 then 0.5


# ----------------------------------------------------------------------------------------- video


def video(pos_enc: str, attention: str = "joint") -> VideoTransformer:
    torch.manual_seed(0)
    return VideoTransformer(embed_dim=32, depth=2, num_heads=4, num_classes=3, num_frames=4, img_size=32,
                            tubelet=(2, 8, 8), pos_enc=pos_enc, attention=attention, global_pool="token")  # fmt: skip


@pytest.mark.parametrize("pos_enc", ["alibi-2d", "fire", "peg3d+fire"])
@pytest.mark.parametrize("attention", ["joint", "divided"])
def test_video_runs_any_clip_and_splits_the_bias_in_divided_attention(pos_enc, attention):
    model = video(pos_enc, attention)
    for clip in ((4, 32, 32), (8, 24, 40), (2, 16, 16)):
        model(torch.randn(2, 3, *clip)).sum().backward()
    if "fire" in pos_enc:
        assert all(p.grad is not None for p in model.attn_bias.parameters())
    size = (4, 3, 5)
    biases = model._attn_biases(size, torch.zeros(1))
    full = model.attn_bias(size)[0].reshape(4, 4, 3, 5, 4, 3, 5)  # (heads, T, H, W, T, H, W)
    if attention == "joint":
        assert biases.shape == (1, 4, 61, 61)
        return
    bias_t, bias_s = biases
    assert bias_t.shape == (1, 4, 4, 4) and bias_s.shape == (1, 4, 16, 16)
    if (
        pos_enc == "alibi-2d"
    ):  # the temporal part: |dt| at a fixed (h, w); the spatial part: (h, w) in one frame
        torch.testing.assert_close(bias_t[0], full[:, :, 0, 0, :, 0, 0])
        torch.testing.assert_close(bias_s[0, :, 1:, 1:], full[:, 0, :, :, 0].reshape(4, 15, 15))
    assert not bias_s[0, :, 0].any() and not bias_s[0, :, :, 0].any()  # the class token: unbiased


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from tests.video.runs import synthetic_set

    return synthetic_set(tmp_path_factory.mktemp("clips"), num_train=8, num_val=4, frames=24, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("pos_enc", ["alibi-2d", "fire"])
def test_video_cli_trains_and_evaluates_at_two_other_sizes(clips, tmp_path, pos_enc):
    from peg_video.__main__ import main
    from tests.video.runs import TINY

    run = tmp_path / "run"
    data = ["--train-ann", str(clips / "train.csv"), "--val-ann", str(clips / "val.csv")]
    assert main(["train", *data, "--output-dir", str(run), *TINY, "--epochs", "1", "--pos-enc", pos_enc]) == 0
    ckpt = read_checkpoint(run / "checkpoint.pth", "video")
    assert ckpt["model_config"]["pos_enc"] == pos_enc
    for frames, crop in (("8", "40"), ("6", "24")):
        ev = tmp_path / f"ev{frames}"
        assert main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--val-ann", str(clips / "val.csv"),
                     "--num-frames", frames, "--crop", crop, "--output-dir", str(ev), "--no-progress",
                     "--workers", "0"]) == 0  # fmt: skip
        metrics = json.loads((ev / "report.json").read_text())["eval"]
        assert metrics["num_frames"] == int(frames) and 0 <= metrics["top1"] <= 1
