"""Docstrings as ``-h`` text: the reStructuredText markup that reads well in Sphinx, removed for a terminal.

The verbs' descriptions are their modules' docstrings (one text for the API docs and for ``-h``),
so they carry ``double backticks``, cross-reference roles and ``::`` literal-block markers that a
terminal shows as noise.  :func:`plain_text` keeps the words and drops the markup.
"""

from __future__ import annotations

import re

__all__ = ["plain_text"]

#: ``:role:`target``` / ``:py:role:`target``` with an optional ``~`` (show the last name only) and an
#: optional ``title <target>`` form
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`(~?)([^`<]*?)\s*(?:<([^`>]*)>)?`")
#: ``literal`` text; its content is shown as it is (no other markup is read inside it)
_LITERAL = re.compile(r"``(.+?)``", re.S)
#: *emphasis* / **strong**: opened after a space or "(", a word inside, closed before a space or punctuation;
#: globs such as ``train/*.jpg`` do not match (the star follows a slash, a dot follows it)
_EMPHASIS = re.compile(r"(?<![^\s(])(\*\*?)([A-Za-z][^*\n/]*?)\1(?=[\s).,;:]|$)", re.M)
#: a paragraph that ends in ``::`` introduces a literal block; in plain text one colon says the same
_LITERAL_MARKER = re.compile(r"(\S)::$", re.M)


def _role(m: re.Match[str]) -> str:
    short, title, target = m.group(1), m.group(2), m.group(3)
    if target is not None and title:  # :role:`title <target>`: the title is what the reader sees
        return title
    name = target if target is not None else title
    return name.rsplit(".", 1)[-1] if short else name


def _markup(text: str) -> str:
    """Roles, emphasis and ``::`` markers removed from text that holds no literal."""
    text = _ROLE.sub(_role, text)
    text = _EMPHASIS.sub(r"\2", text)
    return _LITERAL_MARKER.sub(r"\1:", text)


def plain_text(text: str) -> str:
    """``text`` without reStructuredText markup: ``x`` -> x, :class:`~a.B` -> B, *word* -> word, ``::`` -> ``:``.

    Line breaks and indentation are kept (the verbs' help keeps the description's layout); the
    content of a literal is kept character for character.
    """
    out, last = [], 0
    for m in _LITERAL.finditer(text):
        out += [_markup(text[last : m.start()]), m.group(1)]
        last = m.end()
    out.append(_markup(text[last:]))
    return "".join(out)
