"""docs/study.md holds the study's generated tables and figures; the number gate reads them there.

The tables, figures and bullet points of ``docs/study.md`` are what ``python -m tools.study`` writes to
``OUT/report.md`` (copied unchanged; each task's section is headed ``<task>: <metric> by test size``).
The paragraphs written around them, and the README's Results paragraph, quote numbers from those
tables: every three-decimal value they quote (``0.855`` or ``0.855 ± 0.041``) must be a cell value of a
table on the page, so a regenerated table cannot leave a stale number in the prose.  Spreads
(``±0.232``, a sum of two standard deviations) and differences are the generated sentences' own and are
not looked up.  Also: the README stays a landing page (no study tables, at most ~400 lines), and every
relative link of README.md and docs/*.md reaches a file and, with ``#anchor``, one of its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
STUDY = REPO / "docs" / "study.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]

#: a generated section of the study: ``## classify: top-1 by test size``, ``### extrapolation: detect: AP50 ...``
GENERATED = re.compile(r"^#+ .*: (?:top-1|AP50) by test size$")
#: a quoted value: three decimals, not a spread (``±0.232``) and not a difference
VALUE = re.compile(r"(?<![\d.±])(?<!difference )(\d\.\d{3})(?!\d)(?: ± (\d\.\d{3}))?")


def table_values(text: str) -> set[str]:
    """Every ``mean ± std`` and every value of the page's table rows."""
    out = set()
    for line in text.splitlines():
        if line.startswith("|"):
            for m in VALUE.finditer(line):
                out |= {v for v in m.groups() if v} | {m.group(0)}
    return out


def quoted(text: str, skip_generated: bool = True) -> list[tuple[int, str]]:
    """``(line, value)`` of the values quoted outside tables (and, on the study page, outside generated
    sections), read per paragraph so that a ``mean ±`` wrapped before its ``std`` is one value."""
    out, generated, paragraph = [], False, []

    def flush() -> None:
        if paragraph:
            out.extend(
                (paragraph[0][0], m.group(0)) for m in VALUE.finditer(" ".join(s for _, s in paragraph))
            )
            paragraph.clear()

    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            generated = skip_generated and GENERATED.match(line) is not None
        if not line.strip() or line.startswith(("#", "|", "* ")):
            flush()
        if line.strip() and not line.startswith(("#", "|")) and not generated:
            paragraph.append((n, line.strip()))
    flush()
    return out


def test_the_study_lives_in_docs_with_its_figures():
    study = STUDY.read_text()
    for task in (
        "classify",
        "classify-scale",
        "detect",
        "detect-rtdetr",
        "detect-dfine",
        "detect-rfdetr",
        "video",
    ):
        assert re.search(rf"^## {re.escape(task)}: (?:top-1|AP50) by test size$", study, re.M), task
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", study)
    assert len(figures) >= 13 and all((STUDY.parent / f).is_file() for f in figures), figures


def test_the_number_gate_reads_docs_study():
    """Every value the study page's prose and the README's Results quote is a cell of the study's tables."""
    values = table_values(STUDY.read_text())
    assert len(values) > 500  # the tables are here, not in the README
    prose = quoted(STUDY.read_text())
    results = README.read_text().split("\n## Results", 1)[1].split("\n## ", 1)[0]
    readme = quoted(results, skip_generated=False)
    assert len(prose) > 40 and len(readme) >= 3
    stale = [f"docs/study.md:{n}: {v}" for n, v in prose if v not in values]
    stale += [f"README.md Results: {v}" for _, v in readme if v not in values]
    assert not stale, "numbers quoted that no table of docs/study.md holds:\n" + "\n".join(stale)


def test_the_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    assert not re.search(r"^\|.* ± ", text, re.M), "a study table in the README (it belongs in docs/study.md)"
    contents = text.split("\n## Contents", 1)[1].split("\n## ", 1)[0]
    headings = [h for h in re.findall(r"^## (.+)$", text, re.M) if h != "Contents"]
    assert re.findall(r"^\* \[(.+?)\]\(#", contents, re.M) == headings


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # no headings in code blocks
    out, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_links_reach_files_and_headings():
    broken = []
    for doc in DOCS:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
