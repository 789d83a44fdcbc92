"""The README is a front page, and every relative link and #anchor in it and in docs/ resolves.

Markdown is parsed with markdown-it-py (CommonMark plus GitHub's tables), so links inside code
blocks are not links and headings inside code blocks are not headings; anchors follow GitHub's
rule for heading ids.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

from tooling.paths import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]
README_MAX_LINES = 150

PARSER = MarkdownIt("commonmark").enable("table")


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading's text: lower case, punctuation dropped (not - or _), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def plain_text(inline) -> str:
    """A heading's text as GitHub renders it: code spans keep their content, markup goes."""
    return "".join(child.content for child in inline.children if child.type in ("text", "code_inline"))


@cache
def page(path: Path) -> tuple[set[str], list[str]]:
    """(the anchors of the page's headings, the targets of its links and images)."""
    tokens = PARSER.parse(path.read_text(encoding="utf-8"))
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    targets: list[str] = []
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            anchor = github_anchor(plain_text(tokens[index + 1]))
            # GitHub numbers repeated headings: name, name-1, name-2 ...
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
        if token.type == "inline":
            for child in token.children:
                if child.type == "link_open":
                    targets.append(child.attrs["href"])
                elif child.type == "image":
                    targets.append(child.attrs["src"])
    return anchors, targets


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in page(path)[1]:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: … : not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not destination.exists() or not destination.is_relative_to(REPO):
            broken.append(f"{target}: no such file")
        elif anchor and (destination.suffix != ".md" or unquote(anchor) not in page(destination)[0]):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(REPO)}")
    return broken


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(path):
    assert page(path)[1] or path.parent.name.startswith("bench-"), f"{path} has no link at all: was it parsed?"
    assert broken_links(path) == []


def test_the_readme_is_a_front_page_that_links_every_guide():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in page(README)[1]}
    guides = {path.resolve() for path in (REPO / "docs").glob("*.md")}
    assert guides <= linked, sorted(str(p.relative_to(REPO)) for p in guides - linked)


def test_anchors_follow_github_s_rule():
    assert github_anchor("1. The storage layout and its cluster configuration") == (
        "1-the-storage-layout-and-its-cluster-configuration"
    )
    assert github_anchor("Demo model (MiniLM-L6 classifier), batch_size=1 vs batch_size=8") == (
        "demo-model-minilm-l6-classifier-batch_size1-vs-batch_size8"
    )
    assert (
        github_anchor("Keys, rotation, and turning authorization off") == "keys-rotation-and-turning-authorization-off"
    )
