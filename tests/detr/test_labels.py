"""``--labels ids|contiguous``: the label map, the dataset, COCO evaluation and the recipes' defaults.

Categories with gaps (ids 1, 3, 7, as COCO's 1..90 has gaps) map to labels 0, 1, 2 and back; COCO
evaluation of the same detections gives the same numbers whichever labels the model used; the
checkpoint records the map, so predict / export-hf need no annotation file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg_detr.cli import parse_train_args
from peg_detr.data import (
    CocoDataError,
    CocoDetr,
    LabelMap,
    load_coco_annotations,
    make_rtdetr_val_transforms,
    match_label_names,
)
from peg_detr.evaluation import BACKENDS, CocoEvaluator
from peg_detr.model import load_model
from tests.detr.label_runs import NAMES, SMALL_RUN, train_contiguous

# ------------------------------------------------------------------------------------ the label map


def test_contiguous_maps_ids_with_gaps_to_labels_and_back():
    cats = [{"id": 7, "name": "triangle"}, {"id": 1, "name": "square"}, {"id": 3, "name": "disc"}]
    contiguous = LabelMap.from_categories(cats, "contiguous")
    assert contiguous.categories == ((1, "square"), (3, "disc"), (7, "triangle"))
    assert contiguous.num_labels == 3
    assert contiguous.labels_of(torch.tensor([7, 1, 3, 3])).tolist() == [2, 0, 1, 1]
    # a label past the last category (a larger --num-classes) or negative has none: -1
    assert contiguous.category_ids_of(torch.tensor([0, 1, 2, 3, -1])).tolist() == [1, 3, 7, -1, -1]
    assert contiguous.names(4) == ["square", "disc", "triangle", ""]
    assert [contiguous.category_id(k) for k in range(4)] == [1, 3, 7, None]
    with pytest.raises(KeyError, match=r"\[2\]"):
        contiguous.labels_of(torch.tensor([1, 2]))
    ids = LabelMap.from_categories(cats, "ids")  # DETR's: labels are the ids
    assert ids.num_labels == 8 and ids.labels_of(torch.tensor([7, 1])).tolist() == [7, 1]
    assert ids.category_ids_of(torch.tensor([0, 7])).tolist() == [0, 7]
    assert ids.names(8) == ["", "square", "", "disc", "", "", "", "triangle"]
    assert (contiguous.check_fits(2), ids.check_fits(4), ids.check_fits(8)) == ([7], [7], [])


def test_the_map_round_trips_through_json_and_old_checkpoints_read_as_ids():
    cats = [{"id": 1, "name": "square"}, {"id": 3, "name": "disc"}, {"id": 7, "name": "triangle"}]
    m = LabelMap.from_categories(cats, "contiguous")
    doc = m.to_json()
    assert doc == {"mode": "contiguous", "labels": [
        {"label": 0, "id": 1, "name": "square"}, {"label": 1, "id": 3, "name": "disc"},
        {"label": 2, "id": 7, "name": "triangle"}]}  # fmt: skip
    assert LabelMap.from_json(json.loads(json.dumps(doc))) == m
    assert LabelMap.from_meta({"labels": doc, "categories": []}) == m
    old = LabelMap.from_meta({"categories": cats})  # a checkpoint written before meta["labels"]
    assert old.mode == "ids" and old.names(4) == ["", "square", "", "disc"]
    with pytest.raises(ValueError, match="not a label map"):
        LabelMap.from_json({"mode": "contiguous", "labels": [3]})
    with pytest.raises(ValueError, match="unknown label mode"):
        LabelMap.from_categories(cats, "sparse")


def test_folder_names_pick_the_mode_case_insensitively():
    cats = [{"id": 1, "name": "person"}, {"id": 2, "name": "bicycle"}, {"id": 5, "name": "Airplane"}]
    assert match_label_names(["Person", "bicycle", "airplane "], cats) == "contiguous"  # RT-DETR's 80
    # DETR's folders: one name per id up to the largest, "N/A" in the gaps
    assert match_label_names(["N/A", "person", "bicycle", "N/A", "N/A", "airplane"], cats) == "ids"
    assert match_label_names(["LABEL_0", "LABEL_1", "LABEL_2"], cats) is None
    assert match_label_names(["bicycle", "person", "airplane"], cats) is None  # another order
    assert match_label_names(["person", "bicycle"], cats) is None


def test_recipes_default_to_their_label_mode():
    def labels(*flags: str) -> str:
        return parse_train_args(["--data-root", "x", *flags]).labels

    assert labels() == "ids" and labels("--config", "cpvt_peg_50ep") == "ids"  # DETR: category ids
    for name in ("rtdetr_r18vd_6x", "rtdetr_r50vd_6x", "rtdetr_r18vd_6x_peg", "rtdetr_r50vd_6x_peg"):
        assert labels("--config", name) == "contiguous", name
    assert labels("--arch", "rtdetr") == "contiguous"  # rtdetr_r50vd_6x's values
    assert labels("--config", "rtdetr_demo_tiny") == "ids"  # the demo's README numbers are with ids
    assert labels("--config", "rtdetr_r18vd_6x", "--labels", "ids") == "ids"
    with pytest.raises(SystemExit):
        parse_train_args(["--data-root", "x", "--labels", "sparse"])


# -------------------------------------------------------------------------- dataset and evaluation


def test_dataset_gives_contiguous_labels_of_the_annotations(gap_data):
    annotations = load_coco_annotations(gap_data / "annotations" / "instances_train2017.json")
    contiguous = LabelMap.from_categories(annotations.categories, "contiguous")
    square = make_rtdetr_val_transforms(64)
    by_ids = CocoDetr(gap_data / "train2017", annotations, square)
    by_labels = CocoDetr(gap_data / "train2017", annotations, square, contiguous)
    seen = set()
    for i in range(len(by_ids)):
        image_id = by_ids.ids[i]
        want = [a["category_id"] for a in annotations.coco.imgToAnns[image_id]]
        _, t_ids = by_ids[i]
        _, t_labels = by_labels[i]
        assert t_ids["labels"].tolist() == want  # ids: unchanged, DETR's
        assert t_labels["labels"].tolist() == [{1: 0, 3: 1, 7: 2}[c] for c in want]
        torch.testing.assert_close(t_labels["boxes"], t_ids["boxes"])
        seen.update(want)
    assert seen == {1, 3, 7}  # every gap id was exercised


def test_a_category_outside_the_map_is_refused(gap_data, tmp_path):
    annotations = load_coco_annotations(gap_data / "annotations" / "instances_val2017.json")
    only_two = LabelMap.from_categories(annotations.categories[:2], "contiguous")
    with pytest.raises(CocoDataError, match=r"categories \[7\] are not among the 2"):
        CocoDetr(gap_data / "val2017", annotations, None, only_two)


def _predictions(coco, labels_of) -> dict[int, dict[str, torch.Tensor]]:
    """Hand-built detections: each ground-truth box (one shifted 2 px), right class, plus a wrong-class one."""
    preds = {}
    for image_id in sorted(coco.imgs):
        anns = coco.imgToAnns[image_id]
        boxes = [[a["bbox"][0] + 2 * (k == 0), a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                 for k, a in enumerate(anns)]  # fmt: skip
        cats = [a["category_id"] for a in anns]
        wrong = [{1: 3, 3: 7, 7: 1}[c] for c in cats[:1]]
        preds[image_id] = {
            "boxes": torch.tensor(boxes + boxes[:1], dtype=torch.float32),
            "scores": torch.tensor([0.9 - 0.1 * k for k in range(len(anns))] + [0.95]),
            "labels": labels_of(torch.tensor(cats + wrong)),
        }
    return preds


@pytest.mark.parametrize("backend", BACKENDS)
def test_coco_eval_with_the_remap_equals_the_ids_run(gap_data, backend):
    annotations = load_coco_annotations(gap_data / "annotations" / "instances_val2017.json")
    contiguous = LabelMap.from_categories(annotations.categories, "contiguous")
    by_ids = CocoEvaluator(annotations.coco, backend)
    by_ids.update(_predictions(annotations.coco, lambda c: c))
    remapped = CocoEvaluator(annotations.coco, backend, contiguous)
    remapped.update(_predictions(annotations.coco, contiguous.labels_of))
    want, got = by_ids.summarize(verbose=False), remapped.summarize(verbose=False)
    assert got == want and 0.3 < want["ap"] < 1.0  # the shifted box and the wrong class cost AP
    results_ids, _ = by_ids.gather()
    results_labels, _ = remapped.gather()
    assert results_labels == results_ids  # the results json carries the real category ids
    assert {r["category_id"] for r in results_labels} == {1, 3, 7}
    # labels the map has no category for (a 4-class head on 3 categories) are left out
    extra = CocoEvaluator(annotations.coco, backend, contiguous)
    preds = _predictions(annotations.coco, contiguous.labels_of)
    first = next(iter(preds))
    preds[first] = {k: torch.cat([v, v[:1]]) for k, v in preds[first].items()}
    preds[first]["labels"][-1] = 3
    extra.update(preds)
    assert extra.gather()[0] == results_ids


# ------------------------------------------------------------------------------- train end to end


def _train(data: Path, out: Path, *flags: str) -> dict:
    from peg_detr.cli import train

    return train(["--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(out),
                  "--epochs", "1", "--workers", "0", "--device", "cpu", "--no-progress", "--seed", "3", *SMALL_RUN,
                  *flags])  # fmt: skip


@pytest.fixture(scope="module")
def contiguous_run(gap_data, tmp_path_factory):
    """``--config rtdetr_r18vd_6x`` (no ``--labels``: the recipe's contiguous) shrunk to seconds on a CPU."""
    out = tmp_path_factory.mktemp("contiguous")
    return out, train_contiguous(gap_data, out)


def test_a_contiguous_run_records_its_map_and_predicts_category_ids(
    contiguous_run, gap_data, tmp_path, capsys
):
    from peg_core.engine import read_checkpoint
    from peg_detr.predict import Predictor

    out, report = contiguous_run
    assert report["status"] == "finished" and 0.0 <= report["eval"]["ap"] <= 1.0
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    assert ckpt["model_config"]["num_classes"] == 3  # the category count, not max id + 1 = 8
    assert LabelMap.from_meta(ckpt["meta"]) == LabelMap.from_categories(
        [{"id": i, "name": n} for i, n in NAMES.items()], "contiguous"
    )
    loaded = load_model(out / "checkpoint.pth")
    assert loaded.classes == ["square", "disc", "triangle"]
    predictor = Predictor(out / "checkpoint.pth", threshold=0.0)
    image = next((gap_data / "val2017").iterdir())
    (pred,) = predictor.predict_files([str(image)])
    assert pred.detections and all(d.label in NAMES and d.name == NAMES[d.label] for d in pred.detections)
    raw = predictor.detect(predictor.read(str(image)), threshold=0.0)
    assert [d.label for d in pred.detections] == [{0: 1, 1: 3, 2: 7}[int(k)] for k in raw["labels"]]


def test_export_hf_writes_the_recorded_names_and_init_picks_contiguous(
    contiguous_run, gap_data, tmp_path, capsys
):
    transformers = pytest.importorskip("transformers")
    from peg_detr.__main__ import main as cli

    out, _ = contiguous_run
    folder = tmp_path / "hf"
    assert cli(["export-hf", str(out / "checkpoint.pth"), str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["id2label"] == {"0": "square", "1": "disc", "2": "triangle"}
    assert transformers.RTDetrForObjectDetection.from_pretrained(folder).config.num_labels == 3
    capsys.readouterr()
    # the recipe says ids (8 classes); the folder's 3 names are the data's: contiguous, said in one line
    run = tmp_path / "init"
    assert cli(["train", "--config", "rtdetr_demo_tiny", "--data-root", str(gap_data), "--output-dir", str(run),
                "--init", str(folder), "--epochs", "1", "--workers", "0", "--no-progress", *SMALL_RUN]) == 0  # fmt: skip
    said = [line for line in capsys.readouterr().out.splitlines() if "label names" in line]
    assert said == [
        f"--init {folder}: its 3 label names are the categories of instances_train2017.json: --labels contiguous"
    ]
    assert load_model(run / "checkpoint.pth").classes == ["square", "disc", "triangle"]


def test_a_batch_larger_than_the_data_names_the_flags(gap_data, tmp_path, capsys):
    """The refusal says which flags make the batch fit (the data has 4 training images)."""
    from peg_detr.__main__ import main as cli

    out = tmp_path / "run"
    argv = ["train", "--config", "rtdetr_r18vd_6x", "--data-root", str(gap_data), "--output-dir", str(out),
            "--epochs", "1", "--workers", "0", "--no-progress"]  # fmt: skip
    assert cli(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fewer than one batch (16 per process)" in err[0]
    assert "--batch-size" in err[0] and "--total-batch-size" in err[0]
    assert not (out / "checkpoint.pth").exists()


@pytest.mark.filterwarnings("ignore:resnet18 backbone starts from random weights")
def test_init_from_an_hf_detr_folder_with_the_data_names_keeps_its_class_head(gap_data, tmp_path, capsys):
    """A DETR folder whose 3 id2label names are the data's: contiguous, the classifier loaded (not dropped)."""
    transformers = pytest.importorskip("transformers")
    from peg_core.engine import read_checkpoint
    from peg_core.interop.hf_folder import read_hf_weights
    from peg_detr.cli import train

    config = transformers.DetrConfig(
        use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, id2label={0: "Square", 1: "disc", 2: "triangle"},
    )  # fmt: skip
    folder = tmp_path / "detr"
    transformers.DetrForObjectDetection(config).save_pretrained(folder)
    capsys.readouterr()
    train([
        "--data-root", str(gap_data), "--output-dir", str(tmp_path / "run"), "--init", str(folder), "--pos-enc", "sine",
        "--backbone", "resnet18", "--num-queries", "5", "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1",
        "--dec-layers", "1", "--dim-feedforward", "64", "--train-sizes", "64", "--crop-resize", "", "--val-size", "64",
        "--total-batch-size", "4", "--epochs", "1", "--lr", "1e-12", "--lr-backbone", "0", "--weight-decay", "0",
        "--workers", "0", "--no-progress", "--device", "cpu", "--eval-every", "0",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert "its 3 label names are the categories of instances_train2017.json: --labels contiguous" in out
    assert "--num-classes not given: using 3 (categories in instances_train2017.json)" in out
    trained = read_checkpoint(tmp_path / "run" / "checkpoint.pth", "detect")["model"]
    head = read_hf_weights(folder)[0]["class_labels_classifier.weight"]  # (3 + no-object, 32)
    torch.testing.assert_close(trained["class_embed.weight"], head, atol=1e-8, rtol=0)


@pytest.mark.filterwarnings("ignore:resnet18 backbone starts from random weights")
def test_export_hf_of_a_contiguous_detr_names_its_labels(tmp_path, capsys):
    from peg_core.interop.hf_folder import read_hf_weights
    from peg_detr.__main__ import main as cli
    from peg_detr.models import build_detr

    model, _, _ = build_detr("resnet18", "sine", num_classes=3, num_queries=3, hidden_dim=32, num_heads=2,
                             enc_layers=1, dec_layers=1, dim_feedforward=32)  # fmt: skip
    cats = [{"id": i, "name": n} for i, n in NAMES.items()]
    for mode, want in (
        ("contiguous", {"0": "square", "1": "disc", "2": "triangle"}),
        # ids: only category 1 fits 3 labels; labels 0 and 2 name no category and are left out
        ("ids", {"0": "square"}),
    ):
        ckpt = tmp_path / f"{mode}.pth"
        meta = {"categories": cats, "labels": LabelMap.from_categories(cats, mode).to_json()}
        torch.save({"task": "detect", "model": model.state_dict(), "model_config": model.build_config,
                    "meta": meta}, ckpt)  # fmt: skip
        assert cli(["export-hf", str(ckpt), str(tmp_path / mode)]) == 0
        assert json.loads((tmp_path / mode / "config.json").read_text())["id2label"] == want
    head = read_hf_weights(tmp_path / "ids")[0]["class_labels_classifier.weight"]  # square + no object
    torch.testing.assert_close(head, model.class_embed.weight[[1, 3]], rtol=0, atol=0)


class _Printer:
    """The part of a RunContext resolve_label_map uses: ``print``, collected."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str) -> None:
        self.lines.append(text)


def test_a_resumed_run_keeps_its_checkpoints_mode(tmp_path):
    import argparse

    from peg_detr.task import resolve_label_map

    cats = [{"id": i, "name": n} for i, n in NAMES.items()]
    ann = tmp_path / "instances_train2017.json"
    args = argparse.Namespace(labels="ids", num_classes=None, init=None, arch="rtdetr")
    ckpt = {"meta": {"labels": LabelMap.from_categories(cats, "contiguous").to_json()}}
    printer = _Printer()
    label_map, num_classes = resolve_label_map(args, cats, ann, ckpt, printer)
    assert (label_map.mode, num_classes) == ("contiguous", 3)
    assert printer.lines == ["--num-classes not given: using 3 (categories in instances_train2017.json)"]
    old = {"meta": {"categories": cats}}  # written before meta["labels"]: ids
    args.labels = "contiguous"
    assert resolve_label_map(args, cats, ann, old, printer)[0].mode == "ids"
    assert resolve_label_map(args, cats, ann, None, printer) == (label_map, 3)  # a new run: the flag
