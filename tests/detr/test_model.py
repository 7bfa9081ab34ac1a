"""DETR model: shapes per position encoding, input forms, mask invariance, frozen layers, optimiser groups."""

from __future__ import annotations

import json

import pytest
import torch

from peg_detr import ImageBatch, build_detr, pad_images
from peg_detr.task import optimizer_groups

SMALL = dict(
    hidden_dim=32, num_heads=4, enc_layers=2, dec_layers=2, dim_feedforward=64, num_queries=10, dropout=0.0
)


def small(pos_enc: str = "peg", **kw):
    opts = {**SMALL, "learned_grid": (6, 8), **kw}
    model, criterion, post = build_detr("tiny", pos_enc=pos_enc, num_classes=5, **opts)
    return model.eval(), criterion, post


def test_shapes_non_square():
    """A padded batch of odd, non-square images (every encoding at any size: test_archs.py)."""
    model, _, _ = small("peg")
    images = [torch.randn(3, 96, 160), torch.randn(3, 75, 53)]  # odd sides too
    with torch.no_grad():
        out = model(images)
    assert out["pred_logits"].shape == (2, 10, 6)
    assert out["pred_boxes"].shape == (2, 10, 4)
    assert len(out["aux_outputs"]) == 1
    assert out["aux_outputs"][0]["pred_logits"].shape == (2, 10, 6)
    assert out["aux_outputs"][0]["pred_boxes"].shape == (2, 10, 4)
    assert ((out["pred_boxes"] > 0) & (out["pred_boxes"] < 1)).all()
    assert torch.isfinite(out["pred_logits"]).all()


def test_no_aux_outputs_without_aux_loss():
    model, criterion, _ = small(aux_loss=False)
    out = model(torch.randn(1, 3, 64, 96))
    assert "aux_outputs" not in out
    assert set(criterion.weight_dict) == {"loss_ce", "loss_bbox", "loss_giou"}


def test_input_forms_agree():
    """A list of images, the same padded ImageBatch, and a plain tensor (one size) give the same outputs."""
    model, _, _ = small("peg")
    images = [torch.randn(3, 80, 112), torch.randn(3, 128, 96)]
    with torch.no_grad():
        a = model(images)
        b = model(pad_images(images))
        stacked = torch.stack([images[0], torch.randn(3, 80, 112)])
        c = model(stacked)
        d = model(ImageBatch(stacked, torch.zeros(2, 80, 112, dtype=torch.bool)))
    torch.testing.assert_close(a["pred_logits"], b["pred_logits"], rtol=0, atol=0)
    torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], rtol=0, atol=0)
    torch.testing.assert_close(c["pred_logits"], d["pred_logits"], rtol=0, atol=0)


MASK_CASES = [(p, k) for p in ("peg", "sine", "learned", "none") for k in ("sine", "none")] + [
    ("peg", "peg-output")
]


@pytest.mark.parametrize(("pos_enc", "key_pos"), MASK_CASES)
def test_mask_invariance(pos_enc, key_pos):
    """An image's outputs alone equal its outputs when padded into a batch with a larger image.

    The tiny backbone (3×3 stride-2 convolutions) reads no bottom/right padding
    for sides that are multiples of 16, so this tests the mask handling of the
    encoder (PEG zero padding, sine/learned codes from the mask, attention key
    padding) and of the decoder's cross-attention exactly.
    """
    model, _, _ = small(pos_enc, decoder_key_pos=key_pos)
    with torch.no_grad():
        # Non-zero PEG so the test sees its mask handling.
        for peg in model.transformer.encoder.pegs.values():
            torch.nn.init.normal_(peg.proj.weight, std=0.3)
        small_img, big_img = torch.randn(3, 64, 96), torch.randn(3, 128, 144)
        alone = model([small_img])
        batched = model([big_img, small_img])
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(batched[key][1], alone[key][0], rtol=0, atol=2e-5)
    # And the outputs do depend on the content (the test is not vacuous).
    assert (batched["pred_logits"][0] - alone["pred_logits"][0]).abs().max() > 1e-3


def test_peg_changes_output_and_position_matters():
    """With a non-zero PEG the encoder output differs from the 'none' model with the same weights."""
    peg_model, _, _ = small("peg")
    none_model, _, _ = small("none")
    none_model.load_state_dict(peg_model.state_dict(), strict=False)
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        a, b = peg_model(x)["pred_logits"], none_model(x)["pred_logits"]
    assert (a - b).abs().max() > 1e-4


def test_build_config_rebuilds_the_same_model():
    """``model.build_config`` survives json and rebuilds a model with the same keys, shapes and outputs."""
    model, _, _ = small("learned", peg_at=[1], learned_grid=[5, 7])
    config = json.loads(json.dumps(model.build_config))
    assert config["pos_enc"] == "learned" and config["learned_grid"] == [5, 7] and config["hidden_dim"] == 32
    clone, _, _ = build_detr(**config)
    clone.load_state_dict(model.state_dict())  # strict: same keys and shapes
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        torch.testing.assert_close(clone.eval()(x)["pred_boxes"], model(x)["pred_boxes"], rtol=0, atol=0)


def test_peg_at_several_layers_keys():
    model, _, _ = small("peg", peg_at=(0, 1), peg_kernel_size=5)
    keys = {k for k in model.state_dict() if ".pegs." in k}
    assert keys == {f"transformer.encoder.pegs.{i}.proj.{p}" for i in (0, 1) for p in ("weight", "bias")}
    assert model.state_dict()["transformer.encoder.pegs.1.proj.weight"].shape == (32, 1, 5, 5)


def test_bad_options():
    with pytest.raises(ValueError, match="peg-output"):
        small("sine", decoder_key_pos="peg-output")
    with pytest.raises(ValueError, match="decoder_key_pos"):
        small("peg", decoder_key_pos="learned")
    with pytest.raises(ValueError, match="peg_at"):
        small("peg", peg_at=(2,))
    with pytest.raises(ValueError, match="pos_enc"):
        small("rope")
    with pytest.raises(ValueError, match="backbone"):
        build_detr("vgg16", **SMALL)
    with pytest.raises(ValueError, match="dilation"):
        build_detr("tiny", dilation=True, **SMALL)
    with pytest.raises(TypeError):
        build_detr("tiny", hidden_dimension=32)
    model, _, _ = small()
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        model(torch.randn(3, 64, 64))


def test_resnet18_frozen_stem_and_gradients():
    """Stem and layer1 are frozen, layer2-4 and the transformer get finite gradients."""
    with pytest.warns(UserWarning, match="random weights"):
        model, criterion, _ = build_detr("resnet18", pos_enc="peg", num_classes=3, **SMALL)
    names = dict(model.named_parameters())
    assert not names["backbone.0.body.conv1.weight"].requires_grad
    assert not names["backbone.0.body.layer1.0.conv1.weight"].requires_grad
    assert names["backbone.0.body.layer2.0.conv1.weight"].requires_grad
    assert "backbone.0.body.bn1.running_mean" in model.state_dict()  # FrozenBatchNorm2d buffers
    assert not any(k.startswith("backbone.0.body.fc") for k in model.state_dict())
    model.train()
    out = model([torch.randn(3, 64, 96), torch.randn(3, 96, 64)])
    targets = [
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3]])},
        {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.6, 0.2, 0.2], [0.7, 0.3, 0.3, 0.4]])},
    ]
    criterion.total(criterion(out, targets)).backward()
    for key in (
        "backbone.0.body.layer4.1.conv2.weight",
        "transformer.encoder.pegs.0.proj.weight",
        "input_proj.weight",
    ):
        g = names[key].grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, key
    assert names["backbone.0.body.conv1.weight"].grad is None


def test_optimizer_groups_split_backbone_and_decay_all():
    model, _, _ = small()
    groups = optimizer_groups(model, lr_backbone=1e-5, weight_decay=1e-4)
    assert [g["name"] for g in groups] == ["main", "backbone"] and groups[1]["lr"] == 1e-5
    assert all(g["weight_decay"] == 1e-4 for g in groups)  # DETR decays norms and biases too
    backbone_ids = {id(p) for p in model.backbone.parameters()}
    assert all(id(p) in backbone_ids for p in groups[1]["params"])
    assert not any(id(p) in backbone_ids for p in groups[0]["params"])
    n_trainable = sum(p.requires_grad for p in model.parameters())
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == n_trainable
    opt = torch.optim.AdamW(groups, lr=1e-4)
    assert [g["lr"] for g in opt.param_groups] == [1e-4, 1e-5]
    frozen, _, _ = small(train_backbone=False)
    assert len(optimizer_groups(frozen, 1e-5, 1e-4)) == 1


def test_optimizer_state_of_old_checkpoints_loads():
    """An optimiser state saved with the former ``peg_detr.models.param_groups`` layout resumes."""
    model, _, _ = small()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    old_groups = [
        {"params": [p for n, p in trainable if not n.startswith("backbone.")], "lr": 1e-4, "weight_decay": 1e-4,
         "name": "transformer_heads"},
        {"params": [p for n, p in trainable if n.startswith("backbone.")], "lr": 1e-5, "weight_decay": 1e-4,
         "name": "backbone"},
    ]  # fmt: skip
    old = torch.optim.AdamW(old_groups, lr=1e-4, weight_decay=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) if p.requires_grad else None
    old.step()
    saved = old.state_dict()
    new = torch.optim.AdamW(optimizer_groups(model, 1e-5, 1e-4), lr=1e-4, weight_decay=1e-4)
    new.load_state_dict(saved)
    assert [g["lr"] for g in new.param_groups] == [1e-4, 1e-5]
    for group in new.param_groups:
        for p in group["params"]:
            assert new.state[p]["exp_avg"].shape == p.shape
    by_id = {id(p): p for _, p in trainable}
    assert all(id(p) in by_id for g in new.param_groups for p in g["params"])
    # the same parameters, in the same order: the restored moments sit on the parameters that made them
    for p_old, p_new in zip(
        (p for g in old.param_groups for p in g["params"]), (p for g in new.param_groups for p in g["params"])
    ):
        assert p_old is p_new and torch.equal(old.state[p_old]["exp_avg"], new.state[p_new]["exp_avg"])


def test_bf16_autocast_forward_and_loss():
    """Autocast (what --amp bf16 does on GPU) runs end to end; boxes and losses stay float32."""
    model, criterion, post = small("peg", decoder_key_pos="peg-output")
    model.train()
    targets = [
        {"labels": torch.tensor([1, 4]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.2, 0.3, 0.1, 0.2]])}
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model([torch.randn(3, 64, 96)])
        losses = criterion(out, targets)
    assert out["pred_boxes"].dtype == torch.float32
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values())
    criterion.total(losses).backward()
    assert torch.isfinite(model.transformer.encoder.pegs["0"].proj.weight.grad).all()
    assert post(out, torch.tensor([[120, 180]]))[0]["boxes"].dtype == torch.float32


def test_backbone_weights_from_local_file(tmp_path):
    """An ImageNet-style resnet18 file (with its fc) initialises the backbone; a wrong file is named in the error."""
    import torchvision

    reference = torchvision.models.resnet18(weights=None)
    path = tmp_path / "resnet18.pth"
    torch.save({"state_dict": reference.state_dict()}, path)
    model, _, _ = build_detr("resnet18", pos_enc="sine", num_classes=3, backbone_weights=path, **SMALL)
    body = model.backbone[0].body
    torch.testing.assert_close(body.layer3[1].conv2.weight, reference.layer3[1].conv2.weight, rtol=0, atol=0)
    torch.testing.assert_close(body.bn1.running_var, reference.bn1.running_var, rtol=0, atol=0)
    bad = tmp_path / "bad.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, bad)
    with pytest.raises(ValueError, match=r"do not match ResNet: missing .*: .*bad\.pth$"):
        build_detr("resnet18", backbone_weights=bad, **SMALL)


def test_pre_norm_adds_encoder_norm_only_then():
    post, _, _ = small("sine")
    pre, _, _ = small("sine", pre_norm=True)
    assert not any(k.startswith("transformer.encoder.norm.") for k in post.state_dict())
    assert {k for k in pre.state_dict() if k.startswith("transformer.encoder.norm.")} == {
        "transformer.encoder.norm.weight",
        "transformer.encoder.norm.bias",
    }
    with torch.no_grad():
        out = pre([torch.randn(3, 48, 80)])
    assert out["pred_boxes"].shape == (1, 10, 4) and torch.isfinite(out["pred_logits"]).all()
