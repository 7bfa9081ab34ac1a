"""Annotation parsing: official Kinetics CSV (class folders or flat) and ``path label`` lists."""

from pathlib import Path

import pytest

from peg_core.engine import UserError
from peg_core.errors import InputError
from peg_video.data.annotations import (
    AnnotationError,
    load_annotations,
    normalize_label,
    read_class_map,
    read_kinetics_csv,
    read_path_label_list,
    write_class_map,
)


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_normalize_label():
    assert normalize_label(' "air drumming" ') == "air_drumming"
    assert normalize_label("'abseiling'") == "abseiling"
    assert normalize_label("passing American football (in game)") == "passing_American_football_(in_game)"


def test_kinetics_csv_class_folders_and_flat(tmp_path):
    csv = tmp_path / "val.csv"
    csv.write_text(
        "label,youtube_id,time_start,time_end,split,is_cc\n"
        '"air drumming",abc-_12,5,15,val,0\n'
        "abseiling,zzz,0,10,val,0\n"
        '"zumba",flat1,120,130,val,1\n'
        '"air drumming",gone,1,11,val,0\n'
    )
    root = tmp_path / "val"
    a = _touch(root / "air drumming" / "abc-_12_000005_000015.mp4")  # folder as written
    b = _touch(root / "abseiling" / "zzz_000000_000010.mkv")  # another container
    c = _touch(root / "flat1_000120_000130.mp4")  # flat layout
    ann = load_annotations(csv)
    assert ann.classes == ["abseiling", "air_drumming", "zumba"]  # sorted, normalised
    assert [r.label for r in ann.records] == [1, 0, 2, 1]
    assert [r.path for r in ann.records[:3]] == [a, b, c]
    # a video that is not on disk keeps its expected (underscored class folder) path
    assert ann.records[3].path == root / "air_drumming" / "gone_000001_000011.mp4"
    assert not ann.records[3].path.exists()


def test_kinetics_csv_underscored_folders_and_fixed_classes(tmp_path):
    csv = tmp_path / "ann.csv"
    csv.write_text('label,youtube_id,time_start,time_end,split\n"air drumming",q,7,17,train\n')
    video = _touch(tmp_path / "videos" / "air_drumming" / "q_000007_000017.mp4")
    ann = read_kinetics_csv(csv, video_root=tmp_path / "videos", classes=["a", "air_drumming", "z"])
    assert ann.records[0].path == video and ann.records[0].label == 1
    with pytest.raises(
        AnnotationError, match=r"^label 'air_drumming' is not one of the 2 known classes: .*ann\.csv:2$"
    ):
        read_kinetics_csv(csv, video_root=tmp_path, classes=["x", "y"])


def test_kinetics_csv_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("label,youtube_id,split\nx,y,train\n")
    with pytest.raises(AnnotationError, match=r"^missing columns \['time_start', 'time_end'\]; .*bad\.csv$"):
        read_kinetics_csv(bad)
    bad.write_text("label,youtube_id,time_start,time_end,split\nx,y,one,2,train\n")
    with pytest.raises(
        AnnotationError, match=r"^time_start/time_end must be integers, got 'one', '2': .*bad\.csv:2$"
    ):
        read_kinetics_csv(bad)
    with pytest.raises(AnnotationError, match=r"^annotation file not found: .*nope\.csv$"):
        load_annotations(tmp_path / "nope.csv")


def test_path_label_list_indices_and_spaces(tmp_path):
    lst = tmp_path / "train.txt"
    lst.write_text("# comment\nclips/a b.mp4 2\n/abs/c.mp4 0\n\nclips/d.mp4 1\n")
    ann = load_annotations(lst)
    assert ann.classes == ["0", "1", "2"]
    assert [r.label for r in ann.records] == [2, 0, 1]
    assert ann.records[0].path == tmp_path / "clips" / "a b.mp4"  # relative to the list's folder
    assert ann.records[1].path == Path("/abs/c.mp4")
    named = read_path_label_list(lst, video_root="/data", classes=["x", "y", "z"])
    assert named.classes == ["x", "y", "z"] and named.records[2].path == Path("/data/clips/d.mp4")
    with pytest.raises(AnnotationError, match=r"^class index 2 outside \[0, 2\): .*train\.txt:2$"):
        read_path_label_list(lst, classes=["x", "y"])


def test_path_label_list_with_names(tmp_path):
    lst = tmp_path / "l.txt"
    lst.write_text('v1.mp4 "tai chi"\nv2.mp4 archery\n')
    ann = read_path_label_list(lst)
    assert ann.classes == ["archery", "tai_chi"] and [r.label for r in ann.records] == [1, 0]
    lst.write_text("only_a_path.mp4\n")
    with pytest.raises(
        AnnotationError, match=r"^expected '<path> <label>', got 'only_a_path.mp4': .*l\.txt:1$"
    ):
        read_path_label_list(lst)


def test_class_map_round_trip(tmp_path):
    path = write_class_map(["b", "a"], tmp_path / "run" / "classes.json")
    assert read_class_map(path) == ["b", "a"]
    (tmp_path / "plain.json").write_text('["x", "y"]')
    assert read_class_map(tmp_path / "plain.json") == ["x", "y"]


def test_annotation_errors_are_one_line_user_errors(tmp_path):
    """An AnnotationError is an InputError (a ValueError): the command line prints it as one ``error:`` line."""
    bad = tmp_path / "v.csv"
    bad.write_text('label,youtube_id,time_start,time_end,split\n"a\nb",x,1,2,val\n')
    with pytest.raises(AnnotationError) as e:
        load_annotations(bad, video_root=tmp_path / "missing")
    assert isinstance(e.value, InputError) and isinstance(e.value, ValueError)
    assert (e.value.what, e.value.where) == ("video folder not found", str(tmp_path / "missing"))
    assert (
        UserError(e.value.what, e.value.where).line()
        == f"error: video folder not found: {tmp_path / 'missing'}"
    )
    (tmp_path / "c.json").write_text("{broken")
    with pytest.raises(AnnotationError, match=r"^class file is not valid JSON \(.*\): .*c\.json$"):
        read_class_map(tmp_path / "c.json")
    (tmp_path / "c.json").write_text('{"names": 3}')
    with pytest.raises(AnnotationError, match="class file must hold a list of names"):
        read_class_map(tmp_path / "c.json")
