"""RT-DETR's decoder alone against transformers' query selection + ``RTDetrDecoder``.

A random ``RTDetrForObjectDetection`` (small config) runs on an image; its encoder's three
maps are fed to ``peg_detr``'s :class:`RTDETRDecoder` holding the same weights, and the
logits / boxes must agree: in eval (the prediction), and in training with the same
denoising group (every layer, denoising queries included).  Hand-computed cases check the
anchors and the deformable sampling.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from peg_detr.interop.hf_rtdetr import decoder_key_from_hf
from peg_detr.models.rtdetr.decoder import (
    MSDeformableAttention,
    RTDETRDecoder,
    RTDETRDecoderSpec,
    generate_anchors,
    inverse_sigmoid,
    multi_scale_deformable_attention,
)

transformers = pytest.importorskip("transformers")

NUM_CLASSES, NUM_QUERIES = 5, 20


def _hf_model(**overrides):
    from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrResNetConfig

    backbone = RTDetrResNetConfig(
        layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=32,
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    config = RTDetrConfig(
        backbone_config=backbone, encoder_hidden_dim=64, d_model=64, encoder_in_channels=[64, 128, 256],
        decoder_in_channels=[64, 64, 64], num_labels=NUM_CLASSES, num_queries=NUM_QUERIES, decoder_layers=3,
        decoder_ffn_dim=128, **overrides,
    )  # fmt: skip
    torch.manual_seed(0)
    model = RTDetrForObjectDetection(config)
    with torch.no_grad():  # non-trivial box heads and BN statistics (their init is zero / identity)
        for name, p in model.named_parameters():
            if "bbox_embed" in name or "bbox_head" in name:
                p.normal_(0, 0.2)
        for name, b in model.named_buffers():
            if "running_var" in name:
                b.uniform_(0.5, 2.0)
            elif "running_mean" in name:
                b.normal_(0, 0.2)
        # transformers' N(0, 0.01) BN weights leave the encoder's maps nearly constant (top-K ties)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
    return model


def _ours_from(hf) -> RTDETRDecoder:
    cfg = hf.config
    spec = RTDETRDecoderSpec(
        in_channels=cfg.decoder_in_channels,
        hidden_dim=cfg.d_model,
        num_queries=cfg.num_queries,
        num_layers=cfg.decoder_layers,
        num_heads=cfg.decoder_attention_heads,
        dim_feedforward=cfg.decoder_ffn_dim,
        num_points=cfg.decoder_n_points,
        learn_initial_query=cfg.learn_initial_query,
    )
    ours = RTDETRDecoder(cfg.num_labels, spec)
    mapped = {decoder_key_from_hf(k): v for k, v in hf.state_dict().items()}
    state = {k.removeprefix("decoder."): v for k, v in mapped.items() if k and k.startswith("decoder.")}
    ours.load_state_dict(state, strict=True)  # every decoder tensor has its HF counterpart
    return ours


def _images(b: int = 2, h: int = 96, w: int = 128) -> torch.Tensor:
    return torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(1))


def test_decoder_matches_transformers_in_eval():
    hf = _hf_model().eval()
    ours = _ours_from(hf).eval()
    with torch.no_grad():
        ref = hf(_images())
        got = ours(list(ref.encoder_last_hidden_state))
    assert got.logits.shape == (1, 2, NUM_QUERIES, NUM_CLASSES)  # eval: only the eval_idx layer
    torch.testing.assert_close(got.logits[-1], ref.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.boxes[-1], ref.pred_boxes, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.enc_logits, ref.enc_topk_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.enc_boxes, ref.enc_topk_bboxes, atol=1e-5, rtol=0)


def test_decoder_matches_transformers_in_training_with_denoising():
    """Same denoising group (same RNG draws), train mode: every layer's outputs, dn queries first."""
    from transformers.models.rt_detr.modeling_rt_detr import get_contrastive_denoising_training_group

    hf = _hf_model().train()
    ours = _ours_from(hf).train()
    labels = [
        {
            "class_labels": torch.tensor([1, 3]),
            "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]]),
        },
        {"class_labels": torch.tensor([4]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
    ]
    torch.manual_seed(5)
    ref = hf.model(_images(), labels=labels)
    torch.manual_seed(5)
    cls, box, mask, meta = get_contrastive_denoising_training_group(
        labels,
        NUM_CLASSES,
        NUM_QUERIES,
        hf.model.denoising_class_embed,
        num_denoising_queries=hf.config.num_denoising,
    )

    class Group:  # the fields of denoising.DenoisingGroup the decoder reads
        queries, ref_boxes_unact, attn_mask = cls, box, torch.isinf(mask)

    got = ours([f.detach() for f in ref.encoder_last_hidden_state], Group())
    n = meta["dn_num_split"][0] + NUM_QUERIES
    assert got.logits.shape == (3, 2, n, NUM_CLASSES)
    # every layer, denoising queries included; 1e-4 (the ports' standard): three layers of float32
    # sums in another order reach ~1.5e-5 on some weight draws
    torch.testing.assert_close(got.logits, ref.intermediate_logits.transpose(0, 1), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        got.boxes, ref.intermediate_reference_points.transpose(0, 1), atol=1e-4, rtol=0
    )
    # gradients reach the box heads of the previous layer through the output boxes (RT-DETR's refinement)
    got.boxes[1].sum().backward()
    assert ours.bbox_embed[0].layers[-1].weight.grad.abs().sum() > 0
    later = ours.bbox_embed[2].layers[-1].weight.grad
    assert later is None or not later.any()


def test_learned_initial_queries_are_the_table():
    """``learn_initial_query`` (transformers 5.24 cannot run it: it tiles the Embedding module)."""
    spec = RTDETRDecoderSpec(
        in_channels=(8, 8, 8),
        hidden_dim=16,
        num_queries=4,
        num_layers=1,
        num_heads=2,
        learn_initial_query=True,
    )
    ours = RTDETRDecoder(3, spec)
    memory, shapes = torch.randn(2, 21, 16), [(4, 4), (2, 2), (1, 1)]
    queries, ref, _, _ = ours.select_queries(memory, shapes)
    assert torch.equal(queries, ours.weight_embedding.weight.expand(2, -1, -1))
    assert ref.shape == (2, 4, 4) and not ref.requires_grad


def test_anchors_hand_computed():
    anchors, valid = generate_anchors([(2, 4), (1, 1)], grid_size=0.05)
    assert anchors.shape == (1, 9, 4) and valid.shape == (1, 9, 1)
    boxes = anchors[0, :8].sigmoid()
    # level 0: cx = (x + 0.5) / 4, cy = (y + 0.5) / 2, w = h = 0.05
    torch.testing.assert_close(boxes[5], torch.tensor([0.375, 0.75, 0.05, 0.05]))
    assert valid[0, :8].all()
    # level 1: one cell (0.5, 0.5) with w = h = 0.1; a 1x1 level is valid, a box at 0.995 is not
    torch.testing.assert_close(anchors[0, 8].sigmoid(), torch.tensor([0.5, 0.5, 0.1, 0.1]))
    edge, ok = generate_anchors([(1, 200)])
    assert not ok[0, 0, 0] and ok[0, 100, 0]  # cx = 0.0025 < 0.01: invalid
    assert edge[0, 0, 0] == torch.finfo(torch.float32).max
    torch.testing.assert_close(
        inverse_sigmoid(torch.tensor([0.0, 0.5, 1.0])), torch.tensor([-11.5129, 0.0, 11.5129])
    )


def test_deformable_sampling_hand_computed():
    """One head, one point at pixel centres and between them: bilinear values, zero outside."""
    value_map = torch.arange(6.0).view(1, 1, 2, 3)  # H=2, W=3 : [[0,1,2],[3,4,5]]
    value = value_map.flatten(2).transpose(1, 2).unsqueeze(2)  # (1, 6, 1, 1)
    xy = torch.tensor([[0.5 / 3, 0.25], [1.0 / 3, 0.5], [2.5 / 3, 0.75], [1.5, 0.5]])  # (4, 2) normalised
    locations = xy.view(1, 4, 1, 1, 1, 2)
    weights = torch.ones(1, 4, 1, 1, 1)
    out = multi_scale_deformable_attention(value, [(2, 3)], locations, weights)
    # pixel (0,0) = 0; between (0,0),(0,1),(1,0),(1,1) = 2; pixel (1,2) = 5; outside = 0
    torch.testing.assert_close(out.view(4), torch.tensor([0.0, 2.0, 5.0, 0.0]))


def test_deformable_attention_batched_equals_per_sample_loop():
    """Batched over batch, heads and levels == a plain per-image, per-head grid_sample loop."""
    torch.manual_seed(0)
    attn = MSDeformableAttention(d_model=16, num_heads=2, num_levels=2, num_points=3)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    shapes = [(4, 5), (2, 3)]
    memory, query = torch.randn(2, 26, 16), torch.randn(2, 7, 16)
    boxes = torch.rand(2, 7, 4) * 0.5 + 0.25
    got = attn(query, boxes, memory, shapes)

    value = attn.value_proj(memory).view(2, 26, 2, 8)
    off = attn.sampling_offsets(query).view(2, 7, 2, 2, 3, 2)
    w = attn.attention_weights(query).view(2, 7, 2, 6).softmax(-1).view(2, 7, 2, 2, 3)
    want = torch.zeros(2, 7, 2, 8)
    start = 0
    for lvl, (h, wd) in enumerate(shapes):
        v = value[:, start : start + h * wd]
        start += h * wd
        for b in range(2):
            for m in range(2):
                loc = boxes[b, :, None, :2] + off[b, :, m, lvl] / 3 * boxes[b, :, None, 2:] * 0.5  # (7, 3, 2)
                grid = (2 * loc - 1)[None]  # (1, 7, 3, 2)
                img = v[b, :, m].T.reshape(1, 8, h, wd)
                s = F.grid_sample(img, grid, align_corners=False, padding_mode="zeros")[0]  # (8, 7, 3)
                want[b, :, m] += (s * w[b, :, m, lvl][None]).sum(-1).T
    torch.testing.assert_close(got, attn.output_proj(want.flatten(2)), atol=1e-5, rtol=0)


def test_anchors_follow_the_input_size():
    """No size is cached: the same decoder runs at several input sizes (in-graph anchors)."""
    hf = _hf_model().eval()
    ours = _ours_from(hf).eval()
    for h, w in [(64, 64), (96, 160), (160, 96)]:
        with torch.no_grad():
            ref = hf(_images(1, h, w))
            got = ours(list(ref.encoder_last_hidden_state))
        torch.testing.assert_close(got.boxes[-1], ref.pred_boxes, atol=1e-5, rtol=0)
