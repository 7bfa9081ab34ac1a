"""``peg_detr.from_hf`` / ``export_hf_dfine`` against transformers' ``DFineForObjectDetection``.

Random D-FINE models (a tiny HGNetV2 config, hidden 32, 3 decoder layers, 8 bins, per-level
points ``[3, 4, 2]``) are saved with ``save_pretrained`` and rebuilt by ``from_hf``: logits and
boxes equal (<= 1e-4) at 128x128 and 96x160.  Every float tensor of the random model is perturbed
(the box heads, LQE, gates and sampling offsets start at zero, BN statistics at identity), so the
encoder's maps depend on the image.  Where the top-K query selection near-ties on random weights
(top ``Q + 1`` cell scores closer than 4e-6, :func:`tests.detr.rtdetr_checks.topk_margin`) the
final outputs are not comparable; every case compares the encoder's output maps and the encoder
head's logits on every cell before the top-K, and the final logits and boxes on the first of a
few random inputs without a near tie (required for the main model at both sizes).
Variants: two levels (D-FINE N's layout), an encoder wider than the decoder (D-FINE X's
projection), trainable backbone norms.  The export back loads with ``from_pretrained`` and computes
the same.  (A built model's export, and ``pos_enc="peg"`` equal to ``"none"`` as read: ``test_archs.py``.)
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.interop.io import WeightsError
from peg_detr import from_hf
from peg_detr.interop import export_hf_dfine
from peg_detr.models.dfine import DFINE
from tests.detr.rtdetr_checks import topk_margin

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")

SIZES = [(128, 128), (96, 160)]
TOL = 1e-4


def _config(levels: int = 3, **overrides):
    """A tiny ``DFineConfig``: HGNetV2 with 4 stages of 1 block, widths 16-64."""
    backbone = transformers.HGNetV2Config(
        stem_channels=[3, 8, 8], stage_in_channels=[8, 16, 32, 64], stage_mid_channels=[8, 8, 16, 16],
        stage_out_channels=[16, 32, 64, 64], hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1],
        stage_num_blocks=[1, 1, 1, 1], stage_numb_of_layers=[2, 2, 2, 2],
        stage_downsample=[False, True, True, True], stage_light_block=[False, False, True, True],
        stage_kernel_size=[3, 3, 5, 5], use_learnable_affine_block=True,
        out_indices=[2, 3, 4] if levels == 3 else [3, 4],
    )  # fmt: skip
    widths = [32, 64, 64][-levels:]
    hidden = overrides.pop("encoder_hidden_dim", 32)
    options = dict(
        backbone_config=backbone, encoder_in_channels=widths, feat_strides=[8, 16, 32][-levels:],
        encode_proj_layers=[levels - 1], encoder_hidden_dim=hidden, d_model=32,
        decoder_in_channels=[hidden] * levels, num_feature_levels=levels, encoder_ffn_dim=64, decoder_ffn_dim=64,
        encoder_attention_heads=4, decoder_attention_heads=4, decoder_layers=3, num_queries=20, max_num_bins=8,
        decoder_n_points=[3, 4, 2][:levels], num_labels=5, hidden_expansion=0.5, depth_mult=0.34,
        lqe_hidden_dim=16,
    )  # fmt: skip
    return transformers.DFineConfig(**{**options, **overrides})


def _save_random(config, folder, seed: int = 0):
    """A random ``DFineForObjectDetection`` with every float tensor perturbed, saved to ``folder``."""
    torch.manual_seed(seed)
    model = transformers.DFineForObjectDetection(config).eval()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point() or name.endswith(("up", "reg_scale", "num_points_scale")):
                continue
            if name.endswith("running_var"):
                t.uniform_(0.5, 1.5)
            else:
                t.add_(torch.randn_like(t) * 0.1)
        # transformers draws BN weights near 0: each BN would shrink the maps ~100x and the cell
        # scores would barely depend on the image (near-tied top-K); weights near 1 keep them apart,
        # and its N(0, 0.01) convolutions shrink the signal at every layer the same way
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d) or "FrozenBatchNorm" in type(module).__name__:
                module.weight.uniform_(0.5, 1.5)
            elif isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("dfine_hf")
    hf = _save_random(_config(), path)
    return path, hf


def _compare(hf, ours, size) -> tuple[float, float] | None:
    """Max differences of logits and boxes, or None when every input tried near-ties the top-K.

    Always compared first (they do not depend on the top-K): the encoder's output maps and the
    encoder head's logits on every cell, before the selection.  The final outputs are compared on
    the first of a few random inputs whose top ``Q + 1`` cell scores are at least 4e-6 apart
    (two backends may swap closer cells).
    """
    for seed in range(4):
        torch.manual_seed(seed)
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            ref = hf(pixel_values=x)
            maps = ours.encoder(ours.backbone(x))
            _, cell_logits, _ = ours.decoder.score_cells(*ours.decoder.flatten_features(maps))
        for mine, theirs in zip(maps, ref.encoder_last_hidden_state):
            assert (mine - theirs).abs().max() <= TOL
        assert (cell_logits - ref.enc_outputs_class).abs().max() <= TOL
        if topk_margin(ours, x) > 4e-6:
            with torch.no_grad():
                out = ours(x)
            return (
                (out["pred_logits"] - ref.logits).abs().max().item(),
                (out["pred_boxes"] - ref.pred_boxes).abs().max().item(),
            )
    return None


@pytest.mark.parametrize("size", SIZES)
def test_same_outputs_as_transformers(folder, size):
    path, hf = folder
    model, report = from_hf(path)
    assert isinstance(model, DFINE) and not model.training
    assert not report.converted and not report.missing
    diffs = _compare(hf, model, size)
    assert diffs is not None, "every input near-ties the top-K selection"
    assert max(diffs) <= TOL, diffs


@pytest.mark.parametrize(
    "levels, overrides",
    [
        (2, {}),  # D-FINE N: strides 16 / 32
        (3, {"encoder_hidden_dim": 48}),  # D-FINE X: the decoder projects the encoder's maps
        (3, {"freeze_backbone_batch_norms": False, "decoder_n_points": 4}),
    ],
    ids=["two-levels", "decoder-projection", "trainable-norms"],
)
def test_variants(tmp_path, levels, overrides):
    config = _config(levels, **dict(overrides))
    if "encoder_hidden_dim" in overrides:
        config.encoder_attention_heads = 4
    hf = _save_random(config, tmp_path)
    model, _ = from_hf(tmp_path)
    diffs = _compare(hf, model, (96, 160))  # None: near ties everywhere, the encoder side was compared
    assert diffs is None or max(diffs) <= TOL, diffs


def test_export_back(folder, tmp_path):
    path, _ = folder
    model, _ = from_hf(path)
    export_hf_dfine(model, tmp_path / "out", {0: "cat"})
    back = transformers.DFineForObjectDetection.from_pretrained(tmp_path / "out").eval()
    assert back.config.id2label[0] == "cat"
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        a, b = back(pixel_values=x), model(x)
    assert (a.logits - b["pred_logits"]).abs().max() <= TOL
    assert (a.pred_boxes - b["pred_boxes"]).abs().max() <= TOL
    peg, _ = from_hf(path, pos_enc="peg")
    with pytest.raises(ValueError, match="sincos"):
        export_hf_dfine(peg, tmp_path / "peg")


def test_config_errors_name_the_field(folder, tmp_path):
    path, _ = folder
    config = json.loads((path / "config.json").read_text())
    for field, value in [("eval_idx", 0), ("decoder_method", "discrete"), ("encoder_in_channels", [1, 2, 3])]:
        bad = tmp_path / field
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**config, field: value}))
        (bad / "model.safetensors").symlink_to(path / "model.safetensors")
        with pytest.raises(WeightsError, match=field):
            from_hf(bad)
