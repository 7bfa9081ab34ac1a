"""``train --init`` onto the data's own labels, through the command line, for the RT-DETR family and DETR.

A Hugging Face D-FINE folder whose classes partly match the data's (by name, one by ``--class-map``),
a folder whose classes match nothing, a peg_detr checkpoint of another label set, and the README's
transfer case (``tools.transfer_case``: the kept classes keep the source's AP50, fresh ones start
from zero).  Row-by-row equality of the rebuilt heads is ``test_relabel.py``'s.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.engine import read_checkpoint
from peg_detr.__main__ import main as cli
from peg_detr.model import load_model
from tests.detr.test_dfine_cli import _tiny_dfine_folder

RUN = ["--epochs", "1", "--workers", "0", "--no-progress", "--device", "cpu", "--lr", "1e-12", "--lr-backbone", "0",
       "--val-size", "96", "--eval-sizes", "96"]  # fmt: skip


COCO_SET = dict(size=96, num_train=4, num_val=2)  # the module's ``data`` (tests/conftest.py)


def _folder(path, names):
    """The tiny D-FINE folder (4 classes) with ``names`` as its ``id2label``."""
    folder = _tiny_dfine_folder(path)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {str(i): n for i, n in enumerate(names)}
    config["label2id"] = {n: i for i, n in enumerate(names)}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_folder_of_other_classes_starts_a_run_keeping_the_shared_ones(data, tmp_path, capsys):
    folder = _folder(tmp_path / "hf", ["Disc", "ball", "dog", "Square"])
    (tmp_path / "map.json").write_text(json.dumps({"triangle": "ball"}))
    out = tmp_path / "run"
    argv = ["train", "--config", "dfine_demo_tiny", "--data-root", str(data), "--output-dir", str(out), "--init",
            str(folder), "--class-map", str(tmp_path / "map.json"), *RUN]  # fmt: skip
    assert cli(argv) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "classes by name" in line]
    assert said == [f"--init {folder}: kept 3 of 3 classes by name (square, disc, triangle <- ball); "
                    "0 start fresh"]  # fmt: skip
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    kept = ckpt["meta"]["init_classes"]["kept"]
    assert [(k["label"], k["start_label"]) for k in kept] == [(1, 3), (2, 0), (3, 1)]
    # the model is the data's: 4 labels (ids 1..3, label 0 names no category), id2label given the data's names
    assert ckpt["model_config"]["num_classes"] == 4
    assert ckpt["model_config"]["hf_config"]["id2label"] == {
        "0": "LABEL_0",
        "1": "square",
        "2": "disc",
        "3": "triangle",
    }
    loaded = load_model(out / "checkpoint.pth")
    assert loaded.model.num_classes == 4 and loaded.postprocess.named.tolist() == [False, True, True, True]
    # predictions never name label 0 (an id without a category), even at threshold 0
    image = sorted((data / "val2017").iterdir())[0]
    assert cli(["predict", str(image), "--checkpoint", str(out / "checkpoint.pth"), "--threshold", "0",
                "--output-dir", str(tmp_path / "pred"), "--json"]) == 0  # fmt: skip
    found = json.loads((tmp_path / "pred" / "detections.json").read_text())[str(image)]
    assert found and {d["label"] for d in found} <= {1, 2, 3}


def test_a_folder_with_no_shared_name_trains_a_new_head(data, tmp_path, capsys):
    folder = _folder(tmp_path / "hf", [f"LABEL_{i}" for i in range(4)])  # transformers' default names
    argv = ["train", "--config", "dfine_demo_tiny", "--data-root", str(data), "--output-dir", str(tmp_path / "run"),
            "--init", str(folder), "--labels", "contiguous", *RUN]  # fmt: skip
    assert cli(argv) == 0
    assert (
        f"--init {folder}: kept 0 of 3 classes by name; 3 start fresh (square, disc, triangle)"
        in capsys.readouterr().out
    )
    assert read_checkpoint(tmp_path / "run" / "checkpoint.pth", "detect")["model_config"]["num_classes"] == 3


def test_a_class_map_naming_no_class_is_one_line_before_training(data, tmp_path, capsys):
    folder = _folder(tmp_path / "hf", ["square", "disc", "triangle", "x"])
    (tmp_path / "map.json").write_text(json.dumps({"circle": "disc"}))
    argv = ["train", "--config", "dfine_demo_tiny", "--data-root", str(data), "--output-dir", str(tmp_path / "run"),
            "--init", str(folder), "--class-map", str(tmp_path / "map.json"), *RUN]  # fmt: skip
    capsys.readouterr()  # save_pretrained's progress lines
    assert cli(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: class map entry 'circle': no category of the data has this name: {tmp_path / 'map.json'}"
    ]
    assert not (tmp_path / "run" / "checkpoint.pth").exists()


def test_a_checkpoint_of_this_project_starts_a_run_of_its_own_arch(data, tmp_path, capsys):
    """An RT-DETR checkpoint starts a new run (its architecture); another arch, typed or a recipe's, is refused."""
    source = tmp_path / "source"
    base = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), *RUN]
    assert cli([*base, "--output-dir", str(source)]) == 0
    start = read_checkpoint(source / "checkpoint.pth", "detect")["model"]
    assert cli([*base, "--output-dir", str(tmp_path / "ft"), "--init", str(source / "checkpoint.pth")]) == 0
    assert "kept 3 of 3 classes by name (square, disc, triangle)" in capsys.readouterr().out
    tuned = read_checkpoint(tmp_path / "ft" / "checkpoint.pth", "detect")["model"]
    # lr 1e-12 for one step: the start's weights, class rows included (the same labels: all copied)
    key = "model.decoder.class_embed.1.weight"
    torch.testing.assert_close(tuned[key], start[key], rtol=0, atol=1e-6)
    # encoding flags apply to a checkpoint as to a folder: --pos-enc sincos replaces its PEG, the rest loads
    swapped = tmp_path / "sincos"
    init = ["--init", str(source / "checkpoint.pth")]
    assert cli([*base, "--output-dir", str(swapped), *init, "--pos-enc", "sincos"]) == 0
    said = capsys.readouterr().out
    assert f"--init {source / 'checkpoint.pth'}: encoding sincos;" in said and ", 0 new" in said
    ckpt = read_checkpoint(swapped / "checkpoint.pth", "detect")
    assert ckpt["model_config"]["pos_enc"] == "sincos" and not any(".pegs." in k for k in ckpt["model"])
    torch.testing.assert_close(ckpt["model"][key], start[key], rtol=0, atol=1e-6)
    bad = [*base, "--output-dir", str(tmp_path / "bad"), *init, "--arch", "dfine"]
    assert cli(bad) == 1
    assert "the checkpoint holds a RT-DETR, not a D-FINE; use --arch rtdetr" in capsys.readouterr().err
    # a recipe of another family (not a typed --arch) is refused the same way
    bad = ["train", "--config", "demo_tiny", "--data-root", str(data), *RUN, "--output-dir", str(tmp_path / "bad2"),
           "--init", str(source / "checkpoint.pth")]  # fmt: skip
    assert cli(bad) == 1
    assert "the checkpoint holds a RT-DETR, not a DETR; use --arch rtdetr" in capsys.readouterr().err


@pytest.mark.slow
def test_the_transfer_case_keeps_the_source_level_and_fresh_names_start_from_zero(tmp_path):
    """The README's measured case (``python -m tools.transfer_case``): ~50 s on two CPU cores."""
    from tools.transfer_case import run_transfer_case

    result = run_transfer_case(tmp_path)
    assert result["source"]["ap50"] > 0.5
    assert result["kept"]["ap50"] >= result["source"]["ap50"] - 0.03
    assert result["fresh"]["ap50"] < 0.05
    assert [k["start_name"] for k in result["kept"]["classes"]["kept"]] == ["disc", "triangle", "square"]
    assert result["fresh"]["classes"]["kept"] == []


@pytest.mark.parametrize(
    "name", ["detr_finetune", "rtdetr_finetune", "dfine_finetune", "deimv2_finetune", "rfdetr_finetune"]
)
def test_the_finetune_recipes_are_short_lower_lr_and_end_plain(name, tmp_path):
    from peg_detr.cli import parse_train_args
    from peg_detr.configs import CONFIGS

    base = {"detr_finetune": "detr_r50_500ep", "rtdetr_finetune": "rtdetr_r50vd_6x", "dfine_finetune": "dfine_l",
            "deimv2_finetune": "deimv2_s", "rfdetr_finetune": "rfdetr_base_coco"}[name]  # fmt: skip
    args = parse_train_args(["--config", name, "--data-root", str(tmp_path)])
    assert args.arch == CONFIGS[base].get("arch", "detr") and args.epochs < CONFIGS[base]["epochs"]
    assert args.lr == CONFIGS[base]["lr"] / 2 and args.lr_backbone == CONFIGS[base]["lr_backbone"] / 2
    assert args.total_batch_size == 8
    if name not in (
        "detr_finetune",
        "rfdetr_finetune",
    ):  # the RT-DETR family's strong augmentation stops before the end
        assert args.no_aug_epochs == 4 and args.warmup_steps == 200
    if name == "rfdetr_finetune":  # RF-DETR's augmentation has no strong phase to stop
        assert args.no_aug_epochs == 0 and args.warmup_steps == 200


def test_a_folder_is_predicted_at_the_size_its_processor_names(tmp_path):
    """``predict`` / ``load_hf_model`` on an export-hf folder use its preprocessor_config.json's size."""
    from peg_detr.interop.hf_processor import PREPROCESSOR_CONFIG, rtdetr_processor_config
    from peg_detr.model import load_hf_model

    folder = _folder(tmp_path / "hf", ["square", "disc", "triangle", "diamond"])
    assert "val_size" not in load_hf_model(folder).meta  # no processor: the architecture's default
    (folder / PREPROCESSOR_CONFIG).write_text(json.dumps(rtdetr_processor_config(96)))
    assert load_hf_model(folder).meta["val_size"] == 96


def test_a_bare_weights_file_is_refused_where_the_arch_has_no_reader_for_it(data, tmp_path, capsys):
    """``Arch.init_file``: DETR reads an official checkpoint; the RT-DETR family refuses one in a line, building nothing."""
    bare = tmp_path / "weights.pth"
    torch.save({"model": {"class_embed.weight": torch.zeros(92, 8)}}, bare)
    out = tmp_path / "run"
    argv = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(out),
            "--init", str(bare), "--batch-size", "2", *RUN]  # fmt: skip
    assert cli(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --arch rtdetr starts from a Hugging Face folder or a checkpoint of peg_detr train; "
                   f"this is neither: {bare}"]  # fmt: skip
    assert not (out / "checkpoint.pth").exists()
