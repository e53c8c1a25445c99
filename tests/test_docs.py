"""The README is a short front door, every link and test file named in it and in docs/ leads somewhere, and the
generated blocks are current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from invariants.suite import PROPERTIES
from reports import glance
from tests.helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
TEST_FILE = re.compile(r"\btests/[\w/]+\.py\b")  # a test file named in prose, such as tests/model/test_kernel.py


def prose(page: Path) -> str:
    """The page without its fenced code blocks, where a `](...)` is code, not a link."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def slug(heading: str) -> str:
    """The anchor a code host gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(page).splitlines() if re.match(r"#{1,6} ", line)}


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page)) if not re.match(r"[a-z]+:", t)]


def test_readme_is_under_150_lines():
    assert len((REPO / "README.md").read_text().splitlines()) < 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_named_test_file_resolves(page):
    text = page.read_text()
    broken = [f"{name}: no such test file" for name in TEST_FILE.findall(text) if not (REPO / name).is_file()]
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, "\n".join(broken)


def test_readme_links_every_docs_page():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in relative_links(REPO / "README.md")}
    assert set(PAGES[1:]) <= linked


def test_property_table_in_docs_is_the_one_generated_from_the_suite():
    text = (REPO / "docs" / "invariants.md").read_text()
    assert glance.replace_block(text, "properties", glance.property_table()) == text, (
        "docs/invariants.md is stale: run `nox -s report` (python -m reports)"
    )
    assert all(f"| `{p.name}` |" in text for p in PROPERTIES)


def test_glance_block_in_readme_is_the_one_generated_from_the_committed_reports():
    text = (REPO / "README.md").read_text()
    reports = REPO / "reports"
    block = glance.glance(reports / "results", reports / "invariants", reports, REPO)
    assert glance.replace_block(text, "glance", block) == text, (
        "README.md is stale: run `nox -s report` (python -m reports)"
    )


def test_replacing_a_block_keeps_the_markers_and_the_text_around_them():
    text = "before\n<!-- x:start -->\nold\n<!-- x:end -->\nafter\n"
    assert glance.replace_block(text, "x", "new") == "before\n<!-- x:start -->\nnew\n<!-- x:end -->\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        glance.replace_block("no markers here", "x", "new")
