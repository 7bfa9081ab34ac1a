"""SSv2 / UCF101 / HMDB51 / folder data sets: official-format readers, segment sampling, the flip
rule, and ``make-data`` + ``train`` + ``eval`` (``--split all``) through each layout."""

import json
import shutil
from argparse import Namespace

import numpy as np
import pytest

from peg_core.engine import EXIT_ERROR, EXIT_USAGE, read_checkpoint
from peg_core.engine.distributed import DistInfo
from peg_video.__main__ import main
from peg_video.cli import parse_train_args
from peg_video.data import KineticsVideoDataset
from peg_video.data.annotations import AnnotationError
from peg_video.data.datasets import (
    load_dataset,
    read_folder,
    read_hmdb51,
    read_ssv2,
    read_ucf101,
    segment_indices,
)
from peg_video.data.loaders import LoaderOptionError, make_loader, transform_config
from tests.video.runs import TINY

ONE_EPOCH = [*TINY, "--epochs", "1"]


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _fails(capsys, argv, code=EXIT_ERROR) -> str:
    """Run ``argv``: exit ``code`` with one ``error:`` line on stderr and no traceback; returns it."""
    capsys.readouterr()
    try:
        assert main(argv) == code
    except SystemExit as e:
        assert e.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


# -------------------------------------------------------------------------------- SSv2 reader

SSV2_LABELS = {"Putting something on something": "1", "Pushing something from left to right": "0"}


def _ssv2(root, entries, labels=SSV2_LABELS, subset="train"):
    _write(root / "something-something-v2-labels.json", json.dumps(labels))
    name = {"train": "train", "test": "validation"}[subset]
    return _write(root / f"something-something-v2-{name}.json", json.dumps(entries))


def test_ssv2_reads_the_official_json(tmp_path):
    entries = [
        {"id": "78687", "label": "putting a cup on a box", "template": "Putting [something] on [something]",
         "placeholders": ["a cup", "a box"]},
        {"id": "42326", "label": "pushing a pen from left to right",
         "template": "Pushing [something] from left to right", "placeholders": ["a pen"]},
    ]  # fmt: skip
    _ssv2(tmp_path, entries)
    _ssv2(tmp_path, entries[1:], subset="test")
    (tmp_path / "20bn-something-something-v2").mkdir()  # the tarball's folder: videos are there
    ann = read_ssv2(tmp_path, "train")
    # classes ordered by the index strings of the labels file, not by name
    assert ann.classes == ["Pushing something from left to right", "Putting something on something"]
    videos = tmp_path / "20bn-something-something-v2"
    assert [(r.path, r.label) for r in ann.records] == [
        (videos / "78687.webm", 1),
        (videos / "42326.webm", 0),
    ]
    assert [r.label for r in load_dataset("ssv2", tmp_path, "test").records] == [0]
    # without the tarball folder the videos sit in the root; the JSON files may be in labels/
    flat = tmp_path / "flat"
    _ssv2(flat / "labels", entries)
    assert read_ssv2(flat).records[0].path == flat / "78687.webm"


@pytest.mark.parametrize(
    ("entries", "labels", "message"),
    [
        ({"id": "1"}, SSV2_LABELS, "expected a JSON list of entries: {train}"),
        ([{"id": "1", "template": "Putting [something] on [something]"}, {"id": "2"}], SSV2_LABELS,
         "entry has no 'template' key: {train}[1]"),
        ([{"template": "Putting [something] on [something]"}], SSV2_LABELS, "entry has no 'id' key: {train}[0]"),
        ([{"id": "1", "template": "Dropping [something]"}], SSV2_LABELS,
         "template 'Dropping something' is not in something-something-v2-labels.json: {train}[0]"),
        ([{"id": "1", "template": "x"}], {"x": "one"}, "index of 'x' is not an integer string: 'one': {labels}"),
    ],
)  # fmt: skip
def test_ssv2_malformed_files_name_the_entry(tmp_path, entries, labels, message):
    train = _ssv2(tmp_path, entries, labels)
    where = {"train": train, "labels": tmp_path / "something-something-v2-labels.json"}
    with pytest.raises(AnnotationError) as info:
        read_ssv2(tmp_path)
    assert str(info.value) == message.format(**where)


# ------------------------------------------------------------------------------- UCF101 reader


def _ucf(root, train="", test="", classes=("ApplyEyeMakeup", "HandstandPushups", "YoYo")):
    lists = root / "ucfTrainTestlist"
    _write(lists / "classInd.txt", "".join(f"{i} {c}\r\n" for i, c in enumerate(classes, 1)))
    return _write(lists / "trainlist01.txt", train), _write(lists / "testlist01.txt", test)


def test_ucf101_reads_the_official_lists(tmp_path):
    _ucf(
        tmp_path,
        train="ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\r\nYoYo/v_YoYo_g09_c02.avi 3\r\n",
        # the official lists spell the folder HandstandPushups, the files HandStandPushups
        test="HandstandPushups/v_HandStandPushups_g01_c01.avi\r\nYoYo/v_YoYo_g01_c01.avi\r\n",
    )
    train = read_ucf101(tmp_path, "train", 1)
    assert train.classes == ["ApplyEyeMakeup", "HandstandPushups", "YoYo"]
    videos = tmp_path / "UCF-101"
    assert [(r.path, r.label) for r in train.records] == [
        (videos / "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi", 0),
        (videos / "YoYo/v_YoYo_g09_c02.avi", 2),
    ]
    test = read_ucf101(tmp_path, "test", 1)
    assert [r.label for r in test.records] == [1, 2]


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ("YoYo/v_YoYo_g01_c01.avi 3\nYoYo/v_YoYo_g02_c01.avi x\n", "expected '<class>/<video>.avi <label 1-3>', got 'YoYo/v_YoYo_g02_c01.avi x': {f}:2"),
        ("YoYo/v_YoYo_g01_c01.avi 4\n", "label 4 outside 1..3: {f}:1"),
        ("YoYo/v_YoYo_g01_c01.avi 1\n", "label 1 is 'ApplyEyeMakeup', the folder says 'YoYo': {f}:1"),
        ("\nSkiing/v_Skiing_g01_c01.avi 1\n", "class folder 'Skiing' of 'Skiing/v_Skiing_g01_c01.avi' is not in classInd.txt: {f}:2"),
    ],
)  # fmt: skip
def test_ucf101_malformed_lists_name_file_and_line(tmp_path, train, message):
    train_list, _ = _ucf(tmp_path, train=train)
    with pytest.raises(AnnotationError) as info:
        read_ucf101(tmp_path, "train", 1)
    assert str(info.value) == message.format(f=train_list)


def test_ucf101_class_index_out_of_order(tmp_path):
    _ucf(tmp_path, train="YoYo/v_YoYo_g01_c01.avi 1\n")
    _write(tmp_path / "ucfTrainTestlist/classInd.txt", "1 ApplyEyeMakeup\n3 YoYo\n")
    with pytest.raises(
        AnnotationError, match=r"indices 1, 2, \.\.\. in order, got '3 YoYo': .*classInd.txt:2$"
    ):
        read_ucf101(tmp_path, "train", 1)


# ------------------------------------------------------------------------------- HMDB51 reader


def test_hmdb51_reads_the_split_flags(tmp_path):
    splits = tmp_path / "testTrainMulti_7030_splits"
    _write(splits / "brush_hair_test_split1.txt", "a.avi 1 \nb.avi 2 \nc.avi 0 \n")
    _write(splits / "brush_hair_test_split2.txt", "a.avi 2 \nb.avi 1 \nc.avi 1 \n")
    _write(splits / "cartwheel_test_split1.txt", "d.avi 2 \ne.avi 1 \n")
    _write(splits / "cartwheel_test_split2.txt", "d.avi 1 \ne.avi 1 \n")
    train = read_hmdb51(tmp_path, "train", 1)
    assert train.classes == ["brush_hair", "cartwheel"]  # "brush_hair" keeps its underscore
    assert [(r.path, r.label) for r in train.records] == [
        (tmp_path / "brush_hair/a.avi", 0),
        (tmp_path / "cartwheel/e.avi", 1),
    ]  # c.avi is flagged 0: in neither list
    assert [r.path.name for r in read_hmdb51(tmp_path, "test", 1).records] == ["b.avi", "d.avi"]
    assert [r.path.name for r in read_hmdb51(tmp_path, "test", 2).records] == ["a.avi"]
    _write(splits / "brush_hair_test_split3.txt", "a.avi 1\n")
    bad = _write(splits / "cartwheel_test_split3.txt", "d.avi 1\ne.avi 3\n")
    with pytest.raises(AnnotationError) as info:
        read_hmdb51(tmp_path, "train", 3)
    assert (
        str(info.value) == f"expected '<video>.avi 0|1|2' (0 unused, 1 train, 2 test), got 'e.avi 3': {bad}:2"
    )


def test_hmdb51_class_without_its_split_file_is_refused(tmp_path, capsys):
    splits = tmp_path / "testTrainMulti_7030_splits"
    _write(splits / "brush_hair_test_split1.txt", "a.avi 1\nb.avi 2\n")
    _write(splits / "cartwheel_test_split1.txt", "c.avi 1\nd.avi 2\n")
    _write(splits / "cartwheel_test_split2.txt", "c.avi 2\nd.avi 1\n")
    # brush_hair has no split 2 file: dropping it would make cartwheel class 0
    with pytest.raises(AnnotationError) as info:
        read_hmdb51(tmp_path, "test", 2)
    assert str(info.value) == (
        "class 'brush_hair' has no split file for split 2 (dropping it would shift the later class indices): "
        f"{splits / 'brush_hair_test_split2.txt'}"
    )
    # a class folder with videos but no split file at all is a class too
    _write(tmp_path / "catch" / "e.avi", "")
    with pytest.raises(
        AnnotationError, match=r"class 'catch' has no split file for split 1 .*catch_test_split1.txt$"
    ):
        read_hmdb51(tmp_path, "train", 1)
    err = _fails(capsys, ["train", "--dataset", "hmdb51", "--data-root", str(tmp_path), "--split", "2",
                          "--output-dir", str(tmp_path / "run"), *ONE_EPOCH])  # fmt: skip
    assert "class 'brush_hair' has no split file for split 2" in err and "brush_hair_test_split2.txt" in err


def _mmaction_hmdb51(raw, out):
    """mmaction2's HMDB51 layout made from a raw one: ``annotations/*.txt``, ``videos/<class>/``."""
    shutil.copytree(raw / "testTrainMulti_7030_splits", out / "annotations")
    for folder in sorted(p for p in raw.iterdir() if p.is_dir() and p.name != "testTrainMulti_7030_splits"):
        shutil.copytree(folder, out / "videos" / folder.name)
    return out


@pytest.mark.slow
def test_hmdb51_mmaction2_layout_gives_the_same_samples_and_accuracy(tmp_path, capsys):
    raw = tmp_path / "raw"
    assert main(["make-data", str(raw), "--dataset", "hmdb51", *LAYOUT]) == 0
    mm = _mmaction_hmdb51(raw, tmp_path / "mm")
    assert not (mm / "testTrainMulti_7030_splits").exists()
    for split in (1, 2, 3):
        for subset in ("train", "test"):
            a, b = read_hmdb51(raw, subset, split), read_hmdb51(mm, subset, split)
            assert a.classes == b.classes and len(a.records) > 0
            assert [(r.path.relative_to(raw), r.label) for r in a.records] == [
                (r.path.relative_to(mm / "videos"), r.label) for r in b.records
            ]
            assert all(r.path.is_file() for r in b.records)
    # a model trained on the raw layout scores the same on the mmaction2 copy
    run = tmp_path / "run"
    argv = ["train", "--dataset", "hmdb51", "--data-root", str(raw), "--output-dir", str(run), *ONE_EPOCH]
    assert main(argv) == 0
    trained = json.loads((run / "report.json").read_text())["eval"]
    argv = ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--data-root", str(mm), "--output-dir",
            str(tmp_path / "eval"), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert (
        report["eval"]["num_videos"] == trained["num_videos"] == 4 and report["broken"]["val"]["count"] == 0
    )
    assert report["eval"]["top1"] == trained["top1"]
    shutil.rmtree(mm / "annotations")
    err = _fails(capsys, ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--data-root", str(mm)])
    assert "split folder testTrainMulti_7030_splits/ (official layout) or annotations/" in err


def test_every_reader_refuses_other_class_names_than_the_checkpoints(tmp_path):
    ucf = tmp_path / "ucf"
    _ucf(ucf, train="YoYo/v_YoYo_g01_c01.avi 3\n", test="YoYo/v_YoYo_g01_c01.avi\n")
    ind = ucf / "ucfTrainTestlist" / "classInd.txt"
    with pytest.raises(AnnotationError) as info:  # the checkpoint's order differs from classInd.txt
        read_ucf101(ucf, "test", 1, ["ApplyEyeMakeup", "YoYo", "HandstandPushups"])
    assert str(info.value) == (
        "class 1 is 'HandstandPushups' here but 'YoYo' in the checkpoint (a renamed or re-ordered class list "
        f"would remap the labels): {ind}"
    )
    assert read_ucf101(ucf, "test", 1, ["ApplyEyeMakeup", "HandstandPushups", "YoYo"]).records[0].label == 2
    with pytest.raises(AnnotationError, match=f"has 3 classes, the checkpoint 4: {ind}$"):
        read_ucf101(ucf, "test", 1, ["ApplyEyeMakeup", "HandstandPushups", "YoYo", "Zumba"])
    ssv2 = tmp_path / "ssv2"
    _ssv2(ssv2, [{"id": "1", "template": "Putting [something] on [something]"}])
    with pytest.raises(AnnotationError, match="class 0 is 'Pushing something from left to right' here but "
                       "'Putting something on something' in the checkpoint"):  # fmt: skip
        read_ssv2(ssv2, "train", sorted(SSV2_LABELS, reverse=True))
    hmdb = tmp_path / "hmdb"
    _write(hmdb / "testTrainMulti_7030_splits" / "brush_hair_test_split1.txt", "a.avi 2\n")
    with pytest.raises(
        AnnotationError, match="class 0 is 'brush_hair' here but 'comb_hair' in the checkpoint"
    ):
        read_hmdb51(hmdb, "test", 1, ["comb_hair"])
    # Kinetics: an integer-labelled list indexes the classes.json beside it
    from peg_video.data.annotations import load_annotations, write_class_map

    listed = _write(tmp_path / "kin" / "val.txt", "a.mp4 1\n")
    write_class_map(["run", "walk"], listed.parent / "classes.json")
    assert load_annotations(listed, classes=["run", "walk"]).records[0].label == 1
    with pytest.raises(
        AnnotationError, match=r"class 0 is 'run' here but 'walk' in the checkpoint.*classes\.json$"
    ):
        load_annotations(listed, classes=["walk", "run"])


@pytest.mark.slow
def test_eval_refuses_a_reordered_class_index(tmp_path, capsys):
    root, run = tmp_path / "ucf", tmp_path / "run"
    assert main(["make-data", str(root), "--dataset", "ucf101", *LAYOUT]) == 0
    argv = ["train", "--dataset", "ucf101", "--data-root", str(root), "--output-dir", str(run), *ONE_EPOCH]
    assert main(argv) == 0
    ind = root / "ucfTrainTestlist" / "classInd.txt"
    names = [line.split()[1] for line in ind.read_text().splitlines()]
    swapped = [names[1], names[0], *names[2:]]
    ind.write_text("".join(f"{i} {n}\r\n" for i, n in enumerate(swapped, 1)))
    err = _fails(
        capsys, ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--output-dir", str(tmp_path / "e")]
    )
    assert err == (
        f"error: class 0 is {names[1]!r} here but {names[0]!r} in the checkpoint (a renamed or re-ordered class "
        f"list would remap the labels): {ind}\n"
    )
    assert not (tmp_path / "e" / "report.json").exists()


def test_folder_reads_class_folders(tmp_path):
    for rel in ("train/walk/a.mp4", "train/run/b.webm", "train/run/notes.txt", "val/walk/c.avi"):
        _write(tmp_path / rel, "")
    train = read_folder(tmp_path, "train")
    assert train.classes == ["run", "walk"]
    assert [(r.path.name, r.label) for r in train.records] == [("b.webm", 0), ("a.mp4", 1)]
    assert [(r.path.name, r.label) for r in read_folder(tmp_path, "test", train.classes).records] == [
        ("c.avi", 1)
    ]
    _write(tmp_path / "val/jump/d.mp4", "")
    with pytest.raises(AnnotationError, match="class folder is not one of the 2 training classes"):
        read_folder(tmp_path, "test", train.classes)


# ---------------------------------------------------------------------------- segment sampling


def test_segment_indices_test_mode_takes_segment_centres():
    # floor((i + 0.5) * L / T): L=10, T=4 -> 1.25, 3.75, 6.25, 8.75
    assert segment_indices(10, 4).tolist() == [[1, 3, 6, 8]]
    assert segment_indices(32, 8).tolist() == [[2, 6, 10, 14, 18, 22, 26, 30]]
    # a video shorter than the clip repeats frames, in order
    assert segment_indices(3, 8).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]
    # two clips: the places 1/4 and 3/4 of each segment
    assert segment_indices(16, 4, num_clips=2).tolist() == [[1, 5, 9, 13], [3, 7, 11, 15]]


@pytest.mark.parametrize(("length", "frames"), [(37, 8), (5, 5), (300, 16), (7, 16)])
def test_segment_indices_train_mode_is_one_random_frame_per_segment(length, frames):
    got = segment_indices(length, frames, np.random.default_rng(3))
    u = np.random.default_rng(3).random(frames)  # the same draws, in float64
    expected = np.minimum(np.floor((np.arange(frames) + u) * length / frames), length - 1).astype(np.int64)
    assert got.dtype == np.int64 and got.tolist() == expected.tolist()
    seg = np.arange(frames + 1) * length / frames
    assert np.all(got >= np.floor(seg[:-1])) and np.all(got < np.maximum(np.ceil(seg[1:]), 1))
    assert np.all(np.diff(got) >= 0)


def test_dataset_uses_segment_indices(tmp_path):
    from peg_video.data import Annotations, VideoRecord

    ann = Annotations([VideoRecord(tmp_path / "x.webm", 0)], ["a"])
    test = KineticsVideoDataset(ann, "test", num_frames=4, stride=2, num_clips=2, sampling="segment")
    assert test._test_indices(16).tolist() == [[1, 5, 9, 13], [3, 7, 11, 15]]
    stride = KineticsVideoDataset(ann, "test", num_frames=4, stride=2, num_clips=1)
    assert stride._test_indices(16).tolist() == [
        [4, 6, 8, 10]
    ]  # the centred stride clip (start (16 - 7) // 2), unchanged
    with pytest.raises(ValueError, match="sampling must be"):
        KineticsVideoDataset(ann, sampling="dense")


# --------------------------------------------------------------------------------- SSv2 protocol


def test_ssv2_protocol_defaults_and_flip_refusal(tmp_path, capsys):
    # a Kinetics recipe (hflip on, stride sampling) moved to ssv2: no flip, segment sampling
    args = parse_train_args(
        ["--config", "k400_vit_s_16x4_peg3d", "--dataset", "ssv2", "--data-root", str(tmp_path)]
    )
    assert (args.hflip, args.sampling, args.split) == (False, "segment", None)
    args = parse_train_args(["--config", "ssv2_vit_s_16_learned", "--data-root", str(tmp_path)])
    assert (args.dataset, args.hflip, args.sampling, args.pos_enc) == ("ssv2", False, "segment", "learned")
    assert parse_train_args(["--config", "ucf101_vit_s_16x4_peg3d", "--data-root", "x"]).hflip is True
    err = _fails(capsys, ["train", "--dataset", "ssv2", "--data-root", str(tmp_path), "--hflip"], EXIT_USAGE)
    assert "--hflip: refused for ssv2" in err and "left to right" in err
    with pytest.raises(LoaderOptionError, match="contradict SSv2's left / right labels"):
        transform_config(Namespace(**{**vars(args), "hflip": True}))
    assert "required with --dataset ucf101: --data-root" in _fails(
        capsys, ["train", "--dataset", "ucf101"], EXIT_USAGE
    )
    err = _fails(capsys, ["train", "--dataset", "folder", "--data-root", "x", "--split", "2"], EXIT_USAGE)
    assert "folder has no official splits" in err


# ------------------------------------------------------------------------ the command line, per layout

LAYOUT = ["--num-train", "6", "--num-val", "6", "--width", "64", "--height", "48", "--frames", "8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``make-data`` then one training epoch in each layout: ``{dataset: (data root, run folder)}``."""
    out = {}
    for dataset in ("ssv2", "ucf101", "hmdb51", "folder"):
        root = tmp_path_factory.mktemp(f"data_{dataset}")
        assert main(["make-data", str(root), "--dataset", dataset, *LAYOUT]) == 0
        run = tmp_path_factory.mktemp(f"run_{dataset}")
        argv = ["train", "--dataset", dataset, "--data-root", str(root), "--output-dir", str(run), *ONE_EPOCH]
        assert main(argv) == 0
        out[dataset] = (root, run)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dataset", "train_videos", "val_videos"),
    [("ssv2", 6, 6), ("ucf101", 8, 4), ("hmdb51", 8, 4), ("folder", 6, 6)],
)
def test_train_and_eval_in_each_layout(runs, dataset, train_videos, val_videos, tmp_path, capsys):
    root, run = runs[dataset]
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "finished"
    assert report["broken"]["train"]["total"] == train_videos and report["broken"]["train"]["count"] == 0
    assert report["eval"]["num_videos"] == val_videos
    args = read_checkpoint(run / "checkpoint.pth", "video")["args"]
    assert args["dataset"] == dataset and args["data_root"] == str(root)
    assert args["sampling"] == ("segment" if dataset == "ssv2" else "stride")
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(run / "checkpoint.pth"),
                "--output-dir",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    evaluated = json.loads((tmp_path / "report.json").read_text())["eval"]
    assert evaluated["num_videos"] == val_videos and evaluated["top1"] == report["eval"]["top1"]


@pytest.mark.slow
def test_ssv2_counts_and_lists_missing_videos(runs, tmp_path):
    root, _ = runs["ssv2"]
    data = tmp_path / "ssv2"
    data.mkdir()
    for name in ("something-something-v2-labels.json", "something-something-v2-train.json",
                 "something-something-v2-validation.json"):  # fmt: skip
        (data / name).write_text((root / name).read_text())
    videos = data / "20bn-something-something-v2"
    videos.mkdir()
    for i in range(1, 13):
        if i not in (2, 8):  # one training, one validation video missing
            (videos / f"{i}.webm").symlink_to(root / "20bn-something-something-v2" / f"{i}.webm")
    out = tmp_path / "run"
    argv = [
        "train",
        "--dataset",
        "ssv2",
        "--data-root",
        str(data),
        "--output-dir",
        str(out),
        "--max-broken",
        "0.5",
    ]
    assert main([*argv, *ONE_EPOCH]) == 0
    broken = json.loads((out / "report.json").read_text())["broken"]
    assert broken["train"]["count"] == 1 and broken["train"]["samples"] == [
        {"path": str(videos / "2.webm"), "reason": "missing file"}
    ]
    assert broken["val"]["count"] == 1 and broken["val"]["samples"][0]["path"] == str(videos / "8.webm")


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["ucf101", "hmdb51"])
def test_eval_split_all_reports_each_split_and_the_mean(runs, dataset, tmp_path, capsys):
    _, run = runs[dataset]
    capsys.readouterr()
    argv = [
        "eval",
        "--checkpoint",
        str(run / "checkpoint.pth"),
        "--split",
        "all",
        "--output-dir",
        str(tmp_path),
    ]
    assert main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    metrics = report["eval"]
    for k in ("split1", "split2", "split3"):
        assert metrics[k]["num_videos"] == 4 and f"{k} top1 {metrics[k]['top1']:.4f}" in printed
        assert report["broken"][f"val_{k}"]["count"] == 0
    for key in ("top1", "top5"):
        mean = sum(metrics[f"split{k}"][key] for k in (1, 2, 3)) / 3
        assert metrics["mean"][key] == pytest.approx(mean) and metrics[key] == pytest.approx(mean)
    assert f"mean  top1 {metrics['mean']['top1']:.4f}" in printed
    assert metrics["trained_split"] == 1 and "trains one model per split" in printed
    assert (
        printed.strip()
        .splitlines()[-1]
        .startswith(f"eval done: top1 {metrics['mean']['top1']:.3f} top5 {metrics['mean']['top5']:.3f} at ")
    )
    # one split's test list; a Kinetics-format file needs --dataset kinetics
    assert main([*argv[:3], "--split", "2", "--output-dir", str(tmp_path / "s2"), "--no-progress"]) == 0
    report = json.loads((tmp_path / "s2" / "report.json").read_text())
    assert report["eval"]["top1"] == metrics["split2"]["top1"] and report["broken"]["val"]["total"] == 4
    err = _fails(capsys, ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--val-ann", "val.csv"])
    assert f"reads --dataset {dataset}; add --dataset kinetics" in err


@pytest.mark.slow
def test_split_all_is_refused_without_splits(runs, capsys):
    _, run = runs["folder"]
    err = _fails(capsys, ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--split", "all"])
    assert err == "error: folder has no official splits (only ucf101, hmdb51): --split all\n"


@pytest.mark.slow
def test_train_flip_is_off_in_the_built_ssv2_dataset(runs):
    root, run = runs["ssv2"]
    args = parse_train_args(
        ["--dataset", "ssv2", "--data-root", str(root), "--output-dir", str(run), *ONE_EPOCH]
    )
    ann = load_dataset("ssv2", root, "train")
    _, ds = make_loader(args, ann, "train", DistInfo(), run)
    assert ds.sampling == "segment" and ds.transform.cfg.hflip is False
