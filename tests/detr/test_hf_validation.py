"""A Hugging Face DETR folder is checked before use: config.json a JSON object with typed fields, and the
classifier / q-k-v tensors of the right dimensions; each problem is one line naming the file and key."""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.interop import WeightsError
from peg_detr.interop import load_official_checkpoint, read_hf_state
from peg_detr.models import build_detr

pytest.importorskip("safetensors")
Q = "model.encoder.layers.0.self_attn.q_proj"
K = "model.encoder.layers.0.self_attn.k_proj"


def _folder(tmp_path, config, **tensors):
    from safetensors.torch import save_file

    folder = tmp_path / "detr"
    folder.mkdir()
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    base = {"class_labels_classifier.weight": torch.zeros(4, 8), "class_labels_classifier.bias": torch.zeros(4),
            f"{Q}.weight": torch.zeros(8, 8), f"{Q}.bias": torch.zeros(8),
            f"{K}.weight": torch.zeros(8, 8), f"{K}.bias": torch.zeros(8)}  # fmt: skip
    save_file({**base, **tensors}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([1, 2], "config.json is not a JSON object (got list)"),
        ('"detr"', "config.json is not a JSON object (got str)"),
        ({"auxiliary_loss": "yes"}, 'config.json key \'auxiliary_loss\' must be true or false; got "yes"'),
        ({"d_model": 0}, "config.json key 'd_model' must be a positive int; got 0"),
        ({"id2label": ["a"]}, 'config.json key \'id2label\' must be a non-empty object {"0": name, ...} whose keys '
                              'are the labels 0..n-1; got ["a"]'),
        ({"num_queries": "300"}, 'config.json key \'num_queries\' must be a positive int; got "300"'),
        ({"num_queries": -1}, "config.json key 'num_queries' must be a positive int; got -1"),
        ({"num_queries": 300.0}, "config.json key 'num_queries' must be a positive int; got 300.0"),
        ({"num_queries": 10**9}, "config.json key 'num_queries' must be a positive int; got 1000000000"),
        ({"d_model": 8, "encoder_attention_heads": 3},
         "config.json key 'encoder_attention_heads' must be a divisor of d_model 8; got 3"),
        ({"encoder_attention_heads": 8, "decoder_attention_heads": 4},
         "config.json key 'decoder_attention_heads' must be encoder_attention_heads 8 (peg_detr's DETR has one "
         "head count); got 4"),
        ({"dropout": 1.5}, "config.json key 'dropout' must be a number >= 0 and < 1; got 1.5"),
        ({"backbone": "resnet34"}, "config.json key 'backbone' must be one of 'resnet18', 'resnet50', 'resnet101'; "
                                   'got "resnet34"'),
        ({"backbone_config": {"backbone": 50}}, "config.json key 'backbone_config.backbone' must be one of "
                                                "'resnet18', 'resnet50', 'resnet101'; got 50"),
        ({"backbone_config": {"model_type": "resnet", "embedding_size": 32}},
         "config.json key 'backbone_config.embedding_size' must be 64 (torchvision's ResNet stem); got 32"),
        ({"backbone_config": {"model_type": "vit"}},
         "config.json key 'backbone_config.model_type' must be one of 'timm_backbone', 'resnet'; got \"vit\""),
        ({"model_type": "rt_detr"}, "config.json key 'model_type' must be one of 'detr'; got \"rt_detr\""),
        ({"id2label": {"0": "a", "one": "b"}}, "config.json key 'id2label' has the key 'one', not a label 0..1"),
        ({"id2label": {"0": "a", "2": "b"}}, "config.json key 'id2label' must number the labels 0..1; it lacks [1]"),
        ({"id2label": {"0": ["a"]}}, 'config.json key \'id2label\' names label 0 ["a"], not a string'),
        ({"num_labels": True}, "config.json key 'num_labels' must be a positive int; got true"),
        ("[" * 100_000 + "]" * 100_000, "config.json is nested deeper than 64 levels"),
    ],
)  # fmt: skip
def test_bad_config_json_names_the_file_and_key(tmp_path, config, message):
    folder = _folder(tmp_path, config)
    with pytest.raises(WeightsError) as e:
        read_hf_state(folder)
    assert str(e.value) == f"{message}: {folder / 'config.json'}"


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"class_labels_classifier.weight": torch.tensor(1.0)},
         "key class_labels_classifier.weight has shape (): expected (out, in)"),
        ({"class_labels_classifier.bias": torch.zeros(3)},
         "key class_labels_classifier.bias has shape (3,): expected (4,) like class_labels_classifier.weight"),
        ({f"{K}.weight": torch.zeros(8, 4)}, f"key {K}.weight has shape (8, 4): expected (8, 8) like {Q}"),
        ({f"{Q}.bias": torch.zeros(8, 1)}, f"key {Q}.bias has shape (8, 1): expected (out,)"),
    ],
)  # fmt: skip
def test_bad_tensor_shapes_name_the_file_and_key(tmp_path, tensors, message):
    folder = _folder(tmp_path, {"model_type": "detr"}, **tensors)
    with pytest.raises(WeightsError) as e:
        read_hf_state(folder)
    assert str(e.value) == f"{message}: {folder / 'model.safetensors'}"


def test_a_scalar_class_embed_in_an_official_file_is_one_line(tmp_path):
    model, _, _ = build_detr("tiny", "sine", num_classes=3, num_queries=5, hidden_dim=32, num_heads=2,
                             enc_layers=1, dec_layers=1, dim_feedforward=64)  # fmt: skip
    state = {**model.state_dict(), "class_embed.weight": torch.tensor(0.0)}
    path = tmp_path / "detr.pth"
    torch.save({"model": state}, path)
    with pytest.raises(WeightsError) as e:
        load_official_checkpoint(model, path)
    assert str(e.value) == (
        f"key class_embed.weight has shape (): expected (num_classes + 1, hidden_dim): {path}"
    )


_LABELS = {"0": "a", "1": "b", "2": "c"}  # 3 classes + no-object: the 4 rows of _folder's classifier


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ({"id2label": {"0": "a", "1": "b"}}, {},
         "config.json key 'id2label' gives 2 classes, but the weights' class_labels_classifier.weight has shape (4, 8) "
         "(3 classes + no-object)"),
        ({"num_labels": 5}, {},
         "config.json key 'num_labels' gives 5 classes, but the weights' class_labels_classifier.weight has shape "
         "(4, 8) (3 classes + no-object)"),
        ({"id2label": _LABELS, "d_model": 16}, {"model.input_projection.weight": torch.zeros(8, 32, 1, 1)},
         "config.json key 'd_model' is 16, but the weights' model.input_projection.weight has shape (8, 32, 1, 1)"),
        ({"id2label": _LABELS, "num_queries": 100}, {"model.query_position_embeddings.weight": torch.zeros(5, 8)},
         "config.json key 'num_queries' is 100, but the weights' model.query_position_embeddings.weight has shape "
         "(5, 8)"),
        ({"id2label": _LABELS, "encoder_layers": 6}, {},
         "config.json key 'encoder_layers' is 6, but the weights have 1 (model.encoder.layers.0..0)"),
        ({"id2label": _LABELS, "encoder_ffn_dim": 2048}, {"model.encoder.layers.0.fc1.weight": torch.zeros(16, 8)},
         "config.json key 'encoder_ffn_dim' is 2048, but the weights' model.encoder.layers.0.fc1.weight has shape "
         "(16, 8)"),
    ],
)  # fmt: skip
def test_config_sizes_against_the_weights(tmp_path, config, tensors, message):
    """A size the weights do not have is named before any model is built (a 10^6-wide one would allocate first)."""
    folder = _folder(tmp_path, {"model_type": "detr", "encoder_layers": 1, **config}, **tensors)
    with pytest.raises(WeightsError) as e:
        read_hf_state(folder)
    assert str(e.value) == f"{message}: {folder / 'config.json'}"


def test_from_hf_detr_names_the_field_before_building(tmp_path):
    """``from_hf`` on a DETR folder: a 2^20-wide ``d_model`` is named, not built (that model would not fit)."""
    from peg_detr import from_hf

    config = {"model_type": "detr", "id2label": _LABELS, "d_model": 1 << 20, "encoder_layers": 1}
    folder = _folder(tmp_path, config, **{"model.input_projection.weight": torch.zeros(8, 32, 1, 1)})
    with pytest.raises(WeightsError) as e:
        from_hf(folder)
    assert str(e.value) == (
        "config.json key 'd_model' is 1048576, but the weights' model.input_projection.weight has shape "
        f"(8, 32, 1, 1): {folder / 'config.json'}"
    )


# ------------------------------------------------------------------------------------------- RT-DETR


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"backbone_config": {"out_indices": [2, 3, 5]}},
         "config.json key 'backbone_config.out_indices' must be a non-empty list of ints in 1..4; got [2, 3, 5]"),
        ({"backbone_config": {"out_indices": [3, 2, 4]}},
         "config.json key 'backbone_config.out_indices' must be increasing stage numbers in 1..4; got [3, 2, 4]"),
        ({"backbone_config": {"depths": [3, 4]}},
         "config.json key 'backbone_config.depths' must be a list of 4 ints >= 1; got [3, 4]"),
        ({"backbone_config": {"hidden_sizes": [64, 128, 0, 512]}},
         "config.json key 'backbone_config.hidden_sizes' must be a list of 4 ints >= 1; got [64, 128, 0, 512]"),
        ({"backbone_config": {"layer_type": "preact"}},
         "config.json key 'backbone_config.layer_type' must be one of 'basic', 'bottleneck'; got \"preact\""),
        ({"backbone_config": [1]}, "config.json key 'backbone_config' must be an object; got [1]"),
        ({"num_queries": "300"}, "config.json key 'num_queries' must be a positive int; got \"300\""),
        ({"num_queries": -1}, "config.json key 'num_queries' must be a positive int; got -1"),
        ({"d_model": 0}, "config.json key 'd_model' must be a positive int; got 0"),
        ({"encoder_in_channels": [512, 1024, 1024]},
         "config.json key 'encoder_in_channels' must be the widths [512, 1024, 2048] of backbone stages [2, 3, 4] "
         "(hidden_sizes); got [512, 1024, 1024]"),
        ({"encode_proj_layers": [3]}, "config.json key 'encode_proj_layers' must be a non-empty list of ints in 0..2; "
                                      "got [3]"),
        ({"encoder_hidden_dim": 30, "encoder_attention_heads": 6},
         "config.json key 'encoder_hidden_dim' must be a multiple of 4 (AIFI's sin-cos table); got 30"),
        ({"encoder_attention_heads": 7}, "config.json key 'encoder_attention_heads' must be a divisor of "
                                         "encoder_hidden_dim 256; got 7"),
        ({"hidden_expansion": 0}, "config.json key 'hidden_expansion' must be a number > 0 and <= 64; got 0"),
        ({"layer_norm_eps": -1e-5}, "config.json key 'layer_norm_eps' must be a number > 0 and < 1; got -1e-05"),
        ({"decoder_in_channels": [256, 128, 256]}, "config.json key 'decoder_in_channels' must be the encoder's width "
                                                   "encoder_hidden_dim 256 at every level; got [256, 128, 256]"),
        ({"num_feature_levels": 4}, "config.json key 'num_feature_levels' must be len(decoder_in_channels) 3; got 4"),
        ({"decoder_activation_function": "tanh"}, "config.json key 'decoder_activation_function' must be one of "
                                                  "'relu', 'gelu', 'silu'; got \"tanh\""),
        ({"with_box_refine": False}, "config.json key 'with_box_refine' must be true (peg_detr's RT-DETR refines its "
                                     "boxes layer by layer); got false"),
        ({"label_noise_ratio": 2}, "config.json key 'label_noise_ratio' must be a number >= 0 and <= 1; got 2"),
        ({"id2label": {"zero": "a"}}, "config.json key 'id2label' has the key 'zero', not a label 0..0"),
    ],
)  # fmt: skip
def test_bad_rtdetr_config_json_names_the_file_and_field(tmp_path, config, message):
    """Checked before the weights are read or a model is built (the folder has no weights at all)."""
    from peg_detr import from_hf

    folder = tmp_path / "rtdetr"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "rt_detr", **config}))
    with pytest.raises(WeightsError) as e:
        from_hf(folder)
    assert str(e.value) == f"{message}: {folder / 'config.json'}"
