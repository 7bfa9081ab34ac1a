"""peg_video.from_hf / export_hf against transformers' VideoMAE, TimeSformer and V-JEPA 2 (tiny random models).

Every folder is written by ``save_pretrained`` into ``tmp_path``; nothing is downloaded.  peg_video
takes clips ``(B, 3, T, H, W)``, transformers ``(B, T, 3, H, W)``.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from peg_core.interop.io import WeightsError  # noqa: E402
from peg_video import from_hf  # noqa: E402
from peg_video.interop.hf import export_hf, hf_model_config, read_hf_video_config  # noqa: E402

TOL = 1e-4
SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _clip(b: int = 2, t: int = 4, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, 3, t, size, size, generator=torch.Generator().manual_seed(seed))


def _hf(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)  # (B, 3, T, H, W) -> (B, T, 3, H, W)


def _save(model, path):
    torch.manual_seed(0)
    for p in model.parameters():  # HF's init leaves biases and norms at 0 / 1: randomise everything
        p.data.normal_(0, 0.2)
    model.eval().save_pretrained(path)
    return model


def _videomae(path, cls=None, **kw):
    cls = cls or transformers.VideoMAEForVideoClassification
    cfg = transformers.VideoMAEConfig(
        **SIZES, image_size=32, patch_size=8, num_frames=4, tubelet_size=2, num_labels=5, **kw
    )
    return _save(cls(cfg), path)


def _timesformer(path, **kw):
    cfg = transformers.TimesformerConfig(
        **SIZES, image_size=32, patch_size=8, num_frames=4, num_labels=5, **kw
    )
    return _save(transformers.TimesformerForVideoClassification(cfg), path)


def _vjepa2(path, cls=None, **kw):
    cls = cls or transformers.VJEPA2Model
    cfg = transformers.VJEPA2Config(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=2, crop_size=32, patch_size=8,
        frames_per_clip=4, tubelet_size=2, pred_hidden_size=32, pred_num_hidden_layers=1,
        pred_num_attention_heads=2, **{"num_pooler_layers": 1, **kw},
    )  # fmt: skip
    return _save(cls(cfg), path)


@torch.no_grad()
def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------------ same outputs


@torch.no_grad()
def test_videomae_classifier_same_logits(tmp_path):
    hf = _videomae(tmp_path)
    model, report = from_hf(tmp_path)
    x = _clip()
    assert _close(model(x), hf(_hf(x)).logits) <= TOL
    assert not report.missing and not report.skipped
    assert "blocks.0.attn.qkv.weight" in report.converted and "blocks.0.attn.qkv.q_bias" in report.copied


@torch.no_grad()
def test_videomae_without_mean_pooling_and_qv_bias(tmp_path):
    hf = _videomae(tmp_path, use_mean_pooling=False, qv_bias=False)
    model, _ = from_hf(tmp_path)
    x = _clip()
    assert model.global_pool == "first" and model.blocks[0].attn.qkv.bias is None
    assert _close(model(x), hf(_hf(x)).logits) <= TOL


@torch.no_grad()
@pytest.mark.parametrize("attention_type", ["divided_space_time", "joint_space_time"])
def test_timesformer_same_logits(tmp_path, attention_type):
    hf = _timesformer(tmp_path, attention_type=attention_type)
    model, report = from_hf(tmp_path)
    x = _clip()
    assert _close(model(x), hf(_hf(x)).logits) <= TOL
    assert "cls_token" in report.converted and "patch_embed.proj.weight" in report.converted


@torch.no_grad()
def test_vjepa2_encoder_same_features(tmp_path):
    hf = _vjepa2(tmp_path)
    model, report = from_hf(tmp_path)
    assert model.num_classes == 0
    x = _clip()
    tokens, size = model.forward_features(x)
    ref = hf(_hf(x), skip_predictor=True).last_hidden_state
    assert size == (2, 4, 4) and _close(tokens, ref) <= TOL
    assert any(k.startswith("predictor.") for k in report.skipped)
    assert all(k.startswith("blocks.") or k.startswith(("patch_embed", "norm")) for k in report.copied)


@torch.no_grad()
@pytest.mark.parametrize("pooler_layers", [0, 2])
def test_vjepa2_classifier_same_logits_attentive_pooler(tmp_path, pooler_layers):
    hf = _vjepa2(tmp_path, cls=transformers.VJEPA2ForVideoClassification, num_labels=3,
                 num_pooler_layers=pooler_layers, mlp_ratio=2.0)  # fmt: skip
    model, report = from_hf(tmp_path)
    assert model.global_pool == "attentive" and len(model.pool.blocks) == pooler_layers
    assert model.pool.cross.mlp.fc1.out_features == 4 * 48  # the pooler's MLP stays 4x wide
    assert "pool.query" in model.no_weight_decay() and "pool.query" in dict(model.named_parameters())
    x = _clip()
    assert _close(model(x), hf(_hf(x)).logits) <= TOL
    assert not report.missing and all(k.startswith("vjepa2.predictor.") for k in report.skipped)
    assert "pool.cross.kv.weight" in report.converted and "pool.query" in report.copied
    if pooler_layers:
        assert "pool.blocks.1.attn.qkv.bias" in report.converted
    for t, size in ((8, 32), (4, 48)):  # rotary ids from the input; the pool is not sized by the clip
        out = model(_clip(1, t, size))
        assert out.shape == (1, 3) and torch.isfinite(out).all()


@torch.no_grad()
@pytest.mark.parametrize("pos_enc", ["peg3d", "peg3d+rope-3d"])
def test_vjepa2_classifier_peg3d_keeps_the_pooler(tmp_path, pos_enc):
    hf = _vjepa2(tmp_path, cls=transformers.VJEPA2ForVideoClassification, num_labels=3)
    model, report = from_hf(tmp_path, pos_enc)
    assert "pool.cross.q.weight" in report.copied and "head.weight" in report.copied
    x = _clip()
    if pos_enc == "peg3d+rope-3d":  # the zero PEG3d is the identity: transformers' logits
        assert _close(model(x), hf(_hf(x)).logits) <= TOL
    assert model(_clip(1, 8, 48)).shape == (1, 3)
    model5, report5 = from_hf(tmp_path, pos_enc, num_classes=5)  # new head, same pooler
    assert model5(x).shape == (2, 5) and "head.weight" in report5.missing
    assert torch.equal(model5.pool.query, model.pool.query)


# ------------------------------------------------------------------------------------ encoders


@torch.no_grad()
@pytest.mark.parametrize("cls", ["VideoMAEModel", "VideoMAEForPreTraining"])
def test_videomae_encoder_folders(tmp_path, cls):
    hf = _videomae(tmp_path, cls=getattr(transformers, cls))
    model, report = from_hf(tmp_path)
    x = _clip()
    encoder = hf.videomae if cls == "VideoMAEForPreTraining" else hf
    assert model.num_classes == 0
    assert _close(model.forward_features(x)[0], encoder(_hf(x)).last_hidden_state) <= TOL
    if cls == "VideoMAEForPreTraining":
        assert "encoder_to_decoder.weight" in report.skipped and "mask_token" in report.skipped
        assert any(k.startswith("decoder.") for k in report.skipped)
    assert "fc_norm.weight" in report.missing  # the mean-pooling head's norm is new
    model10, report10 = from_hf(tmp_path, num_classes=10)
    assert model10(x).shape == (2, 10) and "head.weight" in report10.missing


# ---------------------------------------------------------------------------- peg3d variants


def _zero_table(hf, kind: str) -> None:
    if kind == "videomae":
        emb = hf.videomae.embeddings
        emb.position_embeddings = torch.zeros_like(emb.position_embeddings)
    else:
        emb = hf.timesformer.embeddings
        emb.position_embeddings.data.zero_()
        emb.time_embeddings.data.zero_()


@torch.no_grad()
@pytest.mark.parametrize("kind", ["videomae", "timesformer"])
@pytest.mark.parametrize("pos_enc", ["peg3d", "peg3d-factorized"])
def test_peg3d_equals_the_model_with_its_table_zeroed(tmp_path, kind, pos_enc):
    hf = _videomae(tmp_path) if kind == "videomae" else _timesformer(tmp_path)
    model, report = from_hf(tmp_path, pos_enc)
    x = _clip()
    with_table = hf(_hf(x)).logits
    _zero_table(hf, kind)
    out = model(x)
    assert _close(out, hf(_hf(x)).logits) <= TOL
    assert _close(out, with_table) > 10 * TOL  # the table did matter: the test can fail
    assert any(k.startswith("pos_blocks.0.") for k in report.missing)
    table = "videomae.embeddings.position_embeddings" if kind == "videomae" else (
        "timesformer.embeddings.position_embeddings")  # fmt: skip
    assert table in report.skipped
    for t, size in ((8, 32), (16, 32), (6, 48), (4, 24)):  # other clip lengths and crops run
        assert model(_clip(1, t, size)).shape == (1, 5)


@torch.no_grad()
def test_vjepa2_peg3d_plus_rope(tmp_path):
    hf = _vjepa2(tmp_path)
    model, report = from_hf(tmp_path, "peg3d+rope-3d")
    x = _clip()
    ref = hf(_hf(x), skip_predictor=True).last_hidden_state
    assert _close(model.forward_features(x)[0], ref) <= TOL
    assert "pos_blocks.0.proj.weight" in report.missing
    for t, size in ((8, 32), (16, 32), (6, 48)):
        tokens, grid = model.forward_features(_clip(1, t, size))
        assert grid == (t // 2, size // 8, size // 8) and tokens.shape[1] == grid[0] * grid[1] * grid[2]
    plain, report = from_hf(tmp_path, "peg3d")
    assert plain.rope is None and "<3-D rotary encoding>" in report.skipped


# ------------------------------------------------------------------------ off the native shape


def _videomae_at(hf, t: int, size: int, table: torch.Tensor):
    """transformers' VideoMAE for ``t`` frames of ``size`` px with ``hf``'s weights and ``table`` as its table."""
    cfg = transformers.VideoMAEConfig(**{**hf.config.to_dict(), "num_frames": t, "image_size": size})
    other = transformers.VideoMAEForVideoClassification(cfg).eval()
    other.load_state_dict(hf.state_dict())  # the table is no state-dict key: nothing is sized by the clip
    other.videomae.embeddings.position_embeddings = table
    return other


@torch.no_grad()
@pytest.mark.parametrize(("t", "size"), [(8, 32), (6, 40)])
def test_videomae_table_resized_trilinearly_at_other_clip_shapes(tmp_path, t, size):
    from transformers.models.videomae.modeling_videomae import get_sinusoid_encoding_table

    hf = _videomae(tmp_path)
    model, _ = from_hf(tmp_path)
    x = _clip(1, t, size)
    with pytest.raises((ValueError, RuntimeError)):  # transformers: native clip shape only
        hf(_hf(x))
    # the hand reference: the (2, 4, 4) table as a grid, trilinear in float64, in transformers' model
    grid = get_sinusoid_encoding_table(2 * 4 * 4, 32).double().reshape(1, 2, 4, 4, 32).permute(0, 4, 1, 2, 3)
    new = (t // 2, size // 8, size // 8)
    table = torch.nn.functional.interpolate(grid, size=new, mode="trilinear", align_corners=False)
    table = table.flatten(2).transpose(1, 2).float()
    out = model(x)
    assert _close(out, _videomae_at(hf, t, size, table)(_hf(x)).logits) <= TOL
    assert _close(out, _videomae_at(hf, t, size, torch.zeros_like(table))(_hf(x)).logits) > 10 * TOL


def _timesformer_at(hf, t: int, size: int):
    """transformers' TimeSformer configured for ``t`` frames of ``size`` px, its tables resized by hand (nearest)."""
    cfg = transformers.TimesformerConfig(**{**hf.config.to_dict(), "num_frames": t, "image_size": size})
    other = transformers.TimesformerForVideoClassification(cfg).eval()
    state = hf.state_dict()
    emb = "timesformer.embeddings."
    pos, time = state[emb + "position_embeddings"], state[emb + "time_embeddings"]
    grid = pos[:, 1:].transpose(1, 2).reshape(1, -1, 4, 4)  # the native 4x4 grid, channels first
    grid = torch.nn.functional.interpolate(grid, size=(size // 8, size // 8), mode="nearest")
    state[emb + "position_embeddings"] = torch.cat([pos[:, :1], grid.flatten(2).transpose(1, 2)], dim=1)
    time = torch.nn.functional.interpolate(time.transpose(1, 2), size=t, mode="nearest")
    state[emb + "time_embeddings"] = time.transpose(1, 2)
    other.load_state_dict(state)
    return other


@torch.no_grad()
@pytest.mark.parametrize("attention_type", ["divided_space_time", "joint_space_time"])
def test_timesformer_resizes_its_tables_by_nearest_neighbour(tmp_path, attention_type):
    hf = _timesformer(tmp_path, attention_type=attention_type)
    model, _ = from_hf(tmp_path)
    assert model.pos_enc.interpolation == model.pos_enc.temporal_interpolation == "nearest"
    for t, size in ((8, 32), (6, 40)):
        x = _clip(1, t, size)
        out = model(x)
        assert _close(out, _timesformer_at(hf, t, size)(_hf(x)).logits) <= TOL
        # transformers resizes the tables the same way; its divided attention, though, splits the
        # tokens into frames with the config's num_frames / image_size: off that shape it is wrong
        # (8 frames: the tokens of two frames are grouped as one) or does not run (another crop)
        if attention_type == "joint_space_time":
            assert _close(out, hf(_hf(x)).logits) <= TOL
        elif size == 32:
            assert _close(out, hf(_hf(x)).logits) > 10 * TOL
        else:
            with pytest.raises(RuntimeError):
                hf(_hf(x))
    smooth, _ = from_hf(tmp_path, pos_interpolation="bicubic", pos_temporal_interpolation="linear")
    x = _clip()
    assert _close(smooth(x), hf(_hf(x)).logits) <= TOL  # the native shape is not resized
    x = _clip(1, 6, 40)
    assert _close(smooth(x), model(x)) > 10 * TOL


@torch.no_grad()
def test_vjepa2_rotary_ids_from_the_input_grid(tmp_path):
    hf = _vjepa2(tmp_path)
    model, _ = from_hf(tmp_path)
    x = _clip(1, 8, 32)  # another length at the native crop: transformers' ids are right too
    assert _close(model.forward_features(x)[0], hf(_hf(x), skip_predictor=True).last_hidden_state) <= TOL
    x = _clip(1, 4, 48)  # another crop: transformers numbers the tokens on the config's 4x4 grid
    ours = model.forward_features(x)[0]
    cfg = transformers.VJEPA2Config(**{**hf.config.to_dict(), "crop_size": 48})
    at_48 = transformers.VJEPA2Model(cfg).eval()
    at_48.load_state_dict(hf.state_dict())
    assert _close(ours, at_48(_hf(x), skip_predictor=True).last_hidden_state) <= TOL
    assert _close(ours, hf(_hf(x), skip_predictor=True).last_hidden_state) > 10 * TOL


def test_rope_3d_vjepa2_layout_is_transformers_rotation():
    from transformers.models.vjepa2.modeling_vjepa2 import rotate_queries_or_keys

    from peg_core.rope import apply_rope, build_rope

    head_dim, size = 40, (3, 4, 5)  # 40 // 3 // 2 = 6 pairs a section, 4 channels left unrotated
    rope = build_rope("rope-3d", head_dim, layout="vjepa2")
    x = torch.randn(2, 2, 60, head_dim, generator=torch.Generator().manual_seed(0))
    t, h, w = torch.meshgrid(*(torch.arange(s) for s in size), indexing="ij")
    d = 2 * ((head_dim // 3) // 2)
    ref = torch.cat([rotate_queries_or_keys(x[..., i * d : (i + 1) * d], pos=p.flatten().float())
                     for i, p in enumerate((t, h, w))] + [x[..., 3 * d :]], dim=-1)  # fmt: skip
    assert _close(apply_rope(x, *rope(size)), ref) <= 1e-5
    with pytest.raises(ValueError, match="layout must be one of"):
        build_rope("rope-3d", head_dim, layout="halves")


def test_sinusoid_table_is_videomaes():
    from transformers.models.videomae.modeling_videomae import get_sinusoid_encoding_table

    from peg_video.models.vit import sinusoid_table

    assert torch.equal(sinusoid_table(40, 32), get_sinusoid_encoding_table(40, 32))


# --------------------------------------------------------------------------------- config, errors


def test_read_config_and_model_config(tmp_path):
    _videomae(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]})
    )
    info = read_hf_video_config(tmp_path)
    assert info["model_type"] == "videomae" and info["tubelet"] == (2, 8, 8) and info["num_frames"] == 4
    assert info["image_size"] == (32, 32) and info["num_classes"] == 5 and info["id2label"][0] == "LABEL_0"
    assert info["mean"] == (0.5, 0.5, 0.5) and info["std"] == (0.25, 0.25, 0.25)
    config = hf_model_config(tmp_path, "peg3d", num_classes=3, drop_path_rate=0.1)
    assert config["pos_enc"] == "peg3d" and config["num_classes"] == 3 and config["peg_zero_init"] is True
    json.dumps(config)  # storable in a checkpoint
    with pytest.raises(ValueError, match="embed_dim"):
        hf_model_config(tmp_path, embed_dim=64)
    with pytest.raises(ValueError, match="peg3d\\+rope-3d"):
        from_hf(tmp_path, "peg3d+rope-3d")


def test_errors(tmp_path):
    with pytest.raises(WeightsError, match="Hugging Face folder not found"):
        from_hf(tmp_path / "nope")
    with pytest.raises(WeightsError, match=r"no config\.json"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(WeightsError, match="model_type 'bert' is not a video encoder"):
        from_hf(tmp_path)


def test_mismatched_weights_one_message(tmp_path):
    _videomae(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 96  # the weights have 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError) as e:  # named before the model is built
        from_hf(tmp_path)
    assert e.value.what == ("config.json key 'intermediate_size' is 96, but the weights' "
                            "videomae.encoder.layer.0.intermediate.dense.weight has shape (64, 32)")  # fmt: skip
    assert e.value.where == str(tmp_path / "config.json")
    cfg["intermediate_size"], cfg["num_hidden_layers"] = 64, 3  # a layer the weights do not have
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError) as e:
        from_hf(tmp_path)
    assert e.value.what == ("config.json key 'num_hidden_layers' is 3, but the weights have 2 "
                            "(videomae.encoder.layer.0..1)")  # fmt: skip


# ------------------------------------------------------------------------------------- export


@torch.no_grad()
def test_export_hf_round_trip(tmp_path):
    hf = _videomae(tmp_path / "src")
    model, _ = from_hf(tmp_path / "src")
    out = export_hf(model, tmp_path / "out")
    back = transformers.VideoMAEForVideoClassification.from_pretrained(out).eval()
    x = _clip()
    assert _close(back(_hf(x)).logits, model(x)) <= TOL
    assert _close(back(_hf(x)).logits, hf(_hf(x)).logits) <= TOL


@torch.no_grad()
def test_export_hf_full_qkv_bias_and_encoder(tmp_path):
    from peg_video import VideoTransformer

    torch.manual_seed(0)
    kw = {
        "num_frames": 4,
        "img_size": 32,
        "tubelet": (2, 8, 8),
        "pos_enc": "sinusoid-1d",
        "fc_norm_eps": 1e-5,
    }
    model = VideoTransformer(32, 2, 2, num_classes=3, **kw).eval()
    for p in model.parameters():
        p.normal_(0, 0.2)  # a key bias that export_hf drops: the softmax removes it
    back = transformers.VideoMAEForVideoClassification.from_pretrained(
        export_hf(model, tmp_path / "c")
    ).eval()
    x = _clip()
    assert _close(back(_hf(x)).logits, model(x)) <= TOL
    encoder = VideoTransformer(32, 2, 2, num_classes=0, **kw).eval()
    back = transformers.VideoMAEModel.from_pretrained(export_hf(encoder, tmp_path / "e")).eval()
    assert _close(back(_hf(x)).last_hidden_state, encoder.forward_features(x)[0]) <= TOL


def test_export_hf_refuses_what_videomae_cannot_express(tmp_path):
    from peg_video import VideoTransformer

    with pytest.raises(TypeError, match="export_hf writes a VideoTransformer; got PosixPath"):
        export_hf(tmp_path / "checkpoint.pth", tmp_path / "out")  # the checkpoint is read by peg_video.model
    model = VideoTransformer(32, 1, 2, num_classes=3, num_frames=4, img_size=32, tubelet=(2, 8, 8))
    with pytest.raises(ValueError, match="pos_enc='peg3d'"):
        export_hf(model, tmp_path / "out")
    pooled = VideoTransformer(32, 1, 2, num_classes=3, num_frames=4, img_size=32, tubelet=(2, 8, 8),
                              pos_enc="sinusoid-1d", global_pool="attentive")  # fmt: skip
    with pytest.raises(ValueError, match="global_pool='attentive'"):
        export_hf(pooled, tmp_path / "out")


def test_export_hf_from_a_trained_checkpoint(tmp_path):
    """One tiny ``python -m peg_video train`` epoch of a VideoMAE-layout model, exported from its checkpoint."""
    from peg_video.__main__ import main
    from peg_video.model import load_model
    from tests.video.runs import TINY, synthetic_set

    data = synthetic_set(tmp_path / "syn", num_train=4, num_val=2, frames=8, seed=2)
    run = tmp_path / "run"
    assert main([
        "train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
        "--output-dir", str(run), *TINY, "--epochs", "1", "--pos-enc", "sinusoid-1d",
        "--model-opt", "qkv_bias=qv", "--model-opt", "fc_norm_eps=1e-5",
    ]) == 0  # fmt: skip
    loaded = load_model(
        run / "checkpoint.pth"
    )  # the application reads the checkpoint, export_hf takes a model
    out = export_hf(loaded.model, tmp_path / "hf", classes=loaded.classes)
    back = transformers.VideoMAEForVideoClassification.from_pretrained(out).eval()
    assert back.config.id2label == dict(enumerate(loaded.classes)) and len(loaded.classes) == 4
    assert back.config.label2id["move_up"] == loaded.classes.index("move_up")
    x = _clip()
    with torch.no_grad():
        assert _close(back(_hf(x)).logits, loaded.model.eval()(x)) <= TOL


def test_build_video_model_documents_every_option():
    import inspect

    from peg_video import VideoTransformer, build_video_model
    from peg_video.models.vit import GLOBAL_POOLS, VIDEO_ENCODINGS

    doc = build_video_model.__doc__
    own = set(inspect.signature(build_video_model).parameters)  # its own arguments, documented as such
    keywords = set(inspect.signature(VideoTransformer).parameters) - own
    assert not [k for k in keywords if f"``{k}``" not in doc]
    from peg_core.registry import get_encoding

    # every name the suite itself registers for the video ViT (a plugin documents its own)
    ours = [n for n in VIDEO_ENCODINGS.names()[1:] if get_encoding(n).build.__module__.startswith("peg_")]
    builtin = [*ours, "none", "peg3d+rope-3d"]
    assert not [v for v in (*builtin, *GLOBAL_POOLS) if f'``"{v}"``' not in doc]
