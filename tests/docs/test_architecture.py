"""``docs/architecture.md`` tells the truth: its layout lists every package module, and only modules that exist.

The layout is the ``text`` block under "## Layout": a tree indented by two spaces per level, each
entry line starting with the names it describes (``folder/``, ``module.py`` or several modules as
``a.py, b.py``), then the description after at least two spaces.  Lines whose first field names
no folder or module are continuations of the description above them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("peg_core", "peg_detr", "peg_video")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.py|/)$")


def _layout_block(text: str) -> list[str]:
    section = text.split("## Layout", 1)[1]
    return section.split("```text", 1)[1].split("```", 1)[0].splitlines()


def documented(text: str) -> tuple[set[str], set[str]]:
    """``(modules, folders)`` named by the layout, as paths relative to the repository root."""
    modules: set[str] = set()
    folders: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in _layout_block(text):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        first = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names = [n.strip() for n in first.split(",")]
        if not all(NAME.match(n) for n in names):
            continue  # a continuation of the description above
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        for name in names:
            path = parent + name
            if name.endswith("/"):
                folders.add(path.rstrip("/"))
                stack.append((indent, path))
            else:
                modules.add(path)
    return modules, folders


def actual() -> tuple[set[str], set[str]]:
    """Every module (``__init__.py`` aside) and sub-folder of the three packages."""
    modules: set[str] = set()
    folders: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "__pycache__" in rel.parts:
                continue
            folders.update(str(p) for p in rel.parents if str(p) != ".")
            if path.name != "__init__.py":
                modules.add(str(rel))
    return modules, folders


def test_architecture_lists_every_module_and_no_other():
    doc_modules, doc_folders = documented((ROOT / "docs" / "architecture.md").read_text())
    modules, folders = actual()
    assert not sorted(modules - doc_modules), (
        f"modules missing from docs/architecture.md: {sorted(modules - doc_modules)}"
    )
    assert not sorted(doc_modules - modules), (
        f"listed in docs/architecture.md but absent: {sorted(doc_modules - modules)}"
    )
    assert not sorted(folders - doc_folders), (
        f"folders missing from docs/architecture.md: {sorted(folders - doc_folders)}"
    )
    assert not sorted(doc_folders - folders), (
        f"listed folders that do not exist: {sorted(doc_folders - folders)}"
    )


def test_the_parser_reads_nesting_and_continuations():
    text = "## Layout\n```text\npkg/   the package\n  a.py, b.py   two\n    more words: x.py\n  sub/   s\n    c.py   c\n  d.py\n```\n"
    assert documented(text) == ({"pkg/a.py", "pkg/b.py", "pkg/sub/c.py", "pkg/d.py"}, {"pkg", "pkg/sub"})
