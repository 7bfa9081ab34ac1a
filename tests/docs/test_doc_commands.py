"""Every fenced ```bash / ```sh / ```python block of README.md and docs/*.md is executed or checked.

* ``python`` blocks run for real: all blocks of one file, in order, in one
  subprocess (tmp working directory, the repository on ``PYTHONPATH``), each
  in a fresh namespace; a failure names the file and the block's line.
* shell commands (one per line; ``\\`` continuations joined, ``#`` comments
  dropped) are classified by :func:`classify`:

  - ``run``: cheap commands run for real, in order, in one tmp working
    directory per file (so ``make-data`` can feed a later command), after
    :data:`FIXTURES` created the files the docs refer to;
  - ``parse``: commands that need a GPU, real COCO / Kinetics, or ``torchrun``
    (its launcher options are stripped) are fed to the module's own argparse
    parser, so every flag, choice and config name they use must exist; so are
    the ``--quick`` runs of the study and the GPU check, which
    ``tests/tools/test_study.py`` and ``test_gpu_check.py`` run for real
    (:data:`COVERED`);
  - ``skip``: only the two ``make`` targets (``make test`` is this suite;
    ``make demo`` is covered by ``tests/tools/test_demo.py``).

  A command the harness cannot classify fails the test, so a new command in
  the docs needs a rule here.

Placeholders: docs use real-looking names and the fixtures make them real
(see :data:`FIXTURES`); :data:`SUBSTITUTIONS` rewrites the few arguments that
would be too slow to run as written (none of them changes which flags are used).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(bash|sh|python)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)

#: (regex, replacement) applied to ``run`` commands before they execute (documented in the docs pages).
SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"--num-train \d+", "--num-train 6"),  # synthetic videos: enough to check the layout, seconds to write
    (r"--num-val \d+", "--num-val 6"),
]


def _env() -> dict[str, str]:
    # One intra-op thread: on a shared 2-core machine OpenMP spinning makes tiny ops much slower with 2.
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


# ------------------------------------------------------------------------------------------ extraction


def blocks(path: Path) -> list[tuple[str, int, str]]:
    """``(language, first line number, code)`` of each fenced bash/sh/python block."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start(2)) + 1
        out.append(("python" if m.group(1) == "python" else "sh", line, m.group(2)))
    return out


def shell_commands(code: str) -> list[list[str]]:
    """Commands of a shell block as argv lists (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", code)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


# -------------------------------------------------------------------------------------- classification


# (module, first argument or None) -> argparse check of the remaining arguments
def _detr_train(argv: list[str]) -> None:
    from peg_detr.cli import parse_train_args

    parse_train_args(argv)


def _detr_eval(argv: list[str]) -> None:
    from peg_detr.cli import parse_eval_args

    parse_eval_args(argv)


def _core_train(argv: list[str]) -> None:
    from peg_core.classify.cli import CONFIGS, build_train_parser
    from peg_core.engine import parse_with_config

    parse_with_config(build_train_parser(), argv, CONFIGS)


def _core_eval(argv: list[str]) -> None:
    from peg_core.classify.cli import build_eval_parser

    build_eval_parser().parse_args(argv)


def _video_train(argv: list[str]) -> None:
    from peg_video.cli import parse_train_args

    parse_train_args(argv)


def _video_eval(argv: list[str]) -> None:
    from peg_video.cli import build_eval_parser

    build_eval_parser().parse_args(argv)


def _study(argv: list[str]) -> None:
    from tools.study import build_parser

    build_parser().parse_args(argv)


def _gpu_check(argv: list[str]) -> None:
    """``tools/gpu_check.py`` builds its parser inside ``main``: stop ``main`` right after parsing."""
    import tools.gpu_check as gpu_check

    class Parsed(Exception):
        pass

    real_parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(real_parse(self, args, namespace))

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), pytest.raises(Parsed):
        gpu_check.main(argv)


def _video_export_hf(argv: list[str]) -> None:
    from peg_video.cli import build_export_hf_parser

    build_export_hf_parser().parse_args(argv)


PARSERS: dict[tuple[str, str | None], Callable[[list[str]], None]] = {
    ("peg_video", "export-hf"): _video_export_hf,
    ("peg_detr", "train"): _detr_train,
    ("peg_detr", "eval"): _detr_eval,
    ("peg_video", "train"): _video_train,
    ("peg_video", "eval"): _video_eval,
    ("peg_core", "train"): _core_train,
    ("peg_core", "eval"): _core_eval,
    ("tools.study", None): _study,
    ("tools.gpu_check", None): _gpu_check,
}

#: commands cheap enough to run as written (module, first argument or None, required flag or None)
RUNNABLE: list[tuple[str, str | None, str | None]] = [
    ("peg_detr", "make-data", None),
    ("peg_detr", "predict", None),
    ("peg_video", "make-data", None),
    ("peg_core", "resize-pos-embed", None),
    ("peg_core", "make-data", None),
    ("peg_core", "configs", None),
    ("peg_detr", "configs", None),
    ("peg_video", "configs", None),
]
#: cheap commands that a dedicated test already runs for real (same flags): only parsed here, to keep
#: the suite's time down
COVERED = {
    "tools.study": "tests/tools/test_study.py (--quick, every task)",
    "tools.gpu_check": "tests/tools/test_gpu_check.py (--device cpu --quick)",
}
SKIPPED = {("make", "demo"), ("make", "test")}


def _module_argv(argv: list[str]) -> tuple[str, list[str], bool]:
    """``(module, its arguments, launched by torchrun)`` of a python / torchrun command line."""
    launcher = argv[0]
    if launcher not in ("python", "python3", "torchrun"):
        raise ValueError(f"not a python or torchrun command: {shlex.join(argv)}")
    rest = argv[1:]
    if "-m" in rest:
        i = rest.index("-m")
        return rest[i + 1], rest[i + 2 :], launcher == "torchrun"
    scripts = [i for i, a in enumerate(rest) if a.endswith(".py")]
    if not scripts:
        raise ValueError(f"no module or script in: {shlex.join(argv)}")
    i = scripts[0]
    return rest[i].removesuffix(".py").replace("/", "."), rest[i + 1 :], launcher == "torchrun"


def classify(argv: list[str]) -> tuple[str, str, list[str]]:
    """``(kind, module, args)`` with kind ``run`` / ``parse`` / ``skip``; ValueError when unknown."""
    if tuple(argv) in SKIPPED:
        return "skip", argv[0], argv[1:]
    module, args, torchrun = _module_argv(argv)
    sub = args[0] if args and not args[0].startswith("-") else None
    if not torchrun:
        for mod, first, flag in RUNNABLE:
            if mod == module and first == sub and (flag is None or flag in args):
                return "run", module, args
    for (mod, first), _ in PARSERS.items():
        if mod == module and (first is None or first == sub):
            return "parse", module, args
    raise ValueError(
        f"the doc harness has no rule for: {shlex.join(argv)} (add one to {Path(__file__).name})"
    )


def check_parse(module: str, args: list[str]) -> None:
    shown = shlex.join([module, *args])
    sub = args[0] if args and not args[0].startswith("-") else None
    if sub is not None and (module, sub) in PARSERS:  # a subcommand: its parser gets the rest
        fn, args = PARSERS[(module, sub)], args[1:]
    else:
        fn = PARSERS[(module, None)]
    try:
        fn(args)
    except SystemExit as e:
        raise AssertionError(f"argparse rejected `{shown}` (exit {e.code})") from None


# ------------------------------------------------------------------------------------------- fixtures


def _deit_checkpoint(path: Path) -> None:
    """A timm/DeiT-tiny-shaped state dict (224 px, patch 16: a 14x14 table plus the class token)."""
    import torch

    g = torch.Generator().manual_seed(0)
    sd = {
        "cls_token": torch.randn(1, 1, 192, generator=g),
        "pos_embed": torch.randn(1, 1 + 14 * 14, 192, generator=g),
        "patch_embed.proj.weight": torch.randn(192, 3, 16, 16, generator=g),
    }
    torch.save({"model": sd}, path)


def _detr_checkpoint(path: Path) -> None:
    """A tiny untrained ``peg_detr`` training checkpoint (what ``predict`` reads)."""
    from peg_core.interop import atomic_save
    from peg_detr import build_detr

    model, _, _ = build_detr(
        "tiny", "peg", num_classes=4, num_queries=5, hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=1,
        dim_feedforward=64,
    )  # fmt: skip
    cats = [
        {"id": i, "name": n, "supercategory": "shape"}
        for i, n in enumerate(("square", "disc", "triangle"), 1)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save(
        {"task": "detect", "model": model.state_dict(), "model_config": model.build_config,
         "meta": {"categories": cats, "val_size": 64}},
        path,
    )  # fmt: skip


def _quiet(fn: Callable[[list[str]], object], argv: list[str]) -> None:
    """Run a command function in process for a fixture, its console lines swallowed."""
    import io

    import torch

    threads = torch.get_num_threads()  # --threads 1 of the tiny runs must not leak into later tests
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert fn(argv) is not None
    finally:
        torch.set_num_threads(threads)


def _classify_run(path: Path) -> None:
    """A one-epoch tiny CPVT (seconds) and the generated shapes it reads (``data/py_shapes``)."""
    from peg_core.classify import cli
    from tests.core.classify_runs import tiny

    work = path.parents[2]
    _quiet(
        cli.make_data,
        [str(work / "data" / "py_shapes"), "--num-train", "12", "--num-val", "12", "--img-size", "16"],
    )
    _quiet(cli.train, [*tiny(24, 12), "--epochs", "1", "--output-dir", str(path.parent)])


def _detect_images(path: Path) -> None:
    """The synthetic COCO shapes (``make-data``'s layout) under ``path``."""
    from peg_detr.data import SyntheticSpec, make_synthetic_coco

    make_synthetic_coco(path, num_train=2, num_val=2, seed=0, spec=SyntheticSpec(size=64, num_classes=3))


def _video_run(path: Path) -> None:
    """A one-epoch tiny video transformer and the synthetic Kinetics set it reads (``data/py_video``)."""
    from peg_video import cli
    from tests.video.runs import TINY, synthetic_set

    data = synthetic_set(path.parents[2] / "data" / "py_video", num_train=4, num_val=2, frames=8)
    _quiet(
        cli.train,
        ["--train-ann", str(data / "train.csv"), "--output-dir", str(path.parent), *TINY, "--epochs", "1"],
    )


def _videomae_folder(path: Path) -> None:
    """A tiny random VideoMAE classifier (``save_pretrained``): the docs' downloaded VideoMAE folder."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.VideoMAEConfig(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=32,
                                      num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)  # fmt: skip
    transformers.VideoMAEForVideoClassification(cfg).save_pretrained(path)


#: files the docs' commands and python blocks read, created in the working directory before they run
FIXTURES: dict[str, Callable[[Path], None]] = {
    "deit_tiny_patch16_224.pth": _deit_checkpoint,
    "runs/detr_tiny/checkpoint.pth": _detr_checkpoint,
    "runs/py_classify/checkpoint.pth": _classify_run,
    "data/py_coco": _detect_images,
    "runs/py_video/checkpoint.pth": _video_run,
    "videomae-small-k400": _videomae_folder,
}


# ---------------------------------------------------------------------------------------------- tests


def _doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_docs_exist_and_have_commands() -> None:
    names = {_doc_id(p) for p in DOCS}
    assert {
        "README.md",
        "docs/api.md",
        "docs/data.md",
        "docs/troubleshooting.md",
        "docs/concepts.md",
    } <= names
    assert sum(len(blocks(p)) for p in DOCS) >= 10


def test_every_shell_command_is_classified() -> None:
    unknown = []
    for path in DOCS:
        for lang, line, code in blocks(path):
            if lang != "sh":
                continue
            for argv in shell_commands(code):
                try:
                    classify(argv)
                except ValueError as e:
                    unknown.append(f"{_doc_id(path)}:{line}: {e}")
    assert not unknown, "\n".join(unknown)


def test_covered_commands_have_their_tests() -> None:
    for module, where in COVERED.items():
        assert (REPO / where.split()[0]).is_file(), where
        assert classify(["python", "-m", module, "--quick"])[0] == "parse"


def test_harness_rejects_what_it_cannot_check() -> None:
    with pytest.raises(ValueError, match="no rule"):
        classify(["python", "-m", "peg_detr", "benchmark"])
    with pytest.raises(ValueError, match="not a python"):
        classify(["curl", "https://example.com"])
    # torchrun commands are never run, only parsed; a wrong flag fails the parse
    kind, module, args = classify(["torchrun", "--nproc_per_node", "8", "-m", "peg_detr", "train", "--bogus"])
    assert (kind, module) == ("parse", "peg_detr")
    with pytest.raises(AssertionError, match="argparse rejected"):
        check_parse(module, args)


@pytest.mark.parametrize("path", [p for p in DOCS if any(b[0] == "sh" for b in blocks(p))], ids=_doc_id)
def test_shell_commands(path: Path, tmp_path: Path) -> None:
    commands = [
        (line, argv) for lang, line, code in blocks(path) if lang == "sh" for argv in shell_commands(code)
    ]
    for name, make in FIXTURES.items():
        if any(name in a for _, argv in commands for a in argv):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            make(tmp_path / name)
    for line, argv in commands:
        kind, module, args = classify(argv)
        if kind == "parse":
            with contextlib.chdir(tmp_path):  # a relative --init FOLDER is read while parsing
                check_parse(module, args)
        elif kind == "run":
            text = shlex.join(args)
            for pattern, repl in SUBSTITUTIONS:
                text = re.sub(pattern, repl, text)
            proc = subprocess.run(
                [sys.executable, "-m", module, *shlex.split(text)],
                cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert proc.returncode == 0, (
                f"{_doc_id(path)}:{line}: `{shlex.join(argv)}` failed\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            )


_RUNNER = """
import sys, traceback
blocks = {blocks!r}
for line, code in blocks:
    try:
        exec(compile(code, f"{doc}:{{line}}", "exec"), {{"__name__": "__main__"}})
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: python block at {doc}:{{line}}", file=sys.stderr)
        sys.exit(1)
"""


@pytest.mark.parametrize("path", [p for p in DOCS if any(b[0] == "python" for b in blocks(p))], ids=_doc_id)
def test_python_blocks(path: Path, tmp_path: Path) -> None:
    code = [(line, textwrap.dedent(src)) for lang, line, src in blocks(path) if lang == "python"]
    for name, make in FIXTURES.items():  # e.g. the checkpoints the Predictor examples load
        if any(name in src for _, src in code):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            make(tmp_path / name)
    runner = _RUNNER.format(blocks=code, doc=_doc_id(path))
    proc = subprocess.run(
        [sys.executable, "-c", runner], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
