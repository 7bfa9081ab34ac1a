"""peg_core.interop.hf_folder: a save_pretrained folder's config.json and weights (one file or shards)."""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.interop import WeightsError, read_hf_config, read_hf_weights, write_state_file


def _folder(tmp_path, config=None):
    (tmp_path / "config.json").write_text(json.dumps(config or {"model_type": "x"}))
    return tmp_path


def test_config_and_single_file(tmp_path):
    folder = _folder(tmp_path)
    write_state_file({"a": torch.ones(2)}, folder / "model.safetensors")
    torch.save({"a": torch.zeros(2)}, folder / "pytorch_model.bin")
    assert read_hf_config(folder) == {"model_type": "x"}
    state, where = read_hf_weights(folder)
    assert where.name == "model.safetensors" and torch.equal(state["a"], torch.ones(2))  # safetensors first


def test_shards_are_merged(tmp_path):
    folder = _folder(tmp_path)
    write_state_file({"a": torch.ones(2)}, folder / "model-00001-of-00002.safetensors")
    write_state_file({"b": torch.full((3,), 2.0)}, folder / "model-00002-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    state, where = read_hf_weights(folder)
    assert where.name == "model.safetensors.index.json" and sorted(state) == ["a", "b"]
    assert torch.equal(state["b"], torch.full((3,), 2.0))


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(WeightsError, match="Hugging Face folder not found"):
        read_hf_config(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(WeightsError, match="got a file"):
        read_hf_config(tmp_path / "file")
    with pytest.raises(WeightsError, match=r"no config\.json"):
        read_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(WeightsError, match="not a JSON object"):
        read_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(WeightsError, match="not valid JSON"):
        read_hf_config(tmp_path)
    with pytest.raises(WeightsError, match=r"neither model\.safetensors nor pytorch_model\.bin"):
        read_hf_weights(tmp_path)
    index = {"weight_map": {"a": "../elsewhere.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="outside the folder"):
        read_hf_weights(tmp_path)
    torch.save({"a": [1, 2]}, tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(WeightsError, match="not a state dict of tensors"):
        read_hf_weights(tmp_path)
