"""A start detector rebuilt for another label set: shared names keep their rows, the rest start fresh.

Every family (DETR, RT-DETR, D-FINE, DEIMv2) is checked tensor by tensor against its start: the
class rows of the kept classes, the non-class rows (DETR's "no object", the denoising padding
row), every other tensor; the fresh rows at the family's initialisation (the focal prior bias);
and the list of class-dependent tensors is complete (every tensor whose shape follows the
class count is in it).
"""

from __future__ import annotations

import math

import pytest
import torch

from peg_core.interop.classes import (
    ClassParam,
    class_key,
    match_classes,
    read_class_map,
    transfer_class_rows,
)
from peg_detr.model import build_model, relabel
from tests.detr.rtdetr_checks import tiny_rtdetr_config

FAMILIES = {
    "detr": dict(arch="detr", backbone="tiny", pos_enc="peg", hidden_dim=32, num_heads=2, enc_layers=1,
                 dec_layers=2, dim_feedforward=64, num_queries=8),
    "rtdetr": dict(arch="rtdetr", backbone="tiny", pos_enc="peg", hidden_dim=32, num_heads=2, dim_feedforward=64,
                   dec_layers=2, encoder_expansion=0.5, num_queries=10, num_denoising=8),
    "dfine": dict(arch="dfine", backbone="tiny", pos_enc="peg", hidden_dim=32, num_heads=2, dim_feedforward=64,
                  dec_layers=2, encoder_expansion=0.5, depth_mult=0.34, num_points=[3, 6, 3], num_queries=10,
                  num_denoising=8),
    "deimv2": dict(arch="deimv2", backbone="vit_tiny", hidden_dim=32, num_heads=2, dec_heads=2,
                   enc_dim_feedforward=64, dim_feedforward=64, dec_layers=2, num_queries=10, num_denoising=8,
                   vit_options=dict(embed_dim=32, depth=4, num_heads=2, num_reg_tokens=2),
                   vit_out_indices=[0, 1, 2], sta_inplanes=8),
}  # fmt: skip
START = ["person", "Bicycle", "car", "dog"]
# label 0 "": an id no category uses (--labels ids); "car " and "BICYCLE" keep theirs; "zebra" is new
NEW = ["", "zebra", "car ", "BICYCLE", "motorbike", "cat"]
PRIOR = -math.log((1 - 0.01) / 0.01)  # the focal / VFL class bias the RT-DETR family starts from


def _build(family: str, num_classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model, _, _ = build_model({**FAMILIES[family], "num_classes": num_classes})
    return model


def test_names_match_case_and_whitespace_insensitively_and_through_a_class_map() -> None:
    assert class_key("  Traffic   Light ") == class_key("traffic_light") == "traffic light"
    t = match_classes(NEW, START, {"Motorbike": "bicycle"})
    # "motorbike" -> bicycle through the map; "BICYCLE" by name; both keep start label 1
    assert t.source == (None, None, 2, 1, 1, None)
    assert t.kept == [(2, 2), (3, 1), (4, 1)] and t.fresh == [1, 5]
    assert t.mapped == {"motorbike": "Bicycle"}
    assert (
        t.line()
        == "kept 3 of 5 classes by name (car , BICYCLE, motorbike <- Bicycle); 2 start fresh (zebra, cat)"
    )
    assert not t.identity and match_classes(START, START).identity
    assert match_classes(["a", "b"], ["x", "y"]).line() == "kept 0 of 2 classes by name; 2 start fresh (a, b)"
    many = match_classes([f"c{i}" for i in range(12)], [])
    assert many.line(limit=3) == "kept 0 of 12 classes by name; 12 start fresh (c0, c1, c2, ... 9 more)"
    doc = t.to_json()
    assert doc["kept"][2] == {"label": 4, "name": "motorbike", "start_label": 1, "start_name": "Bicycle"}
    assert doc["fresh"] == [{"label": 1, "name": "zebra"}, {"label": 5, "name": "cat"}]


def test_a_class_map_naming_no_class_is_an_error() -> None:
    with pytest.raises(ValueError, match="'motorcycle': no category of the data"):
        match_classes(NEW, START, {"motorcycle": "bicycle"})
    with pytest.raises(ValueError, match="the start has no class of this name"):
        match_classes(NEW, START, {"motorbike": "moped"})
    with pytest.raises(ValueError, match="a class map is a JSON object"):
        read_class_map(["motorbike", "bicycle"], "map.json")
    with pytest.raises(ValueError, match="the same name"):
        read_class_map({"Cat": "dog", "cat ": "dog"}, "map.json")


def test_rows_are_copied_along_any_axis_with_the_non_class_rows() -> None:
    g = torch.Generator().manual_seed(0)
    start = {
        "head": torch.randn(5, 3, generator=g),
        "cols": torch.randn(2, 4, generator=g),
        "w": torch.ones(2),
    }
    fresh = {"head": torch.zeros(4, 3), "cols": torch.zeros(2, 3), "w": torch.zeros(2)}
    params = [ClassParam("head", extra=1), ClassParam("cols", dim=1)]
    t = match_classes(["b", "new", "d"], ["a", "b", "c", "d"])
    state, converted = transfer_class_rows(fresh, start, params, t)
    assert torch.equal(state["head"][0], start["head"][1]) and torch.equal(state["head"][2], start["head"][3])
    assert torch.equal(state["head"][1], torch.zeros(3))  # fresh
    assert torch.equal(state["head"][3], start["head"][4])  # the non-class row
    assert torch.equal(state["cols"][:, 2], start["cols"][:, 3]) and torch.equal(
        state["cols"][:, 1], torch.zeros(2)
    )
    assert torch.equal(state["w"], start["w"])  # not class-dependent: the start's
    assert converted["head"] == "2 of 3 class rows from the start (+1 non-class)"
    with pytest.raises(ValueError, match="head: 4 / 5 rows"):
        transfer_class_rows(fresh, start, params, match_classes(["b", "new", "d"], ["a", "b", "c", "d", "e"]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_class_dependent_tensors_are_every_tensor_that_follows_the_class_count(family: str) -> None:
    a, b = _build(family, 4, 0).state_dict(), _build(family, 7, 0).state_dict()
    follows = {k for k in a if a[k].shape != b[k].shape}
    declared = {p.key for p in _build(family, 4, 0).class_parameters()}
    assert follows == declared


@pytest.mark.parametrize("family", list(FAMILIES))
def test_relabel_keeps_shared_classes_row_by_row_and_starts_the_others_fresh(family: str) -> None:
    start = _build(family, len(START), seed=1)
    fresh_reference = _build(family, len(NEW), seed=2)  # what fresh rows look like in this family
    model, criterion, _, report = relabel(start, NEW, START, {"motorbike": "bicycle"})
    assert model.num_classes == len(NEW) and criterion.num_classes == len(NEW)
    assert report.classes.kept == [(2, 2), (3, 1), (4, 1)]
    ours, theirs = model.state_dict(), start.state_dict()
    params = {p.key: p for p in model.class_parameters()}
    assert set(report.converted) == set(params)
    for key, value in ours.items():
        if key not in params:
            torch.testing.assert_close(value, theirs[key], rtol=0, atol=0, msg=key)
            continue
        p = params[key]
        for new, old in report.classes.kept:
            assert torch.equal(value.select(p.dim, new), theirs[key].select(p.dim, old)), key
        for r in range(1, p.extra + 1):  # no object / denoising padding: the start's
            assert torch.equal(value.select(p.dim, -r), theirs[key].select(p.dim, -r)), key
        if key.endswith("bias") and family != "detr":  # fresh class biases at the focal prior
            for label in (0, 1, 5):
                assert value[label].item() == pytest.approx(PRIOR), key
                assert value[label].item() == pytest.approx(fresh_reference.state_dict()[key][label].item())
    # the model computes: a forward at training and evaluation
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(1, 3, 64, 96))
    assert out["pred_logits"].shape[-1] == len(NEW) + (1 if family == "detr" else 0)


def test_relabel_of_a_folder_model_gives_its_config_the_new_names(tmp_path) -> None:
    """A model from a Hugging Face folder is rebuilt from the folder's config with the new id2label."""
    transformers = pytest.importorskip("transformers")
    from peg_detr.interop import from_hf

    config = tiny_rtdetr_config(transformers, id2label=dict(enumerate(START)))
    torch.manual_seed(0)
    transformers.RTDetrForObjectDetection(config).save_pretrained(tmp_path / "hf")
    start, _ = from_hf(tmp_path / "hf", pos_enc="peg")
    model, _, _, report = relabel(start, ["dog", "apple", ""], START)
    assert report.classes.kept == [(0, 3)]
    hf = model.build_config["hf_config"]
    assert hf["id2label"] == {"0": "dog", "1": "apple", "2": "LABEL_2"} and model.num_classes == 3
    rebuilt, _, _ = build_model({"arch": "rtdetr", **model.build_config})  # a resume rebuilds the same shapes
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()
    }


@pytest.mark.filterwarnings("ignore:resnet18 backbone starts from random weights")
def test_from_hf_with_classes_rebuilds_detr_and_rtdetr_folders(tmp_path) -> None:
    """``peg_detr.from_hf(folder, classes=...)``: the Python form of ``train --init FOLDER``."""
    transformers = pytest.importorskip("transformers")
    from peg_detr.interop import from_hf

    detr = transformers.DetrConfig(
        use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, d_model=32, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        num_queries=5, auxiliary_loss=False, id2label=dict(enumerate(START)),
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.DetrForObjectDetection(detr).save_pretrained(tmp_path / "detr")
    start, _ = from_hf(tmp_path / "detr")
    model, report = from_hf(tmp_path / "detr", classes=["Dog", "", "moto"], class_map={"moto": "bicycle"})
    assert report.classes.kept == [(0, 3), (2, 1)] and model.num_classes == 3
    ours, theirs = model.state_dict()["class_embed.weight"], start.state_dict()["class_embed.weight"]
    assert (
        torch.equal(ours[0], theirs[3])
        and torch.equal(ours[2], theirs[1])
        and torch.equal(ours[3], theirs[4])
    )
    assert not model.training
