"""peg_core.jsonfile: the one JSON reader, and every JSON the suite reads from outside going through it.

A hostile file (nested 10^5 deep, ``NaN``, too large, not UTF-8) is one line naming the file,
never a ``RecursionError`` or a traceback: each reader is given such a file here.
"""

from __future__ import annotations

import json
import zipfile

import pytest

from peg_core.engine import UserError
from peg_core.errors import InputError
from peg_core.export.pt2 import PROGRAM, WEIGHTS_CONFIG, UnsafeArchiveError, check_pt2_archive
from peg_core.export.quantize import check_meta
from peg_core.interop import WeightsError, read_hf_config, read_hf_weights
from peg_core.jsonfile import MAX_DEPTH, JsonError, json_depth, parse_json, read_json

#: deeper than any parser's recursion: json.loads alone raises RecursionError on it
DEEP = "[" * 100_000 + "]" * 100_000
NESTED = f"is nested deeper than {MAX_DEPTH} levels"


def _one_line(error: Exception, path) -> str:
    line = str(error)
    assert "\n" not in line and line.endswith(f": {path}"), line
    return line


# ------------------------------------------------------------------------------------ the reader


def test_reads_json_and_checks_the_top_level(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"a": [1, 2.5, "x", null, true]}')
    assert read_json(path, kind=dict) == {"a": [1, 2.5, "x", None, True]}
    with pytest.raises(JsonError) as e:
        read_json(path, "class file", kind=list)
    assert e.value.what == "class file must hold an array at the top level, not an object"


@pytest.mark.parametrize(
    ("text", "what"),
    [
        (DEEP, f"config {NESTED}"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"config {NESTED}"),
        ('{"x": NaN}', "config is not valid JSON (NaN is not JSON)"),
        ('{"x": -Infinity}', "config is not valid JSON (-Infinity is not JSON)"),
        ("{oops", "config is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
                  "(char 1))"),
        ("  \n", "config is empty"),
    ],
)  # fmt: skip
def test_bad_files_are_one_json_error(tmp_path, text, what):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(JsonError) as e:
        read_json(path, "config")
    assert e.value.what == what and _one_line(e.value, path)
    assert isinstance(e.value, InputError)


def test_limits_missing_and_not_utf8(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[" + "1," * 100 + "1]")
    with pytest.raises(JsonError, match=r"^config is 203 bytes, more than the 100 accepted: "):
        read_json(path, "config", max_bytes=100)
    assert read_json(path, max_depth=1) == [1] * 101
    with pytest.raises(JsonError, match=r"^config is nested deeper than 0 levels: "):
        read_json(path, "config", max_depth=0)
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(JsonError, match=r"^config is not UTF-8 text"):
        read_json(path, "config")
    with pytest.raises(JsonError, match=r"^config not found: "):
        read_json(tmp_path / "none.json", "config")
    with pytest.raises(JsonError, match=r"^config is not a file: "):
        read_json(tmp_path, "config")


def test_depth_is_counted_without_recursion():
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [{"b": []}]}) == 4
    deep: list = []
    node = deep
    for _ in range(100_000):  # built in memory: deeper than any recursive walk could go
        node.append([])
        node = node[0]
    assert json_depth(deep, limit=10) == 11
    assert parse_json("[[1]]", "x") == [[1]]


# ------------------------------------------------------------------- every reader goes through it


def test_hf_config_and_shard_index(tmp_path):
    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(WeightsError) as e:
        read_hf_config(tmp_path)
    assert e.value.what == f"config.json {NESTED}" and _one_line(e.value, tmp_path / "config.json")
    (tmp_path / "model.safetensors.index.json").write_text(DEEP)
    with pytest.raises(WeightsError) as e:
        read_hf_weights(tmp_path)
    assert e.value.what == f"model.safetensors.index.json {NESTED}"


def test_detr_and_rtdetr_folders(tmp_path):
    from peg_detr import from_hf

    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(WeightsError) as e:
        from_hf(tmp_path)
    assert _one_line(e.value, tmp_path / "config.json") == f"config.json {NESTED}: {tmp_path / 'config.json'}"


def test_video_folder_and_its_preprocessor_config(tmp_path):
    from peg_video.interop.hf import read_hf_video_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "videomae"}))
    (tmp_path / "preprocessor_config.json").write_text(DEEP)
    with pytest.raises(WeightsError) as e:
        read_hf_video_config(tmp_path)
    assert e.value.what == f"preprocessor_config.json {NESTED}"
    _one_line(e.value, tmp_path / "preprocessor_config.json")


def test_coco_annotations(tmp_path):
    from peg_detr.data import load_coco_annotations

    path = tmp_path / "instances.json"
    path.write_text(DEEP)
    with pytest.raises(InputError) as e:
        load_coco_annotations(path)
    assert e.value.what == f"annotation file {NESTED}" and _one_line(e.value, path)


def test_video_class_file_and_ssv2_labels(tmp_path):
    from peg_video.data.annotations import AnnotationError, read_class_map
    from peg_video.data.datasets import SSV2_LABELS, read_ssv2

    path = tmp_path / "classes.json"
    path.write_text(DEEP)
    with pytest.raises(AnnotationError) as e:
        read_class_map(path)
    assert e.value.what == f"class file {NESTED}" and _one_line(e.value, path)
    labels = tmp_path / SSV2_LABELS
    labels.write_text(DEEP)
    with pytest.raises(AnnotationError) as e:
        read_ssv2(tmp_path)
    assert e.value.what == f"annotation file {NESTED}" and _one_line(e.value, labels)


def test_prepare_copies_a_deep_json_as_is_and_refuses_deep_settings(tmp_path):
    from peg_video.prepare import SETTINGS_NAME, _recorded_settings, _rewrite_json

    assert _rewrite_json(DEEP, lambda text: None) is None  # not rewritten: copied as it is
    (tmp_path / SETTINGS_NAME).write_text(DEEP)
    with pytest.raises(UserError) as e:
        _recorded_settings(tmp_path)
    assert (
        e.value.what
        == f"cannot read the settings of the earlier run (settings file {NESTED}); remove the file"
    )


def test_quantized_model_metadata():
    with pytest.raises(WeightsError) as e:
        check_meta(DEEP, "m.pt2")
    assert str(e.value) == f"the metadata {NESTED}: m.pt2 (extra/peg_quantized.json)"
    with pytest.raises(WeightsError, match=r"^the metadata is not valid JSON \(NaN is not JSON\)"):
        check_meta('{"num_classes": NaN}', "m.pt2")


def test_pt2_archive_members(tmp_path):
    path = tmp_path / "m.pt2"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("m/archive_format", "pt2")
        zf.writestr("m/archive_version", "0")
        zf.writestr(f"m/{PROGRAM}", "{}")
        zf.writestr(f"m/{WEIGHTS_CONFIG}", DEEP)
        zf.writestr("m/data/constants/model_constants_config.json", '{"config": {}}')
    with pytest.raises(UnsafeArchiveError) as e:
        check_pt2_archive(path)
    assert e.value.what == (
        f"refused .pt2 member m/{WEIGHTS_CONFIG}: nested deeper than 128 levels (nothing in the file was run)"
    )


def test_demo_stamps_that_are_not_json_mean_new_data(tmp_path):
    from peg_detr.demo import _read_stamp as detr_stamp
    from peg_video.demo import _read_stamp as video_stamp

    stamp = tmp_path / "spec.json"
    stamp.write_text(DEEP)
    assert detr_stamp(stamp) is None and video_stamp(stamp) is None
    stamp.write_text('{"seed": 0}')
    assert detr_stamp(stamp) == {"seed": 0}
