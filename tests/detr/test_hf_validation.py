"""A Hugging Face DETR folder is checked before use: config.json a JSON object with typed fields, and the
classifier / q-k-v tensors of the right dimensions; each problem is one line naming the file and key."""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.interop import WeightsError
from peg_detr.hf import read_hf_state
from peg_detr.models import build_detr, load_official_checkpoint

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
        ({"auxiliary_loss": "yes"}, "config.json key 'auxiliary_loss' must be true or false; got yes"),
        ({"d_model": 0}, "config.json key 'd_model' must be a positive int; got 0"),
        ({"id2label": ["a"]}, "config.json key 'id2label' must be an object; got ['a']"),
    ],
)
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
