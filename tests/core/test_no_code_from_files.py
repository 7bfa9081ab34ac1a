"""No file runs code: every loader of the suite refuses pickled payloads, as one line, before anything runs.

Each payload creates a marker file when it is unpickled (or exec'd / eval'd); the marker must never
appear.  Torch files: a ``torch.save`` zip archive with a ``__reduce__`` payload, the legacy
(non-zip) format as ``.bin`` / ``pytorch_model.bin``, and a raw pickle.  ``.pt2`` archives: a
genuine small int8 export with one member edited: a weight marked ``use_pickle``, an opaque-object,
custom-object or pickled tensor constant, sample inputs that need full unpickling (torch falls back to
``weights_only=False``), guards that torch ``exec``-s, a symbolic expression that sympy ``eval``-s,
a graph target outside the tensor ops, AOTInductor / legacy members, names pasted into code.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from peg_core.__main__ import main as core_main
from peg_core.export.pt2 import UnsafeArchiveError, check_pt2_archive
from peg_core.interop import WeightsError, read_state_file

ROOT = Path(__file__).resolve().parents[2]
CORE_TINY = [
    "--img-size", "16", "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--peg-at", "0",
    "--patch-size", "4", "--batch-size", "8", "--n-train", "16", "--n-val", "8", "--workers", "0",
    "--threads", "1", "--no-progress", "--device", "cpu", "--epochs", "1",
]  # fmt: skip
DETR_TINY = [
    "--backbone", "tiny", "--hidden-dim", "32", "--nheads", "2", "--enc-layers", "1", "--dec-layers", "1",
    "--dim-feedforward", "64", "--num-queries", "5", "--train-scales", "64", "--crop-resize", "",
    "--val-size", "64", "--total-batch-size", "4", "--workers", "0", "--no-progress", "--epochs", "1",
]  # fmt: skip


class Payload:
    """Unpickling it opens (creates) ``path``: the proof that a file ran code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def marker(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("marker") / "RAN"


@pytest.fixture(autouse=True)
def _never_ran(marker):
    yield
    assert not marker.exists(), "a file ran code"


@pytest.fixture(scope="module")
def torch_files(tmp_path_factory, marker) -> dict[str, Path]:
    """The classic payloads: zip ``.pth``, legacy ``.bin``, raw pickle, and a Hugging Face folder of one."""
    d = tmp_path_factory.mktemp("evil")
    obj = {"model": {"w": torch.zeros(1)}, "task": "classify", "x": Payload(marker)}
    torch.save(obj, d / "zip.pth")
    torch.save(obj, d / "legacy.bin", _use_new_zipfile_serialization=False)
    (d / "raw.pth").write_bytes(pickle.dumps(Payload(marker), protocol=2))  # GLOBAL: refused by name
    (d / "raw4.pth").write_bytes(pickle.dumps(Payload(marker), protocol=4))  # opcodes torch does not read
    hf = d / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "detr", "num_labels": 3}))
    torch.save({"model.w": torch.zeros(1), "x": Payload(marker)}, hf / "pytorch_model.bin",
               _use_new_zipfile_serialization=False)  # fmt: skip
    return {"hf": hf, **{p.name: p for p in d.iterdir() if p.is_file()}}


def _one_line(capsys, code: int, path: Path) -> str:
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert str(path) in err and "weights_only=False" not in err, err
    return err.strip()


def _calls(main: Callable[[list[str]], int], capsys, argv: list[str], path: Path) -> str:
    capsys.readouterr()
    return _one_line(capsys, main(argv), path)


# --------------------------------------------------------------------------------------- torch files


def test_read_state_file_and_timm_refuse_every_torch_payload(torch_files):
    for name in ("zip.pth", "legacy.bin", "raw.pth"):
        with pytest.raises(WeightsError, match="refused") as e:
            read_state_file(torch_files[name])
        assert "nothing in it was executed" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(WeightsError, match=r"not a torch file \(Unsupported operand 149\)"):
        read_state_file(torch_files["raw4.pth"])
    timm = pytest.importorskip("timm")
    pytest.importorskip("peg_core.interop.timm")
    for name in ("zip.pth", "legacy.bin"):
        with pytest.raises(WeightsError, match="refused"):
            overlay = dict(file=str(torch_files[name]))
            timm.create_model("cpvt_tiny", pretrained=True, pretrained_cfg_overlay=overlay, depth=1)


def test_peg_core_commands_refuse_every_torch_payload(torch_files, tmp_path, capsys):
    image = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (16, 16)).save(image)
    out = tmp_path / "out"
    for name in ("zip.pth", "legacy.bin", "raw.pth"):
        p = torch_files[name]
        for argv in (
            ["eval", "--checkpoint", str(p), "--output-dir", str(out), "--no-progress"],
            ["predict", "--checkpoint", str(p), str(image)],
            ["resize-pos-embed", str(p), str(out / "r.pth"), "--grid", "2x2"],
            ["to-cpvt", str(p), str(out / "c.pth")],
            ["quantize", str(p), str(out / "q.pt2")],
            ["train", *CORE_TINY, "--output-dir", str(out), "--resume", str(p)],
            ["train", *CORE_TINY, "--output-dir", str(out), "--init", str(p)],
        ):
            assert "refused" in _calls(core_main, capsys, argv, p), argv


COCO_SET = dict(max_frac=0.45, num_train=4, num_val=2, seed=3)  # the module's ``coco`` (tests/conftest.py)


def test_peg_detr_commands_refuse_every_torch_payload(torch_files, coco, tmp_path, capsys):
    from peg_detr.__main__ import main as detr_main

    image = next((coco / "val2017").glob("*.jpg"))
    out = tmp_path / "out"
    train = ["train", "--data-root", str(coco), "--output-dir", str(out), *DETR_TINY]
    for name in ("zip.pth", "legacy.bin", "hf"):
        p = torch_files[name]
        named = p / "pytorch_model.bin" if name == "hf" else p
        argvs = [[*train, "--init", str(p)], [*train, "--pretrained", str(p)]]
        if name != "hf":
            argvs += [
                [*train, "--resume", str(p)],
                [*train, "--backbone-weights", str(p)],
                ["eval", "--checkpoint", str(p), "--data-root", str(coco), "--output-dir", str(out)],
                ["predict", str(image), "--checkpoint", str(p), "--out", str(out / "p")],
                ["export", str(p), str(out / "m.onnx")],
            ]
        for argv in argvs:
            assert "refused" in _calls(detr_main, capsys, argv, named), argv


def test_peg_video_commands_refuse_every_torch_payload(torch_files, tmp_path_factory, tmp_path, capsys):
    from peg_video.__main__ import main as video_main
    from tests.video.runs import TINY, synthetic_set

    data = synthetic_set(tmp_path_factory.mktemp("video"), num_train=2, num_val=1, frames=4)
    video = next((data / "val").rglob("*.mp4"))
    out = tmp_path / "out"
    train = [
        "train",
        "--train-ann",
        str(data / "train.csv"),
        "--output-dir",
        str(out),
        *TINY,
        "--epochs",
        "1",
    ]
    for name in ("zip.pth", "legacy.bin"):
        p = torch_files[name]
        for argv in (
            [*train, "--model", "vit_tiny", "--init-2d", str(p)],
            [*train, "--init", str(p)],
            [*train, "--resume", str(p)],
            ["eval", "--checkpoint", str(p), "--val-ann", str(data / "val.csv"), "--output-dir", str(out)],
            ["predict", "--checkpoint", str(p), str(video)],
            ["export", str(p), str(out / "v.onnx")],
        ):
            assert "refused" in _calls(video_main, capsys, argv, p), argv


# ----------------------------------------------------------------------------------------- .pt2 files


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    """A small int8 ``.pt2`` written by :func:`save_quantized` (the 'peg_core quantize' format)."""
    from peg_core.classify.model import build_model
    from peg_core.classify.shapes import CLASS_NAMES
    from peg_core.export.quantize import quantize_int8, save_quantized

    torch.manual_seed(0)
    model = build_model({"arch": "demo", "pos_enc": "peg", "img_size": 16, "num_classes": len(CLASS_NAMES),
                         "embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 4, "peg_at": [0]})  # fmt: skip
    example = torch.zeros(2, 3, 8, 8)
    quantized = quantize_int8(model, [torch.randn(4, 3, 16, 16)], example)
    path = tmp_path_factory.mktemp("pt2") / "int8.pt2"
    meta = {"classes": list(CLASS_NAMES), "img_size": 16, "data": {"kind": "shapes", "seed": 0, "n_val": 8}}
    return save_quantized(quantized, example, path, meta)


def edited(src: Path, dst: Path, edit: Callable[[dict[str, bytes]], None]) -> Path:
    """A copy of archive ``src`` whose members (by path under the root folder) ``edit`` changed in place."""
    with zipfile.ZipFile(src) as zf:
        root = zf.namelist()[0].split("/", 1)[0]
        members = {n.split("/", 1)[1]: zf.read(n) for n in zf.namelist()}
    edit(members)
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in members.items():
            zf.writestr(f"{root}/{name}", data)
    return dst


def _json_edit(member: str, change: Callable[[dict], None]) -> Callable[[dict[str, bytes]], None]:
    def edit(members: dict[str, bytes]) -> None:
        doc = json.loads(members[member])
        change(doc)
        members[member] = json.dumps(doc).encode()

    return edit


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


WEIGHTS = "data/weights/model_weights_config.json"
CONSTANTS = "data/constants/model_constants_config.json"
PROGRAM = "models/model.json"


def _pickled_weight(marker: Path):
    def edit(members):
        _json_edit(WEIGHTS, lambda d: d["config"]["cls_token"].update(use_pickle=True))(members)
        path = json.loads(members[WEIGHTS])["config"]["cls_token"]["path_name"]
        members[f"data/weights/{path}"] = _torch_bytes(Payload(marker))

    return edit, f"{WEIGHTS}: entry 'cls_token' has use_pickle True"


def _constant(marker: Path, path_name: str, payload: bytes, use_pickle: bool = False):
    entry = {"path_name": path_name, "is_param": False, "use_pickle": use_pickle, "tensor_meta": None}

    def edit(members):
        _json_edit(CONSTANTS, lambda d: d["config"].update(c0=entry))(members)
        members[f"data/constants/{path_name}"] = payload

    return edit


def _sample_inputs(marker: Path):
    def edit(members):
        members["data/sample_inputs/model.pt"] = _torch_bytes(((Payload(marker),), {}))

    return edit, "data/sample_inputs/model.pt: pickled objects other than tensors"


def _guard(marker: Path):
    code = f"open({str(marker)!r}, 'w') is not None"
    return _json_edit(PROGRAM, lambda d: d["guards_code"].append(code)), 'guard "open('


def _sym_expr(marker: Path):
    def change(doc):
        text = json.dumps(doc)
        sym = "Symbol('s77', positive=True, integer=True)"
        assert sym in text
        doc.clear()
        doc.update(
            json.loads(
                text.replace(sym, f"Symbol('s77', positive=open({str(marker)!r}, 'w') is not None)", 1)
            )
        )

    return _json_edit(PROGRAM, change), "expr_str \"Symbol('s77', positive=open("


def _node(change: Callable[[dict], None]) -> Callable[[dict], None]:
    def on_doc(doc):
        node = next(n for n in doc["graph_module"]["graph"]["nodes"] if n["target"].endswith("gelu.default"))
        change(node)

    return on_doc


def _payloads(marker: Path) -> dict[str, tuple[Callable[[dict[str, bytes]], None], str]]:
    """name -> (edit of a genuine archive, the part of the refusal that names the member and why)."""
    bad_name = "cls_token\")or open('x','w')#"
    stack = "File \"a.py\", line 1, in f\r__import__('os')\n    x = 1"
    return {
        "use_pickle weight": _pickled_weight(marker),
        "opaque-object constant": (
            _constant(marker, "opaque_obj_0", pickle.dumps(Payload(marker)), use_pickle=True),
            f"{CONSTANTS}: entry 'c0' is stored as 'opaque_obj_0', not a tensor payload tensor_<i>",
        ),
        "custom-object constant": (
            _constant(marker, "custom_obj_0", pickle.dumps(Payload(marker)), use_pickle=True),
            f"{CONSTANTS}: entry 'c0' is stored as 'custom_obj_0'",
        ),
        "pickled tensor constant": (
            _constant(marker, "tensor_0", _torch_bytes(Payload(marker)), use_pickle=True),
            f"{CONSTANTS}: entry 'c0' has use_pickle True",
        ),
        "sample inputs": _sample_inputs(marker),
        "exec'd guard": _guard(marker),
        "eval'd expression": _sym_expr(marker),
        "call target": (
            _json_edit(PROGRAM, _node(lambda n: n.update(target="torch.os.system"))),
            "target 'torch.os.system' is not allowed",
        ),
        "carriage return": (
            _json_edit(PROGRAM, _node(lambda n: n["metadata"].update(stack_trace=stack))),
            "stack_trace",
        ),
        "name pasted into code": (
            _json_edit(WEIGHTS, lambda d: d["config"].update({bad_name: d["config"]["cls_token"]})),
            "is not a plain dotted name",
        ),
        "AOTInductor library": (
            lambda m: m.update({"data/aotinductor/model/model.so": b"\x7fELF"}),
            "data/aotinductor/model/model.so: not a member torch.export.save writes",
        ),
        "legacy weights pickle": (
            lambda m: m.update({"data/weights/model.pt": _torch_bytes(Payload(marker))}),
            "data/weights/model.pt: not a member",
        ),
        "not a PT2 archive": (lambda m: m.pop("archive_format"), "archive_format: missing"),
    }


PAYLOADS = list(_payloads(Path("x")))


def test_the_genuine_archive_passes_the_check_and_loads(genuine):
    from peg_core.export.quantize import load_quantized

    check_pt2_archive(genuine)  # our own int8 export has no pickled member
    with zipfile.ZipFile(genuine) as zf:
        configs = [json.loads(zf.read(n)) for n in zf.namelist() if n.endswith("_config.json")]
    assert all(e["use_pickle"] is False for c in configs for e in c["config"].values())
    model, meta = load_quantized(genuine)
    assert model(torch.zeros(1, 3, 12, 16)).shape == (1, len(meta["classes"]))


@pytest.mark.parametrize("name", PAYLOADS)
def test_planted_pt2_payloads_are_refused_by_eval(name, genuine, marker, tmp_path, capsys):
    edit, expected = _payloads(marker)[name]
    path = edited(genuine, tmp_path / "evil.pt2", edit)
    with pytest.raises(UnsafeArchiveError) as e:
        check_pt2_archive(path)
    assert expected in str(e.value) and str(e.value).endswith(f"(nothing in the file was run): {path}")
    argv = ["eval", "--checkpoint", str(path), "--output-dir", str(tmp_path / "ev"), "--no-progress"]
    err = _calls(core_main, capsys, argv, path)
    assert err.startswith("error: refused .pt2 member ") or name == "not a PT2 archive", err


@pytest.mark.parametrize("name", ["use_pickle weight", "sample inputs", "exec'd guard"])
def test_subprocess_eval_of_a_planted_pt2_is_one_line(name, genuine, marker, tmp_path):
    path = edited(genuine, tmp_path / "evil.pt2", _payloads(marker)[name][0])
    proc = subprocess.run(
        [sys.executable, "-m", "peg_core", "eval", "--checkpoint", str(path), "--no-progress",
         "--output-dir", str(tmp_path / "ev")],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert (
        err.count("\n") == 1 and err.startswith("error: refused .pt2 member ") and "Traceback" not in err
    ), err
    assert "weights_only=False" not in err and err.strip().endswith(str(path))
