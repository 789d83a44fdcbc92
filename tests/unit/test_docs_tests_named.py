"""Every test the README and docs/ name exists, so a renamed or deleted test cannot leave a claim citing nothing.

A reference is a path `tests/….py`, optionally followed by `::name` (`::Class::method` names a method); a `::name`
without a path names a test of the last path of the same paragraph or table row, as the docs write
`tests/a.py::test_one`, `::test_two`. Parametrisations (`[…]`) are not part of the name. Each path must be a file
and each name a function or class defined in it (read with ast, nothing imported).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tooling.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A path to a .py file with ::names after it, a bare ::name (or ::Class::method), or a path alone.
REFERENCE = re.compile(r"(?P<path>(?:[\w.-]+/)+[\w.-]+\.py)?(?P<names>(?:::\w+)+)|(?P<alone>(?:[\w.-]+/)+[\w.-]+\.py)")


def blocks(text: str) -> list[str]:
    """The paragraphs of a page, each table row a block of its own."""
    found: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("|"):
            if current:
                found.append("\n".join(current))
                current = []
            if line.strip():
                found.append(line)
        else:
            current.append(line)
    if current:
        found.append("\n".join(current))
    return found


def references(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(path, names) for every test file named in `text`; names is empty for a path named alone."""
    found = []
    for block in blocks(text):
        last = None
        for match in REFERENCE.finditer(block):
            path = match["path"] or match["alone"]
            if path:
                last = path
            if not (path or last) or not (path or last).startswith("tests/"):
                continue  # another file's ::name (handlers/pipeline.py::answer_batch) is not a test
            names = tuple(match["names"].strip(":").split("::")) if match["names"] else ()
            found.append((path or last, names))
    return found


@cache
def definitions(path: Path) -> dict[str, dict]:
    """The module's functions and classes, each class with its own, as nested dicts of names."""

    def defined(body) -> dict[str, dict]:
        return {
            node.name: defined(node.body) if isinstance(node, ast.ClassDef) else {}
            for node in body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }

    return defined(ast.parse(path.read_text(encoding="utf-8")).body)


def missing(path: str, names: tuple[str, ...]) -> str | None:
    """What of a reference does not exist, or None."""
    file = REPO / path
    if not file.is_file():
        return f"{path}: no such file"
    scope = definitions(file)
    for name in names:
        if name not in scope:
            return f"{path}::{'::'.join(names)}: no {name} in {path}"
        scope = scope[name]
    return None


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_test_a_page_names_exists(page):
    named = references(page.read_text(encoding="utf-8"))
    assert sorted({problem for path, names in named if (problem := missing(path, names))}) == []


def test_the_pages_are_read():
    named = [reference for page in PAGES for reference in references(page.read_text(encoding="utf-8"))]
    assert len([names for _, names in named if names]) > 100, "far fewer named tests than the docs hold"


def test_references_are_read_as_the_docs_write_them():
    text = (
        "| claim | `tests/unit/test_a.py::test_one[x-…]`, `[y-…]`, `::test_two`, `tests/e2e/test_b.py` |\n"
        "| next row | `::orphan` |\n"
        "\n"
        "`tests/unit/test_c.py::Suite::test_three` and `handlers/pipeline.py::answer_batch`, then\n"
        "(`::test_four`).\n"
    )
    assert references(text) == [
        ("tests/unit/test_a.py", ("test_one",)),
        ("tests/unit/test_a.py", ("test_two",)),
        ("tests/e2e/test_b.py", ()),
        ("tests/unit/test_c.py", ("Suite", "test_three")),
    ]


def test_a_name_that_is_not_defined_is_reported():
    this = str(Path(__file__).relative_to(REPO))
    assert missing(this, ("test_a_name_that_is_not_defined_is_reported",)) is None
    assert missing(this, ("test_that_does_not_exist",)) is not None
    assert missing("tests/unit/no_such_file.py", ()) is not None
