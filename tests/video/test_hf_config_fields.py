"""A Hugging Face video folder's config.json / preprocessor_config.json checked field by field.

A field of the wrong type or range (``hidden_size: 0``, ``tubelet_size: 0``, ``patch_size: [16]``,
``id2label`` keys that are not labels, ``image_std: 0``) is one :class:`WeightsError` line naming the
file and the field, before weights are read or a model is built; a size the weights do not have is
named against the tensor, before the model of that size is built.  No transformers needed: folders
are written by hand or by :func:`peg_video.interop.hf.export_hf`.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.interop.io import WeightsError
from peg_video import VideoTransformer, from_hf
from peg_video.interop.hf import export_hf, read_hf_video_config

VIDEOMAE = {"model_type": "videomae", "architectures": ["VideoMAEForVideoClassification"], "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "image_size": 32,
            "patch_size": 8, "num_frames": 4, "tubelet_size": 2, "id2label": {"0": "a", "1": "b", "2": "c"}}  # fmt: skip


def _config_error(tmp_path, config: dict, name: str = "config.json", pre: dict | None = None) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if pre is not None:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    with pytest.raises(WeightsError) as e:
        read_hf_video_config(tmp_path)
    assert e.value.where == str(tmp_path / name) and "\n" not in str(e.value)
    return e.value.what


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 0}, "config.json key 'hidden_size' must be a positive int; got 0"),
        ({"hidden_size": "768"}, 'config.json key \'hidden_size\' must be a positive int; got "768"'),
        ({"tubelet_size": 0}, "config.json key 'tubelet_size' must be a positive int; got 0"),
        ({"patch_size": [16]}, "config.json key 'patch_size' must be a positive int or a list [height, width] of "
                               "two, each up to 32; got [16]"),
        ({"patch_size": 64}, "config.json key 'patch_size' must be a positive int or a list [height, width] of two, "
                             "each up to 32; got 64"),
        ({"image_size": "224"}, "config.json key 'image_size' must be a positive int or a list [height, width] of "
                                'two; got "224"'),
        ({"image_size": 36}, "config.json key 'image_size' must be a multiple of patch_size [8, 8]; got 36"),
        ({"num_frames": 5}, "config.json key 'num_frames' must be a multiple of tubelet_size 2; got 5"),
        ({"num_attention_heads": 5}, "config.json key 'num_attention_heads' must be a divisor of hidden_size 32; "
                                     "got 5"),
        ({"num_hidden_layers": -2}, "config.json key 'num_hidden_layers' must be a positive int; got -2"),
        ({"layer_norm_eps": 0}, "config.json key 'layer_norm_eps' must be a number > 0 and < 1; got 0"),
        ({"num_channels": 4}, "config.json key 'num_channels' must be 3 (peg_video reads RGB clips); got 4"),
        ({"hidden_act": "relu"}, 'config.json key \'hidden_act\' must be "gelu" (peg_video\'s MLP is gelu); '
                                 'got "relu"'),
        ({"use_mean_pooling": "yes"}, 'config.json key \'use_mean_pooling\' must be true or false; got "yes"'),
        ({"id2label": {"0": "a", "x": "b"}}, "config.json key 'id2label' has the key 'x', not a label 0..1"),
        ({"id2label": {"1": "a"}}, "config.json key 'id2label' must number the labels 0..0; it lacks [0]"),
        ({"architectures": "VideoMAEForVideoClassification"}, "config.json key 'architectures' must be a list of "
                                                              'class names; got "VideoMAEForVideoClassification"'),
    ],
)  # fmt: skip
def test_videomae_fields(tmp_path, change, message):
    assert _config_error(tmp_path, {**VIDEOMAE, **change}) == message


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "timesformer", "attention_type": "space_only"},
         "config.json key 'attention_type' must be one of 'divided_space_time', 'joint_space_time'; "
         'got "space_only"'),
        ({"model_type": "timesformer", "qkv_bias": 1}, "config.json key 'qkv_bias' must be true or false; got 1"),
        ({"model_type": "vjepa2", "frames_per_clip": 0}, "config.json key 'frames_per_clip' must be a positive int; "
                                                         "got 0"),
        ({"model_type": "vjepa2", "crop_size": [256, 0]}, "config.json key 'crop_size' must be a positive int or a "
                                                          "list [height, width] of two; got [256, 0]"),
        ({"model_type": "vjepa2", "mlp_ratio": 0}, "config.json key 'mlp_ratio' must be a number > 0 and <= 64; "
                                                   "got 0"),
        ({"model_type": "vjepa2", "hidden_size": 10, "num_attention_heads": 2, "mlp_ratio": 0.25},
         "config.json key 'mlp_ratio' must be a ratio that gives a whole number of channels with hidden_size 10; "
         "got 0.25"),
        ({"model_type": "vjepa2", "architectures": ["VJEPA2ForVideoClassification"], "num_pooler_layers": "3"},
         'config.json key \'num_pooler_layers\' must be a non-negative int; got "3"'),
    ],
)  # fmt: skip
def test_timesformer_and_vjepa2_fields(tmp_path, config, message):
    assert _config_error(tmp_path, config) == message


@pytest.mark.parametrize(
    ("pre", "message"),
    [
        ({"image_mean": [0.5, 0.5, 0.5], "image_std": 0},
         "preprocessor_config.json key 'image_std' must be a number or a list of 3 numbers, each > 0; got 0"),
        ({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.2, 0.0, 0.2]},
         "preprocessor_config.json key 'image_std' must be a number or a list of 3 numbers, each > 0; "
         "got [0.2, 0.0, 0.2]"),
        ({"image_mean": [0.5, 0.5], "image_std": 0.2},
         "preprocessor_config.json key 'image_mean' must be a number or a list of 3 numbers; got [0.5, 0.5]"),
        ({"image_mean": "0.5", "image_std": 0.2},
         'preprocessor_config.json key \'image_mean\' must be a number or a list of 3 numbers; got "0.5"'),
    ],
)  # fmt: skip
def test_preprocessor_fields(tmp_path, pre, message):
    """``image_std: 0`` names the field here, instead of a training that reports ``loss is nan``."""
    assert _config_error(tmp_path, VIDEOMAE, "preprocessor_config.json", pre) == message


def test_a_single_number_normalises_every_channel(tmp_path):
    """transformers reads ``image_mean: 0.5`` as 0.5 for each channel; so does peg_video."""
    (tmp_path / "config.json").write_text(json.dumps(VIDEOMAE))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": 0.5, "image_std": 0.25}))
    info = read_hf_video_config(tmp_path)
    assert info["mean"] == (0.5, 0.5, 0.5) and info["std"] == (0.25, 0.25, 0.25)
    assert info["tubelet"] == (2, 8, 8) and info["id2label"] == {0: "a", 1: "b", 2: "c"}


@pytest.fixture
def exported(tmp_path):
    """A VideoMAE-layout folder of a tiny peg_video model (32 wide, 2 layers, tubelet 2x8x8, 3 classes)."""
    torch.manual_seed(0)
    model = VideoTransformer(32, 2, 2, num_classes=3, num_frames=4, img_size=32, tubelet=(2, 8, 8),
                             pos_enc="sinusoid-1d", fc_norm_eps=1e-5)  # fmt: skip
    return export_hf(model, tmp_path / "folder")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 1 << 20, "num_attention_heads": 1},
         "config.json key 'hidden_size' is 1048576, but the weights' "
         "videomae.embeddings.patch_embeddings.projection.weight has shape (32, 3, 2, 8, 8)"),
        ({"tubelet_size": 4}, "config.json key 'tubelet_size' is 4, but the weights' "
                              "videomae.embeddings.patch_embeddings.projection.weight has shape (32, 3, 2, 8, 8)"),
        ({"patch_size": 16}, "config.json key 'patch_size' is 16, but the weights' "
                             "videomae.embeddings.patch_embeddings.projection.weight has shape (32, 3, 2, 8, 8)"),
        ({"num_hidden_layers": 12}, "config.json key 'num_hidden_layers' is 12, but the weights have 2 "
                                    "(videomae.encoder.layer.0..1)"),
    ],
)  # fmt: skip
def test_sizes_against_the_weights_before_building(exported, change, message):
    """A 2^20-wide config over 32-wide weights is named, not built (that model would not fit in memory)."""
    config = json.loads((exported / "config.json").read_text())
    (exported / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(WeightsError) as e:
        from_hf(exported)
    assert (e.value.what, e.value.where) == (message, str(exported / "config.json"))


def test_the_exported_folder_loads(exported):
    model, report = from_hf(exported)
    assert model.num_classes == 3 and not report.missing
