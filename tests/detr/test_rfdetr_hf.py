"""RF-DETR from transformers' ``RfDetrForObjectDetection``: the same logits and boxes, and the PEG variant.

A tiny random ``RfDetrConfig`` (a 4-block ViT of width 32, patch 4, 2 x 2 windows, a 14 x 14 table;
2 decoder layers; 3 Group DETR groups of 10 queries), every parameter perturbed so that no
zero-initialised head (transformers zeroes the box heads' last layers) hides a mismatch, written
with ``save_pretrained`` and read back by :func:`peg_detr.interop.hf_rfdetr.rfdetr_from_hf`.

The query selection is a top-k over the cells' class scores: on random weights two cells could
tie and make the two implementations pick different queries.  So the projector's map and the
pre-top-k scores of group 0 (what precedes the selection) are compared first: a tie would show
as equal scores with different outputs rather than as a silent mismatch (none occurs at this seed;
the perturbed heads give every cell a distinct score).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peg_core.errors import InputError
from peg_detr.interop.hf_rfdetr import (
    RFDETR_FILE_KEYS,
    load_rfdetr_state,
    rfdetr_from_hf,
    rfdetr_from_hf_config,
    rfdetr_hf_to_ours,
    rfdetr_ours_to_hf,
)
from peg_detr.models.rfdetr import build_windowed_vit, from_windows, to_windows
from peg_detr.models.rfdetr.backbone import IMAGENET_MEAN, IMAGENET_STD, window_token_order, windows_to_map
from peg_detr.models.rfdetr.decoder import cell_proposals
from tests.detr.rtdetr_checks import tiny_rfdetr_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.rf_detr")

TOL = 1e-4
NATIVE = (56, 56)  # the table's 14 x 14 grid at patch 4
NON_SQUARE = (48, 80)  # 12 x 20 patches: the 2 x 2 windows divide it, the table is resized


def _config(**overrides):
    return tiny_rfdetr_config(transformers, **overrides)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> tuple[object, Path]:
    torch.manual_seed(0)
    model = transformers.RfDetrForObjectDetection(_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    folder = tmp_path_factory.mktemp("rfdetr")
    model.save_pretrained(folder)
    return model, folder


def _hf_pixels(x: torch.Tensor) -> torch.Tensor:
    """transformers' model takes the standardised image (its processor normalises); ours takes [0, 1] pixels."""
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    return (x - mean) / std


def _group0_scores(model, memory: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Our pre-top-k class scores of group 0 ``(B, S)`` (invalid cells -inf)."""
    dec = model.decoder
    _, valid = cell_proposals([shape])
    cells = dec.enc_output_norm[0](dec.enc_output[0](memory * valid))
    return dec.enc_out_class_embed[0](cells).masked_fill(~valid, float("-inf")).max(-1).values


def _hf_group0_scores(hf, feat: torch.Tensor) -> torch.Tensor:
    memory = feat.flatten(2).transpose(1, 2)
    mask = torch.ones(memory.shape[:2], dtype=torch.bool)
    query, _, invalid = hf.model.gen_encoder_output_proposals(memory, ~mask, [tuple(feat.shape[-2:])])
    cells = hf.model.enc_output_norm[0](hf.model.enc_output[0](query))
    return hf.model.enc_out_class_embed[0](cells).masked_fill(invalid, float("-inf")).max(-1).values


@pytest.mark.parametrize("size", [NATIVE, NON_SQUARE], ids=["native", "non-square"])
def test_equal_to_transformers_in_eval(hf_folder, size) -> None:
    hf, folder = hf_folder
    ours, report = rfdetr_from_hf(folder)
    assert not report.missing, report.missing
    assert list(report.skipped) == ["backbone.0.encoder.encoder.embeddings.mask_token"]
    torch.manual_seed(1)
    x = torch.rand(2, 3, *size)
    with torch.no_grad():
        theirs = hf(pixel_values=_hf_pixels(x))
        feat = ours.projector(ours.backbone(x))
        hf_feat, _ = hf.model.backbone(_hf_pixels(x), torch.ones(2, *size, dtype=torch.long))
        # what precedes the top-k: the projector's map and group 0's scores
        assert (feat - hf_feat).abs().max() < TOL
        memory = feat.flatten(2).transpose(1, 2)
        scores = _group0_scores(ours, memory, tuple(feat.shape[-2:]))
        assert (scores - _hf_group0_scores(hf, hf_feat)).abs().max() < TOL
        out = ours(x)
    assert out["pred_logits"].shape == (2, 10, 5) and set(out) == {"pred_logits", "pred_boxes"}
    assert (out["pred_logits"] - theirs.logits).abs().max() < TOL
    assert (out["pred_boxes"] - theirs.pred_boxes).abs().max() < TOL


def test_equal_to_transformers_in_training_group_detr(hf_folder) -> None:
    """Training: all 3 groups' queries (dropout 0 in this config), the encoder proposals, the layers."""
    hf, folder = hf_folder
    ours, _ = rfdetr_from_hf(folder)
    hf.train()
    ours.train()
    try:
        x = torch.rand(2, 3, *NON_SQUARE)
        with torch.no_grad():
            theirs = hf(pixel_values=_hf_pixels(x))
            out = ours(x)
    finally:
        hf.eval()
    assert out["num_groups"] == 3 and out["pred_logits"].shape == (2, 30, 5)
    assert (out["pred_logits"] - theirs.logits).abs().max() < TOL
    assert (out["pred_boxes"] - theirs.pred_boxes).abs().max() < TOL
    enc = out["enc_aux_outputs"][0]
    assert (enc["pred_logits"] - theirs.enc_outputs_class).abs().max() < TOL
    assert (enc["pred_boxes"] - theirs.enc_outputs_coord_logits).abs().max() < TOL
    assert len(out["aux_outputs"]) == 1


def test_module_layout_and_key_map_round_trip(hf_folder) -> None:
    """transformers' in-memory state dict maps too; ours -> file layout gives the folder's keys back."""
    hf, folder = hf_folder
    ours = rfdetr_from_hf_config(hf.config).eval()
    report = load_rfdetr_state(ours, hf.state_dict())
    assert not report.missing and list(report.skipped) == ["model.backbone.backbone.embeddings.mask_token"]
    x = torch.rand(1, 3, *NATIVE)
    with torch.no_grad():
        assert (ours(x)["pred_boxes"] - hf(pixel_values=_hf_pixels(x)).pred_boxes).abs().max() < TOL
    from safetensors.torch import load_file

    file_state = load_file(str(folder / "model.safetensors"))
    back, _, skipped = rfdetr_ours_to_hf(ours.state_dict())
    assert not skipped
    assert set(back) == set(file_state) - {"backbone.0.encoder.encoder.embeddings.mask_token"}
    assert all(torch.equal(back[k], file_state[k]) for k in back)
    ours_again, _, _ = rfdetr_hf_to_ours(back)
    assert all(torch.equal(ours_again[k], v) for k, v in ours.state_dict().items())
    assert len(RFDETR_FILE_KEYS) < 50  # a table, not code


def test_peg_equals_none_and_runs_where_the_table_never_was(hf_folder) -> None:
    _, folder = hf_folder
    peg, report = rfdetr_from_hf(folder, pos_enc="peg")
    none, _ = rfdetr_from_hf(folder, pos_enc="none")
    # the folder's table is skipped, the zero PEG after block 0 is the only thing left at init
    assert "backbone.vit.pos_enc.pos_embed" in report.skipped
    assert report.missing == [] and report.converted
    assert all(
        k.startswith("backbone.vit.pos_blocks.0.") and "zero" in why for k, why in report.converted.items()
    )
    # (96, 40): a 24 x 10 grid, never the table's 14 x 14; (50, 70): padded to 56 x 72 (no multiple of 8)
    for size in (NATIVE, NON_SQUARE, (96, 40), (50, 70)):
        x = torch.rand(1, 3, *size)
        with torch.no_grad():
            a, b = peg(x), none(x)
        assert torch.equal(a["pred_logits"], b["pred_logits"]) and torch.equal(
            a["pred_boxes"], b["pred_boxes"]
        )
    with torch.no_grad():  # a trained (non-zero) PEG changes the output: it is on the path
        for p in peg.backbone.vit.pos_blocks.parameters():
            p.normal_(0, 0.1)
        assert not torch.equal(peg(x)["pred_logits"], none(x)["pred_logits"])


def test_gradients_reach_every_parameter(hf_folder) -> None:
    _, folder = hf_folder
    model, _ = rfdetr_from_hf(folder, pos_enc="learned+peg")
    model.train()
    out = model(torch.rand(2, 3, *NON_SQUARE))
    heads = [out, *out["aux_outputs"], *out["enc_aux_outputs"]]
    loss = sum(h["pred_logits"].sum() + h["pred_boxes"].sum() for h in heads)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_size_the_windows_do_not_divide_is_padded_by_the_model_and_refused_by_the_backbone(hf_folder) -> None:
    """The rule: the model pads a side to the next multiple of patch x windows (the mean colour) and maps the
    boxes back; the backbone alone refuses such a size with one line naming it."""
    _, folder = hf_folder
    model, _ = rfdetr_from_hf(folder)
    with pytest.raises(InputError, match=r"multiples of patch_size x num_windows = 4 x 2 = 8 px") as err:
        model.backbone(torch.rand(1, 3, 52, 56))
    assert err.value.where == "52 x 56 px"
    assert "48, 56" in str(err.value)  # the nearest valid sides
    x = torch.rand(1, 3, 52, 56)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    padded = torch.cat([x, mean.expand(1, 3, 4, 56)], dim=2)  # 56 x 56: the mean colour below
    with torch.no_grad():
        ours, full = model(x), model(padded)
    assert torch.allclose(ours["pred_logits"], full["pred_logits"], atol=1e-5)
    scale = torch.tensor([1.0, 56 / 52, 1.0, 56 / 52])
    assert torch.allclose(ours["pred_boxes"], full["pred_boxes"] * scale, atol=1e-5)
    with pytest.raises(InputError, match="too small for RF-DETR's 10 queries") as err:
        model.check_input_size(8, 8, "--val-size 8")
    assert err.value.where == "--val-size 8"


def test_no_proposal_lands_in_the_padding(hf_folder) -> None:
    """49 x 49 px is padded to 56 x 56 (a 14 x 14 grid, 13 x 13 cells of the image): without the image-cell
    mask the selection picks padding cells for 3 of these 4 images; with it no group's query starts there."""
    _, folder = hf_folder
    model, _ = rfdetr_from_hf(folder)
    torch.manual_seed(1)
    x = torch.rand(4, 3, 49, 49)
    with torch.no_grad():
        memory, grid, _, cells = model.memory(x)
        unmasked = model.decoder.cell_scores(memory, [grid])  # the box-validity rule alone
        masked = model.cell_scores(x)
    padding = ~cells[0, :, 0]
    assert grid == (14, 14) and int(padding.sum()) == 27
    assert padding[unmasked.topk(10).indices].any()  # the padding would be chosen
    assert not padding[masked.topk(10).indices].any()
    # training: every Group DETR group's proposals (box deltas zeroed: a chosen box is its cell's proposal)
    model.train()
    for head in model.decoder.enc_out_bbox_embed:
        torch.nn.init.zeros_(head.layers[-1].weight), torch.nn.init.zeros_(head.layers[-1].bias)
    with torch.no_grad():
        boxes, _, _ = model.decoder.select(memory, [grid], 3, cells)  # (4, 3 * 10, 4) of the padded grid
    col, row = (boxes[..., 0] * grid[1] - 0.5).round().long(), (boxes[..., 1] * grid[0] - 0.5).round().long()
    assert boxes.shape == (4, 30, 4) and not padding.view(grid)[row, col].any()
    # at a multiple of patch x windows every cell is the image's (transformers' selection, unchanged)
    assert model.memory(torch.rand(1, 3, *NATIVE))[3].all()


def test_window_partition_is_inverted_exactly() -> None:
    tokens = torch.randn(2, 1 + 6 * 10, 3)
    windows = to_windows(tokens, (6, 10), 2)
    assert windows.shape == (8, 1 + 15, 3)
    assert torch.equal(from_windows(windows, (6, 10), 2), tokens[:, 1:])


def test_config_fields_this_model_cannot_take() -> None:
    with pytest.raises(ValueError, match="use_swiglu_ffn"):
        rfdetr_from_hf_config(_config(backbone_config=dict(model_type="rf_detr_dinov2", use_swiglu_ffn=True)))


def _small_vit(pos_enc: str, num_windows: int, **kw):
    torch.manual_seed(2)
    options = dict(embed_dim=32, depth=3, num_heads=2, patch_size=4, image_size=32, out_blocks=(0, 2))
    options.update(kw)
    vit = build_windowed_vit(pos_enc=pos_enc, num_windows=num_windows, normalize_input=False, **options)
    with torch.no_grad():  # a PEG that is not zero, so a wrong grid order would show
        for p in vit.vit.pos_blocks.parameters():
            p.normal_(0, 0.2)
    return vit.eval()


@pytest.mark.parametrize(
    "pos_enc", ["learned+rope-axial", "peg+alibi-2d", "rope-mixed", "peg+rope-dinov3+fire"]
)
def test_one_window_is_cpvt(pos_enc) -> None:
    """With one window every block is a plain ViT block: the maps are CPVT's own intermediates."""
    vit = _small_vit(pos_enc, 1)
    x = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        ours = vit(x)
        ref = vit.vit.forward_intermediates(x, indices=[0, 2], norm=True, intermediates_only=True)
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(ours, ref))


@pytest.mark.parametrize("pos_enc", ["rope-axial+alibi-2d", "peg+rope-mixed+lookhere"])
def test_windows_read_their_tokens_rows_of_the_grid_tables(pos_enc) -> None:
    """Block 0 windowed, block 1 global: each window (and the merged image) uses the rows of its own
    tokens of the grid's rotary table and bias, checked against a loop over windows."""
    vit = _small_vit(pos_enc, 2, depth=2, out_blocks=(1,), global_blocks=(1,), apply_layernorm=False)
    v, grid, b = vit.vit, (6, 10), 2
    x = torch.randn(b, 3, 24, 40)
    tokens, _ = v.patch_embed(x)
    tokens = torch.cat([v.cls_token.expand(b, -1, -1), tokens], dim=1)
    order = window_token_order(grid, 2)
    assert torch.equal(to_windows(tokens, grid, 2), tokens[:, order].flatten(0, 1))
    rope = v.rope(grid, num_prefix_tokens=1)
    bias = v.attn_bias(grid, num_prefix_tokens=1)

    def extras(i: int, idx: torch.Tensor):
        sin, cos = (rope[0][i], rope[1][i]) if v.rope.learned else rope
        layer_bias = v.attn_bias.layer_bias(bias, i)
        return (sin[..., idx, :], cos[..., idx, :]), layer_bias[:, :, idx[:, None], idx[None, :]]

    with torch.no_grad():
        windows = torch.stack(
            [v.blocks[0](tokens[:, idx], *extras(0, idx)) for idx in order], 1
        )  # (B, 4, 1+L, C)
        if "0" in v.pos_blocks:  # the PEG on the true grid, then back to windows
            windows = vit._peg("0", windows.flatten(0, 1), grid).unflatten(0, (b, 4))
        merged = v.blocks[1](windows.flatten(1, 2), *extras(1, order.reshape(-1)))
        ref = windows_to_map(merged.reshape(b * 4, -1, merged.shape[-1]), grid, 2)
        assert (vit(x)[0] - ref).abs().max() < 1e-5


@pytest.mark.parametrize("pos_enc", ["peg+rope-axial", "learned+alibi-2d"])
def test_rotary_and_bias_variants_train_at_two_sizes(hf_folder, pos_enc) -> None:
    """The detector from the folder with another backbone encoding: runs at two sizes, every parameter trains."""
    _, folder = hf_folder
    model, _ = rfdetr_from_hf(folder, pos_enc=pos_enc)
    model.train()
    for size in (NATIVE, NON_SQUARE):
        model.zero_grad()
        out = model(torch.rand(1, 3, *size))
        heads = [out, *out["aux_outputs"], *out["enc_aux_outputs"]]
        sum(h["pred_logits"].sum() + h["pred_boxes"].sum() for h in heads).backward()
        assert not [n for n, p in model.named_parameters() if p.grad is None]


def test_default_config_keys_and_shapes_match() -> None:
    """transformers' default ``RfDetrConfig`` (the base shape: DINOv2-S, patch 14, 4 windows, 13 groups):
    every tensor of its state dict has our key and shape, and ours has no other."""
    config = transformers.RfDetrConfig()
    with torch.device("meta"):
        hf = transformers.RfDetrForObjectDetection(config)
        ours = rfdetr_from_hf_config(config)
    mapped, _, skipped = rfdetr_hf_to_ours(hf.state_dict())
    assert list(skipped) == ["model.backbone.backbone.embeddings.mask_token"]
    target = ours.state_dict()
    assert set(mapped) == set(target)
    assert all(tuple(mapped[k].shape) == tuple(target[k].shape) for k in target)
    assert ours.backbone.out_blocks == [1, 4, 7, 10] and ours.backbone.global_blocks == [2, 5, 8, 11]


def test_eval_output_feeds_the_rtdetr_postprocessor(hf_folder) -> None:
    from peg_detr.models.rtdetr import RTDETRPostProcess

    _, folder = hf_folder
    model, _ = rfdetr_from_hf(folder)
    with torch.no_grad():
        out = model(torch.rand(2, 3, *NATIVE))
    dets = RTDETRPostProcess(num_top_queries=7)(out, torch.tensor([[100, 200], [50, 60]]))
    assert [d["boxes"].shape for d in dets] == [(7, 4), (7, 4)]
