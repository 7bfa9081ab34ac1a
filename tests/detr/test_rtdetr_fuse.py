"""``fuse_for_deploy``: RT-DETR with conv + BN folded and RepVGG blocks merged equals the unfused model.

Two models with random BN statistics and affine weights (identity BNs would hide a wrong fold) and
random box heads: the tiny backbone with frozen BN and a trained-looking PEG, and R18vd (trainable
BN, RT-DETR's ``sincos``, CSP expansion 0.5).  Logits and boxes must equal the unfused model's in
eval mode within 1e-4 at a square and a non-square size, after a check that the top-K query
selection has no near tie (rounding could otherwise swap two cells).  ``python -m peg_detr export``
fuses an RT-DETR checkpoint by default; the graph holds no BatchNormalization and onnxruntime
equals the unfused PyTorch model at two other sizes.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT
from peg_detr.__main__ import main as cli
from peg_detr.export import deploy_form
from peg_detr.model import build_model
from peg_detr.models.rtdetr import FusedConv, fuse_for_deploy, fusion_stats
from peg_detr.models.rtdetr.fuse import fold_conv_bn
from tests.detr.rtdetr_checks import outputs_and_cell_scores, randomise_norms_and_heads, topk_gap

SIZES = [(128, 128), (96, 160)]
TINY = {"arch": "rtdetr", "backbone": "tiny", "pos_enc": "peg", "num_classes": 4, "hidden_dim": 32,
        "num_heads": 2, "dim_feedforward": 64, "dec_layers": 2, "encoder_expansion": 0.5, "num_queries": 20,
        "num_denoising": 0, "freeze_backbone_bn": True}  # fmt: skip
R18VD = {"arch": "rtdetr", "backbone": "r18vd", "pos_enc": "sincos", "num_classes": 5, "dec_layers": 3,
         "encoder_expansion": 0.5, "num_queries": 30, "num_denoising": 0}  # fmt: skip
# conv + BN pairs: backbone = 3 stem + 4 stages x (2 convs per block x blocks + 1 projection);
# encoder = 3 input projections + 2 lateral + 2 downsample + 4 CSP x (conv1, conv2, conv3 + 3 RepVGG
# x 2 branches); decoder = 3 input projections.  Fused convs = pairs - 12 (a RepVGG block is one).
PAIRS = {"tiny": 15 + 43 + 3, "r18vd": 23 + 43 + 3}


def _model(config: dict, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # "ResNet starts from random weights"
        warnings.simplefilter("ignore", UserWarning)
        model, _, _ = build_model(config)
    randomise_norms_and_heads(model, seed)
    with torch.no_grad():  # a trained-looking PEG (it starts at zero, i.e. absent)
        for name, p in model.named_parameters():
            if ".pegs." in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.1)
    return model.eval()


@pytest.fixture(scope="module", params=[TINY, R18VD], ids=["tiny", "r18vd"])
def pair(request):
    model = _model(request.param, seed=7)
    return request.param["backbone"], model, fuse_for_deploy(model)


def _assert_same_outputs(reference, x, got, got_scores, slack=1e-6):
    """``got`` (outputs, cell scores ``(B, S)``) equal ``reference(x)``'s within 1e-4; no near tie in its top-K.

    ``slack``: how far the scores behind ``got`` may be from ``got_scores`` (0 when they are its own).
    """
    want, scores = outputs_and_cell_scores(reference, x)
    margin = topk_gap(scores, reference.num_queries + 1)
    score_diff = float((got_scores - scores).abs().max())
    # a swap of two selected cells needs a gap smaller than twice the scores' difference
    assert margin > 2 * score_diff + slack, f"near-tied top-K at {tuple(x.shape)}: not a valid check"
    torch.testing.assert_close(got["pred_logits"], want["pred_logits"], atol=1e-4, rtol=0)
    torch.testing.assert_close(got["pred_boxes"], want["pred_boxes"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("size", SIZES)
def test_fused_model_equals_the_unfused_one(pair, size):
    _, model, fused = pair
    x = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(size[1]))
    _assert_same_outputs(model, x, *outputs_and_cell_scores(fused, x))


def test_every_norm_is_folded_and_every_repvgg_block_merged(pair):
    name, model, fused = pair
    stats = fusion_stats(fused)
    assert (stats.conv_bn_pairs, stats.repvgg_blocks, stats.convs) == (PAIRS[name], 12, PAIRS[name] - 12)
    norms = (nn.BatchNorm2d, FrozenBatchNorm2d)
    assert not any(isinstance(m, norms) for m in fused.modules())
    assert sum(isinstance(m, norms) for m in model.modules()) == PAIRS[name]  # the source is untouched

    def convs(m):
        return sum(isinstance(c, nn.Conv2d) for c in m.modules())

    assert convs(fused) == convs(model) - 12  # PEG convs (tiny) stay as they are
    assert all(c.conv.bias is not None and not c.conv.weight.requires_grad for c in fused.modules()
               if isinstance(c, FusedConv))  # fmt: skip


def test_fused_model_refuses_training_and_other_models():
    model = _model(TINY, seed=4)
    fused = fuse_for_deploy(model, inplace=True)
    assert fused is model and fusion_stats(model).repvgg_blocks == 12
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = fused(x)["pred_logits"]
    with pytest.raises(RuntimeError, match=r"inference-only.*call \.eval\(\)"):
        fused.train()
    fused.eval()  # eval mode stays allowed, and computes what it computed before
    with torch.no_grad():
        assert torch.equal(fused(x)["pred_logits"], before)
    assert fusion_stats(fuse_for_deploy(fused)) == fusion_stats(fused)  # fusing again changes nothing
    with pytest.raises(TypeError, match="takes an RT-DETR model"):
        fuse_for_deploy(nn.Conv2d(3, 3, 1))


def _checkpoint(tmp_path, config: dict, seed: int, first_id: int = 0):
    """The model and its checkpoint; its categories' ids start at ``first_id`` (1: label 0 names none)."""
    model = _model(config, seed)
    path = tmp_path / f"{config['arch']}.pth"
    meta = {"categories": [{"id": i, "name": f"c{i}"} for i in range(first_id, config["num_classes"])]}
    torch.save(
        {"format": CHECKPOINT_FORMAT, "task": "detect", "model": model.state_dict(),
         "model_config": model.build_config, "meta": meta},
        path,
    )  # fmt: skip
    return model, path


@pytest.mark.slow  # ~10 s on one CPU: torch.export capture and the ONNX decompositions
def test_export_fuses_rtdetr_and_onnxruntime_equals_the_unfused_model(tmp_path, capsys):
    """The suite's one ``python -m peg_detr export`` of an RT-DETR at sizes other than the example's (the
    README's quick start exports a trained one with ``--check``): fused by default, no BatchNormalization
    left, and onnxruntime equals the unfused model at another batch and size.  Its categories are ids 1..3
    (``ids`` labels): label 0 names none, and the graph masks its logit at float32's lowest."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    model, ckpt = _checkpoint(tmp_path, TINY, seed=7, first_id=1)
    out = tmp_path / "fused.onnx"
    assert cli(["export", str(ckpt), str(out), "--height", "96", "--width", "128", "--check"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["fused"] == {
        "convs": PAIRS["tiny"] - 12,
        "conv_bn_pairs": PAIRS["tiny"],
        "repvgg_blocks": 12,
    }
    assert report["max_abs_diff"] <= 1e-4
    graph = onnx.load(str(out))
    ops = [n.op_type for n in graph.graph.node] + [n.op_type for f in graph.functions for n in f.node]
    assert "BatchNormalization" not in ops
    fused = fuse_for_deploy(model)
    assert ops.count("Conv") == sum(isinstance(c, nn.Conv2d) for c in fused.modules())
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    lowest = torch.finfo(torch.float32).min
    for b, (h, w) in ((1, (128, 128)), (3, (160, 96))):
        x = torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(h))
        logits, boxes = session.run(None, {"images": x.numpy()})
        logits = torch.from_numpy(logits)
        assert logits.shape == (b, TINY["num_queries"], TINY["num_classes"])
        assert (logits[..., 0] == lowest).all()  # label 0: no category
        # labels 1..3 (and the boxes) equal the unfused model's; column 0 is compared as the model's
        with torch.no_grad():
            label0 = model(x)["pred_logits"][..., :1]
        got = {"pred_logits": torch.cat([label0, logits[..., 1:]], -1), "pred_boxes": torch.from_numpy(boxes)}
        # onnxruntime's scores are not an output: the fused PyTorch model's, give or take ~1e-6
        _assert_same_outputs(model, x, got, outputs_and_cell_scores(fused, x)[1], slack=4e-6)


def test_fuse_flag_by_arch(tmp_path, capsys):
    model = _model(TINY, seed=6)
    assert deploy_form(model, "rtdetr", False) == (model, None)
    fused, stats = deploy_form(model, "rtdetr", None)  # the default fuses
    assert stats["repvgg_blocks"] == 12 and fusion_stats(fused).convs == stats["convs"]
    assert deploy_form(model, "detr", None) == (model, None)
    _, ckpt = _checkpoint(tmp_path, {"arch": "detr", "backbone": "tiny", "pos_enc": "none", "num_classes": 3,
                                     "num_queries": 5, "hidden_dim": 32, "num_heads": 2, "enc_layers": 1,
                                     "dec_layers": 1, "dim_feedforward": 32}, seed=0)  # fmt: skip
    assert cli(["export", str(ckpt), str(tmp_path / "detr.onnx"), "--fuse"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: applies to the RT-DETR family only") and err.count("\n") == 1, err
    assert not (tmp_path / "detr.onnx").exists()


def test_fold_by_hand_and_its_errors():
    conv = nn.Conv2d(1, 1, 1, bias=False)
    norm = nn.BatchNorm2d(1, eps=1.0).eval()
    with torch.no_grad():
        conv.weight.fill_(2.0)
        norm.running_mean.fill_(1.0)
        norm.running_var.fill_(3.0)  # sqrt(3 + eps) = 2
        norm.weight.fill_(0.5)
        norm.bias.fill_(1.0)
    folded = fold_conv_bn(conv, norm)  # (2x - 1) / 2 * 0.5 + 1 = 0.5x + 0.75
    assert folded.weight.item() == 0.5 and folded.bias.item() == 0.75
    with pytest.raises(ValueError, match="without running statistics"):
        fold_conv_bn(conv, nn.BatchNorm2d(1, track_running_stats=False))
    with pytest.raises(TypeError, match="got GroupNorm"):
        fold_conv_bn(conv, nn.GroupNorm(1, 1))
