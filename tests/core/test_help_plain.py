"""``-h`` of every verb of the three packages is plain text: no reStructuredText markup, no old spellings."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
from unittest import mock

import pytest

from peg_core.engine.cli import new_parser
from peg_core.engine.helptext import plain_text

PACKAGES = ("peg_core", "peg_detr", "peg_video")
#: what a terminal would show as noise: ``literals`` and Sphinx roles (:class:`X`, :py:func:`f`, ...)
MARKUP = re.compile(r"``|:(?:[a-z]+:)?(?:class|func|mod|data|meth|attr|exc|obj|doc|ref):`")


def _help(module: str, argv: list[str]) -> tuple[str, list[argparse.ArgumentParser]]:
    """``(stdout, parsers that printed their help)`` of ``python -m module *argv`` run in process."""
    main = importlib.import_module(f"{module}.__main__").main
    printed: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.print_help

    def record(self: argparse.ArgumentParser, file=None) -> None:
        printed.append(self)
        real(self, file)

    out = io.StringIO()
    with mock.patch.object(argparse.ArgumentParser, "print_help", record), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    assert code == 0, (module, argv)
    return out.getvalue(), printed


def _spellings(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """``(visible, hidden)`` option strings: a hidden one is an alias kept for old commands and checkpoints."""
    visible, hidden = set(), set()
    for action in parser._actions:
        (hidden if action.help is argparse.SUPPRESS else visible).update(action.option_strings)
    return visible, hidden - visible


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


@pytest.mark.parametrize("module", PACKAGES)
def test_every_verb_help_is_plain_text_without_old_spellings(module: str) -> None:
    commands = importlib.import_module(f"{module}.__main__").COMMANDS
    old_everywhere: set[str] = set()
    visible_somewhere: set[str] = set()
    for verb in commands:
        text, parsers = _help(module, [verb, "-h"])
        assert len(parsers) == 1, verb
        assert not MARKUP.search(text), f"{module} {verb} -h: {MARKUP.search(text).group()!r} in\n{text}"
        visible, hidden = _spellings(parsers[0])
        shown = sorted(o for o in hidden if _mentions(text, o))
        assert not shown, f"{module} {verb} -h shows the old spelling(s) {shown}"
        for action in parsers[0]._actions:  # one spelling per option (a --x / --no-x switch is one)
            if action.help is argparse.SUPPRESS or isinstance(action, argparse.BooleanOptionalAction):
                continue
            assert len([o for o in action.option_strings if o.startswith("--")]) <= 1, (
                verb,
                action.option_strings,
            )
        old_everywhere |= hidden
        visible_somewhere |= visible
    # the package's own -h (its docstring) uses the spellings of today too
    text, _ = _help(module, ["-h"])
    assert not MARKUP.search(text), f"{module} -h: {MARKUP.search(text).group()!r} in\n{text}"
    shown = sorted(o for o in old_everywhere - visible_somewhere if _mentions(text, o))
    assert not shown, f"{module} -h shows the old spelling(s) {shown}"


def test_plain_text_drops_markup_and_keeps_literals() -> None:
    assert plain_text("``IN`` / ``OUT`` are ``.pth`` files") == "IN / OUT are .pth files"
    assert plain_text("(:func:`peg_detr.models.fuse`; :class:`~peg_core.engine.Predictor`)") == (
        "(peg_detr.models.fuse; Predictor)"
    )
    assert plain_text("compares with the *unfused* model, **not** the other") == (
        "compares with the unfused model, not the other"
    )
    assert (
        plain_text("PATH/train/<class>/*.jpg, ``*.png``, a * b") == "PATH/train/<class>/*.jpg, *.png, a * b"
    )
    assert plain_text("Several GPUs::\n\n    torchrun ...") == "Several GPUs:\n\n    torchrun ..."
    # the formatter applies it to descriptions and option help alike
    p = new_parser("prog", "Reads ``--data-root`` (:func:`f`).")
    p.add_argument("--x", help="see ``--y``")
    text = p.format_help()
    assert "Reads --data-root (f)." in text and "see --y" in text and "``" not in text
