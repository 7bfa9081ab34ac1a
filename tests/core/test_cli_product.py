"""The three command lines read as one product.

* one top-level ``-h`` layout (a line on the package, the verbs one line each, where the rest is);
* ``train -h`` grouped and short: a short usage, the recipes named once (``configs``), titles and
  ``--init`` help that name every family and format they serve;
* epoch lines that fit a terminal (total loss, main terms, lr, time with its unit), every term
  still in the metrics log;
* ``predict --threads`` as ``train`` and ``eval`` take it;
* ``python -m peg_core export``: the classifier as ONNX that onnxruntime runs at other sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peg_core.engine import StepOutput, TrainParts, add_train_args, fit, new_parser
from peg_core.engine.progress import epoch_line, format_seconds, main_terms
from tests.core.classify_runs import keep_threads, tiny  # noqa: F401 (keep_threads: an autouse fixture)

PACKAGES = ("peg_core", "peg_detr", "peg_video")
#: what a terminal holds: every epoch line and top-level -h line fits
WIDTH = 120
#: train -h at 100 columns (before the short usage and the configs pointer: 168, 284, 237 lines; with
#: them 125, 194, 168): room for new flags, none for a usage of every option or the recipe list again
TRAIN_HELP_LINES = {"peg_core": 140, "peg_detr": 215, "peg_video": 190}
FAMILIES = ("DETR", "RT-DETR", "D-FINE", "DEIMv2")


def _run(module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``python -m module *argv`` in process, at 100 columns."""
    if monkeypatch is not None:
        monkeypatch.setenv("COLUMNS", "100")
    main = importlib.import_module(f"{module}.__main__").main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's -h in the packages whose main does not catch it
            code = e.code
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------------------ the top-level -h


def _layout(text: str, prog: str, verbs: list[str]) -> list[str]:
    """The help's lines with the package's own words replaced: the same list for every package."""
    lines = text.rstrip("\n").splitlines()
    shape = []
    for line in lines:
        if line.startswith(f"{prog}: "):
            shape.append("PROG: DESCRIPTION")
        elif line.strip() and line.split()[0] in verbs and line.startswith("  "):
            shape.append("  VERB SUMMARY")
        else:
            shape.append(line.replace(prog, "PROG"))
    return shape


@pytest.mark.parametrize("module", PACKAGES)
def test_top_level_help_one_layout(module):
    main_module = importlib.import_module(f"{module}.__main__")
    prog = f"python -m {module}"
    code, text, _ = _run(module, ["-h"])
    assert code == 0
    verbs = list(main_module.SUMMARIES)
    assert set(verbs) <= set(main_module.COMMANDS), "a listed verb that does not run"
    assert set(main_module.COMMANDS) - set(verbs) <= set(getattr(main_module, "ALIASES", {})), (
        "a verb that runs but is not listed (only old names, kept as aliases, may be hidden)"
    )
    lines = text.rstrip("\n").splitlines()
    assert lines[0].startswith(f"{prog}: ") and len(lines[0]) <= WIDTH, lines[0]
    assert lines[1:5] == ["", f"usage: {prog} VERB [options]", "", "verbs:"]
    listed = lines[5 : 5 + len(verbs)]
    assert [line.split()[0] for line in listed] == verbs
    for line, verb in zip(listed, verbs, strict=True):  # one line each, with words after the verb
        assert len(line) <= WIDTH and len(line.split()) >= 4, line
        assert main_module.SUMMARIES[verb] in line
    assert lines[5 + len(verbs) :] == [
        "",
        f"{prog} VERB -h: the options of one verb; docs/cli.md: every verb in full.",
        f"{prog} --version: print the version and exit.",
    ]


def test_top_level_help_is_the_same_in_every_package():
    shapes = set()
    for module in PACKAGES:
        verbs = list(importlib.import_module(f"{module}.__main__").SUMMARIES)
        _, text, _ = _run(module, [])  # no verb: the same page (exit 2)
        shape = _layout(text, f"python -m {module}", verbs)
        shapes.add(tuple(line for i, line in enumerate(shape) if line != shape[i - 1] or i == 0))
    assert len(shapes) == 1, shapes


def test_detr_help_export_hf_names_every_family():
    _, text, _ = _run("peg_detr", ["-h"])
    (line,) = [line for line in text.splitlines() if line.strip().startswith("export-hf")]
    assert all(family in line for family in FAMILIES), line
    assert "DETR only" not in text and "DETR folder" not in text
    first = text.splitlines()[0]
    assert all(family in first for family in FAMILIES), first


def test_unknown_verb_is_one_line_pointing_to_help(capsys):
    code, _, err = _run("peg_video", ["trian"])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: python -m peg_video: unknown command 'trian'") and "-h" in err


# ------------------------------------------------------------------------------------- train -h


def _train_parser(module: str) -> argparse.ArgumentParser:
    cli = importlib.import_module("peg_core.classify.cli" if module == "peg_core" else f"{module}.cli")
    return cli.build_train_parser()


@pytest.mark.parametrize("module", PACKAGES)
def test_train_help_is_grouped_and_short(module, monkeypatch):
    code, text, _ = _run(module, ["train", "-h"], monkeypatch)
    assert code == 0
    lines = text.splitlines()
    assert len(lines) <= TRAIN_HELP_LINES[module], len(lines)
    usage = text.split("\n\n")[0].splitlines()
    assert usage == [f"usage: python -m {module} train [--config NAME] [options]"], usage
    # the recipes are listed by the configs verb, not here: at most a few named as examples
    configs = importlib.import_module(
        "peg_core.classify.configs" if module == "peg_core" else f"{module}.configs"
    )
    named = {n: len(re.findall(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)) for n in configs.CONFIGS}
    named = {n: count for n, count in named.items() if count}
    assert len(named) <= 3, named
    assert ",".join(sorted(configs.CONFIGS)[:2]) not in text
    (config_help,) = [a.help for a in _train_parser(module)._actions if "--config" in a.option_strings]
    assert f"python -m {module} configs" in config_help
    assert "--config NAME " in text
    # grouped: the run group, then the package's own groups, each titled
    groups = [g.title for g in _train_parser(module)._action_groups if g._group_actions]
    assert "run (common to every package)" in groups and len(groups) >= 4, groups
    # nothing wider than the terminal but the example commands of the description
    assert all(len(line) <= 100 for line in lines if not line.lstrip().startswith(("python -m", "torchrun")))


def test_detr_train_help_names_every_family():
    parser = _train_parser("peg_detr")
    text = parser.format_help()
    first = parser.description.splitlines()[0]
    assert all(family in first for family in FAMILIES), first
    assert "Train DETR (" not in text and "sine / learned / none" not in text
    titles = {g.title: {o for a in g._group_actions for o in a.option_strings} for g in parser._action_groups}
    # a family's options are under a title naming every family they serve
    (rt_title,) = [t for t, opts in titles.items() if "--ema-decay" in opts]
    assert all(f in rt_title for f in ("RT-DETR", "D-FINE", "DEIMv2")), rt_title
    (size_title,) = [t for t, opts in titles.items() if "--model-size" in opts]
    assert "D-FINE" in size_title and "DEIMv2" in size_title
    (dfine_title,) = [t for t, opts in titles.items() if "--cls-loss" in opts]
    assert "D-FINE" in dfine_title and "DEIM" in dfine_title
    (init,) = [a.help for a in parser._actions if "--init" in a.option_strings]
    for words in ("Hugging Face folder", "hub id", *FAMILIES, "checkpoint of peg_detr train",
                  "official DETR", "by name", "--class-map"):  # fmt: skip
        assert words in init, (words, init)


def test_video_and_classifier_init_help_name_their_formats():
    (video,) = [a.help for a in _train_parser("peg_video")._actions if "--init" in a.option_strings]
    for words in ("Hugging Face folder", "hub id", "VideoMAE", "TimeSformer", "V-JEPA 2",
                  "checkpoint of peg_video train", "2-D", "by name", "--class-map"):  # fmt: skip
        assert words in video, (words, video)
    (core,) = [a.help for a in _train_parser("peg_core")._actions if "--init" in a.option_strings]
    for words in (
        "checkpoint of peg_core train",
        ".safetensors",
        "--init-timm",
        "Hugging Face id",
        "timm:NAME",
    ):
        assert words in core, (words, core)


# ------------------------------------------------------------------------------------ epoch lines

#: the terms D-FINE logs (30): the last layer's, the auxiliary, pre, encoder and denoising copies
DFINE_TERMS = [
    "loss_vfl", "loss_bbox", "loss_giou", "loss_fgl", "loss_vfl_aux_0", "loss_bbox_aux_0", "loss_giou_aux_0",
    "loss_fgl_aux_0", "loss_ddf_aux_0", "loss_vfl_pre", "loss_bbox_pre", "loss_giou_pre", "loss_vfl_enc_0",
    "loss_bbox_enc_0", "loss_giou_enc_0", "loss_vfl_dn_0", "loss_bbox_dn_0", "loss_giou_dn_0",
    "loss_fgl_dn_0", "loss_ddf_dn_0", "loss_vfl_dn_1", "loss_bbox_dn_1", "loss_giou_dn_1", "loss_fgl_dn_1",
    "loss_ddf_dn_1", "loss_vfl_dn_pre", "loss_bbox_dn_pre", "loss_giou_dn_pre", "loss_ce_0", "loss_ce_1",
]  # fmt: skip
#: ``epoch E/N: loss L (t v, ...) lr X T unit``
EPOCH_LINE = re.compile(
    r"^epoch \d+/\d+: loss \d+\.\d{3}( \((\w+ -?\d+\.\d{3}(, )?)+\))?( \w+ \d+\.\d{3})* lr \d\.\de[-+]\d\d"
    r"( at \d+ px)? \d+(\.\d)? (s|min|h)(, \d+ broken)?$"
)


def test_epoch_line_fits_a_terminal():
    stats = {
        "loss": 123.4567,
        **{k: 12.3456 for k in DFINE_TERMS},
        "steps": 9999,
        "broken": 12,
        "size": 1024.0,
    }
    line = epoch_line(300, 300, stats, 2e-4, 36000.0)
    assert len(line) <= WIDTH and EPOCH_LINE.match(line), line
    assert line.startswith("epoch 300/300: loss 123.457 (vfl 12.346, bbox 12.346, giou 12.346, fgl 12.346) ")
    assert line.endswith(" lr 2.0e-04 at 1024 px 10.0 h, 12 broken"), line
    assert main_terms({"loss_ce": 1, "loss_bbox": 2, "loss_giou": 3, "loss_ce_0": 4}) == {
        "ce": 1.0, "bbox": 2.0, "giou": 3.0,
    }  # fmt: skip
    assert epoch_line(3, 12, {"loss": 1.5, "acc": 0.25, "steps": 4, "broken": 0}, 1e-3, 38.2) == (
        "epoch 3/12: loss 1.500 acc 0.250 lr 1.0e-03 38 s"
    )
    assert [format_seconds(s) for s in (0.4, 99, 100, 5999, 6000)] == [
        "0 s",
        "99 s",
        "1.7 min",
        "100.0 min",
        "1.7 h",
    ]


class _ManyTerms:
    """A task that logs D-FINE's 30 terms each step: the epoch line says 4, the log holds all."""

    name = "terms"

    def setup_train(self, args, ctx, ckpt):
        model = nn.Linear(2, 1)
        opt = torch.optim.AdamW([{"params": model.weight, "lr": 1e-3}, {"params": model.bias, "lr": 1e-4}])
        g = torch.Generator().manual_seed(0)
        loader = DataLoader(
            TensorDataset(torch.randn(16, 2, generator=g), torch.randn(16, 1, generator=g)), 4
        )

        def step(net, batch, ctx):
            x, y = batch
            loss = ((net(x) - y) ** 2).mean()
            return StepOutput(loss, {k: loss.detach() * (i + 1) for i, k in enumerate(DFINE_TERMS)})

        return TrainParts(model, opt, loader, 16, step, model_config={}, meta={})


def test_fit_prints_short_epoch_lines_and_logs_every_term(tmp_path, capsys):
    p = new_parser("terms train")
    add_train_args(p, output_dir=str(tmp_path))
    p.set_defaults(epochs=2, batch_size=4, lr=1e-3, clip_max_norm=0.0, workers=0, progress=False)
    fit(_ManyTerms(), p.parse_args(["--output-dir", str(tmp_path)]))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 2, out
    for line in lines:
        assert len(line) <= WIDTH and EPOCH_LINE.match(line), line
        assert " (vfl " in line and ", fgl " in line and " lr 1.0e-03 " in line and "aux" not in line, line
    logged = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in logged if r["tag"] == "train"]
    assert len(train) == 2 and set(DFINE_TERMS) <= set(train[0]) and "lr" in train[0]
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(DFINE_TERMS) <= set(report["train"]), sorted(report)


# ------------------------------------------------------------------------------- predict --threads


@pytest.mark.parametrize("module", PACKAGES)
def test_predict_threads_accepted_and_applied(module, tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    code, _, err = _run(module, ["predict", "--threads", "3", "--checkpoint", str(tmp_path / "no.pth"),
                                 str(tmp_path / "x.png"), "--device", "cpu"])  # fmt: skip
    # the threads are set before the checkpoint is read; the missing checkpoint is one line
    assert calls == [3], (calls, err)
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1, err
    code, _, err = _run(module, ["predict", "--threads", "0", "--checkpoint", "c.pth", "x.png"])
    assert code == 2 and "argument --threads: expected a positive integer" in err, err


def test_classifier_predict_threads_end_to_end(tmp_path, capsys, monkeypatch):
    from peg_core.__main__ import main

    assert main(["train", *tiny(8, 8, "--epochs", "1"), "--output-dir", str(tmp_path / "run")]) == 0
    image = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (16, 16), (200, 30, 30)).save(image)
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(tmp_path / "run" / "checkpoint.pth"), str(image),
                 "--threads", "1", "--device", "cpu"]) == 0  # fmt: skip
    assert torch.get_num_threads() == 1
    assert "predict done: 1 image, 0 skipped" in capsys.readouterr().out


# ------------------------------------------------------------------------------ peg_core export


@pytest.mark.slow  # an ONNX export
def test_peg_core_export_runs_in_onnxruntime_at_other_sizes(tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnx

    from peg_core.__main__ import main
    from peg_core.classify.model import load_model

    run = tmp_path / "run"
    assert main(["train", *tiny(8, 8, "--epochs", "1"), "--output-dir", str(run)]) == 0
    capsys.readouterr()
    out = tmp_path / "cpvt.onnx"
    assert main(["export", str(run / "checkpoint.pth"), str(out), "--check"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["onnx"] == str(out) and report["max_abs_diff"] < 1e-4, report
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    loaded = load_model(run / "checkpoint.pth")
    assert meta["peg_task"] == "classify" and json.loads(meta["peg_classes"]) == loaded.classes
    assert len(json.loads(meta["peg_mean"])) == 3 and meta["peg_img_size"] == "16"
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(1)
    for shape in ((1, 3, 16, 16), (3, 3, 24, 40)):  # another batch, another (non-square) size
        x = torch.randn(*shape, generator=g)
        (got,) = session.run(None, {"images": x.numpy()})
        with torch.no_grad():
            want = loaded.model(x)
        assert got.shape == tuple(want.shape) and float((torch.from_numpy(got) - want).abs().max()) < 1e-4
    # a second export over the first is an ONNX file replaced; the checkpoint is refused as the output
    assert main(["export", str(run / "checkpoint.pth"), str(out)]) == 0
    capsys.readouterr()
    assert main(["export", str(run / "checkpoint.pth"), str(run / "checkpoint.pth")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    # an example size that is not a multiple of the patch is one line naming the flags
    assert main(["export", str(run / "checkpoint.pth"), str(tmp_path / "b.onnx"), "--height", "20"]) == 1
    err = capsys.readouterr().err
    assert "multiples of the patch size 8" in err and err.strip().endswith("--height/--width"), err


def test_peg_core_export_listed_with_a_summary():
    main_module = importlib.import_module("peg_core.__main__")
    assert "export" in main_module.SUMMARIES and "ONNX" in main_module.SUMMARIES["export"]
    assert Path(importlib.import_module("peg_core.classify.export").__file__).is_file()
