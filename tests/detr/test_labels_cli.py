"""The commands on a ``--labels contiguous`` checkpoint: ``predict``, ``export`` (ONNX) and ``eval``.

One tiny contiguous RT-DETR run on shapes whose category ids have gaps (1, 3, 7 -> labels 0, 1, 2;
:mod:`tests.detr.label_runs`) is predicted, exported and evaluated through ``python -m peg_detr``'s
entry point.  The reference for "mapped right" is the same weights read with ``ids`` semantics
(label = category id), mapped by hand with label k -> k-th category by id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg_core.engine import read_checkpoint
from peg_detr.__main__ import main as cli
from peg_detr.data import LabelMap
from tests.detr.label_runs import NAMES, train_contiguous

#: label k of the contiguous run -> its category id (the k-th of 1, 3, 7)
CATEGORY_OF_LABEL = dict(enumerate(sorted(NAMES)))


@pytest.fixture(scope="module")
def run(gap_data, tmp_path_factory) -> tuple[Path, dict]:
    """``(checkpoint.pth, training report)`` of the contiguous run."""
    out = tmp_path_factory.mktemp("contiguous")
    return out / "checkpoint.pth", train_contiguous(gap_data, out)


def _spread_classes(checkpoint: Path, out: Path, mode: str) -> Path:
    """The checkpoint with every label scoring each query alike, and its map in ``mode`` (same categories).

    After one training step every top-K detection is label 0, which would leave labels 1 and 2
    (ids 3 and 7, the ones that differ from their label) unexercised.  Label 0's row of the head the
    post-processor reads is copied to every label, with biases 0.01 apart (no ties): each query's
    three labels rank next to each other, so the top-K holds every label.  ``ids``: label k is id k,
    and the categories are renumbered 0, 1, 2 so that every label names one (a label without a
    category would be masked before the top-K, and the reference would not be the same detections).
    """
    ckpt = read_checkpoint(checkpoint, "detect")
    last = f"decoder.class_embed.{ckpt['model_config']['dec_layers'] - 1}"
    for prefix in ("model.", "ema.module."):  # the live weights and the average (which predict loads)
        weight, bias = ckpt["model"][f"{prefix}{last}.weight"], ckpt["model"][f"{prefix}{last}.bias"]
        ckpt["model"][f"{prefix}{last}.weight"] = weight[:1].repeat(len(weight), 1)
        ckpt["model"][f"{prefix}{last}.bias"] = bias[0] - 0.01 * torch.arange(len(bias))
    categories = LabelMap.from_meta(ckpt["meta"]).categories
    if mode == "ids":
        categories = tuple((k, name) for k, (_, name) in enumerate(categories))
    ckpt["meta"] = {**ckpt["meta"], "labels": LabelMap(mode, categories).to_json()}
    torch.save(ckpt, out)
    return out


def _predict(checkpoint: Path, images: list[Path], out: Path) -> dict[str, list[dict]]:
    """``python -m peg_detr predict`` at threshold 0 (every top-K detection); its ``detections.json``."""
    argv = ["predict", *map(str, images), "--checkpoint", str(checkpoint), "--threshold", "0",
            "--output-dir", str(out), "--json"]  # fmt: skip
    assert cli(argv) == 0
    return json.loads((out / "detections.json").read_text())


def test_predict_command_writes_category_ids_and_names(run, gap_data, tmp_path, capsys):
    checkpoint, _ = run
    images = sorted((gap_data / "val2017").iterdir())
    (plain,) = _predict(
        checkpoint, images[:1], tmp_path / "plain"
    ).values()  # the trained weights as they are
    assert plain and all(d["label"] in NAMES and d["name"] == NAMES[d["label"]] for d in plain)
    contiguous = _spread_classes(checkpoint, tmp_path / "contiguous.pth", "contiguous")
    assert LabelMap.from_meta(read_checkpoint(contiguous)["meta"]) == LabelMap.from_meta(
        read_checkpoint(checkpoint)["meta"]
    )  # the run's own map
    got = _predict(contiguous, images, tmp_path / "contiguous")
    capsys.readouterr()
    raw = _predict(_spread_classes(checkpoint, tmp_path / "ids.pth", "ids"), images, tmp_path / "ids")
    assert sorted(got) == sorted(raw) == sorted(map(str, images))
    seen = set()
    for path, dets in got.items():
        assert dets and len(dets) == len(raw[path])
        for d, r in zip(dets, raw[path]):
            # the same detection; only its label differs: k -> the k-th category, and that one's name
            assert (d["score"], d["box"]) == (r["score"], r["box"])
            assert d["label"] == CATEGORY_OF_LABEL[r["label"]] and d["name"] == NAMES[d["label"]]
        seen.update(d["label"] for d in dets)
        assert (tmp_path / "contiguous" / f"{Path(path).stem}.png").is_file()
    # every label, the two whose id differs from it (3, 7) included, was mapped at least once
    assert seen == set(NAMES)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["detections"] == raw  # the --json closing line carries the ids run's raw labels


def test_onnx_export_records_the_label_map(run, tmp_path, capsys, monkeypatch):
    """The metadata ``export`` hands the ONNX exporter: the run's label map.  ``export_onnx`` writes it into
    the graph's ``metadata_props`` (read back from the file in ``test_export_onnx.py``); a tiny RT-DETR's
    graph is traced by ``test_rtdetr_fuse.py`` and README's quick start, not once more here."""
    import peg_detr.export

    checkpoint, _ = run
    exported = []
    monkeypatch.setattr(peg_detr.export, "export_onnx", lambda *args: exported.append(args))
    out = tmp_path / "model.onnx"
    assert cli(["export", str(checkpoint), str(out), "--height", "64", "--width", "64"]) == 0
    ((*_, props),) = exported
    assert set(props) == {"peg_task", "peg_categories", "peg_labels"} and props["peg_task"] == "detect"
    want = LabelMap.from_meta(read_checkpoint(checkpoint, "detect")["meta"])
    assert want.mode == "contiguous"
    assert json.loads(props["peg_labels"]) == want.to_json()
    # what a deployer reads back: logit k of pred_logits is the k-th category
    recorded = LabelMap.from_json(json.loads(props["peg_labels"]))
    assert recorded.category_ids_of(torch.arange(3)).tolist() == [1, 3, 7]
    assert recorded.names(3) == ["square", "disc", "triangle"]
    assert {c["id"] for c in json.loads(props["peg_categories"])} == set(NAMES)


def test_eval_takes_the_checkpoints_map_and_refuses_another(run, tmp_path, capsys):
    checkpoint, report = run
    base = ["eval", "--checkpoint", str(checkpoint), "--workers", "0", "--no-progress", "--json"]
    for i, flags in enumerate(([], ["--labels", "contiguous"])):  # no flag, or the checkpoint's own
        assert cli([*base, "--output-dir", str(tmp_path / str(i)), *flags]) == 0
        again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval"]
        assert again["size"] == 64 and again["sizes"] == report["eval"]["sizes"], flags
        assert (again["ap"], again["ap50"]) == (report["eval"]["ap"], report["eval"]["ap50"])
    assert cli([*base, "--output-dir", str(tmp_path / "ids"), "--labels", "ids"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "error: the checkpoint was trained with --labels contiguous; --labels ids would mis-label its "
        f"detections (leave --labels out: the checkpoint's map is used): {checkpoint}"
    ]
    assert not (tmp_path / "ids" / "report.json").exists()


def test_recorded_label_map_refuses_any_other_mode():
    from peg_core.engine import UserError
    from peg_detr.task import recorded_label_map

    cats = [{"id": i, "name": n} for i, n in NAMES.items()]
    ids = LabelMap.from_categories(cats, "ids")
    old = {"meta": {"categories": cats}}  # written before meta["labels"]: ids
    assert recorded_label_map(old, None, "old.pth") == ids == recorded_label_map(old, "ids", "old.pth")
    with pytest.raises(UserError) as e:
        recorded_label_map(old, "contiguous", "old.pth")
    assert e.value.line() == (
        "error: the checkpoint was trained with --labels ids; --labels contiguous would mis-label its "
        "detections (leave --labels out: the checkpoint's map is used): old.pth"
    )
